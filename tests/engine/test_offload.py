"""Models dispatched by accelerate (device_map, blocks offloaded to disk) and quantized models
(torchao int8 weight-only on the CPU; bitsandbytes 4-bit on a GPU) are measured one block at a
time and give the numbers of the same model held in memory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import blockcoupling as bc
from blockcoupling.errors import BlockCouplingError
from tests.helpers.tiny_models import tiny_inputs, tiny_model

OPTS = dict(k=(2, 4), tokens="0,-1", progress=False)


def _values(m: bc.Measurement) -> np.ndarray:
    return m.coupling["value"].to_numpy()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_blocks_offloaded_to_disk_give_the_in_memory_coupling(arch: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    import transformers as tf

    from blockcoupling.engine.blocks import find_blocks

    model = tiny_model(arch)
    model.save_pretrained(tmp_path / "m")
    inputs = tiny_inputs(arch, n=5, batch=2)
    ref = bc.measure(model, None, inputs, save_bases=True, **OPTS)
    blocks = find_blocks(model).blocks_path
    names = [n for n, _ in model.named_children()]
    # block 1 in memory, blocks 2 and 3 offloaded to disk (weights on "meta" until used)
    device_map = {n: "cpu" for n in names if n != blocks}
    device_map.update({f"{blocks}.0": "cpu", f"{blocks}.1": "disk", f"{blocks}.2": "disk"})
    off = tf.AutoModel.from_pretrained(tmp_path / "m", device_map=device_map,
                                       offload_folder=str(tmp_path / "offload")).eval()
    assert any(p.device.type == "meta" for p in off.parameters())
    got = bc.measure_to_dir(off, None, inputs, tmp_path / "run", save_bases=True, **OPTS)
    np.testing.assert_allclose(_values(got), _values(ref), rtol=0, atol=1e-6)
    for (k1, f1), (k2, f2) in zip(ref.iter_bases(), got.iter_bases(), strict=True):
        assert k1 == k2
        np.testing.assert_allclose(f1[1].numpy(), f2[1].numpy(), rtol=1e-6)
    # the model is left as it was: offloaded weights back on meta
    assert any(p.device.type == "meta" for p in off.parameters())
    meta = bc.open_run(tmp_path / "run").meta
    assert meta["device_map"][f"{blocks}.1"] == "disk"
    assert meta["peak_memory"]["cpu_max_rss_bytes"] > 0


def test_post_ln_norm_directions_of_offloaded_blocks(tmp_path: Path) -> None:
    """remove_norm_directions reads each block's output LayerNorm: loaded from disk too."""
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    import transformers as tf

    model = tiny_model("bert")
    model.save_pretrained(tmp_path / "m")
    inputs = tiny_inputs("bert", n=5, batch=2)
    opts = dict(OPTS, remove_norm_directions=True, tokens="all")
    ref = bc.measure(model, None, inputs, **opts)
    device_map = {"embeddings": "cpu", "encoder.layer.0": "disk", "encoder.layer.1": "cpu",
                  "encoder.layer.2": "disk", "pooler": "cpu"}
    off = tf.AutoModel.from_pretrained(tmp_path / "m", device_map=device_map,
                                       offload_folder=str(tmp_path / "offload")).eval()
    np.testing.assert_allclose(_values(bc.measure(off, None, inputs, **opts)), _values(ref),
                               atol=1e-6)


def test_cli_device_map_auto_with_max_memory_offloads_and_measures(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts

    folder = save_tiny_lm(tmp_path / "lm")
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:2])
    common = ["--model", str(folder), "--prompts", str(prompts), "--k", "2,4", "--device", "cpu"]
    assert cli("measure", *common, "--out", str(tmp_path / "mem")).exit_code == 0
    res = cli("measure", *common, "--out", str(tmp_path / "off"), "--device-map", "auto",
              "--max-memory", "cpu=30KiB", "--offload-folder", str(tmp_path / "offload"))
    assert res.exit_code == 0, res.output
    off = bc.open_run(tmp_path / "off")
    assert "disk" in off.meta["device_map"].values()
    np.testing.assert_allclose(_values(off), _values(bc.open_run(tmp_path / "mem")), atol=1e-6)
    bad = cli("measure", *common, "--out", str(tmp_path / "bad"), "--device-map", "auto",
              "--max-memory", "lots")
    assert bad.exit_code == 2 and "DEVICE=SIZE" in bad.output and not (tmp_path / "bad").exists()


def _dequantized_float_copy(q: torch.nn.Module, arch: str) -> torch.nn.Module:
    """An independent float model holding the dequantized weights of ``q``'s linear layers."""
    ref = tiny_model(arch)
    state = {n + ".weight": mod.weight.dequantize().float()
             for n, mod in q.named_modules() if isinstance(mod, torch.nn.Linear)}
    missing = set(state) - set(ref.state_dict())
    assert not missing
    ref.load_state_dict(state, strict=False)
    return ref


