"""Overhead of the sweep layer against a plain ``measure_to_dir`` loop on the same units.

Units: ``N_CKPT`` checkpoint folders (HF Trainer layout) of a small random GPT-2 (4 layers,
d = 64), each measured on 4 prompts of ``builtin:all_styles_small`` (depth-wise coupling,
K = 6). Phases, in one process, back to back:

1. ``loop``: for each checkpoint, ``load_model`` + ``load_prompts`` + ``measure_to_dir``.
2. ``sweep-local``: ``bc.run_sweep(..., executor="local")`` (same work, plus the sweep's
   manifest, status files and catalogue).
3. ``sweep-ray-serial``: ``bc.run_sweep(..., executor="ray")``, Ray start-up and shutdown
   included, each unit asking for 2 CPUs on a 2-CPU local cluster (one unit at a time with 2
   threads, like the loop).
4. ``sweep-ray-parallel``: the same with 1 CPU per unit (two units at once, 1 thread each).

Only the public API is used. Run: ``OMP_NUM_THREADS=2 python benchmarks/bench_sweep.py``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, machine, phase, save  # noqa: E402

import blockcoupling as bc  # noqa: E402
from blockcoupling.loading import load_model  # noqa: E402

N_CKPT = 3
PROMPTS = "builtin:all_styles_small"
LIMIT = 4
MEASURE = {"coupling": ["depth"], "k": [6], "orientations": ["ujv"]}


def make_checkpoints(root: Path) -> list[Path]:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for p in bc.load_prompts(PROMPTS) for w in p.text.split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
    cfg = tf.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=len(vocab), n_positions=256)
    out = []
    for i in range(N_CKPT):
        torch.manual_seed(i)
        path = root / "train" / f"checkpoint-{100 * i}"
        tf.AutoModel.from_config(cfg).save_pretrained(path)
        tok.save_pretrained(path)
        out.append(path)
    return out


def main() -> None:
    records: list[dict] = []
    info = machine()
    root = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    try:
        ckpts = make_checkpoints(root)
        cfg = bc.MeasureConfig.parse(**MEASURE)
        spec = {"models": [{"label": "tiny", "checkpoints": str(root / "train" / "checkpoint-*"),
                            "resources": {"num_cpus": 2}}],
                "prompts": [PROMPTS], "limit": LIMIT, "measure": MEASURE}
        load0 = os.getloadavg()[0]
        with phase("loop") as ph:
            for path in ckpts:
                model, tok = load_model(str(path))
                prompts = bc.load_prompts(PROMPTS, limit=LIMIT, seed=cfg.seed)
                bc.measure_to_dir(model, tok, prompts, root / "loop" / path.name, config=cfg,
                                  progress=False)
        emit({"phase": "loop", **ph.as_dict()}, records)
        with phase("sweep-local") as ph:
            bc.run_sweep(spec, root / "local", executor="local", progress=False)
        emit({"phase": "sweep-local", **ph.as_dict()}, records)
        with phase("sweep-ray-serial") as ph:
            s = bc.run_sweep(spec, root / "ray1", executor="ray", progress=False, num_cpus=2)
        emit({"phase": "sweep-ray-serial", **ph.as_dict(),
              "unit_seconds": s.catalogue["seconds"].tolist()}, records)
        par = {**spec, "models": [{**spec["models"][0], "resources": {"num_cpus": 1}}]}
        with phase("sweep-ray-parallel") as ph:
            s = bc.run_sweep(par, root / "ray2", executor="ray", progress=False, num_cpus=2)
        emit({"phase": "sweep-ray-parallel", **ph.as_dict(),
              "unit_seconds": s.catalogue["seconds"].tolist()}, records)
        # the numbers are the same whichever way they were measured
        ref = bc.open_sweep(root / "local").coupling["value"].to_numpy()
        for name in ("ray1", "ray2"):
            other = bc.open_sweep(root / name).coupling["value"].to_numpy()
            emit({"phase": f"check-{name}", "max_abs_diff_vs_local":
                  float(abs(other - ref).max())}, records)
        loop = records[0]["seconds"]
        for r in records:
            if "seconds" in r:
                r["vs_loop"] = round(r["seconds"] / loop, 3)
        records.append({"machine": info, "load_start": load0, "load_end": os.getloadavg()[0],
                        "units": N_CKPT, "prompts_per_unit": LIMIT})
        print(save(records, "bench_sweep"))
        for r in records:
            print(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
