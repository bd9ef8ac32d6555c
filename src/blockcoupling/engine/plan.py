"""The measurement plan: what a ``measure`` call will compute, counted before any Jacobian.

`prompt_work` is the one rule for a prompt's work (its tokens, the pairs of every coupling
kind and the Jacobians they, the spectra and the influence need); the engine runs exactly
that, and `plan_measure` adds it up into a `MeasurePlan` (``measure --dry-run`` prints it).
Its time estimate is a stated model, not a measurement: per dense Jacobian one batched VJP of
d vectors (about ``2 d`` forward passes of ``24 n d^2`` flops) plus a ``d^3`` ``eigh``, at
``GFLOPS``; it tells seconds from hours (BENCHMARKS.md has measured times).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from blockcoupling.engine import bases as eb
from blockcoupling.engine import pairs
from blockcoupling.engine.blocks import BlockSpec
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.engine.names import ORIENTATIONS

__all__ = ["GFLOPS", "MeasurePlan", "PromptWork", "duration", "plan_measure", "prompt_work", "span"]

#: the throughput the time estimate assumes (flop/s)
GFLOPS = 40e9


@dataclass(frozen=True)
class PromptWork:
    """One prompt's work: selected tokens, pairs per kind, Jacobian keys per layer."""

    n: int
    layers: tuple[int, ...]
    tokens: tuple[int, ...]
    pairs: dict[str, list[pairs.Pair]]
    keys: dict[int, list[tuple[int, int]]]  # layer -> (token_in, token_out) Jacobians
    #: the Jacobians a run with ``save_bases``/``save_jacobians`` stores: those of the coupling
    #: pairs and the spectra (the influence's own are not stored)
    n_stored: int = 0

    @property
    def n_jacobians(self) -> int:
        return sum(len(v) for v in self.keys.values())

    def max_per_layer(self) -> int:
        return max((len(v) for v in self.keys.values()), default=0)


def prompt_work(cfg: MeasureConfig, spec: BlockSpec, n: int, *,
                influence: bool = True) -> PromptWork:
    """The work of one prompt of ``n`` real tokens (the engine's own rule: ``measure`` runs
    this): the pairs of every coupling kind, and the Jacobians they, the spectra (J^l_tt at
    every selected layer and token) and, with ``influence``, the influence (J^l_{j, n-1}) need
    (the engine adds the influence keys layer by layer itself)."""
    layers = tuple(cfg.selected_layers(spec.num_layers))
    tokens = tuple(pairs.resolve_tokens(cfg.tokens, n,
                                        cls=pairs.cls_position(spec.arch, spec.causal)))
    by_kind = {kind: pairs.kind_pairs(kind, tokens=tokens, layers=layers, n=n,
                                      causal=spec.causal, pairs_mode=cfg.layer_pairs)
               for kind in cfg.coupling}
    keys = pairs.needed_keys([p for ps in by_kind.values() for p in ps])
    if cfg.spectra:
        for la in layers:
            have = set(keys.setdefault(la, []))
            keys[la] = sorted(have | {(t, t) for t in tokens})
    n_stored = sum(len(v) for v in keys.values())
    if cfg.influence and influence:
        for la, infl in pairs.influence_keys(layers, n=n).items():
            keys[la] = sorted(set(keys.get(la, [])) | set(infl))
    return PromptWork(n=n, layers=layers, tokens=tokens, pairs=by_kind,
                      keys=dict(sorted(keys.items())), n_stored=n_stored)


