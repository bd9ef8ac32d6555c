"""The logit lens (engine/lens.py, measure(logit_lens=True)): the entropy of softmax(W_U N(x^l))
at every layer and token, checked against an independent computation: the same model cut after
block l (its first l blocks, its own final norm and head), whose output logits ARE the lens at
layer l, with the entropy from scipy.stats.entropy in float64."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf
from scipy.stats import entropy as scipy_entropy

import blockcoupling as bc
from blockcoupling.engine import lens
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_models import CAUSAL, VOCAB, tiny_model

ARCHS = ("gpt2", "llama", "gemma2", "gpt_neox")  # learned positions, RMSNorm, soft-capping


def lm(arch: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = CAUSAL[arch]()
    cfg.tie_word_embeddings = False  # an unembedding of its own, as Llama-3 8B
    return tf.AutoModelForCausalLM.from_config(cfg).double().eval()


def cut(model: torch.nn.Module, spec: bc.BlockSpec, n_blocks: int) -> torch.nn.Module:
    """The model with only its first ``n_blocks`` blocks (the config says so too)."""
    short = copy.deepcopy(model)
    parent_path, _, name = spec.blocks_path.rpartition(".")
    parent = short.get_submodule(parent_path) if parent_path else short
    setattr(parent, name, torch.nn.ModuleList(list(getattr(parent, name))[:n_blocks]))
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(short.config, key):
            setattr(short.config, key, n_blocks)
    if getattr(short.config, "layer_types", None) is not None:
        short.config.layer_types = short.config.layer_types[:n_blocks]
    return short


@pytest.mark.parametrize("arch", ARCHS)
def test_lens_entropy_is_the_cut_models_output_entropy(arch: str) -> None:
    model = lm(arch)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    m = bc.measure(model, None, {"input_ids": ids}, coupling="none", spectra=False, k=2,
                   logit_lens=True, dtype=torch.float64, progress=False)
    spec = bc.find_blocks(model)
    got = m.trajectory.pivot_table(index=["prompt_id", "token"], columns="layer",
                                   values="logit_entropy")
    assert got.notna().all().all()
    pids = list(dict.fromkeys(m.trajectory["prompt_id"]))
    for layer in range(1, spec.num_layers + 1):
        with torch.no_grad():
            logits = cut(model, spec, layer)(input_ids=ids).logits  # (2, 6, V)
        want = scipy_entropy(torch.softmax(logits, -1).numpy(), axis=-1)  # (2, 6)
        for b, pid in enumerate(pids):
            np.testing.assert_allclose(got.loc[pid][layer].to_numpy(), want[b], rtol=1e-9,
                                       atol=1e-12)


def test_entropy_formula_against_scipy_and_its_limits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=g, dtype=torch.float64) * 3
    np.testing.assert_allclose(lens.entropy(logits).numpy(),
                               scipy_entropy(torch.softmax(logits, -1).numpy(), axis=-1),
                               rtol=1e-12)
    assert float(lens.entropy(torch.zeros(64))) == pytest.approx(np.log(64))  # uniform
    certain = torch.full((10,), -torch.inf)
    certain[3] = 0.0
    assert float(lens.entropy(certain)) == 0.0  # -inf logits contribute nothing


def test_the_last_layer_is_the_models_own_output_with_the_final_norm_captured() -> None:
    model = lm("llama")
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    a = bc.measure(model, None, {"input_ids": ids}, coupling="none", spectra=False, k=2,
                   logit_lens=True, dtype=torch.float64, progress=False)
    b = bc.measure(model, None, {"input_ids": ids}, coupling="none", spectra=False, k=2,
                   logit_lens=True, dtype=torch.float64, final_norm=True, progress=False)
    L = int(a.trajectory["layer"].max())
    with torch.no_grad():
        want = scipy_entropy(torch.softmax(model(input_ids=ids).logits[0], -1).numpy(), axis=-1)
    for m in (a, b):  # the norm is applied once, whether or not x^L was captured after it
        last = m.trajectory[m.trajectory["layer"] == L].sort_values("token")
        np.testing.assert_allclose(last["logit_entropy"].to_numpy(), want, rtol=1e-9)


def test_lens_off_leaves_the_column_empty_and_the_config_hash_unchanged() -> None:
    model = tiny_model("gpt2")
    ids = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(3))
    m = bc.measure(model, None, {"input_ids": ids}, coupling="none", spectra=False, k=2,
                   progress=False)
    assert m.trajectory["logit_entropy"].isna().all()
    cfg = bc.MeasureConfig()
    assert "logit_lens" not in cfg.to_dict() or cfg.config_hash() == \
        bc.MeasureConfig.parse(logit_lens=False).config_hash()
    assert bc.MeasureConfig.parse(logit_lens=True).config_hash() != cfg.config_hash()


def test_a_model_without_its_head_or_an_encoder_is_one_line() -> None:
    ids = {"input_ids": torch.randint(0, VOCAB, (1, 4))}
    with pytest.raises(BlockCouplingError, match="AutoModelForCausalLM"):
        bc.measure(tiny_model("gpt2"), None, ids, coupling="none", spectra=False, k=2,
                   logit_lens=True, progress=False)
    with pytest.raises(BlockCouplingError, match="encoder"):
        bc.measure(tiny_model("bert"), None, ids, coupling="none", spectra=False, k=2,
                   logit_lens=True, progress=False)
    with pytest.raises(BlockCouplingError, match="trajectory"):
        bc.MeasureConfig.parse(logit_lens=True, trajectory=False)


def test_a_stored_trajectory_without_the_column_reads_as_nan(tmp_path) -> None:
    """Runs stored before the logit lens existed have no logit_entropy column: they still
    read, the column NaN; another missing column is still refused."""
    import io
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from blockcoupling.errors import RunDirError
    from blockcoupling.store.tables import read_table, to_frame

    m = bc.measure(tiny_model("gpt2"), None, {"input_ids": torch.randint(0, VOCAB, (1, 4))},
                   coupling="none", spectra=False, progress=False)
    old = m.trajectory.drop(columns=["logit_entropy"])
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(old, preserve_index=False), sink)
    table = read_table(sink.getvalue(), "trajectory", Path("t.parquet"), "hint")
    frame = to_frame("trajectory", [table], Path("."))
    assert frame["logit_entropy"].isna().all() and len(frame) == len(old)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(old.drop(columns=["norm"]), preserve_index=False), sink)
    with pytest.raises(RunDirError, match="no column norm"):
        read_table(sink.getvalue(), "trajectory", Path("t.parquet"), "hint")


def test_the_cli_refuses_a_lens_on_a_checkpoint_without_its_head(tmp_path) -> None:
    """MiniLM's checkpoint has no LM head: AutoModelForCausalLM would initialise one at random
    and the lens would read noise. One line, even with --allow-missing-weights."""
    from typer.testing import CliRunner

    from blockcoupling.cli import app
    from tests.helpers.tiny_models import minilm_path

    for extra in ([], ["--allow-missing-weights"]):
        res = CliRunner().invoke(app, ["measure", "-m", str(minilm_path()), "--prompts",
                                       "builtin:capital", "--limit", "2", "--logit-lens",
                                       "--out", str(tmp_path / f"run{len(extra)}"), *extra])
        assert res.exit_code != 0
        out = res.output.strip()
        assert "--logit-lens needs the output head" in out and "Traceback" not in out, out
        assert not (tmp_path / f"run{len(extra)}").exists()
