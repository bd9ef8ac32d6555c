"""Structured (GEMM-assembled) decode-step Jacobians against float64 autodiff oracles."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as tf
from torch.func import jacrev

from blockcoupling.engine import fastpath, structured
from blockcoupling.engine.blocks import find_blocks
from blockcoupling.engine.capture import Capture, capture, residual_branch
from blockcoupling.engine.jacobian import jacobian_blocks
from tests.helpers.tiny_models import tiny_inputs, tiny_model

F64 = torch.float64
STRUCTURED = ("gpt2", "llama", "mistral", "qwen2")


def _cap(model: torch.nn.Module, arch: str, final_norm: bool) -> Capture:
    inputs = tiny_inputs(arch, n=6, batch=2, seed=1)
    inputs["attention_mask"] = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    return capture(model, inputs, find_blocks(model), final_norm=final_norm, boundary_dtype=F64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


@pytest.mark.parametrize("arch", STRUCTURED)
def test_structured_jacobian_equals_generic_oracle(arch: str) -> None:
    """GPT-2 in float64 against the float64 oracle; the Llama family (whose RMSNorm computes in
    float32 whatever the dtype, so the structured route is float32-only) in float32 against
    the float32 generic path."""
    dtype = F64 if arch == "gpt2" else torch.float32
    model = tiny_model(arch, seed=4, dtype=dtype)
    tol = 1e-12 if arch == "gpt2" else 2e-5
    for final_norm in (False, True):
        cap = _cap(model, arch, final_norm)
        for prompt in (0, 1):
            n = cap.lengths[prompt]
            layer = cap.n_layers if final_norm else 2
            f, x = residual_branch(model, cap, layer, prompt, dtype=dtype)
            tokens = [0, n // 2, n - 1]
            J_ref = jacobian_blocks(f, x, tokens, in_tokens=tokens)
            tbs = fastpath.token_branches(model, cap, layer, prompt, tokens, dtype=dtype, verify=False)
            assert tbs is not None
            for i, t in enumerate(tokens):
                assert tbs[t].structured, (arch, t)
                J = tbs[t].jacobian()
                assert tbs[t].structured  # it applied (no fallback to the pullback)
                assert _rel(J, J_ref[i, i]) < tol, (arch, final_norm, prompt, t)


def test_unknown_block_types_use_the_pullback() -> None:
    model = tiny_model("gpt_neox", seed=1, dtype=F64)
    cap = _cap(model, "gpt_neox", False)
    tb = fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64)
    assert tb is not None and not tb.structured
    f, x = residual_branch(model, cap, 1, 0, dtype=F64)
    assert _rel(tb.jacobian(), jacobian_blocks(f, x, [5], in_tokens=[5])[0, 0]) < 1e-12


def test_norm_jacobians_match_autodiff() -> None:
    torch.manual_seed(0)
    d = 12
    ln = torch.nn.LayerNorm(d, eps=1e-3).double()
    torch.nn.init.normal_(ln.weight)
    rms = tf.models.llama.modeling_llama.LlamaRMSNorm(d, eps=1e-3)
    torch.nn.init.normal_(rms.weight)
    for norm, dtype, tol in ((ln, F64, 1e-12), (rms, torch.float32, 1e-6)):
        x = (torch.randn(d, dtype=F64) * 3 + 1).to(dtype)
        got = structured.norm_jacobian(norm, x)
        assert got is not None
        val, J = got
        ref = jacrev(lambda v, norm=norm: norm(v[None])[0])(x)
        assert _rel(J.dense(), ref) < tol
        assert _rel(val, norm(x[None])[0]) < tol
        W, M = torch.randn(5, d, dtype=dtype), torch.randn(d, 4, dtype=dtype)
        assert _rel(J.right_of(W), W @ J.dense()) < tol
        assert _rel(J.left_of(M), J.dense() @ M) < tol
    x = torch.randn(d, dtype=F64)
    assert structured.norm_jacobian(torch.nn.Identity(), x) is None
    # the float32-internal RMSNorm in a float64 analysis: left to autodiff
    assert structured.norm_jacobian(rms.double(), x) is None


def test_an_output_that_differs_from_the_recorded_one_falls_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The structured forward must reproduce the recorded block output at t: with a wrong
    recorded output it declines (None), and the TokenBranch pulls back instead."""
    model = tiny_model("gpt2", seed=2, dtype=F64)
    cap = _cap(model, "gpt2", False)
    good = structured.decode_step_jacobian
    seen: list[bool] = []

    def shifted(block, norm, x, keys, values, t, row_kwargs, recorded, rtol):  # type: ignore[no-untyped-def]
        assert good(block, norm, x, keys, values, t, row_kwargs, recorded, rtol) is not None
        out = good(block, norm, x, keys, values, t, row_kwargs, recorded + 1.0, rtol)
        seen.append(out is None)
        return out

    monkeypatch.setattr(structured, "decode_step_jacobian", shifted)
    tb = fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64, verify=False)
    assert tb is not None and tb.structured
    J = tb.jacobian()
    assert seen == [True] and not tb.structured
    f, x = residual_branch(model, cap, 1, 0, dtype=F64)
    assert _rel(J, jacobian_blocks(f, x, [5], in_tokens=[5])[0, 0]) < 1e-12


