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

Every prompt yields one [`Measurement`][blockcoupling.engine.results.Measurement] part (``iter_measure``), which is what the run
store writes atomically; ``measure`` concatenates them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from blockcoupling.engine import (
    bases,
    fastpath,
    fastrecord,
    lens,
    metrics,
    normdirs,
    offload,
    pairs,
    spectra,
    svd,
    tables,
    variants,
)
from blockcoupling.engine import jacobian as jac
from blockcoupling.engine.blocks import BlockSpec
from blockcoupling.engine.capture import Capture, capture, residual_branch
from blockcoupling.engine.causality import model_spec, resolve_causal
from blockcoupling.engine.config import MeasureConfig, parse_config
from blockcoupling.engine.events import EventCallback, MeasureEvent, Phase, ignore
from blockcoupling.engine.inputs import MeasureInput, make_batch, normalise_inputs
from blockcoupling.engine.plan import MeasurePlan, prompt_work
from blockcoupling.engine.results import Measurement, conform
from blockcoupling.engine.state import preserved
from blockcoupling.engine.wrappers import as_module, unwrap_model
from blockcoupling.errors import NumericalError
from blockcoupling.verbosity import grouped_layer_warnings

Key = pairs.Key


def _model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def _model_device(model: torch.nn.Module) -> torch.device:
    return offload.input_device(model)  # offloaded weights (accelerate) wait on "meta"


# ---------------------------------------------------------------------------- per-Jacobian state
#: How one Jacobian J^l_{t_in t_out} is taken, chosen once per layer (`_PromptRun._route`):
#: ``structure`` dense from the block's structure (fastpath.token_jacobians: cross-token
#: keys and J_tt of a causal model), ``decode`` dense from the decode step's operator,
#: ``decode_structure`` dense from the decode step's structure where it applies (else as
#: ``decode_operator``), ``decode_operator`` the decode step's operator (matrix-free);
#: ``blocks`` dense from the generic branch's VJP/JVP batches, ``operator`` the generic
#: branch's operator (matrix-free). The ``decode*`` and ``structure`` routes are the fast path
#: (``_fast`` in the diagnostics' ``method``).
Route = Literal["structure", "decode", "decode_structure", "decode_operator", "blocks",
                "operator"]


@dataclass
class _Measured:
    """One Jacobian J^l_{t_in t_out}: its top-K factors and a way to apply it."""

    top: svd.TopK  # U (d, K), S (K,), V (d, K)
    dense: Tensor | None  # (d, d) when computed densely
    method: str
    residual: float
    seconds: float
    route: Route


@dataclass
class _LayerWork:
    """What pass 1 has of one layer: its coupling keys and influence keys (t_in, t_out), the
    route of each key, the dense J taken for the layer, the decode-step operators by token,
    and the generic residual branch ``f`` at ``x`` (None where nothing needs it)."""

    keys: list[tuple[int, int]]
    infl: list[tuple[int, int]]
    routes: dict[tuple[int, int], Route]
    blocks: dict[tuple[int, int], Tensor]
    fast: dict[int, Any]
    f: Callable[[Tensor], Tensor] | None
    x: Tensor | None

    def branch(self) -> tuple[Callable[[Tensor], Tensor], Tensor]:
        """The generic residual branch (built wherever a key's route needs it)."""
        assert self.f is not None and self.x is not None, "no generic route on this layer"
        return self.f, self.x


def choose_method(cfg: MeasureConfig, d: int) -> str:
    """``dense`` or ``matrix_free`` for hidden size ``d`` (``cfg.method`` unless ``auto``).
    The choice of each Jacobian is in the ``method`` column of ``diagnostics`` and in the
    ``svd`` events; ``method="dense"`` / ``"matrix_free"`` forces it. Under ``auto`` a
    ``matrix_free`` choice is overridden per Jacobian where the block's structure gives J
    densely (engine/structured.py: a few GEMMs, cheaper than the products) and a prompt's
    dense J fit `structured_keep_bytes` of the analysis device."""
    if cfg.method != "auto":
        return cfg.method
    # Dense blocks cost d VJPs per output token and d^2 memory; the matrix-free path costs
    # ~(K + oversample) * (2 * n_iter + 2) products. Choose matrix-free only where it is cheaper.
    per_op = (cfg.k_max + cfg.svd_oversample) * (2 * cfg.svd_iters + 2)
    return "matrix_free" if d >= 2048 and per_op < d else "dense"


#: Under ``method="auto"``, a prompt's Jacobians are taken densely from the blocks' structure
#: (and kept until pass 2) only while they fit this many bytes together (on a GPU also a
#: quarter of its free memory, `structured_keep_bytes`); beyond it (wide models at many
#: tokens) only their top-K factors are kept (matrix-free).
STRUCTURED_KEEP_BYTES: int = 4 << 30


