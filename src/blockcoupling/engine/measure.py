"""measure(): capture -> Jacobians -> top-K SVD -> coupling, trajectories, spectra, influence.

The orchestrator. For each batch of prompts it runs one forward pass (``capture``), computes
the trajectory metrics from the captured block boundaries, and then, prompt by prompt and
layer by layer, the Jacobians that the requested coupling kinds need:

* pass 1 (per layer): the residual branch f^l of that block in the analysis dtype, its
  Jacobians (dense blocks, or matrix-free operators), their top-K_max SVDs, the spectra and
  the influence metrics;
* pass 2 (per measured layer): every measured Jacobian J_a applied to the stacked bases of
  all the Jacobians it is compared with (one GEMM, or one batched JVP, per measured
  Jacobian), giving the K x K coupling matrices of both orientations at once; every variant
  and every K <= K_max then comes from those matrices (the top-K subspaces are nested).

Every prompt yields one :class:`Measurement` part (``iter_measure``), which is what the run
store writes atomically; ``measure`` concatenates them.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from blockcoupling.engine import fastpath, metrics, pairs, spectra, svd, trajectory
from blockcoupling.engine import jacobian as jac
from blockcoupling.engine.blocks import BlockSpec, find_blocks
from blockcoupling.engine.capture import Capture, capture, residual_branch
from blockcoupling.engine.config import MeasureConfig, parse_config
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.errors import BlockCouplingError, NumericalError
from blockcoupling.prompts.sources import Prompt

Key = pairs.Key


# ---------------------------------------------------------------------------- prompts in
def normalise_prompts(prompts: Any) -> list[Prompt]:
    """Strings, :class:`blockcoupling.prompts.sources.Prompt` objects, or (id, text) pairs."""
    if isinstance(prompts, str):
        prompts = [prompts]
    items: list[Prompt] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            items.append(Prompt(f"p{i:05d}", p, ""))
        elif isinstance(p, tuple) and len(p) == 2:
            items.append(Prompt(str(p[0]), str(p[1]), ""))
        elif hasattr(p, "text") and hasattr(p, "prompt_id"):
            items.append(Prompt(str(p.prompt_id), str(p.text), str(getattr(p, "label", ""))))
        else:
            raise BlockCouplingError(
                f"prompt {i} has type {type(p).__name__}; pass strings, Prompt objects or "
                "(prompt_id, text) pairs (for images pass a dict of model inputs)"
            )
    if not items:
        raise BlockCouplingError("no prompts were given")
    ids = [it.prompt_id for it in items]
    if len(set(ids)) != len(ids):
        raise BlockCouplingError("prompt ids must be unique; two prompts share an id")
    for it in items:
        if not it.text.strip():
            raise BlockCouplingError(f"prompt {it.prompt_id!r} is empty; remove it or give it text")
    return items


def _context_length(model: torch.nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def tokenize(tokenizer: Any, items: Sequence[Prompt], model: torch.nn.Module,
             device: torch.device) -> dict[str, Tensor]:
    """Right-padded batch (so real positions are 0..n_b-1 and position ids are natural)."""
    if tokenizer is None:
        raise BlockCouplingError("text prompts need a tokenizer; pass the model's tokenizer")
    old_side = getattr(tokenizer, "padding_side", None)
    added_pad = False
    if getattr(tokenizer, "pad_token", "x") is None:
        eos = getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "unk_token", None)
        if eos is None:
            raise BlockCouplingError("the tokenizer has no pad, eos or unk token to pad a batch with")
        tokenizer.pad_token = eos
        added_pad = True
    try:
        if old_side is not None:
            tokenizer.padding_side = "right"
        enc = tokenizer([it.text for it in items], return_tensors="pt", padding=True)
    finally:
        if old_side is not None:
            tokenizer.padding_side = old_side
        if added_pad:
            tokenizer.pad_token = None
    out = {k: v for k, v in dict(enc).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if "attention_mask" not in out:
        out["attention_mask"] = torch.ones_like(out["input_ids"])
    lengths = out["attention_mask"].sum(dim=1).tolist()
    ctx = _context_length(model)
    for it, n in zip(items, lengths, strict=True):
        if n == 0:
            raise BlockCouplingError(f"prompt {it.prompt_id!r} tokenizes to no tokens")
        if ctx is not None and n > ctx:
            raise BlockCouplingError(
                f"prompt {it.prompt_id!r} has {n} tokens, more than the model's context of "
                f"{ctx}; shorten it"
            )
    return {k: v.to(device) for k, v in out.items()}


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------- per-Jacobian state
@dataclass
class _Measured:
    """One Jacobian J^l_{t_in t_out}: its top-K factors and a way to apply it."""

    top: svd.TopK  # U (d, K), S (K,), V (d, K)
    dense: Tensor | None  # (d, d) when computed densely
    method: str
    residual: float
    seconds: float


def _choose_method(cfg: MeasureConfig, d: int) -> str:
    if cfg.method != "auto":
        return cfg.method
    # Dense blocks cost d VJPs per output token and d^2 memory; the matrix-free path costs
    # ~(K + oversample) * (2 * n_iter + 2) products. Choose matrix-free only where it is cheaper.
    per_op = (cfg.k_max + cfg.svd_oversample) * (2 * cfg.svd_iters + 2)
    return "matrix_free" if d >= 2048 and per_op < d else "dense"


@dataclass
class _RunState:
    """What one measure() call learns across prompts."""

    figure_ids: set[str] = field(default_factory=set)  # prompts whose K x K matrices are kept
    fast_verified: set[int] = field(default_factory=set)  # layers whose fast path was checked
    fast_failed: set[int] = field(default_factory=set)  # layers where it is unsupported


class _PromptRun:
    """All the Jacobian work for one prompt."""

    def __init__(self, model: torch.nn.Module, cap: Capture, b: int, item: Prompt,
                 cfg: MeasureConfig, spec: BlockSpec, progress: Any, state: _RunState) -> None:
        self.model, self.cap, self.b, self.item, self.cfg, self.spec = model, cap, b, item, cfg, spec
        self.state = state
        self._device = torch.device(cfg.analysis_device) if cfg.analysis_device else (
            _model_device(model))
        self.n = cap.lengths[b]
        self.d = spec.hidden_size
        self.layers = cfg.selected_layers(spec.num_layers)
        self.tokens = pairs.resolve_tokens(cfg.tokens, self.n)
        self.method = _choose_method(cfg, self.d)
        self.progress = progress
        self.pairs: dict[str, list[pairs.Pair]] = {
            kind: pairs.kind_pairs(kind, tokens=self.tokens, layers=self.layers, n=self.n,
                                   causal=spec.causal, pairs_mode=cfg.layer_pairs)
            for kind in cfg.coupling
        }
        self.keys = pairs.needed_keys([p for ps in self.pairs.values() for p in ps])
        if cfg.spectra:  # spectra of J^l_tt at every selected layer and token, at least
            for la in self.layers:
                self.keys.setdefault(la, [])
                for t in self.tokens:
                    if (t, t) not in self.keys[la]:
                        self.keys[la].append((t, t))
                self.keys[la].sort()
        self.measured: dict[Key, _Measured] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {"spectra": [], "influence": [], "diagnostics": []}

    # -- pass 1 ------------------------------------------------------------------------
    def _branch(self, layer: int) -> tuple[Callable[[Tensor], Tensor], Tensor]:
        return residual_branch(self.model, self.cap, layer, self.b, dtype=self.cfg.dtype,
                               device=self.cfg.analysis_device)

    def _fast(self, layer: int, keys: Sequence[tuple[int, int]]) -> dict[int, Any]:
        """Decode-step operators (fastpath.TokenBranch) for the diagonal keys J^l_tt of a causal
        model; {} where the fast path is off, unsupported, or failed its check. The check
        against the generic path runs on the first prompt that reaches each layer."""
        diag = [t_in for t_in, t_out in keys if t_in == t_out]
        if not (self.cfg.fast_path and self.spec.causal and diag) or layer in self.state.fast_failed:
            return {}
        verify = layer not in self.state.fast_verified
        tbs = fastpath.token_branches(self.model, self.cap, layer, self.b, diag,
                                      dtype=self.cfg.dtype, verify=verify, seed=self.cfg.seed,
                                      chunk_size=self.cfg.chunk_size,
                                      device=self.cfg.analysis_device)
        if tbs is None:
            self.state.fast_failed.add(layer)
            return {}
        self.state.fast_verified.add(layer)
        return tbs

    def pass1(self) -> None:
        from tqdm.auto import tqdm

        want_influence = self.cfg.influence
        layers = sorted(set(self.keys) | (set(self.layers) if want_influence else set()))
        for layer in tqdm(layers, desc=f"{self.item.prompt_id} Jacobians", unit="layer",
                          leave=False, disable=self.progress is None or self.progress.disable):
            keys = self.keys.get(layer, [])
            infl = pairs.influence_keys([layer], n=self.n)[layer] if want_influence else []
            fast = self._fast(layer, keys)
            generic = [k for k in keys if k[0] != k[1] or k[0] not in fast]
            # the generic residual branch only where something needs it (the fast path
            # replays the block against its recorded output on its own)
            f, x = self._branch(layer) if (generic or infl) else (None, None)
            dense_keys = sorted(set(generic if self.method == "dense" else []) | set(infl))
            with self._where(layer, dense_keys):
                blocks = self._dense_blocks(f, x, dense_keys)
            for t_in, t_out in keys:
                tb = fast.get(t_in) if t_in == t_out else None
                with self._where(layer, [(t_in, t_out)]):
                    m = self._measure_key(t_in, t_out, tb, f, x, blocks)
                self.measured[(layer, t_in, t_out)] = m
                self.rows["diagnostics"].append(dict(
                    prompt_id=self.item.prompt_id, layer=layer, token_in=t_in, token_out=t_out,
                    method=m.method, residual=m.residual, seconds=m.seconds))
                if self.cfg.spectra:
                    s = m.top.S.detach().double().cpu().numpy()
                    self.rows["spectra"] += [
                        dict(prompt_id=self.item.prompt_id, layer=layer, token_in=t_in,
                             token_out=t_out, rank=r + 1, singular_value=float(v))
                        for r, v in enumerate(s)
                    ]
            if infl:
                self._influence(layer, blocks, infl)

    @contextmanager
    def _where(self, layer: int, keys: Sequence[tuple[int, int]]) -> Iterator[None]:
        """A NaN or inf raised inside says which prompt, layer and token pair it came from."""
        try:
            yield
        except NumericalError as err:
            pairs_ = ", ".join(f"{a} -> {b}" for a, b in keys[:4]) + (" ..." if len(keys) > 4 else "")
            raise NumericalError(
                f"prompt {self.item.prompt_id!r}, layer {layer}, token {pairs_}: {err}") from err

    def _measure_key(self, t_in: int, t_out: int, tb: Any, f: Any, x: Any,
                     blocks: dict[tuple[int, int], Tensor]) -> _Measured:
        """Top-K factors of J_{t_in t_out}: dense (from ``blocks`` or the fast path ``tb``)
        or matrix-free; ``auto`` falls back to dense where the SVD residual is above tol."""
        t0 = time.perf_counter()
        kmax = self.cfg.k_max
        tag = "_fast" if tb is not None else ""
        if self.method == "dense":
            J = tb.jacobian() if tb is not None else blocks[(t_in, t_out)]
            m = _Measured(svd.topk_svd(J, kmax), J, "dense" + tag, 0.0, 0.0)
        else:
            op = tb if tb is not None else jac.jacobian_operator(f, x, t_in, t_out)
            top = svd.randomized_topk_svd(
                op, kmax, oversample=self.cfg.svd_oversample, n_iter=self.cfg.svd_iters,
                tol=self.cfg.svd_tol, seed=self.cfg.seed,
            )
            res = float(top.residual.max()) if top.residual is not None else 0.0
            m = _Measured(top, None, "matrix_free" + tag, res, 0.0)
            if self.cfg.method == "auto" and self.cfg.svd_tol is not None and res > self.cfg.svd_tol:
                J = tb.jacobian() if tb is not None else jac.jacobian_blocks(
                    f, x, [t_out], in_tokens=[t_in], chunk_size=self.cfg.chunk_size)[0, 0]
                m = _Measured(svd.topk_svd(J, kmax), J, "dense_fallback" + tag, res, 0.0)
        m.seconds = time.perf_counter() - t0
        return m

    def _dense_blocks(self, f: Callable[[Tensor], Tensor] | None, x: Tensor | None,
                      keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Tensor]:
        """Dense J_{t_in t_out} for ``keys``: one VJP batch per output token yields every
        input token at once, one JVP batch per input token every output token; whichever
        needs fewer batches (e.g. JVPs for ``fixed_input`` at one input token)."""
        out: dict[tuple[int, int], Tensor] = {}
        by_out: dict[int, list[int]] = {}
        by_in: dict[int, list[int]] = {}
        for t_in, t_out in keys:
            by_out.setdefault(t_out, []).append(t_in)
            by_in.setdefault(t_in, []).append(t_out)
        if len(by_in) < len(by_out):
            for t_in, outs in by_in.items():
                J = jac.jacobian_blocks_jvp(f, x, [t_in], out_tokens=outs,
                                            chunk_size=self.cfg.chunk_size)  # (len(outs), 1, d, d)
                for i, t_out in enumerate(outs):
                    out[(t_in, t_out)] = J[i, 0].detach()
            return out
        for t_out, ins in by_out.items():
            J = jac.jacobian_blocks(f, x, [t_out], in_tokens=ins, chunk_size=self.cfg.chunk_size)
            for j, t_in in enumerate(ins):
                out[(t_in, t_out)] = J[0, j].detach()
        return out

    def _influence(self, layer: int, blocks: dict[tuple[int, int], Tensor],
                   keys: Sequence[tuple[int, int]]) -> None:
        Js = torch.stack([blocks[k] for k in keys])  # (n, d, d)
        s = torch.linalg.svdvals(Js.double())  # (n, d)
        vals = spectra.influence_metrics(s)
        for name, v in vals.items():
            for (t_in, t_out), value in zip(keys, v.cpu().numpy(), strict=True):
                self.rows["influence"].append(dict(
                    prompt_id=self.item.prompt_id, layer=layer, token_in=t_in, token_out=t_out,
                    metric=name, value=float(value)))

    # -- pass 2 ------------------------------------------------------------------------
    def pass2(self) -> tuple[list[pd.DataFrame], dict[str, np.ndarray], dict[int, float]]:
        """Coupling matrices for every pair of every kind, and the linearisation cosines."""
        cfg = self.cfg
        frames: list[pd.DataFrame] = []
        arrays: dict[str, np.ndarray] = {}
        lin_vec: dict[int, Tensor] = {}
        want_lin = "depth" in cfg.coupling and tuple(self.layers) == tuple(
            range(1, self.spec.num_layers + 1))
        if want_lin:
            x0 = self.cap.boundaries[0, self.b].to(self._device, self.cfg.dtype)
            lin_vec = {t: x0[t].clone() for t in self.tokens}
        # group pairs by measured Jacobian so each is applied once to all its bases
        by_a: dict[Key, list[tuple[str, Key]]] = {}
        for kind, ps in self.pairs.items():
            for a, b in ps:
                by_a.setdefault(a, []).append((kind, b))
        A_store: dict[tuple[str, Key, Key, str], Tensor] = {}
        measured_layers = sorted({a[0] for a in by_a})
        for layer in measured_layers:
            f = x = None
            fast: dict[int, Any] = {}
            operator_keys = [a for a in by_a if a[0] == layer and self.measured[a].dense is None]
            if operator_keys:  # matrix-free: rebuild the operators of this layer
                fast = self._fast(layer, [(a[1], a[2]) for a in operator_keys])
                if any(a[1] != a[2] or a[1] not in fast for a in operator_keys):
                    f, x = self._branch(layer)  # the generic branch only where it is needed
            for a in [a for a in by_a if a[0] == layer]:
                apply = self._applier(a, f, x, fast)
                bases = by_a[a]
                Ub = torch.stack([self.measured[b].top.U for _, b in bases])  # (P, d, K)
                Vb = torch.stack([self.measured[b].top.V for _, b in bases])  # (P, d, K)
                P, d, K = Ub.shape
                for orient in cfg.orientations:
                    right, left = (Vb, Ub) if orient == "ujv" else (Ub, Vb)
                    JX = apply(right.permute(1, 0, 2).reshape(d, P * K))  # (d, P*K)
                    JX = JX.reshape(d, P, K).permute(1, 0, 2)  # (P, d, K)
                    A = left.transpose(-1, -2) @ JX  # (P, K, K)
                    for (kind, b), Ab in zip(bases, A, strict=True):
                        A_store[(kind, a, b, orient)] = Ab
            if want_lin:
                for t in self.tokens:
                    key = (layer, t, t)
                    if key in self.measured:
                        apply = self._applier(key, f, x, fast)
                        v = lin_vec[t]
                        lin_vec[t] = v + apply(v[:, None])[:, 0]
        frames.append(self._coupling_rows(A_store))
        arrays.update(self._figure_arrays(A_store))
        lin: dict[int, float] = {}
        if want_lin:
            xL = self.cap.boundaries[-1, self.b].to(self._device, self.cfg.dtype)
            for t, v in lin_vec.items():
                lin[t] = float(torch.nn.functional.cosine_similarity(v.detach(), xL[t], dim=0))
        return frames, arrays, lin

    def _applier(self, key: Key, f: Any, x: Any, fast: dict[int, Any]) -> Callable[[Tensor], Tensor]:
        m = self.measured[key]
        if m.dense is not None:
            J = m.dense
            return lambda X: J @ X
        if key[1] == key[2] and key[1] in fast:
            return fast[key[1]].matmat
        return jac.jacobian_operator(f, x, key[1], key[2]).matmat

    def _coupling_rows(self, A_store: dict[tuple[str, Key, Key, str], Tensor]) -> pd.DataFrame:
        if not A_store:
            return conform("coupling", [])
        cfg = self.cfg
        keys = list(A_store)
        A = torch.stack([A_store[k] for k in keys])  # (P, Kmax, Kmax)
        s1 = torch.stack([self.measured[k[1]].top.S for k in keys])  # (P, Kmax)
        fro2 = torch.stack([torch.as_tensor(self.measured[k[1]].top.fro2, dtype=A.dtype,
                                            device=A.device) for k in keys])  # (P,)
        base = pd.DataFrame({
            "prompt_id": self.item.prompt_id,
            "kind": [k[0] for k in keys],
            "layer_a": [k[1][0] for k in keys], "layer_b": [k[2][0] for k in keys],
            "token_in_a": [k[1][1] for k in keys], "token_out_a": [k[1][2] for k in keys],
            "token_in_b": [k[2][1] for k in keys], "token_out_b": [k[2][2] for k in keys],
            "orientation": [k[3] for k in keys],
        })
        values = metrics.all_coupling_values(A, s1, cfg.k, variants=cfg.variants, ps=cfg.p,
                                             fro2=fro2, d=self.d)
        parts = []
        for (variant, p, k), vals in values.items():
            df = base.copy()
            df["k"] = k
            df["variant"] = variant
            df["p"] = np.nan if p is None else float(p)
            df["value"] = vals.detach().double().cpu().numpy()
            parts.append(df)
        return conform("coupling", pd.concat(parts, ignore_index=True))

    def _figure_arrays(self, A_store: dict[tuple[str, Key, Key, str], Tensor]) -> dict[str, np.ndarray]:
        cfg = self.cfg
        if "depth" not in cfg.coupling or self.item.prompt_id not in self.state.figure_ids:
            return {}
        lo, hi = cfg.figure_window or pairs.default_figure_window(self.layers)
        window = [la for la in self.layers if lo <= la <= hi]
        t = self.tokens[-1]
        out = {}
        for orient in cfg.orientations:
            grid = torch.stack([
                torch.stack([A_store[("depth", (la, t, t), (lb, t, t), orient)] for lb in window])
                for la in window
            ])  # (W, W, Kmax, Kmax)
            out[f"A/{self.item.prompt_id}/{orient}"] = grid.detach().float().cpu().numpy()
        return out


# ---------------------------------------------------------------------------- trajectories
def _trajectory_tables(cap: Capture, prompt_ids: Sequence[str], window: int
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``trajectory`` and ``token_metrics`` tables of a captured batch (prompts in order,
    each prompt's rows contiguous).

    Every metric but the PCA is per token, so they are computed once for all the batch's real
    tokens side by side, (L+1, N, d) with N = sum of the prompts' lengths (padding never
    enters); the PCA is fitted per prompt on its last layer."""
    lengths = cap.lengths
    # in the boundaries' precision: float32, or float64 when the analysis asks for it
    X = torch.cat([cap.boundaries[:, b, :n] for b, n in enumerate(lengths)], dim=1)
    Lp1, N = X.shape[0], X.shape[1]  # X: (L+1, N, d)
    norms = trajectory.norms(X).numpy()  # (L+1, N)
    steps = torch.cat([torch.full((1, N), float("nan"), dtype=X.dtype),
                       trajectory.step_norms(X)]).numpy()  # (L+1, N), NaN at layer 0
    lss_t, wl_t = trajectory.line_shape_scores(X, width=window)
    lss, wl = lss_t.numpy(), wl_t.numpy()  # (N,), (L+1, N)
    # norms that only change by rounding have no growth rate: NaN, not a ratio of noise
    ed = trajectory.expodistance(X, resolution=8 * torch.finfo(X.dtype).eps).numpy()
    cv = trajectory.equidistance_cv(X).numpy()
    # one DataFrame per table for the whole batch (pandas construction and typing are the
    # expensive part), then a row slice per prompt
    cols: dict[str, list[np.ndarray]] = {c: [] for c in (
        "token", "layer", "norm", "step_norm", "pca_x", "pca_y", "lss_window")}
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        pca = trajectory.pca_projection(X[:, sl]).numpy()  # (L+1, n, 2)
        layer_idx, tok_idx = np.meshgrid(np.arange(Lp1), np.arange(n), indexing="ij")
        for name, arr in (("token", tok_idx), ("layer", layer_idx), ("norm", norms[:, sl]),
                          ("step_norm", steps[:, sl]), ("pca_x", pca[..., 0]),
                          ("pca_y", pca[..., 1]), ("lss_window", wl[:, sl])):
            cols[name].append(arr.ravel())
        start += n
    ids = np.asarray(prompt_ids, dtype=object)
    traj = conform("trajectory", pd.DataFrame({
        "prompt_id": np.repeat(ids, [Lp1 * n for n in lengths]),
        **{c: np.concatenate(v) for c, v in cols.items()},
    }))
    tokm = conform("token_metrics", pd.DataFrame({
        "prompt_id": np.repeat(ids, lengths),
        "token": np.concatenate([np.arange(n) for n in lengths]),
        "lss": lss, "expodistance": ed, "equidistance_cv": cv, "linearisation_cosine": np.nan,
    }))
    return traj, tokm


