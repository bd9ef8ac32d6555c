"""The engine's public observability and precision contracts: events, method choice, the
expodistance guard at the model's precision, coupling_vs_null stored once."""

from __future__ import annotations

import math

import torch

import blockcoupling as bc
from blockcoupling.engine import metrics, spectra
from blockcoupling.engine.events import PHASES, MeasureEvent
from tests.helpers.tiny_models import tiny_model

IDS = {"input_ids": torch.tensor([[3, 1, 4, 1, 5, 9]])}


def test_events_report_every_phase_with_methods() -> None:
    events: list[MeasureEvent] = []
    m = bc.measure(tiny_model("bert"), None, IDS, k=(2,), coupling=("depth", "self"),
                   influence=True, progress=False, on_event=events.append)
    phases = {e.phase for e in events}
    assert phases == set(PHASES)
    pid = m.prompts.prompt_id[0]
    svd = [e for e in events if e.phase == "svd"]
    # one svd event per measured Jacobian, with the method the diagnostics table shows
    assert len(svd) == len(m.diagnostics)
    assert sorted(e.method for e in svd) == sorted(m.diagnostics.method)
    assert all(e.prompt_id == pid and e.seconds >= 0 for e in events
               if e.phase not in ("capture", "trajectory"))
    assert [e.prompt_ids for e in events if e.phase == "capture"] == [(pid,)]
    assert {e.layer for e in events if e.phase == "coupling"} == {1, 2, 3}


def test_method_can_be_forced_and_is_visible() -> None:
    m = bc.measure(tiny_model("bert"), None, IDS, k=(2,), method="matrix-free", svd_tol=None,
                   progress=False)
    assert set(m.diagnostics.method) == {"matrix_free"}
    m = bc.measure(tiny_model("bert"), None, IDS, k=(2,), method="dense", progress=False)
    assert set(m.diagnostics.method) == {"dense"}


def test_expodistance_guard_uses_the_models_precision() -> None:
    # post-LN BERT: every boundary is LayerNorm'd, so the norms change only by float32
    # rounding; analysed in float64 that is still no growth rate -> NaN, not a ratio of noise
    model = tiny_model("bert")
    m = bc.measure(model, None, IDS, k=(2,), coupling=(), spectra=False, dtype=torch.float64,
                   progress=False)
    assert m.token_metrics.expodistance.isna().all()
    # a float64 model analysed in float64 resolves those changes: finite values
    m64 = bc.measure(tiny_model("bert", dtype=torch.float64), None, IDS, k=(2,), coupling=(),
                     spectra=False, dtype=torch.float64, progress=False)
    norms = m64.trajectory.groupby("token")["norm"].agg(lambda v: v.max() / v.min() - 1)
    assert (norms < 1e-6).all()  # the premise: the norms only change by rounding


def test_coupling_vs_null_is_stored_once_without_p() -> None:
    m = bc.measure(tiny_model("gpt2"), None, IDS, k=(2, 4), p=(1, 2, math.inf),
                   coupling=("depth",), progress=False)
    null = m.coupling[m.coupling.variant == "coupling_vs_null"]
    coup = m.coupling[(m.coupling.variant == "coupling") & (m.coupling.p == 1)]
    assert null.p.isna().all() and len(null) == len(coup)
    # and it does not depend on p
    A = torch.randn(3, 4, 4, dtype=torch.float64)
    s = torch.rand(3, 4, dtype=torch.float64).sort(descending=True).values
    vals = [metrics.coupling_values(A, s, 3, "coupling_vs_null", p, fro2=s.square().sum(-1) * 2,
                                    d=8) for p in (1, 2, math.inf)]
    torch.testing.assert_close(vals[0], vals[1])
    torch.testing.assert_close(vals[0], vals[2])
    assert metrics.reported_p("coupling_vs_null", 2) is None


def test_coupling_matrix_of_an_operator_equals_the_dense_one() -> None:
    g = torch.Generator().manual_seed(0)
    J = torch.randn(6, 6, generator=g, dtype=torch.float64)
    U = torch.linalg.qr(torch.randn(3, 6, 2, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(3, 6, 2, generator=g, dtype=torch.float64)).Q
    for orient in ("ujv", "vju"):
        torch.testing.assert_close(metrics.coupling_matrix(lambda X: J @ X, U, V, orient),
                                   metrics.coupling_matrix(J, U, V, orient))
    x0, xL = torch.randn(2, 6, generator=g, dtype=torch.float64).unbind()
    Js = [J / 10, J.T / 10]
    ops = (lambda v, M=M: v @ M.T for M in Js)  # a generator of operators, consumed once
    torch.testing.assert_close(spectra.linearisation_cosine(ops, x0, xL),
                               spectra.linearisation_cosine(Js, x0, xL))
