"""Which Jacobians each coupling kind compares, and config validation."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from blockcoupling.engine.config import MeasureConfig, parse_layers, parse_tokens
from blockcoupling.engine.pairs import (
    default_figure_window,
    influence_keys,
    kind_pairs,
    needed_keys,
    resolve_tokens,
)
from blockcoupling.errors import BlockCouplingError


def test_resolve_tokens() -> None:
    assert resolve_tokens("last", 5) == [4]
    assert resolve_tokens("all", 3) == [0, 1, 2]
    assert resolve_tokens((0, -1, 4), 5) == [0, 4]
    with pytest.raises(BlockCouplingError, match="out of range .* 5 tokens"):
        resolve_tokens((5,), 5)
    with pytest.raises(BlockCouplingError, match="no tokens"):
        resolve_tokens("last", 0)


def test_depth_pairs_cover_all_layer_pairs() -> None:
    ps = kind_pairs("depth", tokens=[4], layers=[1, 2, 3], n=5, causal=True)
    assert len(ps) == 9
    assert ((2, 4, 4), (3, 4, 4)) in ps
    assert needed_keys(ps) == {1: [(4, 4)], 2: [(4, 4)], 3: [(4, 4)]}


def test_self_pairs() -> None:
    ps = kind_pairs("self", tokens=[0, 1, 2], layers=[1, 2], n=3, causal=True, pairs_mode="same")
    assert len(ps) == 2 * 9
    assert all(a[0] == b[0] for a, b in ps)
    ps_all = kind_pairs("self", tokens=[0, 1], layers=[1, 2], n=3, causal=True, pairs_mode="all")
    assert len(ps_all) == 4 * 4


def test_context_pairs_respect_causality() -> None:
    fo = kind_pairs("fixed_output", tokens=[2], layers=[1], n=4, causal=True)
    # inputs t1, t1' <= 2 -> 3 x 3 pairs, output fixed at 2
    assert len(fo) == 9 and all(a[2] == 2 and b[2] == 2 for a, b in fo)
    assert max(max(a[1], b[1]) for a, b in fo) == 2
    fi = kind_pairs("fixed_input", tokens=[1], layers=[1], n=4, causal=True)
    assert len(fi) == 9 and all(a[1] == 1 and a[2] >= 1 and b[2] >= 1 for a, b in fi)
    enc = kind_pairs("fixed_input", tokens=[1], layers=[1], n=4, causal=False)
    assert len(enc) == 16  # an encoder's outputs all depend on every input


def test_influence_and_window() -> None:
    assert influence_keys([2], n=3) == {2: [(0, 2), (1, 2), (2, 2)]}
    assert default_figure_window(list(range(1, 33))) == (13, 20)
    assert default_figure_window([1, 2, 3]) == (1, 3)


def test_config_parsing_and_roundtrip() -> None:
    cfg = MeasureConfig.parse(k="50,10", tokens="0,-1", layers="9..16", p=(1, 2, "inf"))
    assert cfg.k == (10, 50) and cfg.tokens == (0, -1) and cfg.layers == tuple(range(9, 17))
    assert cfg.p == (1.0, 2.0, math.inf) and all(type(v) is float for v in cfg.p)
    assert MeasureConfig.from_dict(cfg.to_dict()) == cfg
    assert MeasureConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert parse_layers("3,5") == (3, 5) and parse_layers(None) is None
    assert parse_tokens(2) == (2,) and parse_tokens("last") == "last"
    # CLI strings and Python values give the same record
    cli = MeasureConfig.parse(coupling="depth,self", k="2,4", p="1,2,inf", dtype="float64",
                              final_norm="true", batch_size="3", svd_tol="none", method="matrix-free")
    py = MeasureConfig.parse(coupling=("depth", "self"), k=[4, 2], p=[1, 2, math.inf],
                             dtype=torch.float64, final_norm=True, batch_size=3, svd_tol=None,
                             method="matrix_free")
    assert cli == py and cli.config_hash() == py.config_hash()
    assert MeasureConfig.parse(coupling="none").coupling == ()
    assert cfg.replace(k="2") == MeasureConfig.parse(cfg, k=2)


def test_config_record_is_strict_and_frozen() -> None:
    with pytest.raises(BlockCouplingError, match="MeasureConfig.parse"):
        MeasureConfig(k="10,30")  # type: ignore[arg-type]
    with pytest.raises(BlockCouplingError, match="not of type"):
        MeasureConfig(dtype="float64")  # type: ignore[arg-type]
    with pytest.raises(BlockCouplingError, match="not of type"):
        MeasureConfig(k=(True,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        MeasureConfig().k = (3,)  # type: ignore[misc]
    assert MeasureConfig(p=(1, 2)).p == (1.0, 2.0)  # an int is a float (typing's numeric tower)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(coupling=("depthwise",)), "coupling 'depthwise': choose from depth"),
        (dict(k=(0,)), "k must be a whole number >= 1"),
        (dict(k=4.7), "not a whole number"),
        (dict(k="4.7"), "not a whole number"),
        (dict(k="abc"), "not a whole number"),
        (dict(k=","), "empty"),
        (dict(p="abc"), "p = 1, 2 or inf"),
        (dict(variants=("nope",)), "variants 'nope': choose from coupling"),
        (dict(p=(3,)), "p = 1, 2 or inf"),
        (dict(method="svd"), "method 'svd': choose from auto, dense, matrix_free"),
        (dict(seed=2**32), "seed must be a whole number >= 0 and <= 4294967295"),
        (dict(lss_window=4), "odd width"),
        (dict(analysis_device="hip"), "built without hip"),
        (dict(layers="5..2"), "empty"),
        (dict(layers="0..2"), "numbered from 1"),
        (dict(dtype="bfloat16"), "float32 or float64"),
        (dict(tokens="first"), "last"),
        (dict(tokens=","), "last"),
        (dict(tokens=()), "last"),
        (dict(batch_size="2.5"), "not a whole number"),
        (dict(final_norm="maybe"), "true or false"),
        (dict(nope=1), "unknown measure option"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    """Each is refused as an option is (`validate.OptionError`: the command line's exit 2),
    by the rule its field declares."""
    from blockcoupling.validate import OptionError

    with pytest.raises(OptionError, match=match):
        MeasureConfig.parse(**kwargs)


HASH_SCRIPT = (
    "from blockcoupling.engine.config import MeasureConfig as C;"
    "print(C.parse(k='10,30', p='1,inf', tokens='0,-1', layers='2..5', dtype='float64').config_hash())"
)


def test_config_hash_is_stable_across_processes() -> None:
    cfg = MeasureConfig.parse(k="10,30", p="1,inf", tokens="0,-1", layers="2..5", dtype="float64")
    h = cfg.config_hash()
    assert len(h) == 64 and int(h, 16) >= 0
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", HASH_SCRIPT], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out == h
    # every number-changing field moves the hash; the figure selection does not
    assert cfg.replace(batch_size=3).config_hash() != h
    assert cfg.replace(seed=1).config_hash() != h
    assert cfg.replace(p="1").config_hash() != h
    assert cfg.replace(dtype="float32").config_hash() != h
    assert cfg.replace(figure_prompts=3).config_hash() == h
    assert cfg.replace(k="30,10").config_hash() == h  # same set of K


def test_check_model() -> None:
    cfg = MeasureConfig.parse(k=(10, 30), layers="1..4")
    with pytest.raises(BlockCouplingError, match="larger than the model's hidden size d=16"):
        cfg.check_model(num_layers=4, hidden_size=16)
    with pytest.raises(BlockCouplingError, match="goes past the model's 3 blocks"):
        MeasureConfig.parse(k=(2,), layers="1..4").check_model(num_layers=3, hidden_size=16)
