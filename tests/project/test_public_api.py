"""The public API: the library at the top level, the studies under blockcoupling.studies (old
top-level study names: deprecated aliases), and one rule for options given beside a config."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import blockcoupling as bc
import blockcoupling.studies as studies
from blockcoupling.engine.config import MeasureConfig
from tests.helpers.tiny_models import tiny_inputs, tiny_model

STUDY_NAMES = ("CouplingCallback", "CouplingMonitor", "SweepSpec", "load_spec", "run_sweep",
               "CorrelationResult", "paper_scores", "VitTrainConfig", "train_vit")


def test_top_level_is_the_library_and_resolves_without_warnings() -> None:
    assert not set(STUDY_NAMES) & set(bc.__all__) and "correlate" not in bc.__all__
    for name in ("measure", "measure_to_dir", "open_run", "open_sweep", "Sweep", "write_report",
                 "Measurement", "MeasureConfig", "load_prompts"):
        assert name in bc.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in bc.__all__:
            assert getattr(bc, name) is not None


def test_studies_export_their_names() -> None:
    import pkgutil

    submodules = {m.name for m in pkgutil.iter_modules(studies.__path__)}
    assert not submodules & set(studies.__all__), "an export would hide a submodule"
    for name in studies.__all__:
        assert getattr(studies, name) is not None, name
    assert set(STUDY_NAMES) - {"correlate"} <= set(studies.__all__)
    assert set(studies.__all__) <= set(dir(studies))
    with pytest.raises(AttributeError, match="no attribute"):
        studies.not_a_name  # noqa: B018


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_old_top_level_study_names_warn_and_resolve(name: str) -> None:
    import blockcoupling.studies.correlate  # the submodule is imported: no shadowing
    with pytest.warns(DeprecationWarning, match=f"blockcoupling.studies.*{name}"):
        value = getattr(bc, name)
    home = blockcoupling.studies.correlate if name == "correlate" else studies
    assert value is getattr(home, name) and callable(value)


def test_correlate_alias_and_the_module_is_never_shadowed() -> None:
    import blockcoupling.studies.correlate as module
    from blockcoupling.studies import correlate as imported

    with pytest.warns(DeprecationWarning, match="blockcoupling.studies.correlate.correlate"):
        assert bc.correlate is module.correlate
    assert imported is module and studies.correlate is module  # the module, in any order


def _cfg() -> MeasureConfig:
    return MeasureConfig.parse(coupling="depth", k="3", tokens="last")


def test_measure_applies_options_given_beside_a_config() -> None:
    model, inputs = tiny_model("gpt2"), tiny_inputs("gpt2", n=4)
    m = bc.measure(model, None, inputs, config=_cfg(), k=2, progress=False)
    assert m.config.k == (2,) and set(m.coupling["k"]) == {2}
    plain = bc.measure(model, None, inputs, config=_cfg(), progress=False)
    assert plain.config == _cfg() and set(plain.coupling["k"]) == {3}  # the config's own k
    default = bc.measure(model, None, inputs, k=2, tokens="last", progress=False)
    assert default.config == MeasureConfig.parse(k="2", tokens="last")  # no config: defaults


def test_measure_to_dir_and_the_monitor_apply_them_the_same_way(tmp_path: Path) -> None:
    model, inputs = tiny_model("gpt2"), tiny_inputs("gpt2", n=4)
    m = bc.measure_to_dir(model, None, inputs, tmp_path / "run", config=_cfg(), k=2,
                          progress=False)
    assert m.config.k == (2,)
    mon = studies.CouplingMonitor(None, ["a b"], every=1, out=tmp_path / "mon", config=_cfg(),
                                  k=2)
    assert mon.config.k == (2,) and mon.config.tokens == "last"
    assert mon.config.dtype == torch.float32
