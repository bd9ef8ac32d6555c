"""End to end: every number measure() puts in its tables against a float64 oracle.

The oracle is written here, independently of the package: its own hooks record each block's
call, ``torch.autograd.functional.jacobian`` gives the dense block Jacobians, ``numpy.linalg.svd``
their SVDs, and the coupling formulas of DEFINITIONS.md are spelled out with explicit loops.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.engine.blocks import find_blocks, get_module
from tests.helpers.oracles import (
    assert_pca_matches,
    check_coupling_table,
    check_diagnostics,
    oracle_calls,
    oracle_jacobians,
)
from tests.helpers.tiny_models import tiny_inputs, tiny_model


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert", "vit"])
def test_every_coupling_kind_matches_oracle(arch: str) -> None:
    model = tiny_model(arch, dtype=torch.float64)
    inputs = tiny_inputs(arch, n=4)
    Js, _ = oracle_jacobians(model, inputs)
    m = bc.measure(model, None, inputs, coupling=("depth", "self", "fixed_input", "fixed_output"),
                   k=(2, 5), tokens="all", p=(1, 2, "inf"), dtype=torch.float64,
                   layer_pairs="all", progress=False)
    kinds = set(m.coupling["kind"])
    assert kinds == {"depth", "self", "fixed_input", "fixed_output"}
    assert set(m.coupling["variant"]) == set(bc.VARIANTS)
    assert check_coupling_table(m.coupling, Js) == len(m.coupling) > 1000
    assert check_diagnostics(m.diagnostics, Js, 2) == len(m.diagnostics) > 10
    # the diagonal of depth-wise coupling is exactly 1 (c_K(J, J) = 1)
    diag = m.coupling.query(
        "kind == 'depth' and layer_a == layer_b and variant == 'coupling' and orientation == 'ujv'")
    np.testing.assert_allclose(diag["value"], 1.0, atol=1e-10)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_fixed_input_at_one_token_uses_jvps_and_matches_oracle(arch: str) -> None:
    """One input token and every output token: the JVP batch path of the dense Jacobians
    (GPT-2 without its fast path, which builds them from the block's structure instead:
    tests/engine/test_structured.py)."""
    model = tiny_model(arch, dtype=torch.float64)
    inputs = tiny_inputs(arch, n=4)
    Js, _ = oracle_jacobians(model, inputs)
    m = bc.measure(model, None, inputs, coupling=("fixed_input",), k=(3,), tokens=(0,),
                   dtype=torch.float64, spectra=False, fast_path=False, progress=False)
    assert set(m.diagnostics["method"]) == {"dense"}
    assert set(m.coupling["token_in_a"]) == {0} and m.coupling["token_out_a"].nunique() == 4
    assert check_coupling_table(m.coupling, Js) == len(m.coupling) > 0


def _trajectory_on(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """``where="states"``: the trajectory tables from the capture's own states, the path a
    GPU takes (engine/tables.py, `_trajectory_device`), here on the CPU."""
    from blockcoupling.engine import tables

    if where == "states":
        monkeypatch.setattr(tables, "_trajectory_device",
                            lambda cap, n_tokens: cap.device_states())


TRAJECTORY_ON = pytest.mark.parametrize("where", ["boundaries", "states"],
                                        ids=["cpu-boundaries", "gpu-states"])


@TRAJECTORY_ON
def test_trajectory_spectra_influence_match_oracle(monkeypatch: pytest.MonkeyPatch,
                                                   where: str) -> None:
    _trajectory_on(monkeypatch, where)
    model = tiny_model("gpt_neox", dtype=torch.float64)
    inputs = tiny_inputs("gpt_neox", n=5)
    Js, X = oracle_jacobians(model, inputs)
    m = bc.measure(model, None, inputs, coupling=("depth",), k=(3,), tokens="last",
                   dtype=torch.float64, influence=True, progress=False)
    L, n = X.shape[0] - 1, X.shape[1]
    traj = m.trajectory.sort_values(["token", "layer"])
    norms = np.linalg.norm(X, axis=-1)  # (L+1, n)
    np.testing.assert_allclose(traj["norm"].to_numpy(), norms.T.ravel(), rtol=1e-10)
    steps = np.linalg.norm(np.diff(X, axis=0), axis=-1)  # (L, n)
    got = traj[traj["layer"] > 0]["step_norm"].to_numpy()
    np.testing.assert_allclose(got, steps.T.ravel(), rtol=1e-10)
    # LSS and expodistance straight from the definitions
    tm = m.token_metrics.sort_values("token")
    for i in range(n):
        y = X[0, i].copy()
        for layer in range(1, L + 1):
            step = X[layer, i] - X[layer - 1, i]
            y = y + step / np.linalg.norm(step)
        lss = L / np.linalg.norm(y - X[0, i])
        alpha = np.log(norms[1:, i] / norms[:-1, i])
        ed = np.var(alpha) / np.mean(alpha) ** 2
        assert tm.iloc[i]["lss"] == pytest.approx(lss, rel=1e-9)
        assert tm.iloc[i]["expodistance"] == pytest.approx(ed, rel=1e-6)
    # spectra: top singular values of J^l_tt at the last token
    t = n - 1
    for layer in range(1, L + 1):
        s = np.linalg.svd(Js[layer - 1][t, t], compute_uv=False)[:3]
        got = m.spectra.query(f"layer == {layer}").sort_values("rank")["singular_value"]
        np.testing.assert_allclose(got.to_numpy(), s, rtol=1e-9)
    # influence of every input token on the last token
    for layer in range(1, L + 1):
        for j in range(n):
            s = np.linalg.svd(Js[layer - 1][t, j], compute_uv=False)
            rows = m.influence.query(f"layer == {layer} and token_in == {j}").set_index("metric")["value"]
            assert rows["frobenius"] == pytest.approx(np.linalg.norm(s), rel=1e-9, abs=1e-12)
            assert rows["spectral"] == pytest.approx(s[0], rel=1e-9, abs=1e-12)
            if s[0] > 1e-12:
                assert rows["participation_ratio"] == pytest.approx(s.sum() ** 2 / (s ** 2).sum(), rel=1e-8)
    # linearisation cosine: prod_l (I + J^l_tt) x^0_t against x^L_t
    v = X[0, t].copy()
    for layer in range(1, L + 1):
        v = v + Js[layer - 1][t, t] @ v
    cos = v @ X[L, t] / (np.linalg.norm(v) * np.linalg.norm(X[L, t]))
    got = m.token_metrics.query(f"token == {t}")["linearisation_cosine"].item()
    assert got == pytest.approx(cos, rel=1e-9)


@pytest.mark.parametrize("final_norm", [False, True])
def test_trajectory_tables_from_the_states_equal_those_from_the_boundaries(
        monkeypatch: pytest.MonkeyPatch, final_norm: bool) -> None:
    """A float32 model analysed in float64, prompts of lengths 5, 3, 5, 2 right-padded in
    one batch: the tables computed from the capture's states (a GPU's path) are the tables
    computed from the CPU boundaries, bit for bit; and each prompt's PCA (fitted in one
    batched SVD per length) is numpy's on that prompt's real tokens alone."""
    model = tiny_model("gpt2")
    ids = tiny_inputs("gpt2", n=5, batch=4)["input_ids"]
    mask = torch.ones_like(ids)
    for b, n in enumerate((5, 3, 5, 2)):
        mask[b, n:] = 0
    kw = dict(coupling=(), spectra=False, dtype=torch.float64, final_norm=final_norm,
              progress=False)
    inputs = {"input_ids": ids, "attention_mask": mask}
    ref = bc.measure(model, None, inputs, **kw)
    _trajectory_on(monkeypatch, "states")
    got = bc.measure(model, None, inputs, **kw)
    pd.testing.assert_frame_equal(got.trajectory, ref.trajectory)
    pd.testing.assert_frame_equal(got.token_metrics, ref.token_metrics)
    assert list(got.prompts["n_tokens"]) == [5, 3, 5, 2]
    from blockcoupling.engine.capture import capture

    cap = capture(model, inputs, find_blocks(model), final_norm=final_norm,
                  boundary_dtype=torch.float64)
    for b, (pid, n) in enumerate(zip(got.prompts["prompt_id"], (5, 3, 5, 2), strict=True)):
        X = cap.boundaries[:, b, :n].numpy()  # (L+1, n, d): the real tokens only
        L = X.shape[0] - 1
        rows = got.trajectory[got.trajectory["prompt_id"] == pid].sort_values(["layer", "token"])
        pca = rows[["pca_x", "pca_y"]].to_numpy().reshape(L + 1, n, 2)
        mu = X[L].mean(0)
        _, sv, Vt = np.linalg.svd(X[L] - mu)
        for c in range(2):
            if n < 3 and c == 1:  # two tokens span one direction: undefined, NaN
                assert np.isnan(pca[..., c]).all()
                continue
            assert_pca_matches(pca[..., c], (X - mu) @ Vt[c], atol=1e-9)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_float32_depth_coupling_on_the_gpus_top_k_route(monkeypatch: pytest.MonkeyPatch,
                                                        arch: str) -> None:
    """A float32 model (d = 128, two prompts): the depth-wise coupling with the Gram top-K's
    GPU route (subspace iteration first, engine/svd.py) forced on the CPU takes that route
    for every Jacobian and is within 1e-6 of the same measurement in float64, as the CPU's
    route is."""
    import collections

    import transformers as tf

    from blockcoupling.engine import svd

    torch.manual_seed(0)
    cfg = (tf.GPT2Config(n_layer=3, n_embd=128, n_head=4, vocab_size=100, n_positions=32,
                         bos_token_id=0, eos_token_id=0)
           if arch == "gpt2" else
           tf.LlamaConfig(num_hidden_layers=3, hidden_size=128, intermediate_size=256,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    model = tf.AutoModel.from_config(cfg).eval()
    inputs = {"input_ids": torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))}
    kw = dict(coupling=("depth",), k=(4, 8), progress=False)
    ref = bc.measure(model, None, inputs, dtype=torch.float64, **kw).coupling["value"]
    routes: collections.Counter[str] = collections.Counter()
    topk = svd.topk_svd

    def counted(J: torch.Tensor, k: int) -> svd.TopK:
        top = topk(J, k)
        routes[str(top.route)] += 1
        return top

    monkeypatch.setattr(svd, "topk_svd", counted)
    for iterate, route in ((False, "gram-eigh"), (True, "gram-iter")):
        monkeypatch.setattr(svd, "_iterate_first", lambda n, k, device, it=iterate: it)
        routes.clear()
        got = bc.measure(model, None, inputs, **kw).coupling["value"]
        assert routes == {route: 6}, routes
        np.testing.assert_allclose(got.to_numpy(), ref.to_numpy(), atol=1e-6)


def test_matrix_free_agrees_with_dense_within_tolerance() -> None:
    model = tiny_model("llama", dtype=torch.float64)
    inputs = tiny_inputs("llama", n=4)
    kw = dict(coupling=("depth",), k=(2, 4), dtype=torch.float64, progress=False,
              variants=("coupling",), svd_tol=1e-10, svd_iters=6)
    dense = bc.measure(model, None, inputs, method="dense", **kw).coupling
    free = bc.measure(model, None, inputs, method="matrix_free", **kw).coupling
    np.testing.assert_allclose(free["value"].to_numpy(), dense["value"].to_numpy(), atol=1e-6)


def test_matrix_free_isotropy_estimates_are_close_to_dense() -> None:
    """On the matrix-free path tr(J), tr(J^2) and ||J||_F^2 are Hutchinson estimates from
    the sketch's m Gaussian vectors (docs/conventions.md): the rotated-basis coupling and the
    isotropy diagnostics land near the dense values, not on them."""
    model = tiny_model("bert", dtype=torch.float64)  # post-LN: a large isotropic part
    inputs = tiny_inputs("bert", n=4)
    kw = dict(coupling=("depth",), k=(2, 4), dtype=torch.float64, progress=False,
              variants=("coupling_vs_null", "coupling_vs_rotated"), svd_tol=1e-10,
              svd_iters=6, remove_norm_directions=True)
    dense = bc.measure(model, None, inputs, method="dense", **kw)
    free = bc.measure(model, None, inputs, method="matrix_free", **kw)
    assert set(free.diagnostics["method"]) == {"matrix_free"}
    d, f = dense.diagnostics, free.diagnostics
    np.testing.assert_allclose(f["uv_overlap"], d["uv_overlap"], atol=1e-6)  # exact vectors
    assert (f["trace_over_d"] - d["trace_over_d"]).abs().max() < 0.1
    assert not np.allclose(f["trace_over_d"], d["trace_over_d"], atol=1e-9)  # an estimate
    rot = [m.coupling.query("variant == 'coupling_vs_rotated' and layer_a != layer_b")["value"]
           for m in (dense, free)]
    assert np.abs(rot[0].to_numpy() - rot[1].to_numpy()).max() < 0.1


def test_batched_mixed_lengths_equal_single_prompts() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + "the a cat dog sat on mat ran far".split())}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
    model = tiny_model("gpt2", dtype=torch.float64)
    prompts = ["the cat sat on the mat", "a dog ran", "the dog sat far"]
    kw = dict(coupling=("depth", "self"), k=(2,), tokens="all", dtype=torch.float64, progress=False)
    together = bc.measure(model, tok, prompts, batch_size=3, **kw)
    for i, text in enumerate(prompts):
        alone = bc.measure(model, tok, [(f"p{i:05d}", text)], batch_size=1, **kw)
        for name in ("coupling", "trajectory", "token_metrics", "spectra"):
            a = together.table(name).query(f"prompt_id == 'p{i:05d}'").reset_index(drop=True)
            b = alone.table(name).reset_index(drop=True)
            assert len(a) == len(b) > 0
            num = a.select_dtypes("number").columns
            np.testing.assert_allclose(a[num].to_numpy(float), b[num].to_numpy(float),
                                       atol=1e-9, equal_nan=True)
    assert together.prompts["n_tokens"].tolist() == [6, 3, 4]


def test_aggregates() -> None:
    model = tiny_model("gpt2", dtype=torch.float64)
    m = bc.measure(model, None, tiny_inputs("gpt2", n=3), k=(2,), dtype=torch.float64,
                   progress=False)
    dm = m.depth_matrix(k=2).to_numpy()
    L = dm.shape[0]
    assert m.mean_depth_coupling(2, diagonal=True) == pytest.approx(dm.mean())
    assert m.mean_depth_coupling(2) == pytest.approx(dm[~np.eye(L, dtype=bool)].mean())
    dist = m.coupling_by_distance(2)
    assert dist["distance"].tolist() == list(range(L))
    assert dist.loc[0, "mean"] == pytest.approx(1.0)
    key = f"A/{m.prompts.prompt_id[0]}/ujv"  # ready-made inputs: content-derived ids
    assert m.prompts.prompt_id[0].startswith("input-00000-")
    assert key in m.arrays and m.arrays[key].shape == (L, L, 2, 2)


def test_bad_input_errors() -> None:
    model = tiny_model("gpt2")
    with pytest.raises(bc.BlockCouplingError, match="larger than the model's hidden size"):
        bc.measure(model, None, tiny_inputs("gpt2"), k=(17,), progress=False)
    with pytest.raises(bc.BlockCouplingError, match="out of range"):
        bc.measure(model, None, tiny_inputs("gpt2", n=3), k=(2,), tokens=(7,), progress=False)
    with pytest.raises(bc.BlockCouplingError, match="empty"):
        bc.measure(model, object(), ["ok", "  "], k=(2,), progress=False)


def test_analysis_device_option_and_an_unavailable_device() -> None:
    """The analysis_device path gives the same numbers and leaves the model alone (only the
    CPU exists here: copying to a GPU is not exercised by this test)."""
    model = tiny_model("gpt2", dtype=torch.float64)
    inputs = tiny_inputs("gpt2", n=4)
    kw = dict(k=(2,), dtype=torch.float32, progress=False)
    here = bc.measure(model, None, inputs, **kw)
    streamed = bc.measure(model, None, inputs, analysis_device="cpu", **kw)
    np.testing.assert_array_equal(here.coupling["value"], streamed.coupling["value"])
    assert next(model.parameters()).dtype == torch.float64  # the user's model is untouched
    if not torch.cuda.is_available():
        with pytest.raises(bc.BlockCouplingError, match="no CUDA GPU is visible|built without cuda support"):
            bc.measure(model, None, inputs, analysis_device="cuda", **kw)


def test_too_long_prompt_is_refused() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "word": 2}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")
    model = tiny_model("gpt2")  # context of 32 positions
    with pytest.raises(bc.BlockCouplingError, match="40 tokens, more than the model's context of 32"):
        bc.measure(model, tok, ["word " * 40], k=(2,), progress=False)


@pytest.mark.parametrize("method", ["dense", "matrix_free"])
def test_fast_path_is_used_and_agrees_with_generic(method: str) -> None:
    model = tiny_model("gpt_neox", dtype=torch.float64)
    inputs = tiny_inputs("gpt_neox", n=5, batch=2)
    kw = dict(coupling=("depth", "self"), k=(2, 4), tokens="all", dtype=torch.float64,
              progress=False, method=method, svd_tol=1e-10, svd_iters=6)
    fast = bc.measure(model, None, inputs, **kw)
    slow = bc.measure(model, None, inputs, fast_path=False, **kw)
    assert set(fast.diagnostics["method"]) == {f"{method}_fast"}
    assert set(slow.diagnostics["method"]) == {method}
    np.testing.assert_allclose(fast.coupling["value"], slow.coupling["value"], atol=1e-7)
    # an encoder has no decode step: the generic path is used
    enc = bc.measure(tiny_model("bert", dtype=torch.float64), None, tiny_inputs("bert"), k=(2,),
                     dtype=torch.float64, progress=False)
    assert set(enc.diagnostics["method"]) == {"dense"}


def test_real_minilm_depth_coupling_and_trajectories_match_oracle() -> None:
    """The real pretrained all-MiniLM-L6-v2 (float32 weights), analysed in float64."""
    from transformers import AutoModel, AutoTokenizer

    from tests.helpers.tiny_models import minilm_path

    path = minilm_path()
    model = AutoModel.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    text = "What is the capital of France? The capital is"
    m = bc.measure(model, tok, [text], coupling=("depth",), k=(5, 38), tokens="last", dtype=torch.float64,
                   variants=("coupling", "coupling_vs_null", "coupling_vs_rotated",
                             "offdiag_ratio"), progress=False)
    inputs = dict(tok([text], return_tensors="pt"))
    calls, ins, outs = oracle_calls(model, inputs)
    blocks = get_module(model, find_blocks(model).blocks_path)
    n = ins[0].shape[1]
    t = n - 1
    Js = []
    for blk, (args, kwargs), x in zip(blocks, calls, ins, strict=True):
        blk64 = copy.deepcopy(blk).double()
        X = x[0].detach().double()
        kw = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v)
              for k, v in kwargs.items() if k != "hidden_states"}

        def g(xt, blk64=blk64, X=X, kw=kw, args=args):
            Xv = torch.cat([X[:t], xt[None], X[t + 1:]])
            out = blk64(Xv[None], *args[1:], **kw)
            out = out[0] if isinstance(out, tuple) else out
            return out[0, t] - xt

        J = torch.autograd.functional.jacobian(g, X[t], vectorize=True).numpy()  # J^l_tt
        Js.append({(t, t): J})
    assert check_coupling_table(m.coupling, Js) == len(m.coupling) == 6 * 6 * 2 * 2 * 4
    assert check_diagnostics(m.diagnostics, Js, 5) == 6
    # trajectories straight from the oracle's own boundaries (float32 model outputs)
    X = torch.stack([ins[0][0]] + [o[0] for o in outs]).double().numpy()  # (L+1, n, d)
    norms = np.linalg.norm(X, axis=-1)
    traj = m.trajectory.sort_values(["token", "layer"])
    np.testing.assert_allclose(traj["norm"].to_numpy(), norms.T.ravel(), rtol=1e-6)
    alpha = np.log(norms[1:] / norms[:-1])  # (L, n)
    ed = alpha.var(axis=0) / alpha.mean(axis=0) ** 2
    np.testing.assert_allclose(m.token_metrics.sort_values("token")["expodistance"], ed, rtol=1e-4)
    # a trained model is coupled across depth beyond the chance level
    null = m.coupling.query("variant == 'coupling_vs_null' and k == 5 and orientation == 'ujv' "
                            "and layer_a != layer_b")["value"]
    assert null.mean() > 0.1


def test_nan_in_a_jacobian_names_the_prompt_layer_and_tokens() -> None:
    class Block(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + torch.sqrt(h.abs())  # infinite derivative where h = 0

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for blk in self.layers:
                x = blk(x)
            return x

    x = torch.ones(1, 3, 4)
    x[0, 2, 1] = 0.0  # the last token's input to block 1 has a zero coordinate
    net = Net().eval()
    with pytest.raises(bc.NumericalError, match="prompt .input-00000-[0-9a-f]+., layer 1, token 2 -> 2"):
        bc.measure(net, None, {"x": x}, blocks_path="layers", k=(2,), progress=False,
                   fast_path=False)


def test_custom_module_with_blocks_path_measures() -> None:
    """Any nn.Module with a list of blocks: the hidden size is learnt from the capture."""
    from tests.helpers.tiny_models import EncoderStack

    torch.manual_seed(0)
    net = EncoderStack(3).double().eval()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    m = bc.measure(net, None, {"x": x}, blocks_path="layers", k=(2,), dtype=torch.float64,
                   progress=False)
    assert m.coupling["layer_a"].nunique() == 3
    diag = m.coupling.query("layer_a == layer_b and variant == 'coupling' and orientation == 'ujv'")
    np.testing.assert_allclose(diag["value"], 1.0, atol=1e-10)
    with pytest.raises(bc.BlockCouplingError, match="larger than the model's hidden size d=8"):
        bc.measure(net, None, {"x": x}, blocks_path="layers", k=(9,), progress=False)
