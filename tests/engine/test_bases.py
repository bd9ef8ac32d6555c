"""Stored top-K bases (save_bases=True): against an independent float64 autograd oracle, through
the run store (resume bit-identical, tampering detected, disk estimated first)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import blockcoupling as bc
from blockcoupling.engine.inputs import normalise_inputs
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store.writer import RunWriter
from tests.helpers.oracles import oracle_jacobians
from tests.helpers.tiny_models import tiny_inputs, tiny_model

K = 4


def _principal_cosines(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Cosines of the principal angles between the column spaces of orthonormal A, B (d, K)."""
    return np.linalg.svd(A.T @ B, compute_uv=False)


def check_against_oracle(m: bc.Measurement, model: torch.nn.Module, inputs: dict) -> int:
    """Every stored (U, S, V) equals the top-K SVD of the oracle's float64 Jacobian."""
    model64 = __import__("copy").deepcopy(model).double()
    ids = m.prompts["prompt_id"].tolist()
    by_prompt = collections.defaultdict(list)
    for key, fac in m.iter_bases():
        by_prompt[key[0]].append((key, fac))
    checked = 0
    for i, pid in enumerate(ids):
        Js, _ = oracle_jacobians(model64, {k: v[i:i + 1] for k, v in inputs.items()})
        n = Js[0].shape[0]
        # every layer and every measured token pair (tokens="all": J_tt and the fixed_output
        # pairs J_{t1 t2}, t1 <= t2, of a causal model) is stored
        want = {(pid, la + 1, t1, t2) for la in range(len(Js)) for t2 in range(n)
                for t1 in range(t2 + 1)}
        assert {k for k, _ in by_prompt[pid]} == want
        for (_, layer, t_in, t_out), (U, S, V) in by_prompt[pid]:
            J = Js[layer - 1][t_out, t_in]  # (d, d) float64
            Uo, So, Vho = np.linalg.svd(J)
            Uo, So, Vo = Uo[:, :K], So[:K], Vho[:K].T
            U, S, V = (t.double().numpy() for t in (U, S, V))
            assert U.shape == V.shape == (J.shape[0], K) and S.shape == (K,)
            np.testing.assert_allclose(S, So, rtol=1e-5, atol=1e-5 * So[0])
            assert _principal_cosines(U, Uo).min() > 1 - 1e-5
            assert _principal_cosines(V, Vo).min() > 1 - 1e-5
            # the pairs belong together: J v_i = s_i u_i
            np.testing.assert_allclose(J @ V, U * S, atol=1e-5 * So[0])
            checked += 1
    return checked


@pytest.mark.parametrize(("arch", "dtype"), [("gpt2", torch.float32), ("llama", torch.float64)])
def test_stored_bases_equal_the_oracle_svd(arch: str, dtype: torch.dtype, tmp_path: Path) -> None:
    model = tiny_model(arch)
    inputs = tiny_inputs(arch, n=4, batch=2)
    m = bc.measure_to_dir(model, None, inputs, tmp_path / "run", coupling=("depth", "fixed_output"),
                          k=(2, K), tokens="all", dtype=dtype, save_bases=True, progress=False)
    assert check_against_oracle(bc.open_run(tmp_path / "run"), model, inputs) == 2 * 3 * 10
    # the in-memory result and the returned one hold the same factors, in the analysis dtype
    for (key, fac), (key2, fac2) in zip(m.iter_bases(), bc.open_run(tmp_path / "run").iter_bases(),
                                        strict=True):
        assert key == key2 and all(torch.equal(a, b) for a, b in zip(fac, fac2, strict=True))
        assert fac[0].dtype == dtype


def test_bases_lookup_defaults_and_errors() -> None:
    model = tiny_model("gpt2")
    m = bc.measure(model, None, tiny_inputs("gpt2", n=5), k=K, save_bases=True, progress=False)
    pid = m.prompts["prompt_id"][0]
    U, S, V = m.bases(pid, 2)  # the one measured J_tt at the last token
    assert U.shape == V.shape == (16, K)
    assert all(torch.equal(a, b) for a, b in zip((U, S, V), m.bases(pid, 2, -1), strict=True))
    assert all(torch.equal(a, b) for a, b in zip((U, S, V), m.bases(pid, 2, 4, 4), strict=True))
    # the stored singular values are the spectra's
    spec = m.spectra.query("layer == 2")["singular_value"].to_numpy()[:K]
    np.testing.assert_allclose(S.double().numpy(), spec, rtol=1e-6)
    with pytest.raises(BlockCouplingError, match="stored"):
        m.bases(pid, 2, 0)
    with pytest.raises(BlockCouplingError, match="stored layers"):
        m.bases(pid, 7)
    plain = bc.measure(model, None, tiny_inputs("gpt2", n=5), k=K, progress=False)
    with pytest.raises(BlockCouplingError, match="save_bases"):
        plain.bases(pid, 1)


