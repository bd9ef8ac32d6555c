"""One config system (blockcoupling/fields.py): records declared once give the CLI options, the
YAML keys and their errors, the validation and the identity hash; the identities of existing
run directories, sweep units and training runs do not move; options given beside ``config=``
apply on top of it in every entry point; ``--dry-run`` prints a plan and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import blockcoupling as bc
from blockcoupling.engine.config import MeasureConfig
from blockcoupling.errors import BlockCouplingError
from blockcoupling.fields import check_fields, cli_options, from_mapping, identity, opt
from blockcoupling.validate import number, whole
from tiny_models import tiny_inputs, tiny_model


# ---------------------------------------------------------------- identities that must not move
def test_known_configs_keep_their_identity_hashes() -> None:
    """Hashes computed on main before the config system: run directories, sweep units and
    ViT training runs made then are found again (resume, skip, caches)."""
    from blockcoupling.studies.sweep.spec import parse_spec
    from blockcoupling.studies.sweep.units import config_hash, expand
    from blockcoupling.studies.vit.train import VitTrainConfig

    assert MeasureConfig().config_hash() == \
        "c7e3b0cac7a5436914a9ed01f1a4d4d3bd37fb98a9c119e1dcac6d0bee62923a"
    assert config_hash(MeasureConfig()) == MeasureConfig().config_hash()
    cfg = MeasureConfig.parse(k="10,30", p="1,inf", tokens="0,-1", layers="2..5",
                              dtype="float64", causal="true", figure_prompts=3)
    assert cfg.config_hash() == "1bd6241018efe645531d8d67a57841bf567c8a154032304f6948b4b65794829c"
    spec = parse_spec({"models": [{"label": "a", "model": "gpt2", "revisions": ["step1"]}],
                       "prompts": ["builtin:capital"], "measure": {"k": [4], "tokens": "last"}})
    assert [u.unit_id for u in expand(spec)] == ["a-step1-capital-dfa820a4a7c4"]
    assert VitTrainConfig().key() == "748982d1a605"
    assert VitTrainConfig.from_dict({"preset": "paper", "epochs": 3}).key() == "de66b26f00fb"


# ---------------------------------------------------------------- the generic functions
@dataclass(frozen=True)
class _Toy:
    n: int = opt(3, "How many.", cli=True, check=(whole, {"minimum": 1}))
    rate: float = opt(0.5, "A rate.", cli="learning-rate", check=(number, {"above": 0}))
    note: str | None = opt(None, "Not hashed.", hashed=False)
    late: int | None = opt(None, "Added later.", hashed="if_set")

    def __post_init__(self) -> None:
        check_fields(self, prefix="toy option ")


def test_from_mapping_names_the_key_and_where() -> None:
    assert from_mapping(_Toy, {"n": 4.0}, "toy") == _Toy(n=4)  # whole numbers as floats -> int
    with pytest.raises(BlockCouplingError, match=r"^toy: unknown key 'm'; known: n, rate"):
        from_mapping(_Toy, {"m": 1}, "toy")
    with pytest.raises(BlockCouplingError, match=r"^runs\[2\]: toy option n must be a whole"):
        from_mapping(_Toy, {"n": 0}, "runs[2]")
    with pytest.raises(BlockCouplingError, match="give a mapping"):
        from_mapping(_Toy, [1, 2], "toy")


def test_identity_follows_the_hashed_metadata() -> None:
    assert identity(_Toy()) == {"n": 3, "rate": 0.5}
    assert identity(_Toy(note="x", late=2)) == {"n": 3, "rate": 0.5, "late": 2}


def test_cli_options_come_from_the_fields() -> None:
    opts = {o.name: o for o in cli_options(_Toy)}
    assert set(opts) == {"n", "rate"}  # only fields with a flag
    assert opts["rate"].flag == "--learning-rate" and opts["rate"].annotation is float
    assert opts["n"].flag == "--n" and "[default: 3]" in opts["n"].help


# ---------------------------------------------------------------- options beside config=
def test_options_beside_config_apply_in_every_entry_point(tmp_path: Path) -> None:
    """``measure(config=cfg, k=2)`` measures K = 2: the same rule in measure, measure_to_dir,
    the monitor and a sweep's ``measure:`` (parsed onto the defaults)."""
    from blockcoupling.studies.monitor import CouplingMonitor
    from blockcoupling.studies.sweep.spec import parse_spec

    model, inputs = tiny_model("gpt2"), tiny_inputs("gpt2", n=4)
    cfg = MeasureConfig.parse(k="3,4", tokens="last", trajectory=False, spectra=False)
    m = bc.measure(model, None, inputs, config=cfg, k=2, progress=False)
    assert m.config.k == (2,) and set(m.coupling["k"]) == {2}
    m = bc.measure_to_dir(model, None, inputs, tmp_path / "run", config=cfg, k=2, progress=False)
    assert m.config.k == (2,) and set(m.coupling["k"]) == {2}
    assert bc.open_run(tmp_path / "run").config.k == (2,)
    mon = CouplingMonitor(None, ["a b"], steps=[0], out=tmp_path / "mon", config=cfg, k=2)
    assert mon.config.k == (2,) and mon.config.tokens == "last"
    spec = parse_spec({"models": ["gpt2"], "prompts": ["builtin:capital"],
                       "measure": {"k": [2], "tokens": "last"}})
    assert spec.config == MeasureConfig.parse(k=2, tokens="last")
