"""A coupling variant is one record (engine/variants.py): every list the package keeps is built
from it, and a half-declared variant fails here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from blockcoupling.engine import names, variants
from blockcoupling.engine.metrics import (
    all_coupling_values,
    coupling_matrix,
    coupling_values,
    reported_p,
    variant_p_pairs,
)
from blockcoupling.engine.statistic import StatisticRule
from blockcoupling.engine.variants import REGISTRY, Variant
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.summaries.common import HIGHER_IS_COUPLED
from blockcoupling.store import schema

F64 = torch.float64
DOCS = Path(__file__).resolve().parents[1] / "docs"


# ---------------------------------------------------------------- one record, every list
def test_every_list_is_built_from_the_records() -> None:
    assert names.VARIANTS == tuple(REGISTRY)
    assert set(HIGHER_IS_COUPLED) == set(REGISTRY)
    assert set(schema.VARIANTS) == set(REGISTRY)
    assert set(names.P_VARIANTS) | set(names.FIXED_P) == set(REGISTRY)
    assert not set(names.P_VARIANTS) & set(names.FIXED_P)
    for name, v in REGISTRY.items():
        assert v.name == name
        assert HIGHER_IS_COUPLED[name] is v.higher_is_coupled
        assert schema.VARIANTS[name].startswith(v.direction)
        assert (name in names.NULL_VARIANTS) == (v.null is not None)
        StatisticRule(variant=name)  # the headline rule knows it


def test_every_variant_is_documented_in_the_conventions() -> None:
    text = (DOCS / "conventions.md").read_text(encoding="utf-8")
    for name in REGISTRY:
        assert f"`{name}`" in text, f"docs/conventions.md does not define {name}"


def _inputs(J1: torch.Tensor, U2: torch.Tensor, V2: torch.Tensor) -> dict:
    return {"fro2": (J1 ** 2).sum(), "d": J1.shape[-1]}


def test_no_requested_variant_is_dropped() -> None:
    """all_coupling_values answers every (variant, p, k) it is asked for, or raises."""
    g = torch.Generator().manual_seed(0)
    J1, J2 = torch.randn(2, 9, 9, generator=g, dtype=F64)
    U, _, Vh = torch.linalg.svd(J2)
    U2, V2 = U[:, :5], Vh[:5].mT
    s1 = torch.linalg.svdvals(J1)
    A = coupling_matrix(J1, U2, V2)
    got = all_coupling_values(A, s1, (1, 3, 5), names.VARIANTS, ps=(1, 2, "inf"),
                              **_inputs(J1, U2, V2))
    want = {(v, p, k) for v, p in variant_p_pairs(names.VARIANTS, (1, 2, math.inf))
            for k in (1, 3, 5)}
    assert set(got) == want
    for v in names.VARIANTS:  # the single-K function gives the same numbers
        single = coupling_values(A, s1, 3, v, reported_p(v), **_inputs(J1, U2, V2))
        assert float(single) == pytest.approx(float(got[(v, reported_p(v), 3)]), rel=1e-12)
    with pytest.raises(BlockCouplingError, match="coupling_vs_null.*needs.*fro2"):
        all_coupling_values(A, s1, (2,), ("coupling_vs_null",))


def test_a_half_declared_variant_is_refused() -> None:
    def f(parts: variants.Parts, p: float) -> torch.Tensor:
        return parts.signed_num

    Variant("ok_variant", f, True, None, "a test variant")
    for kwargs, what in (({"formula": None}, "a formula"),
                         ({"higher_is_coupled": None}, "a direction"),
                         ({"p": "sometimes"}, "a p rule"),
                         ({"meaning": " "}, "a schema meaning"),
                         ({"needs": ("fro3",)}, "inputs among")):
        args = {"name": "half", "formula": f, "higher_is_coupled": True, "p": None,
                "meaning": "m", **kwargs}
        with pytest.raises(BlockCouplingError, match=what):
            Variant(**args)
