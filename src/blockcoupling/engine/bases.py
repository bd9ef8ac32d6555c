"""Stored top-K bases: the U, S, V of every measured Jacobian, kept when ``save_bases=True``.

The engine computes the top-K_max SVD of each measured Jacobian J^l_{t_in t_out} anyway
(``engine/svd.py``); with ``save_bases`` it keeps them instead of throwing them away: per
prompt, layer and measured token pair, ``U (d, K)``, ``S (K,)``, ``V (d, K)`` in the analysis
dtype (float32, or float64 where the analysis runs in it), ``K = max(k)``, of the Jacobian the
coupling used (with ``remove_norm_directions`` the projected ``Q_N J``).

A source of bases is anything with `BasisSource`'s two methods: `InMemoryBases`
(what `measure` returns) or the run store's reader (``store/bases.py``, lazily and
checksum-verified from the run directory). `select` is the one rule that turns
``(prompt_id, layer, token_in=None, token_out=None)`` into a stored key. Pure: no files here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from blockcoupling.errors import BlockCouplingError

BasisKey = tuple[str, int, int, int]  # (prompt_id, layer, token_in, token_out)
Factors = dict[str, Tensor]  # "U" (d, K), "S" (K,), "V" (d, K) (save_bases); "J" (d, d)
PARTS = ("U", "S", "V")
JACOBIAN = "J"  # save_jacobians: the Jacobian itself (d, d), rows = output coordinates
_SEP = "|"


class BasisSource(Protocol):
    """Where a [`Measurement`][blockcoupling.engine.results.Measurement]'s stored factors (bases, Jacobians) come from."""

    def keys(self, prompt_id: str | None = None) -> list[BasisKey]: ...  # in measured order

    def load(self, key: BasisKey) -> Factors: ...


def tensor_name(key: BasisKey, part: str) -> str:
    """``"{prompt_id}|{layer}|{token_in}|{token_out}|{U,S,V}"``: the tensor's name in a file
    (parsed from the right, so a prompt id may hold the separator)."""
    pid, layer, t_in, t_out = key
    return _SEP.join((pid, str(layer), str(t_in), str(t_out), part))


def parse_name(name: str) -> tuple[BasisKey, str]:
    pid, layer, t_in, t_out, part = name.rsplit(_SEP, 4)
    return (pid, int(layer), int(t_in), int(t_out)), part


def flatten(bases: Mapping[BasisKey, Factors]) -> dict[str, Tensor]:
    """Named, contiguous CPU tensors (``tensor_name``) for a file."""
    return {tensor_name(key, part): t.detach().cpu().contiguous()
            for key, fac in bases.items() for part, t in fac.items()}


