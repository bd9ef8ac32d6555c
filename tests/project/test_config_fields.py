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
from tests.helpers.tiny_models import tiny_inputs, tiny_model


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
    switch: bool = opt(False, "A switch added later.", hashed="if_changed")

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
    assert identity(_Toy(switch=True)) == {"n": 3, "rate": 0.5, "switch": True}


def test_cli_options_come_from_the_fields() -> None:
    opts = {o.name: o for o in cli_options(_Toy)}
    assert set(opts) == {"n", "rate"}  # only fields with a flag
    assert opts["rate"].flag == "--learning-rate" and opts["rate"].annotation is float
    assert opts["n"].flag == "--n" and "[default: 3]" in opts["n"].help


def test_key_names_name_a_check_as_the_specs_key() -> None:
    """One check, named as the CLI's flag or, inside ``key_names``, as a spec's key."""
    from blockcoupling.fields import key_names
    from blockcoupling.loading import ModelSource

    with pytest.raises(BlockCouplingError, match=r"^--init-seed must be a whole number >= 0"):
        ModelSource(model="m", init_seed=-1)
    with key_names("models[3]."), pytest.raises(
            BlockCouplingError, match=r"^models\[3\]\.init_seed must be a whole number >= 0"):
        ModelSource(model="m", init_seed=-1)
    with pytest.raises(BlockCouplingError, match=r"^--dtype None: choose one of"):
        ModelSource(model="m", dtype=None)  # type: ignore[arg-type]


def test_model_loading_options_are_declared_once() -> None:
    """``ModelSource``'s fields are the loading options of ``measure`` (``perturb``: all but
    accelerate's dispatch and quantization), the loading keys of a sweep spec's model entry
    and top level, and what a unit loads: a new field is a new option everywhere."""
    import dataclasses

    import typer

    from blockcoupling.cli import app
    from blockcoupling.cli.paper import _DISPATCH_OPTIONS
    from blockcoupling.loading import ModelSource
    from blockcoupling.studies.sweep.spec import LOADING_KEYS, MODEL_KEYS, TOP_KEYS
    from blockcoupling.studies.sweep.units import Unit

    names = [f.name for f in dataclasses.fields(ModelSource)]
    group = typer.main.get_command(app)
    for command, left_out in (("measure", ()), ("perturb", _DISPATCH_OPTIONS)):
        cmd = group.commands[command]  # type: ignore[attr-defined]
        params = cmd.get_params(cmd.make_context(command, ["--help"], resilient_parsing=True))
        generated = {p.name.partition("__")[2] for p in params
                     if p.name.startswith("source__")}
        assert generated == set(names) - {"model", *left_out}, command
        own = {p.name for p in params if "__" not in p.name}
        assert own & set(names) == {"model"}, command  # --model (-m) only: none restated
    assert set(LOADING_KEYS) == set(names) - {"model", "revision"}  # revisions: several
    assert set(LOADING_KEYS) <= set(TOP_KEYS)  # top-level defaults of every model
    assert set(MODEL_KEYS) >= set(names) - {"revision"}
    unit = Unit(unit_id="u", label="a", model="org/a", revision="r", step=None, prompt_set="p",
                limit=None, config={}, config_hash="h", dtype="float16", init="random",
                init_seed=2, loading={"allow_missing_weights": True})
    assert unit.source() == ModelSource(model="org/a", revision="r", dtype="float16",
                                        init="random", init_seed=2, allow_missing_weights=True)
    assert unit.source().meta(label="a") == {"model": "org/a", "revision": "r", "label": "a",
                                             "init": "random", "init_seed": 2}


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


