"""Before/after of an engine change in ONE process: two source trees of blockcoupling, interleaved.

A loaded machine moves wall and CPU seconds from one run to the next by more than the levers
being compared, so both versions run in the same process, alternating (A B, B A, ...), on the
same model and prompts: the item-2 call of bench_depth.py (random GPT-2-small-shaped model,
d = 768, 12 layers; ONE ``measure()`` call with the defaults on ``--prompts`` 12-token prompts,
first-prompt checks included) per version per repeat. ``--base`` is the ``src`` folder of the
older version (e.g. ``git archive <commit> src | tar -x -C /tmp/base``); the newer one is this
checkout's ``src``. Each version is imported under its own module tree (``sys.modules`` is
swapped between the imports), so each call runs its own code. Reports per version the call's
wall and process CPU seconds per prompt (medians, and each repeat) and the ratios base/new;
with ``--check`` also the largest difference between the two versions' coupling values.

    git archive 2fef915 src | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    OMP_NUM_THREADS=2 python benchmarks/bench_ab.py --base /tmp/base/src --repeats 4 --check
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, machine, save  # noqa: E402

NEW_SRC = Path(__file__).resolve().parent.parent / "src"


def _ours(name: str) -> bool:
    return name == "blockcoupling" or name.startswith("blockcoupling.")


class Version:
    """One source tree of blockcoupling with its own modules; :meth:`active` installs them in
    ``sys.modules`` (and its ``src`` first on ``sys.path``), so that imports made inside
    functions at call time also resolve to this version."""

    def __init__(self, src: Path) -> None:
        self.src = src.resolve()
        with self.active():
            self.bc = importlib.import_module("blockcoupling")
            importlib.import_module("blockcoupling.engine.measure")
        assert Path(str(self.bc.__file__)).resolve().is_relative_to(self.src), self.bc.__file__

    @contextmanager
    def active(self) -> Iterator[None]:
        mine = getattr(self, "modules", {})
        saved = {m: sys.modules.pop(m) for m in [m for m in sys.modules if _ours(m)]}
        sys.modules.update(mine)
        sys.path.insert(0, str(self.src))
        try:
            yield
        finally:
            sys.path.remove(str(self.src))
            self.modules = {m: sys.modules.pop(m) for m in [m for m in sys.modules if _ours(m)]}
            sys.modules.update(saved)

    def measure(self, *args: Any, **kwargs: Any) -> Any:
        with self.active():
            return self.bc.measure(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="src folder of the older version")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="compare the two versions' values")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", **{k: str(v) for k, v in vars(args).items()},
          "machine": machine()}, sink)
    versions = {"base": Version(args.base), "new": Version(NEW_SRC)}
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (args.prompts, 12),
                        generator=torch.Generator().manual_seed(1))
    kw: dict[str, Any] = dict(coupling=("depth",), k=(10, 30, 50), final_norm=True,
                              progress=False, batch_size=1)
    results: dict[str, Any] = {}
    for bc in versions.values():  # warm-up: imports, attention set-up
        bc.measure(model, None, {"input_ids": ids[:1]}, **kw)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in versions}
    for r in range(args.repeats):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for v in order:
            t0, c0 = time.perf_counter(), time.process_time()
            results[v] = versions[v].measure(model, None, {"input_ids": ids}, **kw)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            times[v].append((wall / args.prompts, cpu / args.prompts))
            emit({"record": "call", "version": v, "repeat": r,
                  "wall_per_prompt": round(wall / args.prompts, 3),
                  "cpu_per_prompt": round(cpu / args.prompts, 3),
                  "methods": results[v].diagnostics["method"].value_counts().to_dict(),
                  "loadavg_1m": round(os.getloadavg()[0], 2)}, sink)
    med = {v: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
           for v, t in times.items()}
    summary: dict[str, Any] = {
        "record": "summary", "prompts": args.prompts, "repeats": args.repeats,
        "median_wall_per_prompt": {v: round(m[0], 3) for v, m in med.items()},
        "median_cpu_per_prompt": {v: round(m[1], 3) for v, m in med.items()},
        "ratio_base_over_new_wall": round(med["base"][0] / med["new"][0], 3),
        "ratio_base_over_new_cpu": round(med["base"][1] / med["new"][1], 3),
        "ratio_cpu_each_repeat": [round(b[1] / n[1], 3) for b, n in
                                  zip(times["base"], times["new"], strict=True)],
        "loadavg_1m": round(os.getloadavg()[0], 2)}
    if args.check:
        cols = ["prompt_id", "kind", "layer_a", "layer_b", "token_out_a", "token_out_b", "variant", "p",
                "k", "orientation"]
        a, b = (results[v].coupling for v in ("base", "new"))
        keys = [c for c in cols if c in a.columns]
        m = a.merge(b, on=keys, suffixes=("_base", "_new"))
        assert len(m) == len(a), (len(m), len(a), len(b))  # every base row is still there
        summary["max_abs_diff_values"] = float((m["value_base"] - m["value_new"]).abs().max())
        summary["rows_compared"] = len(m)
        # a variant added since (e.g. coupling_vs_rotated) is new rows, not a difference
        summary["new_only_variants"] = sorted(set(b["variant"]) - set(a["variant"]))
    emit(summary, sink)
    save(sink, "bench_ab")


if __name__ == "__main__":
    main()