def unflatten(tensors: Mapping[str, Tensor]) -> dict[BasisKey, Factors]:
    """The inverse of `flatten` (keys in sorted order of layer and tokens)."""
    by_key: dict[BasisKey, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        key, part = parse_name(name)
        by_key.setdefault(key, {})[part] = t
    return {key: by_key[key] for key in sorted(by_key, key=lambda k: (k[1], k[2], k[3]))}


class InMemoryBases:
    """Bases held in memory: ``{(prompt_id, layer, token_in, token_out): (U, S, V)}``."""

    def __init__(self, bases: Mapping[BasisKey, Factors] | None = None) -> None:
        self.data: dict[BasisKey, Factors] = dict(bases or {})

    def keys(self, prompt_id: str | None = None) -> list[BasisKey]:
        return [k for k in self.data if prompt_id is None or k[0] == prompt_id]

    def load(self, key: BasisKey) -> Factors:
        return self.data[key]

    @classmethod
    def merge(cls, sources: Sequence[BasisSource | None]) -> InMemoryBases | None:
        """One source holding every factor of ``sources`` (None where none has any)."""
        present = [s for s in sources if s is not None]
        if not present:
            return None
        return cls({k: s.load(k) for s in present for k in s.keys()})


def select(source: BasisSource | None, prompt_id: str, layer: int, token_in: int | None,
           token_out: int | None, n_tokens: int | None) -> BasisKey:
    """The stored key that ``(prompt_id, layer, token_in, token_out)`` names.

    ``token_out=None`` and ``token_in=None``: the layer's one diagonal Jacobian J_tt (an
    error listing the choices if there are several); only one of them given: the diagonal
    one at that token. Negative tokens count from the end of the prompt (``n_tokens``)."""
    if source is None:
        raise BlockCouplingError(
            "this measurement has no stored bases; measure with save_bases=True "
            "(CLI: --save-bases)")
    keys = [k for k in source.keys(prompt_id) if k[1] == int(layer)]
    if not keys:
        have = sorted({k[1] for k in source.keys(prompt_id)})
        if not have:
            raise BlockCouplingError(f"no stored bases for prompt {prompt_id!r}")
        raise BlockCouplingError(
            f"no stored bases at layer {layer} of prompt {prompt_id!r}; stored layers: "
            f"{', '.join(map(str, have))}")

    def absolute(t: int | None) -> int | None:
        return t + n_tokens if t is not None and t < 0 and n_tokens is not None else t

    t_in, t_out = absolute(token_in), absolute(token_out)
    if t_in is None and t_out is None:
        diag = [k for k in keys if k[2] == k[3]]
        if len(diag) == 1:
            return diag[0]
    else:
        t_in = t_out if t_in is None else t_in
        t_out = t_in if t_out is None else t_out
        if (prompt_id, int(layer), t_in, t_out) in keys:
            return (prompt_id, int(layer), int(t_in), int(t_out))  # type: ignore[arg-type]
    pairs = ", ".join(f"({k[2]}, {k[3]})" for k in keys[:12]) + (" ..." if len(keys) > 12 else "")
    raise BlockCouplingError(
        f"prompt {prompt_id!r}, layer {layer}: give token_in/token_out; the stored (token_in, "
        f"token_out) pairs are {pairs}")


def factors(source: BasisSource | None, key: BasisKey, parts: Sequence[str]
            ) -> tuple[Tensor, ...]:
    """The stored ``parts`` (e.g. U, S, V) of ``key``; a clear error where they were not kept."""
    got = source.load(key) if source is not None else {}
    missing = [p for p in parts if p not in got]
    if missing:
        option = "save_jacobians=True (CLI: --save-jacobians)" if JACOBIAN in missing else (
            "save_bases=True (CLI: --save-bases)")
        raise BlockCouplingError(f"{key}: {', '.join(missing)} not stored; measure with {option}")
    return tuple(got[p] for p in parts)


def iterate(source: BasisSource | None, prompt_ids: Sequence[str],
            parts: Sequence[str] = PARTS) -> Iterator[tuple[BasisKey, tuple[Tensor, ...]]]:
    """Every stored ``(key, (U, S, V))`` (or the ``parts`` asked for), prompt by prompt in
    ``prompt_ids`` order."""
    if source is None:
        select(source, "", 0, None, None, None)  # raises the "no stored bases" error
    assert source is not None
    for pid in prompt_ids:
        for key in source.keys(pid):
            yield key, factors(source, key, parts)


def estimate_bytes(n_jacobians: int, d: int, k: int, dtype: torch.dtype) -> int:
    """Bytes of the stored bases of ``n_jacobians`` Jacobians: U and V (d, K) and S (K,)."""
    itemsize = torch.finfo(dtype).bits // 8
    return int(n_jacobians) * (2 * d * k + k) * itemsize


def keep(measured: Mapping[tuple[int, int, int], Any], prompt_id: str, dtype: torch.dtype,
         *, save_bases: bool, save_jacobians: bool) -> InMemoryBases | None:
    """What a prompt keeps of its measured Jacobians (``measure._Measured``): the top-K
    factors (``save_bases``) and the dense Jacobians (``save_jacobians``), as CPU tensors in
    the analysis ``dtype``; None if neither is asked for."""
    if not (save_bases or save_jacobians):
        return None
    out: dict[BasisKey, Factors] = {}
    for (layer, t_in, t_out), m in sorted(measured.items()):
        fac: Factors = {}
        if save_bases:
            fac.update(U=m.top.U, S=m.top.S, V=m.top.V)
        if save_jacobians:
            if m.dense is None:
                raise BlockCouplingError(
                    f"save_jacobians: J^{layer}_({t_in},{t_out}) was computed matrix-free, so "
                    "there is no dense Jacobian to store; measure with method='dense'")
            fac[JACOBIAN] = m.dense
        out[(prompt_id, layer, t_in, t_out)] = {
            k: t.detach().to("cpu", dtype).contiguous() for k, t in fac.items()}
    return InMemoryBases(out)


#: save_jacobians refuses runs whose stored Jacobians would exceed this many bytes unless
#: forced (``force_size=True``, CLI ``--force-size``)
JACOBIANS_LIMIT_BYTES: int = 2 << 30


def jacobian_bytes(n_jacobians: int, d: int, dtype: torch.dtype) -> int:
    """Bytes of ``n_jacobians`` stored (d, d) Jacobians."""
    return int(n_jacobians) * d * d * (torch.finfo(dtype).bits // 8)


__all__ = ["BasisKey", "BasisSource", "Factors", "InMemoryBases", "estimate_bytes", "flatten",
           "iterate", "keep", "select", "unflatten"]