def test_a_wrong_structured_jacobian_is_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("gpt2", seed=3, dtype=F64)
    cap = _cap(model, "gpt2", False)
    good = structured.decode_step_jacobian

    def wrong(*a: object, **kw: object) -> torch.Tensor | None:
        J = good(*a, **kw)  # type: ignore[arg-type]
        return None if J is None else J + 1e-3

    monkeypatch.setattr(structured, "decode_step_jacobian", wrong)
    with pytest.warns(UserWarning, match="structured Jacobian of layer 2"):
        tb = fastpath.token_branch(model, cap, 2, 0, 5, dtype=F64)
    assert tb is not None and not tb.structured  # the fast path itself stays on
    f, x = residual_branch(model, cap, 2, 0, dtype=F64)
    J_ref = jacobian_blocks(f, x, [5], in_tokens=[5])[0, 0]
    assert _rel(tb.jacobian(), J_ref) < 1e-12
    # later, unverified builds of that block (later prompts) no longer use it either
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        later = fastpath.token_branch(model, cap, 2, 1, 3, dtype=F64, verify=False)
    assert later is not None and not later.structured
    # other blocks still do
    other = fastpath.token_branch(model, cap, 1, 0, 5, dtype=F64, verify=False)
    assert other is not None and other.structured


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_auto_takes_the_structured_dense_j_where_it_would_go_matrix_free(
        arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under method="auto" a width that would choose matrix-free (d >= 2048; forced here on a
    tiny model) uses the structured dense J on the CPU instead of randomized products and a
    dense fallback: same numbers as method="dense", and every Jacobian says dense_fast."""
    from blockcoupling.engine import measure as measure_mod

    model = tiny_model(arch, seed=3)
    inputs = tiny_inputs(arch, n=6, batch=2, seed=2)
    kw = dict(coupling=("depth",), k=(2, 4), tokens="last", progress=False)
    dense = measure_mod.measure(model, None, inputs, method="dense", **kw)
    real = measure_mod.choose_method
    monkeypatch.setattr(measure_mod, "choose_method",
                        lambda cfg, d: "matrix_free" if cfg.method == "auto" else real(cfg, d))
    auto = measure_mod.measure(model, None, inputs, method="auto", **kw)
    assert set(auto.diagnostics["method"]) == {"dense_fast"}
    a, b = auto.coupling["value"].to_numpy(), dense.coupling["value"].to_numpy()
    assert a.shape == b.shape and float(abs(a - b).max()) < 1e-6
    forced = measure_mod.measure(model, None, inputs, method="matrix_free", **kw)
    assert set(forced.diagnostics["method"]) == {"matrix_free_fast"}  # forcing still forces


def test_one_blas_thread_limits_openblas_and_restores() -> None:
    """The eigensolver's BLAS runs on one thread inside the block and as before after it."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import scipy.linalg  # noqa: F401

    from blockcoupling.engine.svd import one_blas_thread

    def counts() -> list[int]:
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["internal_api"] == "openblas"]

    before = counts()
    if not before:
        pytest.skip("no OpenBLAS loaded (scipy built against another BLAS)")
    with one_blas_thread():
        assert counts() == [1] * len(before)
        with one_blas_thread():  # nests
            assert counts() == [1] * len(before)
        assert counts() == [1] * len(before)
    assert counts() == before


