"""MeasureConfig: every option of :func:`blockcoupling.engine.measure`, validated in one place.

The keyword names are the public contract of DEFINITIONS.md (``coupling``, ``k``, ``tokens``,
``p``, ``dtype``, ...). A config is plain data: it round-trips through JSON (``to_dict`` /
``from_dict``) so a run directory's manifest can rebuild it and a sweep can hash it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

import torch

from blockcoupling.engine.metrics import ORIENTATIONS, VALID_P, VARIANTS
from blockcoupling.errors import BlockCouplingError

KINDS = ("depth", "self", "fixed_input", "fixed_output")
METHODS = ("auto", "dense", "matrix_free")
DTYPES = {"float32": torch.float32, "float64": torch.float64}

TokenSpec = Literal["last", "all"] | tuple[int, ...]
LayerSpec = tuple[int, ...] | None


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Sequence):
        return tuple(value)
    return (value,)


def parse_layers(spec: str | Sequence[int] | None) -> LayerSpec:
    """``None`` (all layers), ``"9..16"`` (inclusive, 1-based), ``"3,5,7"`` or a sequence."""
    if spec is None or spec == "" or spec == "all":
        return None
    if isinstance(spec, str):
        spec = spec.strip()
        if ".." in spec:
            lo, _, hi = spec.partition("..")
            try:
                a, b = int(lo), int(hi)
            except ValueError as err:
                raise BlockCouplingError(
                    f"layers={spec!r}: write a range as A..B with whole numbers, e.g. 9..16"
                ) from err
            if b < a:
                raise BlockCouplingError(f"layers={spec!r}: the range is empty (B < A)")
            return tuple(range(a, b + 1))
        try:
            return tuple(int(v) for v in spec.split(",") if v.strip())
        except ValueError as err:
            raise BlockCouplingError(
                f"layers={spec!r}: give a range A..B or a comma-separated list of layers"
            ) from err
    return tuple(int(v) for v in spec)


def parse_tokens(spec: str | int | Sequence[int]) -> TokenSpec:
    """``"last"``, ``"all"``, or explicit 0-based positions (negative counts from the end)."""
    if isinstance(spec, str):
        s = spec.strip()
        if s in ("last", "all"):
            return s  # type: ignore[return-value]
        try:
            return tuple(int(v) for v in s.split(",") if v.strip())
        except ValueError as err:
            raise BlockCouplingError(
                f"tokens={spec!r}: use 'last', 'all' or comma-separated positions such as 0,3,-1"
            ) from err
    if isinstance(spec, int):
        return (spec,)
    return tuple(int(v) for v in spec)


@dataclass(frozen=True)
class MeasureConfig:
    """What to measure and how. See DEFINITIONS.md for the mathematics of each option."""

    coupling: tuple[str, ...] = ("depth",)
    k: tuple[int, ...] = (10, 30, 50)
    tokens: TokenSpec = "last"
    p: tuple[float, ...] = (1.0,)
    dtype: torch.dtype = torch.float32
    variants: tuple[str, ...] = VARIANTS
    orientations: tuple[str, ...] = ORIENTATIONS
    layers: LayerSpec = None
    layer_pairs: Literal["same", "all"] = "same"
    final_norm: bool = False
    # post-LN blocks: project the output LayerNorm's directions out of every Jacobian before
    # the SVD (engine/normdirs.py; docs/conventions.md "Post-LN blocks")
    remove_norm_directions: bool = False
    method: str = "auto"
    fast_path: bool = True  # decode-step Jacobians J^l_tt for causal models (fastpath.py)
    # where the Jacobian work runs; None = where each block's weights are. A model bigger than
    # the GPU stays on the CPU (or is offloaded) and each analysed block is copied to this
    # device in the analysis dtype, one block at a time.
    analysis_device: str | None = None
    trajectory: bool = True
    spectra: bool = True
    influence: bool = False
    lss_window: int = 11
    batch_size: int = 8
    seed: int = 0
    blocks_path: str | None = None
    svd_oversample: int = 10
    svd_iters: int = 4
    svd_tol: float | None = 1e-3
    figure_window: tuple[int, int] | None = None
    figure_prompts: int = 1
    chunk_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "coupling", tuple(_as_tuple(self.coupling)))
        set_(self, "k", tuple(sorted({int(v) for v in _as_tuple(self.k)})))
        set_(self, "tokens", parse_tokens(self.tokens))
        set_(self, "p", tuple(float(v) for v in _as_tuple(self.p)))
        set_(self, "variants", tuple(_as_tuple(self.variants)))
        set_(self, "orientations", tuple(_as_tuple(self.orientations)))
        set_(self, "layers", parse_layers(self.layers))
        set_(self, "method", str(self.method).replace("-", "_"))
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise BlockCouplingError(
                    f"dtype={self.dtype!r}: the analysis runs in float32 or float64"
                )
            set_(self, "dtype", DTYPES[self.dtype])
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        def bad(msg: str) -> None:
            raise BlockCouplingError(msg)

        for kind in self.coupling:
            if kind not in KINDS:
                bad(f"coupling kind {kind!r} is unknown; choose from {', '.join(KINDS)}")
        if not self.k or min(self.k) < 1:
            bad(f"k={self.k}: give one or more positive top-K sizes, e.g. 10,30,50")
        for v in self.variants:
            if v not in VARIANTS:
                bad(f"variant {v!r} is unknown; choose from {', '.join(VARIANTS)}")
        for o in self.orientations:
            if o not in ORIENTATIONS:
                bad(f"orientation {o!r} is unknown; choose from {', '.join(ORIENTATIONS)}")
        for p in self.p:
            if p not in VALID_P:
                bad(f"p={p}: the normalising norm is p = 1, 2 or inf")
        if self.method not in METHODS:
            bad(f"method={self.method!r}: choose auto, dense or matrix-free")
        if self.dtype not in (torch.float32, torch.float64):
            bad(f"dtype={self.dtype}: the analysis runs in torch.float32 or torch.float64")
        if self.layer_pairs not in ("same", "all"):
            bad(f"layer_pairs={self.layer_pairs!r}: use 'same' (l = l') or 'all'")
        if self.batch_size < 1:
            bad("batch_size must be at least 1")
        if self.lss_window < 3 or self.lss_window % 2 == 0:
            bad(f"lss_window={self.lss_window}: the window is centred, so give an odd width >= 3 "
                "(the paper uses 11)")
        if self.layers is not None and (not self.layers or min(self.layers) < 1):
            bad(f"layers={self.layers}: layers are numbered from 1 (layer l = block l)")

    def check_model(self, num_layers: int, hidden_size: int) -> None:
        """Checks that depend on the model: K <= d and layers within 1..L."""
        if max(self.k) > hidden_size:
            raise BlockCouplingError(
                f"k={max(self.k)} is larger than the model's hidden size d={hidden_size}; "
                f"choose K <= {hidden_size} (the paper uses K = d/10 = {max(1, round(hidden_size / 10))})"
            )
        if self.layers is not None and max(self.layers) > num_layers:
            raise BlockCouplingError(
                f"layers={self.layers[0]}..{self.layers[-1]} goes past the model's {num_layers} "
                f"blocks; layers are numbered 1..{num_layers}"
            )

    def selected_layers(self, num_layers: int) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(1, num_layers + 1))

    @property
    def k_max(self) -> int:
        return max(self.k)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        out["p"] = [("inf" if math.isinf(p) else p) for p in self.p]
        out["tokens"] = self.tokens if isinstance(self.tokens, str) else list(self.tokens)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasureConfig:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if "p" in data:
            data["p"] = tuple(math.inf if v in ("inf", "Infinity") else float(v) for v in data["p"])
        for key in ("k", "coupling", "variants", "orientations"):
            if key in data and isinstance(data[key], list):
                data[key] = tuple(data[key])
        if isinstance(data.get("tokens"), list):
            data["tokens"] = tuple(data["tokens"])
        if isinstance(data.get("layers"), list):
            data["layers"] = tuple(data["layers"])
        if isinstance(data.get("figure_window"), list):
            data["figure_window"] = tuple(data["figure_window"])
        return cls(**data)

    def replace(self, **changes: Any) -> MeasureConfig:
        return replace(self, **changes)
