#!/bin/bash
# Quiet-machine measurements (issue 22 items 1-4, issue 19's and issue 30's costs): one after the other.
# `bash benchmarks/quiet_rerun.sh engine` runs the engine rows only (items 1, 2 and 4); the
# A/B row needs the older tree at /tmp/base/src (`git archive REV src | tar -x -C /tmp/base`).
cd /work/main
export HF_HUB_OFFLINE=1 MPLBACKEND=Agg
Q=${QUIET_DIR:-/work/runs/quiet}; mkdir -p $Q
T="/usr/bin/time -f %e_wall_%U_user_%S_sys_%M_maxkb"
step() { name=$1; shift; echo "== $name start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $Q/log; $T -o $Q/$name.time "$@" > $Q/$name.out 2> $Q/$name.err; echo "== $name end $(date -u +%T) rc $? load $(cut -d' ' -f1-3 /proc/loadavg) $(cat $Q/$name.time)" >> $Q/log; }
# `bash benchmarks/quiet_rerun.sh perf34`: issue 34's rows only (token-wise floor, throughput,
# sweep, guard); about 75 min on 2 quiet cores.
if [ "${1:-}" = perf34 ]; then
  export OMP_NUM_THREADS=2
  step tok34 .venv/bin/python benchmarks/bench_tokenwise.py --floor --oracle --kinds fixed_output fixed_input --repeats 3
  OMP_NUM_THREADS=1 step tok34_1t .venv/bin/python benchmarks/bench_tokenwise.py --floor --no-released --kinds fixed_output fixed_input --repeats 3
  step thr34 .venv/bin/python benchmarks/bench_throughput.py
  step thr34_dir .venv/bin/python benchmarks/bench_throughput.py --ns 64 --to-dir
  OMP_NUM_THREADS=1 step sweep34 .venv/bin/python benchmarks/bench_sweep.py
  OMP_NUM_THREADS=1 step sweep34_70m .venv/bin/python benchmarks/bench_sweep.py --shape pythia-70m
  OMP_NUM_THREADS=1 step guard34 .venv/bin/python benchmarks/guard_fastpath.py --save
  echo "== perf34 rows done $(date -u +%T)" >> $Q/log; exit 0
fi
export OMP_NUM_THREADS=2
step depth .venv/bin/python benchmarks/bench_depth.py --repeats 3 --prompts 4 --oracle fast64 --no-generic
step ab .venv/bin/python benchmarks/bench_ab.py --base /tmp/base/src --repeats 3 --check
step trajectory .venv/bin/python benchmarks/bench_trajectory.py --repeats 7
step memory .venv/bin/python benchmarks/bench_memory.py
step tokenwise .venv/bin/python benchmarks/bench_tokenwise.py --repeats 1
if [ "${1:-}" = engine ]; then echo "== engine rows done $(date -u +%T)" >> $Q/log; exit 0; fi
rm -rf /tmp/q_lm_full /tmp/q_cache_full
BLOCKCOUPLING_CACHE=/tmp/q_cache_full step lm_full .venv/bin/blockcoupling study lm-family --out /tmp/q_lm_full
rm -rf /tmp/q_lm_quick /tmp/q_cache_quick
BLOCKCOUPLING_CACHE=/tmp/q_cache_quick step lm_quick .venv/bin/blockcoupling study lm-family --quick --out /tmp/q_lm_quick
rm -rf /tmp/q_vit2
step vit2x2 .venv/bin/blockcoupling vit-grid --spec docs/vit-grid-digits-2x2.yaml --out /tmp/q_vit2
rm -rf /tmp/q_gen_full /tmp/q_gen_quick
OMP_NUM_THREADS=1 step gen_full .venv/bin/blockcoupling study generalization --out /tmp/q_gen_full
OMP_NUM_THREADS=1 step gen_quick .venv/bin/blockcoupling study generalization --quick --out /tmp/q_gen_quick
echo "== all done $(date -u +%T)" >> $Q/log