def _run(root: Path, model: torch.nn.Module, inputs: dict, *, stop_after: int | None = None
         ) -> None:
    # part_seconds=0: a part per prompt (the per-part bases files are what is tested)
    opts = dict(coupling=("depth",), k=(2, K), tokens="0,-1", save_bases=True, batch_size=1,
                part_seconds=0)
    if stop_after is None:
        bc.measure_to_dir(model, None, inputs, root, progress=False, **opts)
        return
    from blockcoupling.engine.config import parse_config
    from blockcoupling.engine.measure import build_meta
    from blockcoupling.engine.results import conform
    from blockcoupling.store.fingerprint import weights_hash

    cfg = parse_config(None, **{k: v for k, v in opts.items() if k != "part_seconds"})
    items = normalise_inputs(inputs)
    prompts = conform("prompts", [dict(prompt_id=it.prompt_id, text=it.text, n_tokens=0,
                                       label=it.label) for it in items])
    meta = build_meta(model, cfg, prompts_spec="", weights_hash=weights_hash(model))
    with RunWriter(root, config=cfg, meta=meta, prompts=prompts) as w:
        for i, part in enumerate(bc.iter_measure(model, None, items, cfg, progress=False)):
            if i == stop_after:
                break  # "killed": parts written so far stay, no finalize
            w.write_part(part)
    bc.measure_to_dir(model, None, inputs, root, progress=False, resume=True, **opts)


def test_resumed_run_bases_are_bit_identical(tmp_path: Path) -> None:
    model = tiny_model("llama")
    inputs = tiny_inputs("llama", n=5, batch=3)
    _run(tmp_path / "whole", model, inputs)
    _run(tmp_path / "resumed", model, inputs, stop_after=2)
    a, b = bc.open_run(tmp_path / "whole"), bc.open_run(tmp_path / "resumed")
    got_a, got_b = list(a.iter_bases()), list(b.iter_bases())
    assert len(got_a) == 3 * 3 * 2
    for (ka, fa), (kb, fb) in zip(got_a, got_b, strict=True):
        assert ka == kb and all(torch.equal(x, y) for x, y in zip(fa, fb, strict=True))
    assert sorted(p.name for p in (tmp_path / "resumed" / "bases").iterdir()) == [
        "part-000001.safetensors", "part-000002.safetensors", "part-000003.safetensors"]
    assert not (tmp_path / "resumed" / "parts").exists()


def test_tampered_bases_are_detected(tmp_path: Path) -> None:
    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2", n=4, batch=2)
    root = tmp_path / "run"
    _run(root, model, inputs)
    pid = bc.open_run(root).prompts["prompt_id"][1]
    path = root / "bases" / "part-000002.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    m = bc.open_run(root)
    m.bases(m.prompts["prompt_id"][0], 1, 0)  # the other file is intact
    with pytest.raises(RunDirError, match="altered"):
        m.bases(pid, 1, 0)
    path.unlink()
    with pytest.raises(RunDirError, match="missing"):
        bc.open_run(root).bases(pid, 1, -1)


def test_tampered_part_bases_refuse_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    import blockcoupling.store.writer as writer

    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2", n=4, batch=2)
    root = tmp_path / "run"
    monkeypatch.setattr(writer.RunWriter, "finalize", lambda self, **kw: self.close())
    _run(root, model, inputs)  # both parts written, never consolidated
    monkeypatch.undo()
    path = root / "parts" / "part-000001" / "bases.safetensors"
    assert bc.open_run(root).bases(bc.open_run(root).prompts["prompt_id"][0], 3, 0)[0].shape == (16, K)
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(RunDirError, match="part-000001"):
        bc.measure_to_dir(model, None, inputs, root, progress=False, resume=True,
                          coupling=("depth",), k=(2, K), tokens="0,-1", save_bases=True,
                          batch_size=1, part_seconds=0)