def structured_keep_bytes(device: torch.device) -> int:
    """How many bytes of a prompt's dense structured Jacobians ``auto`` keeps on ``device``:
    `STRUCTURED_KEEP_BYTES`, on a CUDA device at most a quarter of its free memory (the
    model's weights and activations share it); 0 (matrix-free) on other accelerators. On the
    GPU, as on the CPU, the structure's GEMMs and the Gram top-K (engine/svd.py) beat the
    randomized products (BENCHMARKS.md, the GPU rows)."""
    if device.type == "cpu":
        return STRUCTURED_KEEP_BYTES
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return min(STRUCTURED_KEEP_BYTES, free // 4)
    return 0


@dataclass
class _RunState:
    """What one measure() call learns across prompts."""

    figure_ids: set[str] = field(default_factory=set)  # prompts whose K x K matrices are kept
    fast_verified: set[int] = field(default_factory=set)  # layers whose fast path was checked
    fast_failed: set[int] = field(default_factory=set)  # layers where it is unsupported
    cross_verified: set[int] = field(default_factory=set)  # layers whose token_jacobians
    cross_failed: set[int] = field(default_factory=set)  # were checked / are unsupported
    # layer -> True (J^l_tt from the fast path) | why not (engine/fastrecord.py): meta["fast_path"]
    fast_path: dict[int, bool | str] = field(default_factory=dict)
    fast_warned: set[int] = field(default_factory=set)  # refused layers already warned about
    on_event: EventCallback = ignore  # receives a MeasureEvent per finished piece of work


class _PromptRun:
    """All the Jacobian work for one prompt."""

    def __init__(self, model: torch.nn.Module, cap: Capture, b: int, item: MeasureInput,
                 cfg: MeasureConfig, spec: BlockSpec, progress: Any, state: _RunState) -> None:
        self.model, self.cap, self.b, self.item, self.cfg, self.spec = model, cap, b, item, cfg, spec
        self.state = state
        self._device = torch.device(cfg.analysis_device) if cfg.analysis_device else (
            _model_device(model))
        self.n = cap.lengths[b]
        self.d = spec.hidden_size
        work = prompt_work(cfg, spec, self.n, influence=False)  # the one rule (engine/plan.py)
        self.layers = list(work.layers)
        self.tokens = list(work.tokens)
        self.method = choose_method(cfg, self.d)
        self.progress = progress
        self.pairs: dict[str, list[pairs.Pair]] = work.pairs
        self.keys = {la: list(v) for la, v in work.keys.items()}
        # whether only dense J are used where a block's structure gives them: always for
        # "dense"; for "auto" while they fit structured_keep_bytes (a few GEMMs beat
        # ~(K + oversample) * (2 iters + 2) decode-step products, with no residual check)
        n_keys = sum(len(v) for v in self.keys.values())
        itemsize = torch.finfo(cfg.dtype).bits // 8
        self.structured_dense = self.method == "dense" or (
            cfg.method == "auto"
            and n_keys * self.d * self.d * itemsize <= structured_keep_bytes(self._device))
        self.measured: dict[Key, _Measured] = {}
        # tr(J^2) costs the matrix-free path one more product of its sketch: only where a
        # requested variant needs it (engine/variants.py, Variant.needs)
        self.needs_trace2 = any("trace2" in variants.get(v).needs for v in cfg.variants)
        self.norm_bases: dict[int, Tensor] = {}  # remove_norm_directions: layer -> (n, d, 2)
        # layer -> (its influence keys, metric -> values (n,))
        self.influence: dict[int, tuple[list[tuple[int, int]], dict[str, Tensor]]] = {}

    # -- pass 1 ------------------------------------------------------------------------
    def _branch(self, layer: int) -> tuple[Callable[[Tensor], Tensor], Tensor]:
        return residual_branch(self.model, self.cap, layer, self.b, dtype=self.cfg.dtype,
                               device=self.cfg.analysis_device)

    def _fast(self, layer: int, keys: Sequence[tuple[int, int]]) -> dict[int, Any]:
        """Decode-step operators (fastpath.TokenBranch) for the diagonal keys J^l_tt of a causal
        model; {} where the fast path is off, unsupported, or failed its check. The check
        against the generic path runs on the first prompt that reaches each layer."""
        diag = [t_in for t_in, t_out in keys if t_in == t_out]
        record = self.state.fast_path
        not_tried = (fastrecord.OFF if not self.cfg.fast_path else
                     fastrecord.NOT_CAUSAL if not self.spec.causal else
                     fastrecord.NO_DIAGONAL if not diag else None)
        if not_tried is not None:
            record.setdefault(layer, not_tried)
            return {}
        if layer in self.state.fast_failed:
            return {}
        verify = layer not in self.state.fast_verified

        def refused(why: str) -> None:
            record[layer] = why

        tbs = fastpath.token_branches(self.model, self.cap, layer, self.b, diag,
                                      dtype=self.cfg.dtype, verify=verify, seed=self.cfg.seed,
                                      chunk_size=self.cfg.chunk_size,
                                      device=self.cfg.analysis_device,
                                      verify_forward=not self.structured_dense,
                                      on_fallback=refused)
        if tbs is None:
            self.state.fast_failed.add(layer)
            return {}
        self.state.fast_verified.add(layer)
        record[layer] = True
        return tbs

    def _structured(self, layer: int, keys: Sequence[tuple[int, int]],
                    infl: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Tensor]:
        """Dense J^l_{s t} from the block's structure (fastpath.token_jacobians) for a layer
        with cross-token keys (s < t) of a causal model: those, the layer's J_tt, and the
        influence's keys; {} where there are none, the fast path is off or unsupported, or it
        failed its check (run against the generic path on the first prompt that reaches each
        layer). Coupling keys only where dense J are used (not under a forced matrix-free)."""
        wanted = set(infl) | (set(keys) if self.structured_dense else set())
        if (not (self.cfg.fast_path and self.spec.causal) or layer in self.state.cross_failed
                or not any(s < t for s, t in wanted)):
            return {}
        got = fastpath.token_jacobians(self.model, self.cap, layer, self.b, sorted(wanted),
                                       dtype=self.cfg.dtype, seed=self.cfg.seed,
                                       device=self.cfg.analysis_device,
                                       verify=layer not in self.state.cross_verified)
        if got is None:
            self.state.cross_failed.add(layer)
            return {}
        self.state.cross_verified.add(layer)
        self.state.fast_path[layer] = True  # the layer's J_tt from the decode step's structure
        return got

    def pass1(self) -> None:
        """Per layer: its routes (`_LayerWork`), then each Jacobian's top-K factors; the
        influence of its tokens."""
        from blockcoupling.progress import bar

        layers = sorted(set(self.keys) | (set(self.layers) if self.cfg.influence else set()))
        with grouped_layer_warnings():  # a fallback said once for its layers, not per layer
            for layer in bar(layers, desc=f"{self.item.prompt_id} Jacobians", unit="layer",
                             leave=False,
                             enabled=not (self.progress is None or self.progress.disable)):
                work = self._layer_work(layer)
                for key in work.keys:
                    with self._where(layer, [key]):
                        m = self._measure_key(layer, key, work)
                    self.measured[(layer, key[0], key[1])] = m
                    self.state.on_event(MeasureEvent(
                        "svd", m.seconds, self.item.prompt_id, layer, key[0], key[1], m.method))
                if work.infl:
                    self._influence(layer, work.blocks, work.infl)

    def _layer_work(self, layer: int) -> _LayerWork:
        """The routes of ``layer``'s Jacobians, chosen once: the dense J the block's structure
        gives (cross-token and, under ``influence``, every J_tt), the decode-step operators of
        the rest of J_tt, the generic residual branch only where something needs it (the fast
        path replays the block on its own), and the dense J that VJP/JVP batches take."""
        keys = self.keys.get(layer, [])
        infl = pairs.influence_keys([layer], n=self.n)[layer] if self.cfg.influence else []
        t0 = time.perf_counter()
        with self._where(layer, keys):
            cross = self._structured(layer, keys, infl)
        served = set(cross) if self.structured_dense else set()  # forced matrix-free
        fast = self._fast(layer, [k for k in keys if k not in served])
        routes = {k: self._route(k in served, k[0] == k[1] and k[0] in fast) for k in keys}
        generic = [k for k, r in routes.items() if r in ("blocks", "operator")]
        infl_generic = [k for k in infl if k not in cross and not (k[0] == k[1] and k[0] in fast)]
        f, x = self._branch(layer) if (generic or infl_generic) else (None, None)
        dense_keys = sorted({k for k in generic if routes[k] == "blocks"} | set(infl_generic))
        with self._where(layer, dense_keys):
            blocks = self._dense_blocks(f, x, dense_keys)
        blocks.update(cross)
        for k in infl:  # the influence's J_tt from the decode step
            if k not in blocks:
                blocks[k] = fast[k[0]].jacobian()
        if dense_keys or cross:
            self._emit("jacobian", t0, layer=layer)
        return _LayerWork(keys, infl, routes, blocks, fast, f, x)

    def _route(self, structured: bool, decode: bool) -> Route:
        """How a key's J is taken (`Route`): ``structured`` the block's structure serves it,
        ``decode`` the decode step does."""
        if structured:
            return "structure"
        if decode:
            return ("decode" if self.method == "dense" else
                    "decode_structure" if self.structured_dense else "decode_operator")
        return "blocks" if self.method == "dense" else "operator"

    def _emit(self, phase: Phase, t0: float, layer: int | None = None) -> None:
        self.state.on_event(MeasureEvent(phase, time.perf_counter() - t0, self.item.prompt_id,
                                         layer))

    @contextmanager
    def _where(self, layer: int, keys: Sequence[tuple[int, int]]) -> Iterator[None]:
        """A NaN or inf raised inside says which prompt, layer and token pair it came from."""
        try:
            yield
        except NumericalError as err:
            pairs_ = ", ".join(f"{a} -> {b}" for a, b in keys[:4]) + (" ..." if len(keys) > 4 else "")
            raise NumericalError(
                f"prompt {self.item.prompt_id!r}, layer {layer}, token {pairs_}: {err}") from err

    def _project(self, layer: int, t_out: int, J: Any) -> Any:
        """``Q_N J`` with ``remove_norm_directions`` (engine/normdirs.py): a dense (d, d) J or
        an operator; J itself when the option is off."""
        if not self.cfg.remove_norm_directions:
            return J
        if layer not in self.norm_bases:
            self.norm_bases[layer] = normdirs.block_null_bases(
                self.model, self.cap, layer, self.b, dtype=self.cfg.dtype, device=self._device)
        N = self.norm_bases[layer][t_out]  # (d, 2)
        if isinstance(J, Tensor):
            return normdirs.project_rows(J, N.to(J.device, J.dtype))
        return normdirs.ProjectedOperator(J, N)

    def _measure_key(self, layer: int, key: tuple[int, int], work: _LayerWork) -> _Measured:
        """Top-K factors of J_key by its route: dense where the route gives J, else
        matrix-free; ``auto`` falls back to dense where the SVD residual is above tol."""
        t0 = time.perf_counter()
        t_in, t_out = key
        route = work.routes[key]
        tb: Any = work.fast[t_in] if route.startswith("decode") else None
        tag = "" if route in ("blocks", "operator") else "_fast"
        J = (work.blocks[key] if route in ("structure", "blocks") else
             tb.jacobian() if route == "decode" else
             tb.structured_jacobian() if route == "decode_structure" else  # None: no structure
             None)
        if J is not None:
            J = self._project(layer, t_out, J)
            m = _Measured(svd.topk_svd(J, self.cfg.k_max), J, "dense" + tag, 0.0, 0.0, route)
        else:
            m = self._matrix_free(layer, key, tb if tb is not None else
                                  jac.jacobian_operator(*work.branch(), t_in, t_out), work)
        m.seconds = time.perf_counter() - t0
        return m

    def _matrix_free(self, layer: int, key: tuple[int, int], operator: Any,
                     work: _LayerWork) -> _Measured:
        """The randomized top-K of an operator; under ``auto`` J dense where its residual is
        above ``svd_tol``."""
        cfg, (t_in, t_out), route = self.cfg, key, work.routes[key]
        tag = "" if route == "operator" else "_fast"
        top = svd.randomized_topk_svd(
            self._project(layer, t_out, operator), cfg.k_max, oversample=cfg.svd_oversample,
            n_iter=cfg.svd_iters, tol=cfg.svd_tol, seed=cfg.seed, trace2=self.needs_trace2)
        res = float(top.residual.max()) if top.residual is not None else 0.0
        if cfg.method == "auto" and cfg.svd_tol is not None and res > cfg.svd_tol:
            J = self._project(layer, t_out, operator.jacobian() if route != "operator" else
                              jac.jacobian_blocks(*work.branch(), [t_out], in_tokens=[t_in],
                                                  chunk_size=cfg.chunk_size)[0, 0])
            return _Measured(svd.topk_svd(J, cfg.k_max), J, "dense_fallback" + tag, res, 0.0,
                             route)
        return _Measured(top, None, "matrix_free" + tag, res, 0.0, route)

    def _dense_blocks(self, f: Callable[[Tensor], Tensor] | None, x: Tensor | None,
                      keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Tensor]:
        """Dense J_{t_in t_out} for ``keys``: one VJP batch per output token yields every
        input token at once, one JVP batch per input token every output token; whichever
        needs fewer batches (e.g. JVPs for ``fixed_input`` at one input token)."""
        out: dict[tuple[int, int], Tensor] = {}
        if not keys:
            return out
        assert f is not None and x is not None  # pass1 builds the branch wherever keys need it
        by_out: dict[int, list[int]] = {}
        by_in: dict[int, list[int]] = {}
        for t_in, t_out in keys:
            by_out.setdefault(t_out, []).append(t_in)
            by_in.setdefault(t_in, []).append(t_out)
        forward = len(by_in) < len(by_out)
        for t, others in (by_in if forward else by_out).items():
            outs, ins = (others, [t]) if forward else ([t], others)
            J = jac.jacobian_blocks(f, x, outs, in_tokens=ins, forward=forward,
                                    chunk_size=self.cfg.chunk_size)  # (len(outs), len(ins), d, d)
            for i, o in enumerate(others):
                out[(t, o) if forward else (o, t)] = (J[i, 0] if forward else J[0, i]).detach()
        return out

    def _influence(self, layer: int, blocks: dict[tuple[int, int], Tensor],
                   keys: list[tuple[int, int]]) -> None:
        Js = torch.stack([self._project(layer, k[1], blocks[k]) for k in keys])  # (n, d, d)
        self.influence[layer] = (keys, spectra.influence_metrics(torch.linalg.svdvals(Js.double())))

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """The ``diagnostics``, ``spectra`` and ``influence`` rows of pass 1."""
        return tables.jacobian_rows(self.item.prompt_id, self.measured, self.influence,
                                    self.d, min(self.cfg.k), spectra=self.cfg.spectra)

    # -- pass 2 ------------------------------------------------------------------------
    def pass2(self) -> tuple[list[pd.DataFrame], dict[str, np.ndarray], dict[int, float]]:
        """Coupling matrices for every pair of every kind, and the linearisation cosines."""
        cfg = self.cfg
        # the linearisation check needs the true Jacobians, not the projected ones
        want_lin = "depth" in cfg.coupling and not cfg.remove_norm_directions and tuple(
            self.layers) == tuple(range(1, self.spec.num_layers + 1))
        A_store: dict[tuple[str, Key, Key, str], Tensor] = {}
        layer_ops = self._coupling_by_layer(A_store)
        lin: dict[int, float] = {}
        if want_lin:  # the product of the linearised blocks, one layer at a time as pass 2 goes
            x0 = self.cap.boundaries[0, self.b].to(self._device, self.cfg.dtype)
            xL = self.cap.boundaries[-1, self.b].to(self._device, self.cfg.dtype)
            toks = list(self.tokens)
            cos = spectra.linearisation_cosine(layer_ops, x0[toks], xL[toks])  # (T,)
            lin = {t: float(c) for t, c in zip(toks, cos, strict=True)}
        else:
            for _ in layer_ops:
                pass
        t0 = time.perf_counter()
        frames = [tables.coupling_rows(self.item.prompt_id, A_store, self.measured, cfg, self.d)]
        arrays = tables.figure_arrays(self.item.prompt_id, A_store, cfg, self.layers, self.tokens,
                                      keep=self.item.prompt_id in self.state.figure_ids)
        self._emit("tables", t0)
        return frames, arrays, lin

    def _coupling_by_layer(self, A_store: dict[tuple[str, Key, Key, str], Tensor]
                           ) -> Iterator[Callable[[Tensor], Tensor]]:
        """Per measured layer: every coupling matrix A of a Jacobian of that layer (into
        ``A_store``), then yields ``V (T, d) -> (J^l_tt V_t)_t`` over the selected tokens for
        the linearisation (the layer's operators are alive only while it is the current one)."""
        cfg = self.cfg
        # group pairs by measured Jacobian so each is applied once to all its bases
        by_a: dict[Key, list[tuple[str, Key]]] = {}
        for kind, ps in self.pairs.items():
            for a, b in ps:
                by_a.setdefault(a, []).append((kind, b))
        # the last stacked bases (P, d, K) twice: depth-wise, every layer couples to the same
        # bases, so they are stacked once per prompt; one entry, so no more than one copy
        stacked: tuple[tuple[Key, ...], Tensor, Tensor] | None = None
        for layer in sorted({a[0] for a in by_a}):
            t0 = time.perf_counter()
            f = x = None
            fast: dict[int, Any] = {}
            operators = [a for a in by_a if a[0] == layer and self.measured[a].dense is None]
            if operators:  # matrix-free: rebuild the operators of this layer, by their routes
                fast = self._fast(layer, [(a[1], a[2]) for a in operators
                                          if self.measured[a].route != "operator"])
                if any(self.measured[a].route == "operator" for a in operators):
                    f, x = self._branch(layer)  # the generic branch only where it is needed
            for a in [a for a in by_a if a[0] == layer]:
                apply = self._applier(a, f, x, fast)
                bases = by_a[a]
                which = tuple(b for _, b in bases)
                if stacked is None or stacked[0] != which:
                    stacked = (which, torch.stack([self.measured[b].top.U for b in which]),
                               torch.stack([self.measured[b].top.V for b in which]))
                _, Ub, Vb = stacked  # (P, d, K) each
                for orient in cfg.orientations:
                    A = metrics.coupling_matrix(apply, Ub, Vb, orient)  # (P, K, K)
                    for (kind, b), Ab in zip(bases, A, strict=True):
                        A_store[(kind, a, b, orient)] = Ab
            self._emit("coupling", t0, layer=layer)
            # built only when the linearisation consumes it (it needs J^l_tt at every token)
            yield functools.partial(self._apply_per_token, layer, f, x, fast)

    def _apply_per_token(self, layer: int, f: Any, x: Any, fast: dict[int, Any],
                         V: Tensor) -> Tensor:
        """``V (T, d) -> (J^l_tt V_t)_t``: each selected token's vector through its own
        Jacobian at ``layer``."""
        return torch.stack([self._applier((layer, t, t), f, x, fast)(v[:, None])[:, 0]
                            for t, v in zip(self.tokens, V, strict=True)])

    def _applier(self, key: Key, f: Any, x: Any, fast: dict[int, Any]) -> Callable[[Tensor], Tensor]:
        m = self.measured[key]
        if m.dense is not None:
            J = m.dense
            return lambda X: J @ X
        op = fast[key[1]] if m.route != "operator" else jac.jacobian_operator(f, x, key[1], key[2])
        return self._project(key[0], key[2], op).matmat


# ---------------------------------------------------------------------------- public API
def iter_measure(model: torch.nn.Module, tokenizer: Any, prompts: Any, config: MeasureConfig,
                 *, skip: frozenset[str] | set[str] = frozenset(), progress: bool = True,
                 on_event: EventCallback | None = None,
                 spec: BlockSpec | None = None,
                 plan: MeasurePlan | None = None) -> Iterator[Measurement]:
    """Yield one [`Measurement`][blockcoupling.engine.results.Measurement] part per prompt (for incremental, resumable stores).

    The model is measured in eval mode (dropout off); its training flags, attention
    implementation, ``requires_grad`` flags and every global RNG state are restored when the
    iterator is exhausted, closed or raises (`blockcoupling.engine.state.preserved`).
    ``model`` may be a wrapper (engine/wrappers.py); ``spec`` a spec already found by
    `blockcoupling.engine.causality.model_spec` (else found here, its causality from
    the first capture where no config says it). ``plan``: the checked
    `MeasurePlan` of ``prompts``
    (`blockcoupling.store.preflight.preflight`): its inputs and spec are measured and the
    checks it made are not made again (``prompts`` and ``spec`` are then ignored).
    """
    model = as_module(model)
    checked = plan is not None and plan.spec is not None
    if plan is not None and plan.spec is not None:
        items, spec = list(plan.items), plan.spec
    else:
        items = normalise_inputs(prompts)
    with preserved(model):
        model.eval()
        yield from _iter_parts(model, tokenizer, items, config, skip=skip, progress=progress,
                               on_event=on_event or ignore, spec=spec, checked=checked)


def _iter_parts(model: torch.nn.Module, tokenizer: Any, items: list[MeasureInput],
                config: MeasureConfig, *, skip: frozenset[str] | set[str], progress: bool,
                on_event: EventCallback, spec: BlockSpec | None, checked: bool = False
                ) -> Iterator[Measurement]:
    """The measurement of normalised ``items``; ``checked``: ``spec`` and ``config`` were
    checked against the model already (a plan's), so they are not checked again."""
    from blockcoupling.progress import bar as progress_bar

    cfg = config
    spec = _checked_spec(model, cfg, spec, checked)
    device = _model_device(model)
    hidden_dtype = _model_dtype(model)  # the precision the hidden states carry
    readout = lens.readout(model, spec) if cfg.logit_lens else None
    # The batches are cut from the whole prompt list, skipped prompts included, so that a
    # resumed run measures every prompt in the batch it had in the first run (batch
    # composition changes float32 rounding): a resume is bit-identical. Likewise the prompts
    # that keep their K x K matrices are the first ones of the list, not of this process.
    batches = [items[i:i + cfg.batch_size] for i in range(0, len(items), cfg.batch_size)]
    state = _RunState(figure_ids={it.prompt_id for it in items[:cfg.figure_prompts]},
                      on_event=on_event)
    batches = [b for b in batches if any(it.prompt_id not in skip for it in b)]
    total = sum(it.prompt_id not in skip for b in batches for it in b)
    bar = progress_bar(total=total, desc="prompts", unit="prompt", enabled=progress)
    try:
        for batch_items in batches:
            ids = [it.prompt_id for it in batch_items]
            cap = _capture_batch(model, tokenizer, batch_items, cfg, spec, device, on_event)
            spec = cap.spec  # width and causality known from here on
            batch_tables = _trajectories(cap, ids, cfg, readout, device, hidden_dtype, on_event)
            if not (cfg.coupling or cfg.spectra or cfg.influence):
                # no Jacobian work: the whole batch is one part (one table build, one write)
                part = tables.trajectory_part(cap, batch_items, cfg, batch_tables)
                if any(i in skip for i in ids):  # a batch partly stored by another run
                    part = _without_prompts(part, skip)
                yield part
                bar.update(sum(i not in skip for i in ids))
                continue
            trajectories = (tables.split_by_prompt(batch_tables, ids, cap.lengths)
                            if batch_tables else {})
            for b, item in enumerate(batch_items):
                if item.prompt_id in skip:
                    continue
                yield _measure_one(model, cap, b, item, cfg, cap.spec, state, bar, trajectories)
                bar.update(1)
    finally:
        bar.close()


def _checked_spec(model: torch.nn.Module, cfg: MeasureConfig, spec: BlockSpec | None,
                  checked: bool) -> BlockSpec:
    """The model's spec (found where not given); unless ``checked`` (a plan's), ``cfg``
    checked against its width and the analysis device against what is available."""
    if spec is None:
        spec = model_spec(model, cfg)
    if not checked:
        if spec.hidden_size:  # a custom model's hidden size is known only after the capture
            cfg.check_model(spec.num_layers, spec.hidden_size)
        if cfg.analysis_device is not None:
            from blockcoupling.loading import resolve_device

            resolve_device(cfg.analysis_device, "--analysis-device")  # one line if absent
    return spec


def _trajectories(cap: Capture, ids: list[str], cfg: MeasureConfig, readout: Any,
                  device: torch.device, hidden_dtype: torch.dtype | None,
                  on_event: EventCallback) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The batch's trajectory and token-metric tables (the logit lens's entropy with them
    where asked for); None without ``cfg.trajectory``."""
    t0 = time.perf_counter()
    ent = (lens.lens_entropy(tables.batch_trajectory(cap), readout, device=device,
                             dtype=hidden_dtype, normed_last=cap.final_norm)
           if readout is not None else None)
    out = (tables.trajectory_tables(cap, ids, cfg.lss_window, hidden_dtype, entropy=ent)
           if cfg.trajectory else None)
    on_event(MeasureEvent("trajectory", time.perf_counter() - t0, prompt_ids=tuple(ids)))
    return out


def _capture_batch(model: torch.nn.Module, tokenizer: Any, items: list[MeasureInput],
                   cfg: MeasureConfig, spec: BlockSpec, device: torch.device,
                   on_event: EventCallback) -> Capture:
    """One batch's capture, its boundaries in the precision of the analysis (float64 when
    asked for); a custom module's causality (its mask, or a probe of J) and width resolved
    from it, the width checked against ``cfg``."""
    t0 = time.perf_counter()
    inputs = make_batch(tokenizer, items, model, device)
    cap = capture(model, inputs, spec, final_norm=cfg.final_norm,
                  boundary_dtype=torch.promote_types(cfg.dtype, torch.float32))
    on_event(MeasureEvent("capture", time.perf_counter() - t0,
                          prompt_ids=tuple(it.prompt_id for it in items)))
    if cap.spec.causal_source == "unknown":
        cap.spec = resolve_causal(model, cap)
    if (cap.spec.num_layers, cap.spec.hidden_size) != (spec.num_layers, spec.hidden_size):
        cfg.check_model(cap.spec.num_layers, cap.spec.hidden_size)  # width learnt here
    return cap


def _without_prompts(part: Measurement, skip: frozenset[str] | set[str]) -> Measurement:
    """``part`` without the rows of the prompts in ``skip`` (a trajectory-only part)."""
    def keep(df: pd.DataFrame) -> pd.DataFrame:
        return df[~df["prompt_id"].isin(list(skip))].reset_index(drop=True)

    return Measurement(trajectory=keep(part.trajectory), token_metrics=keep(part.token_metrics),
                       prompts=keep(part.prompts), config=part.config)


def _measure_one(model: torch.nn.Module, cap: Capture, b: int, item: MeasureInput,
                 cfg: MeasureConfig, spec: BlockSpec, state: _RunState, bar: Any,
                 trajectories: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> Measurement:
    t0 = time.perf_counter()
    n = cap.lengths[b]
    traj, tokm = trajectories.get(item.prompt_id, (None, None))
    run = _PromptRun(model, cap, b, item, cfg, spec, bar, state)
    rows: dict[str, list[dict[str, Any]]] = {}
    frames: list[pd.DataFrame] = []
    arrays: dict[str, np.ndarray] = {}
    if run.keys or cfg.influence:
        with svd.one_blas_thread():  # the Jacobian work is torch's threads' (engine/svd.py)
            run.pass1()
            rows = run.rows()
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
        spectra=conform("spectra", rows.get("spectra", [])),
        influence=conform("influence", rows.get("influence", [])),
        prompts=prompts_df,
        diagnostics=conform("diagnostics", rows.get("diagnostics", [])),
        arrays=arrays,
        config=cfg,
        meta={"seconds": time.perf_counter() - t0,
              fastrecord.FAST_PATH_KEY: fastrecord.to_meta(state.fast_path)},
        basis_store=bases.keep(run.measured, item.prompt_id, cfg.dtype,
                               save_bases=cfg.save_bases, save_jacobians=cfg.save_jacobians),
    )
    state.on_event(MeasureEvent("prompt", part.meta["seconds"], item.prompt_id))
    _warn_fallbacks(state, spec)
    return part


def _warn_fallbacks(state: _RunState, spec: BlockSpec) -> None:
    """One warning for the layers refused since the last one: all of them on the first prompt
    (every layer is tried there), so one per run, whatever the number of layers."""
    new = {la: why for la, why in fastrecord.fallback_layers(state.fast_path).items()
           if la not in state.fast_warned}
    if new:
        state.fast_warned.update(new)
        fastrecord.fallback_warning(new, spec.arch, stacklevel=4)


def build_meta(model: torch.nn.Module, cfg: MeasureConfig, *, spec: BlockSpec | None = None,
               **extra: Any) -> dict[str, Any]:
    """The run's meta: model, architecture, causality (and where it came from), wrapper, and
    what loading left out (``loading``: the load report of ``loading.load_model``, where
    the model came from it)."""
    from blockcoupling.loading import load_report

    report = load_report(model)
    unwrapped = unwrap_model(model)
    model = unwrapped.module
    if spec is None:
        spec = model_spec(model, cfg)
    layers = cfg.selected_layers(spec.num_layers)
    lo, hi = cfg.figure_window or pairs.default_figure_window(layers)
    name = (getattr(getattr(model, "config", None), "_name_or_path", "")
            or getattr(getattr(model, "cfg", None), "model_name", "") or type(model).__name__)
    meta: dict[str, Any] = {
        "model": name,
        "arch": spec.arch,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "causal": spec.causal,
        "causal_source": spec.causal_source,
        "blocks_path": spec.blocks_path,
        "figure_window": [lo, hi],
        "device": str(_model_device(model)),
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        **offload.describe(model, cfg.dtype),  # device_map, quantization (engine/offload.py)
    }
    if report is not None:
        meta["loading"] = report
    meta.update(unwrapped.meta)
    meta.update(extra)
    return meta


def measure(model: torch.nn.Module, tokenizer: Any = None, prompts: Any = (), *,
            coupling: Sequence[str] | str | None = None, k: Sequence[int] | int | None = None,
            tokens: str | Sequence[int] | None = None, p: float | Sequence[float] | None = None,
            dtype: torch.dtype | None = None, config: MeasureConfig | None = None,
            progress: bool = True, on_event: EventCallback | None = None,
            **options: Any) -> Measurement:
    """Measure block coupling, trajectories, spectra and influence of ``model`` on ``prompts``.

    ``prompts`` are strings (tokenized with ``tokenizer``), [`Prompt`][blockcoupling.prompts.prompt.Prompt] objects, or a dict
    of ready model inputs (e.g. ``{"pixel_values": images}`` for a ViT). Every other keyword is
    a [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig] field (``layers="9..16"``, ``variants=...``, ``final_norm=True``,
    ``method="matrix_free"``, ``influence=True``, ...). ``dtype`` is the precision of the
    analysis, not of the model: each analysed block is copied to it. ``on_event`` receives a
    [`blockcoupling.engine.events.MeasureEvent`][blockcoupling.engine.events.MeasureEvent] per finished piece of work (per-batch
    capture, per-prompt and per-layer Jacobians, SVDs, coupling and tables, with timings).
    The options left out take their [`MeasureConfig`][blockcoupling.engine.config.MeasureConfig] defaults (depth-wise coupling,
    K = 10, 30, 50, ``tokens="auto"``, p = 1, float32) or, with ``config``, that config's
    values; every option given is applied on top of ``config`` (the rule of every entry
    point: ``measure_to_dir`` and the monitor alike).
    """
    named = {"coupling": coupling, "k": k, "tokens": tokens, "p": p, "dtype": dtype}
    given = {name: value for name, value in named.items() if value is not None}
    cfg = parse_config(config, **given, **options)
    t0 = time.perf_counter()
    items = normalise_inputs(prompts)
    spec = model_spec(as_module(model), cfg, tokenizer, items)
    module = as_module(model)
    with preserved(module):
        module.eval()
        parts = list(_iter_parts(module, tokenizer, items, cfg, skip=frozenset(),
                                 progress=progress, on_event=on_event or ignore, spec=spec))
    fast = {fastrecord.FAST_PATH_KEY: last_fast_path(parts)} if parts else {}
    meta = build_meta(model, cfg, spec=spec, seconds=time.perf_counter() - t0,
                      peak_memory=offload.peak_memory(), **fast)
    return Measurement.concat(parts, config=cfg, meta=meta)


def last_fast_path(parts: Sequence[Measurement]) -> dict[str, bool | str]:
    """The run's ``meta["fast_path"]`` from its parts (each part carries the record so far)."""
    return dict(parts[-1].meta.get(fastrecord.FAST_PATH_KEY) or {}) if parts else {}


#: the name used before inputs.py existed
normalise_prompts = normalise_inputs

__all__ = ["measure", "iter_measure", "normalise_inputs", "normalise_prompts", "build_meta",
           "last_fast_path"]