@pytest.mark.parametrize("break_it", [False, True])
def test_forward_mode_check_is_skipped_only_where_the_structured_j_passed(
        break_it: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify_forward=False (dense-only callers): a structured J that passes its J^T V check
    spares the decode step's forward-mode check; one that fails is switched off and the
    decode step's J V is checked after all (it may then serve matrix-free products)."""
    model = tiny_model("gpt2", seed=5, dtype=F64)
    cap = _cap(model, "gpt2", False)
    if break_it:
        good = structured.decode_step_jacobian

        def wrong(*a: object, **kw: object) -> torch.Tensor | None:
            J = good(*a, **kw)  # type: ignore[arg-type]
            return None if J is None else J + 1e-3

        monkeypatch.setattr(structured, "decode_step_jacobian", wrong)
    calls: list[int] = []
    real_matmat = fastpath.TokenBranch.matmat

    def counting(self: fastpath.TokenBranch, V: torch.Tensor) -> torch.Tensor:
        calls.append(V.shape[1])
        return real_matmat(self, V)

    monkeypatch.setattr(fastpath.TokenBranch, "matmat", counting)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tbs = fastpath.token_branches(model, cap, 2, 0, [3, 5], dtype=F64, verify_forward=False)
    assert tbs is not None
    off = [w for w in seen if "structured Jacobian of layer 2" in str(w.message)]
    assert bool(off) == break_it
    assert all(tb.structured != break_it for tb in tbs.values())
    assert len(calls) == (2 if break_it else 0)  # one J V check per token, or none
    # with verify_forward=True the check always runs
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broken structured J of layer 1 is switched off too
        fastpath.token_branches(model, cap, 1, 0, [3], dtype=F64, verify_forward=True)
    assert len(calls) == 1


# ----------------------------------------------------------------------------- cross-token J_{s t}
def _all_cross(n: int) -> list[tuple[int, int]]:
    """Every (s, t) with s <= t: the cross-token blocks and the diagonal."""
    return [(s, t) for t in range(n) for s in range(t + 1)]


@pytest.mark.parametrize("arch", STRUCTURED)
def test_cross_token_jacobians_equal_generic_oracle(arch: str) -> None:
    """Every J_{s t}, s <= t, of both prompts (one padded), with and without a folded final
    norm, from one decode step per output token: GPT-2 in float64 against the float64
    oracle, the Llama family in float32 against the float32 generic path."""
    dtype = F64 if arch == "gpt2" else torch.float32
    model = tiny_model(arch, seed=4, dtype=dtype)
    tol = 1e-12 if arch == "gpt2" else 2e-5
    for final_norm in (False, True):
        cap = _cap(model, arch, final_norm)
        layer = cap.n_layers if final_norm else 2
        for prompt in (0, 1):
            n = cap.lengths[prompt]
            f, x = residual_branch(model, cap, layer, prompt, dtype=dtype)
            J_ref = jacobian_blocks(f, x, list(range(n)))  # (out, in, d, d)
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # verified, no complaint
                got = fastpath.token_jacobians(model, cap, layer, prompt, _all_cross(n),
                                               dtype=dtype)
            assert got is not None and set(got) == set(_all_cross(n))
            for (s, t), J in got.items():
                assert _rel(J, J_ref[t, s]) < tol, (arch, final_norm, prompt, s, t)


def test_cross_token_jacobians_decline_what_they_do_not_know() -> None:
    """None (the generic path) for an encoder, a block type the structure does not know, and
    a key above the diagonal (zero in a causal block: never asked for)."""
    gpt2 = tiny_model("gpt2", seed=1, dtype=F64)
    cap = _cap(gpt2, "gpt2", False)
    assert fastpath.token_jacobians(gpt2, cap, 1, 0, [(0, 2), (3, 2)], dtype=F64) is None
    assert fastpath.token_jacobians(gpt2, cap, 1, 0, [(0, 2), (2, 2)], dtype=F64) is not None
    for arch in ("gpt_neox", "bert"):
        model = tiny_model(arch, seed=1, dtype=F64)
        assert fastpath.token_jacobians(model, _cap(model, arch, False), 1, 0, [(0, 2)],
                                        dtype=F64) is None


def test_a_wrong_cross_token_jacobian_is_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A structured J_{s t} that disagrees with the generic path: a warning, None, and the
    block's structured route off from then on (also for its decode step)."""
    model = tiny_model("gpt2", seed=3, dtype=F64)
    cap = _cap(model, "gpt2", False)
    good = structured.OutputStep.cross

    def wrong(self: structured.OutputStep, *a: object, **kw: object) -> torch.Tensor | None:
        J = good(self, *a, **kw)  # type: ignore[arg-type]
        return None if J is None else J + 1e-3

    monkeypatch.setattr(structured.OutputStep, "cross", wrong)
    with pytest.warns(UserWarning, match="token Jacobians of layer 2 .* disagree"):
        assert fastpath.token_jacobians(model, cap, 2, 0, [(0, 5), (3, 5)], dtype=F64) is None
    monkeypatch.setattr(structured.OutputStep, "cross", good)
    assert fastpath.token_jacobians(model, cap, 2, 1, [(0, 3)], dtype=F64, verify=False) is None
    tb = fastpath.token_branch(model, cap, 2, 1, 3, dtype=F64, verify=False)
    assert tb is not None and not tb.structured
    assert fastpath.token_jacobians(model, cap, 1, 0, [(0, 5)], dtype=F64) is not None


@pytest.mark.parametrize("kind,tokens", [("fixed_output", "last"), ("fixed_input", (0,))])
def test_token_wise_kinds_take_the_structured_route(kind: str, tokens: object) -> None:
    """measure(): every Jacobian of fixed_output / fixed_input (and the influence) of GPT-2
    comes from the block's structure (``dense_fast``), with the values of the generic path
    (``fast_path=False``: VJP / JVP batches) to float64 rounding."""
    import blockcoupling as bc

    model = tiny_model("gpt2", seed=6, dtype=F64)
    inputs = tiny_inputs("gpt2", n=6, batch=2, seed=3)
    inputs["attention_mask"] = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    kw = dict(coupling=(kind,), k=(2, 4), tokens=tokens, dtype=F64, influence=True,
              final_norm=True, layer_pairs="all", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fast = bc.measure(model, None, inputs, **kw)
    slow = bc.measure(model, None, inputs, fast_path=False, **kw)
    assert set(fast.diagnostics["method"]) == {"dense_fast"}
    assert set(slow.diagnostics["method"]) == {"dense"}
    # per layer 6 + 5 Jacobians (the padded prompt has 5 tokens), one of each a J_tt
    assert len(fast.diagnostics) == model.config.n_layer * (6 + 5)
    for table in ("coupling", "influence", "spectra"):
        a, b = getattr(fast, table), getattr(slow, table)
        assert len(a) == len(b) > 0
        assert float(abs(a["value" if table != "spectra" else "singular_value"].to_numpy()
                         - b["value" if table != "spectra" else "singular_value"].to_numpy()
                         ).max()) < 1e-10, table
    # a forced matrix-free analysis stays matrix-free; its influence (always dense) still
    # takes the structured J
    mf = bc.measure(model, None, inputs, method="matrix_free", **kw)
    assert {m.split("_fast")[0] for m in mf.diagnostics["method"]} == {"matrix_free"}
    assert float(abs(mf.influence["value"].to_numpy()
                     - slow.influence["value"].to_numpy()).max()) < 1e-10