def test_too_little_disk_is_refused_before_any_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import blockcoupling.store.bases as sb
    from tests.helpers.tiny_runs import PROMPTS, save_tiny_lm

    folder = save_tiny_lm(tmp_path / "lm")
    model, tok = __import__("blockcoupling.loading", fromlist=["load_model"]).load_model(
        str(folder), device="cpu")
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(sb.shutil, "disk_usage", lambda p: Usage(10**6, 10**6, 1000))
    with pytest.raises(BlockCouplingError, match="need about .* free"):
        bc.measure_to_dir(model, tok, PROMPTS, tmp_path / "run", save_bases=True, k=K,
                          tokens="all")
    assert not (tmp_path / "run").exists()
    # enough for the bases, not for the margin: the refusal states both, and the free bytes
    need = sb.estimate(bc.find_blocks(model), [len(p.split()) for p in PROMPTS],
                       bc.MeasureConfig.parse(k=K, tokens="all"))[1]
    free = need + sb.DISK_MARGIN // 2
    monkeypatch.setattr(sb.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, free))
    with pytest.raises(BlockCouplingError) as err:
        bc.measure_to_dir(model, tok, PROMPTS, tmp_path / "run", save_bases=True, k=K,
                          tokens="all")
    msg = str(err.value)
    for n in (need, sb.DISK_MARGIN, need + sb.DISK_MARGIN, free, sb.DISK_MARGIN // 2):
        assert f"({n:,} bytes)" in msg or f"{n:,} bytes" in msg, (n, msg)
    assert "margin" in msg and "\n" not in msg
    # the estimate printed first: prompts x layers x token pairs x (2 d K + K) x 4 bytes
    n_tokens = [len(p.split()) for p in PROMPTS]
    n_jac = sum(3 * n for n in n_tokens)  # depth at every token: J_tt per layer and token
    assert f"bases: {n_jac} Jacobians" in capsys.readouterr().err
    spec = bc.find_blocks(model)
    assert sb.estimate(spec, n_tokens, bc.MeasureConfig.parse(k=K, tokens="all"))[1] == (
        n_jac * (2 * 16 * K + K) * 4)


def test_cli_save_bases_and_too_little_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    import blockcoupling.store.bases as sb
    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts

    folder = save_tiny_lm(tmp_path / "lm")
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:2])
    common = ["--model", str(folder), "--prompts", str(prompts), "--k", "2,4", "--save-bases"]
    res = cli("measure", *common, "--out", str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    m = bc.open_run(tmp_path / "run")
    assert m.bases(m.prompts["prompt_id"][1], 3)[0].shape == (16, 4)
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(sb.shutil, "disk_usage", lambda p: Usage(10**6, 10**6, 1000))
    res = cli("-q", "measure", *common, "--out", str(tmp_path / "full"))
    assert res.exit_code == 1 and "free disk space" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "full").exists()


def test_stored_jacobians_equal_the_oracle_and_are_refused_above_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import blockcoupling.engine.bases as eb

    model = tiny_model("llama", dtype=torch.float64)
    inputs = tiny_inputs("llama", n=4)
    opts = dict(coupling=("depth",), k=2, tokens="all", dtype=torch.float64, progress=False,
                save_jacobians=True)
    m = bc.measure_to_dir(model, None, inputs, tmp_path / "run", **opts)
    Js, _ = oracle_jacobians(model, inputs)
    pid = m.prompts["prompt_id"][0]
    stored = bc.open_run(tmp_path / "run")
    for layer in (1, 2, 3):
        for t in range(4):
            np.testing.assert_allclose(stored.jacobian(pid, layer, t).numpy(),
                                       Js[layer - 1][t, t], rtol=0, atol=1e-12)
    with pytest.raises(BlockCouplingError, match="save_bases"):
        stored.bases(pid, 1, 0)  # Jacobians only: no bases were asked for
    monkeypatch.setattr(eb, "JACOBIANS_LIMIT_BYTES", 1000)
    with pytest.raises(BlockCouplingError, match="force-size"):
        bc.measure_to_dir(model, None, inputs, tmp_path / "big", **opts)
    assert not (tmp_path / "big").exists()
    bc.measure_to_dir(model, None, inputs, tmp_path / "forced", force_size=True, **opts)
    with pytest.raises(BlockCouplingError, match="matrix_free"):
        bc.measure(model, None, inputs, method="matrix_free", **opts)