# ---------------------------------------------------------------- --dry-run: a plan, nothing written
def test_sweep_dry_run_prints_each_units_plan_and_writes_nothing(tmp_path: Path) -> None:
    import json

    import yaml

    from tests.helpers.tiny_runs import PROMPTS, cli, save_tiny_lm, write_prompts

    save_tiny_lm(tmp_path / "model")
    write_prompts(tmp_path / "prompts.txt", PROMPTS)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"models": [{"label": "tiny", "model": "./model"}],
                                    "prompts": ["prompts.txt", "builtin:capital"],
                                    "measure": {"k": [2], "tokens": "last"}}))
    out = tmp_path / "sweep"
    r = cli("sweep", str(spec), "--out", str(out), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "plan of the sweep: 2 units" in r.output and "nothing is written" in r.output
    assert r.output.count("each measurement:") == 2 and not out.exists()
    r = cli("sweep", str(spec), "--out", str(out), "--dry-run", "--json")
    plan = json.loads(r.output)
    capital = len(bc.load_prompts("builtin:capital"))
    assert [u["measure"]["prompts"] for u in plan["runs"]] == [len(PROMPTS), capital]
    assert not out.exists()
    spec.write_text(yaml.safe_dump({"models": [{"label": "tiny", "model": "./model"}],
                                    "prompts": ["prompts.txt"], "measure": {"k": [99]}}))
    r = cli("sweep", str(spec), "--out", str(out), "--dry-run")  # checked as a unit is: K > d
    assert r.exit_code == 1 and "k=99" in r.output and not out.exists()


def test_vit_dry_runs_print_the_training_plan_and_write_nothing(tmp_path: Path) -> None:
    import yaml

    from tests.helpers.tiny_runs import cli

    out = tmp_path / "v"
    r = cli("vit-train", "--out", str(out), "--epochs", "3", "--monitor-every", "2",
            "--train-limit", "100", "--batch-size", "50", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "6 training steps" in r.output and "epochs 0, 2, 3 (3 checkpoints)" in r.output
    assert "final measurement: 16 inputs (272 tokens)" in r.output and not out.exists()
    r = cli("vit-grid", "--out", str(out), "--drop-path", "0,0.1", "--weight-decay", "0.05",
            "--seeds", "0,1", "--epochs", "1", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "4 training runs" in r.output and "dp0.1-wd0.05-s1" in r.output
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"kind": "vit-grid", "drop_path": [0.0], "weight_decay": [0.1],
                                    "train": {"epochs": 1, "monitor_every": 0}}))
    r = cli("sweep", str(grid), "--out", str(out), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "1 training runs" in r.output and "epochs none (0 checkpoints)" in r.output
    assert not out.exists()


def test_lm_family_dry_run_prints_runs_steps_and_checkpoints(tmp_path: Path) -> None:
    from blockcoupling.studies.lm_study import quick_spec
    from tests.helpers.tiny_runs import cli

    out = tmp_path / "study"
    r = cli("study", "lm-family", "--out", str(out), "--quick", "--dry-run")
    assert r.exit_code == 0, r.output
    spec = quick_spec()
    assert f"{len(spec.runs)} training runs" in r.output
    assert f"{sum(run.max_steps for run in spec.runs)} training steps" in r.output
    assert "measured at steps 0, 1, 2, 4, 8, 16 (6 checkpoints)" in r.output
    assert "estimated time at most" in r.output  # the runs stop at their plateau, not the cap
    assert not out.exists()


def _built(kind: str) -> bool:
    """Whether this torch was built for device type ``kind`` (the oracle: torch's own
    build flags; other types have no backend in a stock build)."""
    import torch

    return {"cpu": True, "cuda": torch.backends.cuda.is_built(),
            "mps": torch.backends.mps.is_built(),
            "xpu": bool(getattr(torch.xpu, "_is_compiled", lambda: False)())}.get(kind, False)


@pytest.mark.parametrize("device", ["auto", "cpu", "cpu:0", "cuda", "cuda:1", "cuda:7", "mps",
                                    "xpu", "xpu:0", "hip", "xla", "ipu", "hpu", "meta"])
def test_every_device_name_is_checked_against_this_build(device: str) -> None:
    """A device name is accepted where this torch was built for its type (``cuda`` on a CUDA
    or ROCm build, ``mps``, ``xpu``), whatever machine it runs on (a spec may name the GPU of
    its Ray workers); one a stock build lacks (``hip``, ``xla``, ``cuda`` on a CPU build:
    a traceback from ``model.to`` before) is one line naming what this build has, for the
    model's device and the analysis device alike."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.loading import ModelSource
    from blockcoupling.validate import OptionError

    kind = device.split(":")[0]
    if device == "auto" or (kind != "meta" and _built(kind)):
        assert ModelSource(model="gpt2", device=device).device == device
        if device != "auto":
            assert MeasureConfig.parse(analysis_device=device).analysis_device == device
        return
    for make in (lambda: ModelSource(model="gpt2", device=device),
                 lambda: MeasureConfig.parse(analysis_device=device)):
        with pytest.raises(OptionError, match=r"(built without|no weights).*choose auto, cpu"):
            make()


@pytest.mark.parametrize("device", ["tpu:7", "gpu", "", 3])
def test_a_device_torch_cannot_name_is_one_line(device: object) -> None:
    from blockcoupling.loading import ModelSource
    from blockcoupling.validate import OptionError

    with pytest.raises(OptionError, match="is not a device name; choose auto, cpu"):
        ModelSource(model="gpt2", device=device)  # type: ignore[arg-type]


@pytest.mark.parametrize("device", ["xpu", "xpu:0", "mps", "cuda:99", "meta"])
def test_a_device_this_machine_lacks_is_one_line_when_the_model_loads(device: str) -> None:
    """A name this torch was built for but this machine does not have (no such GPU, an index
    past the last) is refused by `resolve_device`, which every load calls, with one line;
    the CPU is always there."""
    import torch

    from blockcoupling.loading import resolve_device
    from blockcoupling.validate import OptionError

    present = {"xpu": torch.xpu.is_available(), "mps": torch.backends.mps.is_available(),
               "cuda": torch.cuda.device_count() > 99, "meta": False}
    if present[device.split(":")[0]]:
        pytest.skip(f"{device} exists on this machine")
    with pytest.raises(OptionError, match=f"^--device {device}.*(built without|visible|"
                                          "this machine has|no weights)"):
        resolve_device(device)
    assert resolve_device("cpu:0") == torch.device("cpu:0")


def test_every_default_measure_shows_parses_back_to_that_default() -> None:
    """``[default: X]`` in ``measure --help`` is a value the option takes and that means the
    default (``--layers`` showed ``none``, which it refuses)."""
    import re

    from blockcoupling.engine.config import MeasureConfig, measure_options

    default = MeasureConfig()
    shown = {o.name: re.search(r"\[default: (.*)\]$", o.help) for o in measure_options()
             if not o.is_flag}
    assert shown and all(shown.values())
    for name, found in shown.items():
        assert getattr(MeasureConfig.parse(**{name: found.group(1)}), name) == \
            getattr(default, name), name


def test_a_parsed_number_option_is_named_by_its_type_in_the_help() -> None:
    """``--batch-size`` and ``--seed`` take a raw string for their parser but are named
    ``<int>`` in ``measure --help``, as ``perturb``'s own ``--batch-size``/``--seed`` are
    (they read ``<str>``); ``--causal`` (true, false or auto) stays a string."""
    from blockcoupling.engine.config import measure_options

    metavar = {o.name: o.metavar for o in measure_options()}
    assert metavar["batch_size"] == metavar["seed"] == metavar["hidden_size"] == "<int>"
    assert metavar["causal"] is None and metavar["k"] is None


# ---------------------------------------------------------------- every spec key, checked when read
def _bad_keys(rule: object, *, mapping: bool = False) -> list[object]:
    """Values a key refuses: one of the wrong type (a mapping where a value or list is
    expected, text where a mapping is), and each bound of its declared rule crossed."""
    from blockcoupling import validate

    if mapping:
        return ["not-a-mapping"]
    out: list[object] = [{"not": "a value"}]
    if rule is None:
        return out
    fn, bounds = rule  # type: ignore[misc]
    if fn is validate.choice:
        out.append("not-a-choice")
    if fn in (validate.whole, validate.number):
        out += ["text"] + ([1.5] if fn is validate.whole else [float("nan")])
        for key, step in (("minimum", -1), ("maximum", 1), ("above", 0), ("below", 0)):
            if bounds.get(key) is not None:
                out.append(bounds[key] + step)
    return out


def _rules(cls: type) -> dict[str, object]:
    """Each field's rule; ``"mapping"`` for a field whose value is a mapping."""
    import dataclasses

    return {f.name: "mapping" if f.default_factory is dict else f.metadata.get("check")
            for f in dataclasses.fields(cls)}


def _spec_cases(kind: str) -> tuple[dict, list[tuple[tuple, object]], list[list[str]]]:
    """A valid spec of ``kind``, its keys (a path in the spec, the key's rule, or the string
    ``"mapping"``) and the command lines that read it (each run, and its --dry-run)."""
    from blockcoupling.engine.config import MeasureConfig
    from blockcoupling.loading import ModelSource
    from blockcoupling.studies.generalization.design import GeneralizationSpec
    from blockcoupling.studies.lm_study import StudyRun, StudySpec, quick_spec
    from blockcoupling.studies.sweep.spec import (
        LOADING_KEYS,
        MODEL_KEYS,
        TOP_KEYS,
        Resources,
        SweepSpec,
    )
    from blockcoupling.studies.vit.grid import GridSpec
    from blockcoupling.studies.vit.train import VitTrainConfig

    train = [(("train", k), r) for k, r in _rules(VitTrainConfig).items()]
    if kind == "sweep":
        source, top = _rules(ModelSource), _rules(SweepSpec)
        keys = [((k,), source[k] if k in LOADING_KEYS else top.get(k)) for k in TOP_KEYS
                if k not in ("measure", "resources")]
        keys += [(("models", 0, k), source.get(k)) for k in MODEL_KEYS if k != "resources"]
        keys += [(("measure", k), r) for k, r in _rules(MeasureConfig).items()]
        keys += [(("resources",), "mapping"), (("measure",), "mapping")]
        keys += [((*where, "resources", k), r) for k, r in _rules(Resources).items()
                 for where in ((), ("models", 0))]
        return ({"models": [{"label": "a", "model": "./m"}], "prompts": ["p.txt"]}, keys,
                [["sweep", "spec.yaml", "--out", "OUT", "--executor", "local"]])
    if kind == "vit-grid":
        keys = [((k,), r) for k, r in _rules(GridSpec).items() if k != "train"]
        return ({"kind": "vit-grid", "drop_path": [0.0], "weight_decay": [0.1],
                 "train": {"epochs": 1}}, [*keys, *train, (("train",), "mapping")],
                [["vit-grid", "--spec", "spec.yaml", "--out", "OUT", "--executor", "local"],
                 ["sweep", "spec.yaml", "--out", "OUT", "--dry-run"]])  # the same reader
    if kind == "lm-family":
        keys = [((k,), r) for k, r in _rules(StudySpec).items() if k != "runs"]
        keys += [(("runs", 0, k), r) for k, r in _rules(StudyRun).items()]
        return (quick_spec().to_dict(), keys,
                [["study", "lm-family", "--runs", "spec.yaml", "--out", "OUT"]])
    keys = [((k,), r) for k, r in _rules(GeneralizationSpec).items() if k != "train"]
    return ({}, [*keys, *train, (("train",), "mapping")],
            [["study", "generalization", "--spec", "spec.yaml", "--out", "OUT"]])


@pytest.mark.parametrize("kind", ["sweep", "vit-grid", "lm-family", "generalization"])
def test_every_spec_key_is_checked_when_the_spec_is_read(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key of every spec kind (a sweep's top level, model entries, ``measure:`` and
    ``resources:``; a ViT grid's and its ``train:``; the lm-family study's and its runs';
    the generalization design's and its ``train:``), given a value of the wrong type or out of
    its declared range: one line naming the key as the spec writes it, exit 2, by the run and
    its ``--dry-run`` alike, before anything is written (a key checked only when a unit ran
    failed every unit, named as a command-line flag)."""
    import copy

    import yaml

    from tests.helpers.tiny_runs import cli_parser

    monkeypatch.chdir(tmp_path)
    run = cli_parser()
    base, keys, commands = _spec_cases(kind)
    spec = tmp_path / "spec.yaml"
    for path, rule in keys:
        for bad in _bad_keys(rule, mapping=rule == "mapping"):
            data = copy.deepcopy(base)
            node = data
            for step in path[:-1]:
                node = node.setdefault(step, {}) if isinstance(step, str) else node[step]
            node[path[-1]] = bad
            spec.write_text(yaml.safe_dump(data))
            for command in commands:
                for args in (command, [*command, "--dry-run"]) if "--dry-run" not in command \
                        else (command,):
                    r = run(*args)
                    lines = r.output.strip().splitlines()  # type: ignore[attr-defined]
                    where = f"{kind} {path}={bad!r} ({' '.join(args)}): {r.output!r}"  # type: ignore[attr-defined]
                    assert r.exit_code == 2, where  # type: ignore[attr-defined]
                    assert len(lines) == 1 and lines[0].startswith("error: "), where
                    named = str(path[-1]) if isinstance(path[-1], str) else str(path[-2])
                    assert named in lines[0], where
                    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"], where


def test_rules_between_spec_keys_are_checked_when_the_spec_is_read() -> None:
    """The rules between options hold for a spec's keys as for the flags (declared once,
    ``requires``): named as the spec writes them; a top-level default meets an entry's key."""
    from blockcoupling.studies.sweep.spec import SpecError, parse_spec

    base = {"prompts": ["builtin:smoke"]}
    with pytest.raises(SpecError, match=r"^models\[0\]\.init_seed applies with "
                                        r"models\[0\]\.init: random only"):
        parse_spec({**base, "models": [{"model": "gpt2", "init_seed": 3}]})
    with pytest.raises(SpecError, match=r"^models\[0\]\.offload_folder applies with "
                                        r"models\[0\]\.device_map only"):
        parse_spec({**base, "models": [{"model": "gpt2", "offload_folder": "off"}]})
    spec = parse_spec({**base, "init_seed": 3, "models": [{"model": "gpt2", "init": "random"}]})
    assert spec.models[0].init_seed == 3
