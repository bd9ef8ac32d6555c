"""Table building: the engine's numbers -> the long tables of `results` (DEFINITIONS.md).

Pure functions of what the orchestration (``measure.py``) computed: the coupling rows from the
coupling matrices and the measured Jacobians' singular values (every variant, p and K through
`metrics.all_coupling_values`), the K x K matrices kept for the figures, and the
trajectory / token-metric tables of a captured batch. No model access, no Jacobians.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from blockcoupling.engine import metrics, pairs, trajectory, variants
from blockcoupling.engine.capture import Capture
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.inputs import MeasureInput
from blockcoupling.engine.results import Measurement, conform

Key = pairs.Key
#: (kind, measured Jacobian key, basis Jacobian key, orientation) -> A (K_max, K_max)
CouplingStore = Mapping[tuple[str, Key, Key, str], Tensor]


# ---------------------------------------------------------------------------- coupling
def coupling_rows(prompt_id: str, A_store: CouplingStore, measured: Mapping[Key, Any],
                  cfg: MeasureConfig, d: int,
                  overlaps: Mapping[Key, Tensor] | None = None) -> pd.DataFrame:
    """The ``coupling`` rows of one prompt: every (pair, orientation) x (variant, p, k).

    ``measured[key].top`` holds the measured Jacobian's singular values ``S`` (K_max,), and
    what the requested variants need besides (``engine/variants.py``, ``Variant.needs``):
    ``fro2`` = ||J||_F^2, ``trace`` = tr(J), ``trace2`` = tr(J^2). ``overlaps[key]`` is a
    basis's ``U^T V`` (K, K) with K >= K_max; by default it is computed from
    ``measured[key].top`` (every basis is a measured Jacobian), once per basis."""
    if not A_store:
        return conform("coupling", [])
    keys = list(A_store)
    A = torch.stack([A_store[k] for k in keys])  # (P, Kmax, Kmax)
    s1 = torch.stack([measured[k[1]].top.S for k in keys])  # (P, Kmax)
    needs = {n for v in cfg.variants for n in variants.get(v).needs}

    def per_measured(name: str) -> Tensor | None:  # (P,) or None where not computed
        if name not in needs:
            return None
        vals = [getattr(measured[key[1]].top, name) for key in keys]
        if any(v is None for v in vals):
            return None  # the variant's check names what is missing
        return torch.stack([torch.as_tensor(v, dtype=A.dtype, device=A.device) for v in vals])

    overlap = None
    if "overlap" in needs:
        kmax = A.shape[-1]
        cache: dict[Key, Tensor] = {}
        for key in keys:
            b = key[2]
            if b not in cache:
                M = (overlaps[b] if overlaps is not None else
                     measured[b].top.U.mT @ measured[b].top.V)
                cache[b] = M[:kmax, :kmax].to(device=A.device, dtype=A.dtype)
        overlap = torch.stack([cache[key[2]] for key in keys])  # (P, Kmax, Kmax)
    values = metrics.all_coupling_values(A, s1, cfg.k, variants=cfg.variants, ps=cfg.p,
                                         fro2=per_measured("fro2"), d=d,
                                         trace=per_measured("trace"),
                                         trace2=per_measured("trace2"), overlap=overlap)
    # one frame for the whole prompt: every (variant, p, k) block of P rows in the order of
    # `values`, the pairs in the order of `keys` within each (a frame per block, then a
    # concat, cost 21 pandas frame builds per prompt and left 21 chunks in every string
    # column, which the run's final concat then walked: BENCHMARKS.md, issue 43 item 3)
    combos = list(values)
    P, n = len(keys), len(combos)
    if not n:
        return conform("coupling", [])

    def tiled(col: list[Any]) -> np.ndarray:
        return np.tile(np.asarray(col, dtype=object if isinstance(col[0], str) else None), n)

    return conform("coupling", pd.DataFrame({
        "prompt_id": np.full(P * n, prompt_id, dtype=object),
        "kind": tiled([k[0] for k in keys]),
        "layer_a": tiled([k[1][0] for k in keys]), "layer_b": tiled([k[2][0] for k in keys]),
        "token_in_a": tiled([k[1][1] for k in keys]), "token_out_a": tiled([k[1][2] for k in keys]),
        "token_in_b": tiled([k[2][1] for k in keys]), "token_out_b": tiled([k[2][2] for k in keys]),
        "orientation": tiled([k[3] for k in keys]),
        "k": np.repeat(np.asarray([k for _v, _p, k in combos], dtype=np.int64), P),
        "variant": np.repeat(np.asarray([v for v, _p, _k in combos], dtype=object), P),
        "p": np.repeat(np.asarray([np.nan if p is None else float(p) for _v, p, _k in combos],
                                  dtype=np.float64), P),
        "value": np.concatenate([vals.detach().double().cpu().numpy().reshape(P)
                                 for vals in values.values()]),
    }))


#: token-wise |A| mosaics keep at most this many tokens per axis (the last ones)
FIGURE_TOKENS = 12


def jacobian_rows(prompt_id: str, measured: Mapping[Key, Any],
                  influence: Mapping[int, tuple[Sequence[tuple[int, int]], Mapping[str, Tensor]]],
                  d: int, k: int, *, spectra: bool) -> dict[str, list[dict[str, Any]]]:
    """The ``diagnostics`` rows of one prompt's measured Jacobians (``measured[key]``: its
    ``top`` factors, ``method``, ``residual``, ``seconds``; the isotropy columns of
    `metrics.isotropy_diagnostics`, ``uv_overlap`` at ``k``), their ``spectra`` rows (with
    ``spectra``), and the ``influence`` rows (layer -> (keys, metric -> values))."""
    rows: dict[str, list[dict[str, Any]]] = {"diagnostics": [], "spectra": [], "influence": []}
    for (layer, t_in, t_out), m in measured.items():
        top, where = m.top, dict(prompt_id=prompt_id, layer=layer, token_in=t_in, token_out=t_out)
        iso = ({} if top.trace is None or top.fro2 is None else
               metrics.isotropy_diagnostics(top.trace, top.fro2, top.U, top.V, d, k))
        rows["diagnostics"].append(dict(**where, method=m.method, residual=m.residual,
                                        seconds=m.seconds, **iso))
        if spectra:
            s = top.S.detach().double().cpu().numpy()
            rows["spectra"] += [dict(**where, rank=r + 1, singular_value=float(v))
                                for r, v in enumerate(s)]
    for layer, (keys, values) in influence.items():
        for name, v in values.items():
            for (t_in, t_out), value in zip(keys, v.cpu().numpy(), strict=True):
                rows["influence"].append(dict(prompt_id=prompt_id, layer=layer, token_in=t_in,
                                              token_out=t_out, metric=name, value=float(value)))
    return rows


def _token_key(kind: str, layer: int, fixed: int, t: int) -> Key:
    """The Jacobian at token ``t`` of a token-wise kind's axis (``fixed``: its fixed token)."""
    if kind == "self":
        return (layer, t, t)
    return (layer, fixed, t) if kind == "fixed_input" else (layer, t, fixed)


