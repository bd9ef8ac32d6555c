"""The perturbation experiment (paper fig. 34): the last token's embedding perturbed by
level * ||x^0_t|| * u, its trajectory compared with the true one. Checked against an
independent forward: the model fed ``inputs_embeds`` with the perturbation added, block outputs
read by hooks of the test's own, cosine and distance by numpy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from blockcoupling.engine import perturb
from blockcoupling.engine.blocks import find_blocks, get_module
from blockcoupling.errors import BlockCouplingError
from blockcoupling.report.perturb import perturbation_summary
from tests.helpers.tiny_models import VOCAB, tiny_model
from tests.helpers.tiny_runs import cli, save_tiny_lm, write_prompts


def _oracle_states(model: torch.nn.Module, ids: torch.Tensor, t: int,
                   delta: torch.Tensor | None) -> np.ndarray:
    """x^0..x^L at token t of one forward with ``delta`` added to the input embedding."""
    spec = find_blocks(model)
    blocks = get_module(model, spec.blocks_path)
    states: list[torch.Tensor] = []
    hooks = [blocks[0].register_forward_pre_hook(
        lambda mod, args, kw: states.append((args[0] if args else kw["hidden_states"])[0, t]),
        with_kwargs=True)]
    hooks += [b.register_forward_hook(lambda mod, a, out: states.append(
        (out[0] if isinstance(out, tuple) else out)[0, t])) for b in blocks]
    embeds = model.get_input_embeddings()(ids).detach().clone()
    if delta is not None:
        embeds[0, t] += delta
    try:
        with torch.no_grad():
            model(inputs_embeds=embeds, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(states).numpy()  # (L+1, d)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_rows_match_an_independent_forward(arch: str) -> None:
    model = tiny_model(arch, dtype=torch.float64)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    levels, draws = (0.05, 0.5), 3
    rows = perturb.perturbation_rows(model, {"input_ids": ids}, find_blocks(model), "p0",
                                     levels=levels, draws=draws, seed=11, batch_size=4)
    assert len(rows) == len(levels) * draws * (model.config.num_hidden_layers + 1)
    t = 5
    true = _oracle_states(model, ids, t, None)
    dirs = perturb.directions(true.shape[1], draws, 11)
    for lv in levels:
        for k in range(draws):
            delta = lv * np.linalg.norm(true[0]) * dirs[k]
            got = rows[(rows["level"] == lv) & (rows["draw"] == k)].sort_values("layer")
            pert = _oracle_states(model, ids, t, delta)
            cos = (pert * true).sum(-1) / np.linalg.norm(pert, axis=-1) / np.linalg.norm(true, axis=-1)
            rel = np.linalg.norm(pert - true, axis=-1) / np.linalg.norm(true, axis=-1)
            np.testing.assert_allclose(got["cosine"], cos, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(got["rel_distance"], rel, rtol=1e-9)
            assert got["rel_distance"].iloc[0] == pytest.approx(lv)  # the level is ||delta|| / ||x^0||


def test_only_the_perturbed_token_and_later_ones_move() -> None:
    """A causal model: perturbing token 2 leaves tokens 0-1 exactly as they were, moves token
    2 at every layer, and adds delta to the input at that token only."""
    from blockcoupling.engine.capture import capture

    model = tiny_model("gpt2", dtype=torch.float64)
    spec = find_blocks(model)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    clean = capture(model, {"input_ids": ids}, spec, keep_calls=False,
                    boundary_dtype=torch.float64).boundaries[:, 0]
    block1 = get_module(model, spec.blocks_path)[0]
    with perturb._added_to_block_input(block1, 2, torch.ones(1, 16, dtype=torch.float64)):
        moved = capture(model, {"input_ids": ids}, spec, keep_calls=False,
                        boundary_dtype=torch.float64).boundaries[:, 0]
    assert torch.equal(moved[:, :2], clean[:, :2])
    assert torch.equal(moved[0, 2] - clean[0, 2], torch.ones(16, dtype=torch.float64))
    assert torch.equal(moved[0, 3:], clean[0, 3:])  # the input of the later tokens: as it was
    assert (torch.linalg.vector_norm(moved[:, 2] - clean[:, 2], dim=-1) > 0.1).all()
    rows = perturb.perturbation_rows(model, {"input_ids": ids}, spec, "p", levels=(1.0,),
                                     draws=1, seed=0, token=2)
    assert set(rows["token"]) == {2}


def test_directions_are_seeded_unit_and_isotropic() -> None:
    a = perturb.directions(32, 4000, 3)
    assert torch.equal(a, perturb.directions(32, 4000, 3))
    np.testing.assert_allclose(torch.linalg.vector_norm(a, dim=-1), 1.0, rtol=1e-12)
    assert float(a.mean(0).abs().max()) < 0.01  # no preferred direction
    cov = (a.T @ a / len(a)).numpy()
    np.testing.assert_allclose(cov, np.eye(32) / 32, atol=0.005)  # isotropic: E[u u^T] = I/d
    state = torch.random.get_rng_state()
    perturb.directions(8, 2, 0)
    assert torch.equal(state, torch.random.get_rng_state())


def test_summary_takes_the_prompt_as_the_unit() -> None:
    rows = pd.DataFrame({"prompt_id": ["a", "a", "b", "b"], "level": 0.1, "layer": 1,
                         "draw": [0, 1, 0, 1], "cosine": [0.9, 0.7, 0.5, 0.5],
                         "rel_distance": 0.1, "token": 3})
    s = perturbation_summary(rows).iloc[0]
    assert s["n_prompts"] == 2 and s["cosine_mean"] == pytest.approx(0.65)
    assert s["cosine_se"] == pytest.approx(np.std([0.8, 0.5], ddof=1) / np.sqrt(2))


def test_cli_writes_resumes_and_refuses_other_settings(tmp_path: Path) -> None:
    model = save_tiny_lm(tmp_path / "m")
    prompts = write_prompts(tmp_path / "p.txt")
    out = tmp_path / "pert"
    args = ["-q", "perturb", "--model", str(model), "--prompts", str(prompts), "--out",
            str(out), "--levels", "0.1,1", "--draws", "2"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert "layer 3" in r.output
    rows = pd.read_parquet(out / "perturbation.parquet")
    assert rows["prompt_id"].nunique() == 4 and (out / "perturbation.html").is_file()
    settings = json.loads((out / "perturbation.json").read_text())
    assert settings["levels"] == [0.1, 1.0] and "uniformly random unit direction" in settings["rule"]
    page = (out / "perturbation.html").read_text()  # the model by its folder's name, as
    assert "<p>Model m;" in page and str(model) not in page  # every page names a local one
    # a killed run: one prompt's part gone; the same command measures it again, equal rows
    (out / "parts" / "00002.parquet").unlink()
    (out / "perturbation.parquet").unlink()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    pd.testing.assert_frame_equal(pd.read_parquet(out / "perturbation.parquet"), rows)
    r = cli(*args[:-1], "3")
    assert r.exit_code == 1 and "draws: stored 2, now 3" in r.output


def test_perturb_verifies_what_it_reads_and_checks_before_it_writes(tmp_path: Path) -> None:
    """The run protocol on ``perturb`` (issue 40): a part edited or truncated after it was
    written is measured again (the table is bit-identical to the first run's), an edited
    record is one line naming the way out, and a refused command (a token outside a prompt)
    writes nothing, so the corrected command runs in the same --out."""
    from blockcoupling.studies.perturbation import read_perturbation

    model = save_tiny_lm(tmp_path / "m")
    prompts = write_prompts(tmp_path / "p.txt")
    out = tmp_path / "pert"
    args = ["-q", "perturb", "--model", str(model), "--prompts", str(prompts), "--out",
            str(out), "--levels", "0.1,1", "--draws", "2"]
    r = cli(*args, "--token", "40")  # refused before the folder is made
    assert r.exit_code == 1 and "outside the prompt" in r.output and not out.exists()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    table = (out / "perturbation.parquet").read_bytes()
    summary = (out / "summary.csv").read_bytes()
    assert read_perturbation(out).rows.equals(pd.read_parquet(out / "perturbation.parquet"))
    part = out / "parts" / "00001.parquet"
    good = part.read_bytes()
    for damage in (good[: len(good) // 2], good.replace(b"cosine", b"cosinf")):
        part.write_bytes(damage)
        r = cli(*args)
        assert r.exit_code == 0, r.output
        assert part.read_bytes() == good  # measured again
        assert (out / "perturbation.parquet").read_bytes() == table
        assert (out / "summary.csv").read_bytes() == summary
    (out / "perturbation.parquet").write_bytes(table[:100])  # the table: verified on read
    with pytest.raises(BlockCouplingError, match="damaged or was altered"):
        read_perturbation(out)
    record = json.loads((out / "perturbation.json").read_text())
    record["draws"] = 3  # an edited record: one line, nothing written
    (out / "perturbation.json").write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    r = cli(*args)
    assert r.exit_code == 1 and "perturbation.json" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("extra, match, code", [
    (["--levels", "0.1,-1"], "--levels must be a finite number > 0, not -1.0", 2),
    (["--levels", "a"], "--levels 'a'", 2),
    (["--draws", "0"], "--draws must be a whole number >= 1", 2),
    (["--batch-size", "0"], "--batch-size must be a whole number >= 1", 2),
    (["--seed", "-1"], "--seed must be a whole number >= 0", 2),
    (["--token", "40"], "outside the prompt", 1),
])
def test_bad_input_is_one_line(tmp_path: Path, extra: list[str], match: str, code: int) -> None:
    """A setting refused as it is parsed (exit 2, nothing written); a token outside the
    prompt, once the prompt is read (exit 1)."""
    model = save_tiny_lm(tmp_path / "m")
    r = cli("perturb", "--model", str(model), "--prompts", "builtin:capital", "--out",
            str(tmp_path / "o"), *extra)
    assert r.exit_code == code and match in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    if code == 2:
        assert not (tmp_path / "o").exists()


def test_check_levels() -> None:
    assert perturb.check_levels([1, 0.1, 0.1], 2) == (0.1, 1.0)
    with pytest.raises(BlockCouplingError, match="at least one"):
        perturb.check_levels([], 1)