@dataclass
class MeasurePlan:
    """What a measure call will do, before it does it (``describe()`` for people,
    ``to_dict()`` for JSON)."""

    model: str
    arch: str
    causal: bool
    num_layers: int
    hidden_size: int
    layers: tuple[int, ...]
    prompts: int
    lengths: tuple[int, ...]  # each prompt's real tokens
    tokens: int  # real tokens over all prompts
    measured_tokens: int  # selected tokens over all prompts
    pairs: dict[str, int]  # kind -> compared Jacobian pairs over all prompts
    jacobians: int  # Jacobian blocks computed (each with a top-K SVD)
    coupling_rows: int  # rows the coupling table will hold
    analysis_dtype: str
    peak_jacobian_bytes: int  # the largest layer's Jacobians of one prompt, held at once
    estimated_seconds: float
    estimate: str = field(default="")  # how the time was estimated
    # what a run that stores them would store (``store.bases`` checks the size and the disk
    # against these, ``--dry-run`` prints them): the Jacobians of the coupling pairs and the
    # spectra, the bytes of their top-K bases (U, V of K x d, S) and of the dense Jacobians
    stored_jacobians: int = 0
    bases_bytes: int = 0
    jacobian_bytes: int = 0
    stores: tuple[str, ...] = ()  # what the run stores: "bases", "jacobians" (cfg.save_*)
    # what `iter_measure` executes (not part of to_dict): the block spec the run measures
    # (width and causality as stated or resolved) and the normalised inputs
    spec: BlockSpec | None = field(default=None, repr=False, compare=False)
    items: list[Any] = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["spec"], out["items"]
        return out

    def describe(self) -> str:
        gib = self.peak_jacobian_bytes / 2**30
        pairs_txt = ", ".join(f"{k} {v:,}" for k, v in self.pairs.items()) or "none"
        return "\n".join([
            f"plan for {self.model} ({self.arch}, {'causal' if self.causal else 'bidirectional'}"
            f", {self.num_layers} blocks, d = {self.hidden_size}); nothing is written",
            f"  prompts {self.prompts:,} ({self.tokens:,} tokens, {self.measured_tokens:,} "
            f"measured), layers {span(self.layers)}",
            f"  coupling pairs: {pairs_txt}; {self.coupling_rows:,} coupling rows",
            f"  Jacobian blocks {self.jacobians:,} (each a top-K SVD) in {self.analysis_dtype}; "
            f"at most {gib:.3g} GiB of Jacobians held at once",
            f"  estimated time {duration(self.estimated_seconds)} ({self.estimate})",
            *([f"  stored: {self.stored_jacobians:,} Jacobians, " + ", ".join(
                f"{what} about {nbytes / 2**30:.3g} GiB" for what, nbytes in
                (("bases", self.bases_bytes), ("jacobians", self.jacobian_bytes))
                if what in self.stores)] if self.stores else []),
        ])


def span(layers: Sequence[int]) -> str:
    """``1..12`` for a contiguous run, else the numbers listed (``none`` for none)."""
    ls = list(layers)
    if not ls:
        return "none"
    return f"{ls[0]}..{ls[-1]}" if ls == list(range(ls[0], ls[-1] + 1)) else ", ".join(map(str, ls))


def duration(s: float) -> str:
    """``under 1 s`` / ``about 40 s`` / ``about 12 min`` / ``about 3.5 h``."""
    if s < 0.5:
        return "under 1 s"
    if s < 90:
        return f"about {s:.0f} s"
    if s < 5400:
        return f"about {s / 60:.0f} min"
    return f"about {s / 3600:.1f} h"


def plan_measure(cfg: MeasureConfig, spec: BlockSpec, lengths: Sequence[int], *,
                 model: str = "model", items: Sequence[Any] = ()) -> MeasurePlan:
    """The plan of measuring prompts of ``lengths`` real tokens with ``cfg`` on a model of
    ``spec`` (see the module docstring for the time model)."""
    import torch

    d, itemsize = spec.hidden_size, torch.finfo(cfg.dtype).bits // 8
    kinds: dict[str, int] = {kind: 0 for kind in cfg.coupling}
    jac = peak = measured = rows = stored = 0
    flops = 0.0
    n_rows_per_pair = len(cfg.k) * len(cfg.orientations or ORIENTATIONS) * sum(
        len(cfg.p) if v in ("coupling", "miscoupling") else 1 for v in cfg.variants)
    works: dict[int, Any] = {}  # prompts of one length have one plan (prompt_work is pure)
    for n in lengths:
        work = works[n] = works[n] if n in works else prompt_work(cfg, spec, n)
        measured += len(work.tokens)
        for kind, ps in work.pairs.items():
            kinds[kind] += len(ps)
            rows += len(ps) * n_rows_per_pair
        jac += work.n_jacobians
        stored += work.n_stored
        peak = max(peak, work.max_per_layer() * d * d * itemsize)
        flops += work.n_jacobians * (2 * d * 24 * n * d * d + d**3)
    return MeasurePlan(
        model=model, arch=spec.arch, causal=spec.causal, num_layers=spec.num_layers,
        hidden_size=d, layers=tuple(cfg.selected_layers(spec.num_layers)),
        prompts=len(lengths), lengths=tuple(int(n) for n in lengths), tokens=int(sum(lengths)), measured_tokens=measured, pairs=kinds,
        jacobians=jac, coupling_rows=rows, analysis_dtype=str(cfg.dtype).replace("torch.", ""),
        peak_jacobian_bytes=peak, estimated_seconds=flops / GFLOPS,
        estimate=f"stated model: VJP and eigh flops at {GFLOPS / 1e9:.0f} GFLOP/s, not measured",
        stored_jacobians=stored, bases_bytes=eb.estimate_bytes(stored, d, cfg.k_max, cfg.dtype),
        jacobian_bytes=eb.jacobian_bytes(stored, d, cfg.dtype),
        stores=tuple(w for w, on in (("bases", cfg.save_bases), ("jacobians", cfg.save_jacobians))
                     if on),
        spec=spec, items=list(items))