def test_a_finalize_killed_before_its_commit_is_finished_by_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bases linked into bases/, manifest not yet committed: the parts still hold them; the
    resumed run links them again and reads back the same factors."""
    import blockcoupling.store.writer as writer

    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2", n=4, batch=2)
    _run(tmp_path / "whole", model, inputs)
    real = writer.write_manifest

    def killed(root: Path, manifest: dict) -> None:
        if manifest.get("status") == "complete":
            raise KeyboardInterrupt  # "killed" between linking and the commit
        real(root, manifest)

    monkeypatch.setattr(writer, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "run", model, inputs)
    monkeypatch.undo()
    assert (tmp_path / "run" / "bases").is_dir() and (tmp_path / "run" / "parts").is_dir()
    assert bc.open_run(tmp_path / "run").bases(bc.open_run(tmp_path / "run").prompts[
        "prompt_id"][0], 1, 0)[0].shape == (16, K)  # served from the parts meanwhile
    bc.measure_to_dir(model, None, inputs, tmp_path / "run", progress=False, resume=True,
                      coupling=("depth",), k=(2, K), tokens="0,-1", save_bases=True,
                      batch_size=1, part_seconds=0)
    got = list(bc.open_run(tmp_path / "run").iter_bases())
    want = list(bc.open_run(tmp_path / "whole").iter_bases())
    assert len(got) == len(want) == 2 * 3 * 2
    for (ka, fa), (kb, fb) in zip(got, want, strict=True):
        assert ka == kb and all(torch.equal(x, y) for x, y in zip(fa, fb, strict=True))
    assert not (tmp_path / "run" / "parts").exists()


class _CustomLM(torch.nn.Module):
    """A module find_blocks does not know: an embedding and a list of residual blocks."""

    def __init__(self, d: int = 8, n: int = 2) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, d)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(n)])

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
        h = self.emb(input_ids)
        for lin in self.layers:
            h = h + torch.tanh(lin(h))
        return h


def test_a_custom_modules_jacobian_estimate_uses_its_given_width(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: given blocks_path, hidden_size and causal, the size check sees the width it
    was given (it saw 0 and passed without checking anything); without a width it refuses to
    store Jacobians unchecked."""
    from blockcoupling.engine import bases as eb

    torch.manual_seed(0)
    net = _CustomLM().eval()
    ids = {"input_ids": torch.randint(0, 11, (1, 6))}
    kw = dict(blocks_path="layers", causal=False, save_jacobians=True, coupling=("depth",),
              k=(2,), tokens="-1")
    bc.measure_to_dir(net, None, ids, tmp_path / "a", hidden_size=8, **kw)
    err = capsys.readouterr().err
    n_jac = 2  # one token, two layers
    assert f"jacobians: {n_jac} Jacobians of d x d = about 512 B" in err, err
    assert eb.jacobian_bytes(n_jac, 8, torch.float32) == 512
    monkeypatch.setattr(eb, "JACOBIANS_LIMIT_BYTES", 511)
    with pytest.raises(BlockCouplingError, match="would store about 512 B"):
        bc.measure_to_dir(net, None, ids, tmp_path / "b", hidden_size=8, **kw)
    with pytest.raises(BlockCouplingError, match="cannot be checked before the run"):
        bc.measure_to_dir(net, None, ids, tmp_path / "c", **kw)
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
def test_a_custom_modules_jacobian_estimate_uses_its_stated_width_and_causality(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain nn.Module found by ``blocks_path`` with ``hidden_size`` and ``causal`` given:
    the size estimate (and so the --save-jacobians limit and the disk check) counts its
    real d x d Jacobians, not 0 bytes of a width-0 model (issue 33)."""
    import blockcoupling.engine.bases as eb
    import blockcoupling.store.bases as sb
    from tests.helpers.tiny_models import EncoderStack

    class TokenNet(torch.nn.Module):  # token ids in, so the lengths are known before the run
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(11, 8)
            self.layers = EncoderStack(3).layers

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(input_ids)
            for blk in self.layers:
                x = blk(x)
            return x

    torch.manual_seed(0)
    net = TokenNet().double().eval()
    ids = {"input_ids": torch.randint(0, 11, (1, 4))}
    opts = dict(blocks_path="layers", hidden_size=8, causal=False, coupling=("depth",), k=2,
                tokens="all", dtype=torch.float64, save_jacobians=True)
    n_jac = 3 * 4  # J_tt per layer and token
    monkeypatch.setattr(eb, "JACOBIANS_LIMIT_BYTES", n_jac * 8 * 8 * 8 - 1)
    with pytest.raises(BlockCouplingError, match="force-size"):
        bc.measure_to_dir(net, None, ids, tmp_path / "big", **opts)
    assert f"jacobians: {n_jac} Jacobians of d x d" in capsys.readouterr().err
    assert not (tmp_path / "big").exists()
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(sb.shutil, "disk_usage", lambda p: Usage(10**6, 10**6, 100))
    with pytest.raises(BlockCouplingError, match="need about .* free"):
        bc.measure_to_dir(net, None, ids, tmp_path / "full", force_size=True, **opts)
    monkeypatch.undo()
    m = bc.measure_to_dir(net, None, ids, tmp_path / "run", **opts)
    assert bc.open_run(tmp_path / "run").jacobian(m.prompts["prompt_id"][0], 1, 0).shape == (8, 8)