def test_torchao_int8_model_is_measured_block_by_block(tmp_path: Path) -> None:
    pytest.importorskip("torchao", reason="the CPU quantization backend is torchao")
    import transformers as tf
    from torchao.quantization import Int8WeightOnlyConfig

    tiny_model("llama").save_pretrained(tmp_path / "m")
    q = tf.AutoModel.from_pretrained(tmp_path / "m",
                                     quantization_config=tf.TorchAoConfig(Int8WeightOnlyConfig()))
    assert type(q.layers[0].mlp.up_proj.weight).__name__ != "Parameter"  # really quantized
    inputs = tiny_inputs("llama", n=5, batch=2)
    got = bc.measure(q, None, inputs, **OPTS)
    ref = bc.measure(_dequantized_float_copy(q, "llama"), None, inputs, **OPTS)
    # the same function up to the float32 rounding of the quantized forward pass
    np.testing.assert_allclose(_values(got), _values(ref), atol=1e-5)
    assert got.meta["quantization"] == "torchao" and got.meta["dequantized_to"] == "float32"
    # the model still holds its quantized weights
    assert type(q.layers[0].mlp.up_proj.weight).__name__ != "Parameter"


def test_cli_quantize_torchao_and_a_backend_that_is_not_installed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    import importlib.util

    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts

    folder = save_tiny_lm(tmp_path / "lm", head=True)  # a Llama: nn.Linear layers
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:1])
    common = ["--model", str(folder), "--prompts", str(prompts), "--k", "2", "--device", "cpu"]
    if importlib.util.find_spec("torchao") is not None:
        res = cli("measure", *common, "--out", str(tmp_path / "q"), "--quantize", "torchao-int8")
        assert res.exit_code == 0, res.output
        assert bc.open_run(tmp_path / "q").meta["quantization"] == "torchao"
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed: import fails
    res = cli("measure", *common, "--out", str(tmp_path / "bnb"), "--quantize", "bnb-4bit")
    assert res.exit_code == 1 and "pip install bitsandbytes" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "bnb").exists()
    # errors.require: what needs the package, then the extra that installs it
    for package, given, named, extra in (
            ("torchao", ["--quantize", "torchao-int8"], "--quantize torchao-int8", "quant"),
            ("accelerate", ["--device-map", "auto"], "--device-map", "offload")):
        monkeypatch.setitem(sys.modules, package, None)
        res = cli("measure", *common, "--out", str(tmp_path / package), *given)
        assert res.exit_code == 1, res.output
        assert f"{named} needs {package}: pip install 'blockcoupling[{extra}]'" in res.output
    with pytest.raises(BlockCouplingError, match="--quantize '3bit': choose from none"):
        from blockcoupling.loading import quantization_config

        quantization_config("3bit")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bitsandbytes 4-bit needs a CUDA GPU")
def test_bitsandbytes_4bit_on_a_gpu(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    import transformers as tf

    tiny_model("llama").save_pretrained(tmp_path / "m")
    q = tf.AutoModel.from_pretrained(tmp_path / "m", device_map="cuda:0",
                                     quantization_config=tf.BitsAndBytesConfig(
                                         load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32))
    inputs = tiny_inputs("llama", n=5, batch=1)
    got = bc.measure(q, None, inputs, **OPTS)
    assert got.meta["quantization"] == "bitsandbytes" and np.isfinite(_values(got)).all()


def test_sweep_spec_carries_device_map_and_quantize_to_its_units() -> None:
    from blockcoupling.studies.sweep.spec import SpecError, parse_spec
    from blockcoupling.studies.sweep.units import expand

    base = {"prompts": ["builtin:smoke"], "measure": {"k": 2}}
    spec = parse_spec({**base, "device_map": "auto", "max_memory": "0=20GiB,cpu=60GiB",
                       "models": [{"model": "gpt2"},
                                  {"model": "gpt2", "label": "q", "quantize": "torchao-int8"}]})
    plain, quant = expand(spec)
    assert plain.loading == {"device_map": "auto", "max_memory": "0=20GiB,cpu=60GiB"}
    assert quant.loading["quantize"] == "torchao-int8"
    # quantized weights give other numbers: another unit identity; dispatch does not
    same = parse_spec({**base, "models": [{"model": "gpt2"}]})
    assert expand(same)[0].unit_id == plain.unit_id
    assert quant.unit_id.rsplit("-", 1)[1] != plain.unit_id.rsplit("-", 1)[1]
    with pytest.raises(SpecError, match=r"models\[0\]\.device_map 3: choose auto"):
        parse_spec({**base, "models": [{"model": "gpt2", "device_map": 3}]})
    # refused when the spec is read, named as its key (they failed each unit later, named
    # as the command line's flags)
    with pytest.raises(SpecError, match=r"^models\[0\]\.quantize '8bit': choose from none"):
        parse_spec({**base, "models": [{"model": "gpt2", "quantize": "8bit"}]})
    with pytest.raises(SpecError, match=r"^quantize '8bit': choose from none"):
        parse_spec({**base, "quantize": "8bit", "models": [{"model": "gpt2"}]})
    with pytest.raises(SpecError, match=r"^models\[0\]\.max_memory applies with "
                                        r"models\[0\]\.device_map only"):
        parse_spec({**base, "models": [{"model": "gpt2", "max_memory": "0=1GiB"}]})