def _split_by_prompt(tables: tuple[pd.DataFrame, pd.DataFrame], prompt_ids: Sequence[str],
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


# ---------------------------------------------------------------------------- public API
def iter_measure(model: torch.nn.Module, tokenizer: Any, prompts: Any, config: MeasureConfig,
                 *, skip: frozenset[str] | set[str] = frozenset(), progress: bool = True,
                 ) -> Iterator[Measurement]:
    """Yield one :class:`Measurement` part per prompt (for incremental, resumable stores)."""
    from tqdm.auto import tqdm

    cfg = config
    if model.training:
        warnings.warn("the model was in training mode; blockcoupling measures it in eval mode "
                      "(dropout off) and leaves it in eval mode", stacklevel=2)
        model.eval()
    spec = find_blocks(model, cfg.blocks_path)
    if spec.hidden_size:  # a custom model's hidden size is known only after the capture
        cfg.check_model(spec.num_layers, spec.hidden_size)
    if cfg.analysis_device is not None:
        from blockcoupling.loading import resolve_device

        resolve_device(cfg.analysis_device)  # a clear error for an unavailable device
    device = _model_device(model)
    # The batches are cut from the whole prompt list, skipped prompts included, so that a
    # resumed run measures every prompt in the batch it had in the first run (batch
    # composition changes float32 rounding): a resume is bit-identical. Likewise the prompts
    # that keep their K x K matrices are the first ones of the list, not of this process.
    batches: list[tuple[list[Prompt], dict[str, Tensor] | None]]
    if isinstance(prompts, Mapping):  # pre-built model inputs, e.g. {"pixel_values": ...}
        batches = list(_input_batches(prompts, cfg.batch_size))
    else:
        items = normalise_prompts(prompts)
        batches = [
            (items[i:i + cfg.batch_size], None) for i in range(0, len(items), cfg.batch_size)
        ]
    everything = [it for batch_items, _ in batches for it in batch_items]
    state = _RunState(figure_ids={it.prompt_id for it in everything[:cfg.figure_prompts]})
    batches = [b for b in batches if any(it.prompt_id not in skip for it in b[0])]
    total = sum(it.prompt_id not in skip for b in batches for it in b[0])
    bar = tqdm(total=total, desc="prompts", unit="prompt", disable=not progress, dynamic_ncols=True)
    try:
        for batch_items, raw_inputs in batches:
            inputs = raw_inputs if raw_inputs is not None else tokenize(tokenizer, batch_items, model, device)
            if raw_inputs is not None:
                inputs = {k: v.to(device) for k, v in inputs.items()}
            # boundaries keep the precision of the analysis (float64 when asked for)
            cap = capture(model, inputs, spec, final_norm=cfg.final_norm,
                          boundary_dtype=torch.promote_types(cfg.dtype, torch.float32))
            cfg.check_model(cap.spec.num_layers, cap.spec.hidden_size)
            ids = [it.prompt_id for it in batch_items]
            tables = _trajectory_tables(cap, ids, cfg.lss_window) if cfg.trajectory else None
            if not (cfg.coupling or cfg.spectra or cfg.influence):
                # no Jacobian work: the whole batch is one part (one table build, one write)
                part = _trajectory_part(cap, batch_items, cfg, tables)
                if any(i in skip for i in ids):  # a batch partly stored by another run
                    part = _without_prompts(part, skip)
                yield part
                bar.update(sum(i not in skip for i in ids))
                continue
            trajectories = _split_by_prompt(tables, ids, cap.lengths) if tables else {}
            for b, item in enumerate(batch_items):
                if item.prompt_id in skip:
                    continue
                yield _measure_one(model, cap, b, item, cfg, cap.spec, state, bar, trajectories)
                bar.update(1)
    finally:
        bar.close()


def _input_batches(inputs: Mapping[str, Tensor], batch_size: int
                   ) -> list[tuple[list[Prompt], dict[str, Tensor]]]:
    B = next(iter(inputs.values())).shape[0]
    out = []
    for i in range(0, B, batch_size):
        sl = {k: v[i:i + batch_size] for k, v in inputs.items()}
        items = [Prompt(f"input-{j:05d}", f"<input {j}>", "") for j in range(i, min(B, i + batch_size))]
        out.append((items, sl))
    return out


def _trajectory_part(cap: Capture, items: Sequence[Prompt], cfg: MeasureConfig,
                     tables: tuple[pd.DataFrame, pd.DataFrame] | None) -> Measurement:
    prompts_df = conform("prompts", pd.DataFrame({
        "prompt_id": [it.prompt_id for it in items], "text": [it.text for it in items],
        "n_tokens": cap.lengths, "label": [it.label for it in items]}))
    traj, tokm = tables if tables is not None else (conform("trajectory", []),
                                                    conform("token_metrics", []))
    return Measurement(trajectory=traj, token_metrics=tokm, prompts=prompts_df, config=cfg)


def _without_prompts(part: Measurement, skip: frozenset[str] | set[str]) -> Measurement:
    """``part`` without the rows of the prompts in ``skip`` (a trajectory-only part)."""
    def keep(df: pd.DataFrame) -> pd.DataFrame:
        return df[~df["prompt_id"].isin(list(skip))].reset_index(drop=True)

    return Measurement(trajectory=keep(part.trajectory), token_metrics=keep(part.token_metrics),
                       prompts=keep(part.prompts), config=part.config)


def _measure_one(model: torch.nn.Module, cap: Capture, b: int, item: Prompt,
                 cfg: MeasureConfig, spec: BlockSpec, state: _RunState, bar: Any,
                 trajectories: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> Measurement:
    t0 = time.perf_counter()
    n = cap.lengths[b]
    traj, tokm = trajectories.get(item.prompt_id, (None, None))
    run = _PromptRun(model, cap, b, item, cfg, spec, bar, state)
    frames: list[pd.DataFrame] = []
    arrays: dict[str, np.ndarray] = {}
    if run.keys or cfg.influence:
        run.pass1()
        if cfg.coupling:
            frames, arrays, lin = run.pass2()
            if tokm is not None and lin:
                tokm.loc[tokm["token"].isin(list(lin)), "linearisation_cosine"] = (
                    tokm.loc[tokm["token"].isin(list(lin)), "token"].map(lin).astype(float))
    prompts_df = conform("prompts", [dict(prompt_id=item.prompt_id, text=item.text, n_tokens=n,
                                          label=item.label)])
    part = Measurement(
        coupling=pd.concat(frames, ignore_index=True) if frames else conform("coupling", []),
        trajectory=traj if traj is not None else conform("trajectory", []),
        token_metrics=tokm if tokm is not None else conform("token_metrics", []),
        spectra=conform("spectra", run.rows["spectra"]),
        influence=conform("influence", run.rows["influence"]),
        prompts=prompts_df,
        diagnostics=conform("diagnostics", run.rows["diagnostics"]),
        arrays=arrays,
        config=cfg,
        meta={"seconds": time.perf_counter() - t0},
    )
    return part


def build_meta(model: torch.nn.Module, cfg: MeasureConfig, **extra: Any) -> dict[str, Any]:
    spec = find_blocks(model, cfg.blocks_path)
    layers = cfg.selected_layers(spec.num_layers)
    lo, hi = cfg.figure_window or pairs.default_figure_window(layers)
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    meta: dict[str, Any] = {
        "model": name,
        "arch": spec.arch,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "causal": spec.causal,
        "blocks_path": spec.blocks_path,
        "figure_window": [lo, hi],
        "device": str(_model_device(model)),
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }
    meta.update(extra)
    return meta


def measure(model: torch.nn.Module, tokenizer: Any = None, prompts: Any = (), *,
            coupling: Sequence[str] | str = ("depth",), k: Sequence[int] | int = (10, 30, 50),
            tokens: str | Sequence[int] = "last", p: float | Sequence[float] = 1,
            dtype: torch.dtype = torch.float32, config: MeasureConfig | None = None,
            progress: bool = True, **options: Any) -> Measurement:
    """Measure block coupling, trajectories, spectra and influence of ``model`` on ``prompts``.

    ``prompts`` are strings (tokenized with ``tokenizer``), :class:`Prompt` objects, or a dict
    of ready model inputs (e.g. ``{"pixel_values": images}`` for a ViT). Every other keyword is
    a :class:`MeasureConfig` field (``layers="9..16"``, ``variants=...``, ``final_norm=True``,
    ``method="matrix_free"``, ``influence=True``, ...). ``dtype`` is the precision of the
    analysis, not of the model: each analysed block is copied to it.
    """
    if config is None:
        cfg = parse_config(None, coupling=coupling, k=k, tokens=tokens, p=p, dtype=dtype,
                           **options)
    else:  # an explicit config wins over the keyword defaults; extra options still apply
        cfg = config.replace(**options) if options else config
    t0 = time.perf_counter()
    parts = list(iter_measure(model, tokenizer, prompts, cfg, progress=progress))
    meta = build_meta(model, cfg, seconds=time.perf_counter() - t0)
    return Measurement.concat(parts, config=cfg, meta=meta)


__all__ = ["measure", "iter_measure", "normalise_prompts", "build_meta"]
