"""Ready-made inputs (images, token ids) through measure, measure_to_dir, resume and open_run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import blockcoupling as bc
from blockcoupling.engine.inputs import content_id, normalise_inputs
from tests.helpers.tiny_models import tiny_model

OPTS = dict(k=(2,), coupling=("depth",), batch_size=1, progress=False)


def _images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _same(a: bc.Measurement, b: bc.Measurement) -> None:
    for name in ("coupling", "trajectory", "token_metrics", "spectra", "prompts"):
        x, y = a.table(name), b.table(name)
        keys = [c for c in x.columns if x[c].dtype != "float64"]
        pd.testing.assert_frame_equal(x.sort_values(keys).reset_index(drop=True),
                                      y.sort_values(keys).reset_index(drop=True))


def test_content_ids_are_stable_and_follow_content() -> None:
    x = _images()
    items = normalise_inputs({"pixel_values": x})
    assert [it.prompt_id for it in items] == [it.prompt_id for it in normalise_inputs(
        {"pixel_values": x.clone()})]
    assert items[0].prompt_id.startswith("input-00000-") and items[0].text == "<image 3x8x8>"
    y = x.clone()
    y[1, 0, 0, 0] += 1
    changed = [it.prompt_id for it in normalise_inputs({"pixel_values": y})]
    assert changed[0] == items[0].prompt_id and changed[1] != items[1].prompt_id
    script = ("import torch; from blockcoupling.engine.inputs import content_id;"
              "print(content_id(0, {'pixel_values': torch.arange(12.).reshape(3, 2, 2)}))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == content_id(0, {"pixel_values": torch.arange(12.0).reshape(3, 2, 2)})


def test_vit_images_through_the_store_with_resume(tmp_path: Path) -> None:
    model = tiny_model("vit")
    x = _images()
    ref = bc.measure(model, None, {"pixel_values": x}, **OPTS)

    calls = []

    def interrupt_second_batch(module: torch.nn.Module, args: object, kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    handle = model.register_forward_pre_hook(interrupt_second_batch, with_kwargs=True)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        bc.measure_to_dir(model, None, {"pixel_values": x}, out, **OPTS)
    handle.remove()
    got = bc.measure_to_dir(model, None, {"pixel_values": x}, out, resume=True, **OPTS)
    stored = bc.open_run(out)
    _same(got, ref)
    _same(stored, ref)
    assert stored.prompts["text"].tolist() == ["<image 3x8x8>"] * 3

    # resuming with other images is refused: their ids differ
    with pytest.raises(bc.RunDirError):
        bc.measure_to_dir(model, None, {"pixel_values": x + 1}, out, resume=True, **OPTS)


def test_token_ids_with_attention_mask(tmp_path: Path) -> None:
    model = tiny_model("gpt2")
    ids = torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    inputs = {"input_ids": ids, "attention_mask": mask}
    got = bc.measure_to_dir(model, None, inputs, tmp_path / "r", **{**OPTS, "batch_size": 2})
    assert got.prompts["n_tokens"].tolist() == [4, 3]
    # the same as the examples one by one, without padding
    alone = bc.measure(model, None, {"input_ids": ids[1:, :3]}, **OPTS)
    a = got.coupling[got.coupling.prompt_id == got.prompts.prompt_id[1]]["value"].to_numpy()
    torch.testing.assert_close(torch.tensor(a), torch.tensor(alone.coupling["value"].to_numpy()),
                               rtol=1e-4, atol=1e-5)


def test_bad_ready_made_inputs_leave_no_directory(tmp_path: Path) -> None:
    model = tiny_model("vit")
    out = tmp_path / "r"
    with pytest.raises(bc.BlockCouplingError, match="different batch sizes"):
        bc.measure_to_dir(model, None, {"pixel_values": _images(2), "x": torch.ones(3)}, out, **OPTS)
    with pytest.raises(bc.BlockCouplingError, match="larger than the model's hidden size"):
        bc.measure_to_dir(model, None, {"pixel_values": _images(2)}, out, **{**OPTS, "k": (99,)})
    with pytest.raises(bc.BlockCouplingError, match="need a tokenizer"):
        bc.measure_to_dir(model, None, ["some text"], out, **OPTS)
    assert not out.exists()
