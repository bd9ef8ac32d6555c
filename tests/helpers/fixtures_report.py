"""Synthetic Measurements with realistic tables for the figure and report tests.

No model is run: the tables are filled with seeded random values shaped like the real ones
(L = 6 layers, n = 5 tokens, K in (2, 4), three prompts), so the figures can be checked
against the stored numbers exactly.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.results import Measurement, conform

L = 6
N_TOKENS = 5
KS = (2, 4)
PROMPTS = ("p0", "p1", "p2")
WINDOW = (2, 5)  # figure_window, 1-based inclusive
VARIANTS = ("coupling", "miscoupling", "released_norm", "coupling_vs_null")
ORIENTATIONS = ("ujv", "vju")


def _p_of(variant: str) -> float:
    return 2.0 if variant == "released_norm" else 1.0


def _coupling_rows(rng: np.random.Generator, strength: float, kinds: tuple[str, ...],  # noqa: C901 - a fixture that writes every variant's rows
                   chance: float) -> list[dict]:
    rows: list[dict] = []
    last = N_TOKENS - 1

    def add(pid: str, kind: str, la: int, lb: int, tia: int, toa: int, tib: int, tob: int,
            base: float) -> None:
        for k, orient in itertools.product(KS, ORIENTATIONS):
            # one coupling value per Jacobian pair; every variant follows from it
            c = float(np.clip(base + 0.05 * rng.standard_normal() - 0.03 * k, -0.5, 1.0))
            for variant in VARIANTS:
                if variant == "coupling_vs_null":  # every pair's chance level = chance
                    value = (c - chance) / (1.0 - chance)
                elif variant == "coupling":
                    value = c
                else:
                    value = 1.0 - c + (0.1 if variant == "released_norm" else 0.0)
                rows.append(dict(prompt_id=pid, kind=kind, layer_a=la, layer_b=lb,
                                 token_in_a=tia, token_out_a=toa, token_in_b=tib,
                                 token_out_b=tob, k=k, variant=variant, p=_p_of(variant),
                                 orientation=orient, value=value))

    for pid in PROMPTS:
        if "depth" in kinds:
            for la, lb in itertools.product(range(1, L + 1), repeat=2):
                base = 1.0 if la == lb else strength * (1.0 - 0.12 * abs(la - lb))
                add(pid, "depth", la, lb, last, last, last, last, base)
        if "self" in kinds:
            for la, lb in ((3, 3), (4, 4), (2, 5)):
                for t, u in itertools.product(range(N_TOKENS), repeat=2):
                    base = 1.0 if (t == u and la == lb) else strength * 0.6
                    add(pid, "self", la, lb, t, t, u, u, base)
        if "fixed_input" in kinds:
            for s in range(N_TOKENS):
                for t, u in itertools.product(range(s, N_TOKENS), repeat=2):
                    add(pid, "fixed_input", 3, 3, s, t, s, u, 1.0 if t == u else strength * 0.5)
        if "fixed_output" in kinds:
            for t in range(N_TOKENS):
                for s, r in itertools.product(range(t + 1), repeat=2):
                    add(pid, "fixed_output", 3, 3, s, t, r, t, 1.0 if s == r else strength * 0.5)
    return rows


def _trajectory(rng: np.random.Generator, growth: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    traj, tm = [], []
    for pid in PROMPTS:
        for t in range(N_TOKENS):
            direction = rng.standard_normal(2)
            norms = np.exp(growth * np.arange(L + 1)) * (1 + 0.1 * t)
            for layer in range(L + 1):
                traj.append(dict(
                    prompt_id=pid, token=t, layer=layer, norm=float(norms[layer]),
                    step_norm=float("nan") if layer == 0 else float(norms[layer] - norms[layer - 1]),
                    pca_x=float(direction[0] * layer + 0.1 * rng.standard_normal()),
                    pca_y=float(direction[1] * layer + 0.1 * rng.standard_normal()),
                    lss_window=float("nan") if layer in (0, L) else float(1 + rng.random()),
                ))
            tm.append(dict(prompt_id=pid, token=t, lss=float(1 + rng.random()),
                           expodistance=float(rng.random() * 0.2),
                           equidistance_cv=float(rng.random()), linearisation_cosine=float("nan")))
    return conform("trajectory", traj), conform("token_metrics", tm)


def _spectra(rng: np.random.Generator, a: float, b: float) -> pd.DataFrame:
    rows = []
    last = N_TOKENS - 1
    for pid in PROMPTS:
        for layer in range(1, L + 1):
            top = a / layer + b + 0.05 * rng.standard_normal()
            for rank in range(1, max(KS) + 1):
                rows.append(dict(prompt_id=pid, layer=layer, token_in=last, token_out=last,
                                 rank=rank, singular_value=float(top / rank)))
                # an off-diagonal token pair (influence-style) that sigma_1 plots must ignore
                rows.append(dict(prompt_id=pid, layer=layer, token_in=0, token_out=last,
                                 rank=rank, singular_value=float(100.0 + rank)))
    return conform("spectra", rows)


def make_run(seed: int, *, label: str, strength: float,
             kinds: tuple[str, ...] = ("depth", "self", "fixed_input", "fixed_output"),
             arrays: bool = True, chance: float = 0.3, lss_window: int = 3,
             expodistance_nan: int = 0, expodistance_outlier: float | None = None,
             meta: dict | None = None) -> Measurement:
    """One synthetic run; ``strength`` scales the off-diagonal coupling (trained ~ 0.8),
    ``chance`` is every pair's chance coupling c_null (``coupling_vs_null`` rows follow from
    it), the first ``expodistance_nan`` tokens have no expodistance and token 1 of prompt p1
    gets ``expodistance_outlier``."""
    rng = np.random.default_rng(seed)
    coupling = conform("coupling", _coupling_rows(rng, strength, kinds, chance))
    traj, tm = _trajectory(rng, 0.3 + 0.1 * seed)
    if expodistance_nan:
        tm.loc[: expodistance_nan - 1, "expodistance"] = float("nan")
    if expodistance_outlier is not None:
        tm.loc[(tm["prompt_id"] == "p1") & (tm["token"] == 1), "expodistance"] = \
            expodistance_outlier
    spectra = _spectra(rng, a=3.0 + seed, b=0.5)
    prompts = conform("prompts", [
        dict(prompt_id=pid, text=f"What is the capital of France? ({pid}) The capital is",
             n_tokens=N_TOKENS, label="capital") for pid in PROMPTS])
    W = WINDOW[1] - WINDOW[0] + 1
    arr: dict[str, np.ndarray] = {}
    if arrays:
        for orient in ORIENTATIONS:
            A = rng.standard_normal((W, W, max(KS), max(KS))) * (1 - strength)  # (W, W, K, K)
            for i in range(W):
                A[i, i] += np.diag(np.linspace(3, 1, max(KS)))
            arr[f"A/p0/{orient}"] = A
        for kind in (k for k in kinds if k != "depth"):  # token-wise matrices at one layer
            toks = np.arange(N_TOKENS)
            for orient in ORIENTATIONS:
                A = rng.standard_normal((N_TOKENS, N_TOKENS, max(KS), max(KS))) * (1 - strength)
                for i in range(N_TOKENS):
                    A[i, i] += np.diag(np.linspace(3, 1, max(KS)))
                arr[f"A_{kind}/p0/{orient}"] = A
            arr[f"A_{kind}/p0/tokens"] = toks
            arr[f"A_{kind}/p0/where"] = np.array([WINDOW[0], {"self": -1, "fixed_input": 0}.get(
                kind, N_TOKENS - 1)])
    config = MeasureConfig(coupling=kinds, k=KS, tokens="last", p=(1.0,), variants=VARIANTS,
                           figure_window=WINDOW, lss_window=lss_window)
    meta = {"model": "tiny-gpt2-synthetic", "revision": f"step{seed}", "label": label,
            "prompts_spec": "builtin:capital", "figure_window": list(WINDOW),
            "versions": {"blockcoupling": "0.1.0", "torch": "2.13"}, "seconds": 1.5,
            **(meta or {})}
    return Measurement(coupling=coupling, trajectory=traj, token_metrics=tm, spectra=spectra,
                       prompts=prompts, arrays=arr, config=config, meta=meta)


def make_runs() -> list[Measurement]:
    """A 'trained' run with every kind and a 'random init' run with depth and self only.

    The random init is at the chance level (c_null = 0: coupling_vs_null = c ~ 0.02), has an
    LSS window (11) longer than its 7-point trajectories, two tokens without expodistance
    and one heavy-tailed token (347,420, as a random post-LN model produced)."""
    return [
        make_run(0, label="random init", strength=0.1, kinds=("depth", "self"), chance=0.0,
                 lss_window=11, expodistance_nan=2, expodistance_outlier=347_420.0),
        make_run(1, label="trained", strength=0.8),
    ]


def make_checkpoints(n: int = 8) -> list[Measurement]:
    """``n`` training checkpoints of one model (meta ``step`` and ``val_loss``), coupling
    rising with the step; depth-wise coupling only, no stored matrices."""
    runs = []
    for i in range(n):
        step = 0 if i == 0 else 25 * 2 ** (i - 1)
        runs.append(make_run(10 + i, label=f"tiny LM step {step}", strength=0.1 + 0.1 * i,
                             kinds=("depth",), arrays=False, chance=0.25,
                             meta={"revision": f"step-{step:06d}", "step": step,
                                   "val_loss": 5.0 - 0.4 * i, "model": "tiny-lm-synthetic", "train_loss": 5.1 - 0.45 * i,
                                   "path": "/very/long/path/to/checkpoints/tinylm/"
                                           f"step-{step:06d}/model.safetensors"}))
    return runs
