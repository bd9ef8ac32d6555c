"""The conformance matrix: every model family of tests/helpers/families.py, on the installed transformers.

Per family, a tiny random-weight model built from its HF config: ``find_blocks`` finds its
blocks, final norm and causality; depth-wise and token-wise (``self``) coupling of every
variant equal the independent float64 autograd oracle of tests/engine/test_measure.py (dense block
Jacobians by ``torch.autograd.functional.jacobian`` through hooks of its own, numpy SVDs, the
formulas spelled out) at the engine tests' tolerances; and every decoder's J^l_tt comes from
the decode-step fast path at every layer, with no fallback warning, unless the family lists
why it does not (then the recorded reason must be that one). The docs table
(docs/families.md) is generated from the same list.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
import transformers

import blockcoupling as bc
from blockcoupling.engine import fastrecord
from blockcoupling.engine.blocks import SUPPORTED_ARCHITECTURES, find_blocks
from tests.helpers.families import FAMILIES, Family, family_ids
from tests.helpers.oracles import check_coupling_table, oracle_jacobians

F64 = torch.float64


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    before = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("family", FAMILIES, ids=family_ids())
def test_family_conforms(family: Family) -> None:
    if not family.available():
        pytest.skip(f"transformers {transformers.__version__} has no {family.config} "
                    f"(since {family.since})")
    model = family.model(seed=1)
    spec = find_blocks(model)
    assert spec.arch == family.model_type and spec.arch in SUPPORTED_ARCHITECTURES
    assert spec.blocks_path in family.blocks.split("|"), spec
    assert spec.final_norm_path == family.final_norm, spec
    assert spec.causal is family.causal and spec.num_layers == 3, spec

    inputs = family.inputs(n=5 if family.causal else 4)
    experts = getattr(model.config, "_experts_implementation", None)  # MoE: grouped_mm default
    with warnings.catch_warnings(record=True) as caught, _default_dtype(
            F64 if family.needs_float64_default(transformers.__version__) else None):
        warnings.simplefilter("always")
        m = bc.measure(model, None, inputs, coupling=("depth", "self"), k=(2, 5),
                       tokens="all", dtype=F64, progress=False)
        assert getattr(model.config, "_experts_implementation", None) == experts  # put back
        if experts is not None:  # the oracle runs the experts' reference loop (float64 works)
            model.config._experts_implementation = "eager"
        Js, _ = oracle_jacobians(model, inputs, spec.blocks_path)
    assert set(m.coupling["kind"]) == {"depth", "self"}
    assert check_coupling_table(m.coupling, Js, tol=family.tol) == len(m.coupling) > 1000

    refused = [str(w.message) for w in caught if issubclass(w.category, fastrecord.FastPathWarning)]
    assert set(m.fast_path) == {1, 2, 3}
    if not family.causal:
        assert set(m.fast_path.values()) == {fastrecord.NOT_CAUSAL} and not refused
    elif (generic := family.expected_generic(transformers.__version__)) is None:
        assert refused == [], refused
        assert m.fast_path == {1: True, 2: True, 3: True}
        assert set(m.diagnostics["method"]) == {"dense_fast"}
    else:  # listed: refused, for the listed reason, and said once
        assert len(refused) == 1, refused
        assert all(generic in str(v) for v in m.fast_path.values()), m.fast_path


def test_families_cover_the_registry_and_the_paper() -> None:
    """Every architecture the registry names is in the matrix (or an alias of one that is),
    and every family of the paper's Table 1 has a row."""
    in_matrix = {f.model_type for f in FAMILIES}
    aliases = {"xlm-roberta": "roberta"}  # the same modules as a tested family
    assert set(SUPPORTED_ARCHITECTURES) - in_matrix <= set(aliases)
    paper = {f.model_type for f in FAMILIES if f.paper}
    assert paper == {"gpt2", "gpt_neo", "gpt_neox", "llama", "mistral", "falcon", "mpt", "phi",
                     "gemma"}