def token_figure_arrays(prompt_id: str, A_store: CouplingStore, cfg: MeasureConfig,
                        layers: Sequence[int], tokens: Sequence[int]) -> dict[str, np.ndarray]:
    """The token-wise K x K matrices of the paper's fig. 4 and its context-coupling figures,
    per token-wise kind measured, at the middle selected layer l (the pair l = l'):

    * ``A_{kind}/{prompt_id}/{orientation}``: (T, T, Kmax, Kmax), cell (i, j) the matrix of
      the measured Jacobian at token ``tokens[i]`` against the basis at ``tokens[j]``;
    * ``A_{kind}/{prompt_id}/tokens``: (T,) those token positions; ``.../where``: (2,) the
      layer and the fixed token (-1 for ``self``).

    ``self``: J^l_tt against J^l_t't' over the selected tokens; ``fixed_input``: J^l_{s t}
    against J^l_{s t'} at the first selected input token s; ``fixed_output``: J^l_{s t}
    against J^l_{s' t} at the last selected output token t (the token heatmap's defaults).
    At most `FIGURE_TOKENS` tokens per axis, the last ones."""
    out: dict[str, np.ndarray] = {}
    if not layers or not tokens:
        return out
    la = layers[len(layers) // 2]
    for kind in ("self", "fixed_input", "fixed_output"):
        if kind not in cfg.coupling:
            continue
        if kind == "self":
            fixed, axis = -1, sorted(tokens)
        elif kind == "fixed_input":
            fixed = min(tokens)
            axis = sorted({a[2] for (kd, a, _b, _o) in A_store
                           if kd == kind and a[0] == la and a[1] == fixed})
        else:
            fixed = max(tokens)
            axis = sorted({a[1] for (kd, a, _b, _o) in A_store
                           if kd == kind and a[0] == la and a[2] == fixed})
        axis = axis[-FIGURE_TOKENS:]
        if not axis:
            continue
        for orient in cfg.orientations:
            grid = torch.stack([torch.stack([
                A_store[(kind, _token_key(kind, la, fixed, ta), _token_key(kind, la, fixed, tb),
                         orient)] for tb in axis]) for ta in axis])
            out[f"A_{kind}/{prompt_id}/{orient}"] = grid.detach().float().cpu().numpy()
        out[f"A_{kind}/{prompt_id}/tokens"] = np.asarray(axis, dtype=np.int64)
        out[f"A_{kind}/{prompt_id}/where"] = np.asarray([la, fixed], dtype=np.int64)
    return out


def figure_arrays(prompt_id: str, A_store: CouplingStore, cfg: MeasureConfig,
                  layers: Sequence[int], tokens: Sequence[int], *, keep: bool
                  ) -> dict[str, np.ndarray]:
    """``A/{prompt_id}/{orientation}``: the depth-wise K x K matrices (W, W, K, K) over the
    figure window at the last selected token, for the prompts kept for figures; and the
    token-wise ones (`token_figure_arrays`)."""
    if not keep:
        return {}
    extra = token_figure_arrays(prompt_id, A_store, cfg, layers, tokens)
    if "depth" not in cfg.coupling:
        return extra
    lo, hi = cfg.figure_window or pairs.default_figure_window(layers)
    window = [la for la in layers if lo <= la <= hi]
    t = tokens[-1]
    out = {}
    for orient in cfg.orientations:
        grid = torch.stack([
            torch.stack([A_store[("depth", (la, t, t), (lb, t, t), orient)] for lb in window])
            for la in window
        ])  # (W, W, Kmax, Kmax)
        out[f"A/{prompt_id}/{orient}"] = grid.detach().float().cpu().numpy()
    return {**out, **extra}


# ---------------------------------------------------------------------------- trajectories
#: The trajectory tables run on the model's GPU while their batch (L+1, N, d) is at most this
#: fraction of its free memory (their temporaries are a few times that); else on the CPU.
DEVICE_TRAJECTORY_FRACTION: float = 1 / 8


def _trajectory_device(cap: Capture, n_tokens: int) -> list[Tensor] | None:
    """THE rule for where the trajectory tables are computed: the capture's own states
    (`Capture.device_states`) where they lie on one CUDA device with room for the batch
    (`DEVICE_TRAJECTORY_FRACTION`); None: the CPU copy ``cap.boundaries``. On a GPU the
    tables' elementwise work around a millisecond forward cost 20x the forward on the CPU
    (BENCHMARKS.md, issue 34 item 4, item 6)."""
    states = cap.device_states()
    if states is None or states[0].device.type != "cuda":
        return None
    size = cap.n_layers + 1
    nbytes = size * n_tokens * int(states[0].shape[-1]) * cap.boundaries.element_size()
    free, _total = torch.cuda.mem_get_info(states[0].device)
    return states if nbytes <= DEVICE_TRAJECTORY_FRACTION * free else None


def batch_trajectory(cap: Capture) -> Tensor:
    """The real tokens of a captured batch side by side: (L+1, N, d), N = sum of lengths, in
    the boundaries' dtype; on the model's GPU where `_trajectory_device` says so (the same
    values: the boundaries are exact copies of those states), else on the CPU."""
    parts = list(enumerate(cap.lengths))
    states = _trajectory_device(cap, sum(cap.lengths))
    if states is not None:
        return torch.stack([torch.cat([s[b, :n] for b, n in parts]).to(cap.boundaries.dtype)
                            for s in states])
    return torch.cat([cap.boundaries[:, b, :n] for b, n in parts], dim=1)


def trajectory_tables(cap: Capture, prompt_ids: Sequence[str], window: int,
                      hidden_dtype: torch.dtype | None = None,
                      entropy: Tensor | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``trajectory`` and ``token_metrics`` tables of a captured batch (prompts in order,
    each prompt's rows contiguous). ``hidden_dtype``: the precision the model's hidden states
    carry (the model's dtype); the expodistance's "rounding only" guard uses the coarser of
    it and the boundaries' dtype (a float32 model analysed in float64 still only resolves
    float32 rounding).

    Every metric but the PCA is per token, so they are computed once for all the batch's real
    tokens side by side, (L+1, N, d) with N = sum of the prompts' lengths (padding never
    enters), on the device `batch_trajectory` gives (the model's GPU where the batch fits);
    only the per-row results, (L+1, N) and (N,), come to the CPU (eight small copies, no (L+1, N, d) one). The PCA is
    fitted per prompt on its last layer, one batched SVD per prompt length.
    ``entropy`` (L+1, N): the logit lens of the same tokens (engine/lens.py), the
    ``logit_entropy`` column (else NaN)."""
    lengths = cap.lengths
    # in the boundaries' precision: float32, or float64 when the analysis asks for it
    X = batch_trajectory(cap)
    Lp1, N = X.shape[0], X.shape[1]  # X: (L+1, N, d)
    lss, wl = trajectory.line_shape_scores(X, width=window)  # (N,), (L+1, N)
    # norms that only change by rounding have no growth rate: NaN, not a ratio of noise
    eps = torch.finfo(X.dtype).eps
    if hidden_dtype is not None and hidden_dtype.is_floating_point:
        eps = max(eps, torch.finfo(hidden_dtype).eps)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    pca = torch.empty(Lp1, N, 2, dtype=X.dtype, device=X.device)
    for n in sorted(set(lengths)):  # prompts of one length: one batched PCA
        group = [int(a) for a, m in zip(starts, lengths, strict=True) if m == n]
        proj = trajectory.pca_projections(torch.stack([X[:, a:a + n] for a in group]))
        for a, p in zip(group, proj, strict=True):
            pca[:, a:a + n] = p  # (L+1, n, 2)
    per_row = {  # (L+1, N) or (N,): the only tensors copied to the CPU
        "norm": trajectory.norms(X),
        "step_norm": torch.cat([torch.full((1, N), float("nan"), dtype=X.dtype, device=X.device),
                                trajectory.step_norms(X)]),  # NaN at layer 0
        "lss_window": wl, "pca_x": pca[..., 0], "pca_y": pca[..., 1],
        "lss": lss, "expodistance": trajectory.expodistance(X, resolution=8 * eps),
        "equidistance_cv": trajectory.equidistance_cv(X)}
    host = {k: v.cpu().numpy() for k, v in per_row.items()}
    host["logit_entropy"] = (entropy.numpy() if entropy is not None
                             else np.full((Lp1, N), np.nan))  # (L+1, N)
    # one DataFrame per table for the whole batch (pandas construction and typing are the
    # expensive part), then a row slice per prompt
    cols: dict[str, list[np.ndarray]] = {c: [] for c in (
        "token", "layer", "norm", "step_norm", "pca_x", "pca_y", "lss_window", "logit_entropy")}
    for a, n in zip(starts, lengths, strict=True):
        sl = slice(int(a), int(a) + n)
        layer_idx, tok_idx = np.meshgrid(np.arange(Lp1), np.arange(n), indexing="ij")
        cols["token"].append(tok_idx.ravel())
        cols["layer"].append(layer_idx.ravel())
        for name in ("norm", "step_norm", "pca_x", "pca_y", "lss_window", "logit_entropy"):
            cols[name].append(host[name][:, sl].ravel())
    ids = np.asarray(prompt_ids, dtype=object)
    traj = conform("trajectory", pd.DataFrame({
        "prompt_id": np.repeat(ids, [Lp1 * n for n in lengths]),
        **{c: np.concatenate(v) for c, v in cols.items()},
    }))
    tokm = conform("token_metrics", pd.DataFrame({
        "prompt_id": np.repeat(ids, lengths),
        "token": np.concatenate([np.arange(n) for n in lengths]),
        "lss": host["lss"], "expodistance": host["expodistance"],
        "equidistance_cv": host["equidistance_cv"], "linearisation_cosine": np.nan,
    }))
    return traj, tokm


def split_by_prompt(tables: tuple[pd.DataFrame, pd.DataFrame], prompt_ids: Sequence[str],
                     lengths: Sequence[int]) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Row slices of the batch's trajectory tables, one pair per prompt."""
    traj, tokm = tables
    Lp1 = int(traj["layer"].max()) + 1 if len(traj) else 0

    def rows(df: pd.DataFrame, a: int, b: int) -> pd.DataFrame:
        part = df.iloc[a:b]  # shares the data (copy-on-write); reset_index would copy it
        part.index = pd.RangeIndex(b - a)
        return part

    out: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    t0 = k0 = 0
    for pid, n in zip(prompt_ids, lengths, strict=True):
        out[pid] = (rows(traj, t0, t0 + Lp1 * n), rows(tokm, k0, k0 + n))
        t0, k0 = t0 + Lp1 * n, k0 + n
    return out


def trajectory_part(cap: Capture, items: Sequence[MeasureInput], cfg: MeasureConfig,
                     tables: tuple[pd.DataFrame, pd.DataFrame] | None) -> Measurement:
    prompts_df = conform("prompts", pd.DataFrame({
        "prompt_id": [it.prompt_id for it in items], "text": [it.text for it in items],
        "n_tokens": cap.lengths, "label": [it.label for it in items]}))
    traj, tokm = tables if tables is not None else (conform("trajectory", []),
                                                    conform("token_metrics", []))
    return Measurement(trajectory=traj, token_metrics=tokm, prompts=prompts_df, config=cfg)


__all__ = ["DEVICE_TRAJECTORY_FRACTION", "FIGURE_TOKENS", "batch_trajectory", "coupling_rows", "figure_arrays",
           "token_figure_arrays", "split_by_prompt", "trajectory_part",
           "trajectory_tables"]
