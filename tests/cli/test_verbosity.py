"""Logs a reader sees: a warning is one line (the CLI's format), a fallback said per layer is
said once for all its layers, and Ray workers' warnings reach the driver in its format and at
its verbosity, not as Ray's prefixed copies of the workers' stderr (``-q`` silences the
workers' other output; warnings, like the driver's own, stay)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import blockcoupling as bc
from blockcoupling.verbosity import grouped_layer_warnings, warning_line


def test_per_layer_warnings_are_said_once_for_their_layers() -> None:
    with pytest.warns(UserWarning) as record, grouped_layer_warnings():
        for layer in (1, 2, 3, 5):
            warnings.warn(f"fast path for layer {layer} (gpt2) could not be built", stacklevel=1)
        warnings.warn("something else", stacklevel=1)
        warnings.warn("structured Jacobian of layer 4 (gpt2) disagrees", stacklevel=1)
    said = sorted(str(w.message) for w in record)
    assert said == ["fast path for layers 1-3, 5 (gpt2) could not be built",
                    "something else", "structured Jacobian of layer 4 (gpt2) disagrees"]


def test_measure_says_a_per_layer_fallback_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast path that fails on every layer of a 3-block model: one warning, not three."""
    from blockcoupling.engine import fastpath
    from tests.helpers.tiny_models import tiny_inputs, tiny_model

    def fails(model, cap, layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        warnings.warn(f"fast path for layer {layer} (gpt2) could not be built (ValueError: "
                      "no cache); using the generic path (slower).", stacklevel=2)
        return None

    monkeypatch.setattr(fastpath, "token_branches", fails)
    model = tiny_model("gpt2")
    assert len(model.h) >= 2
    with pytest.warns(UserWarning) as record:
        bc.measure(model, None, tiny_inputs("gpt2", n=4), k=(2,), coupling=("depth",),
                   progress=False, trajectory=False, spectra=False)
    fast = [str(w.message) for w in record if "fast path" in str(w.message)]
    n = len(model.h)
    assert fast == [f"fast path for layers 1-{n} (gpt2) could not be built (ValueError: no "
                    "cache); using the generic path (slower)."]


def test_warning_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    warning_line(UserWarning("two\n  lines"), UserWarning, "x.py", 3)
    assert capsys.readouterr().err == "warning: two lines\n"


_WORKER_SCRIPT = """
import sys, warnings
from blockcoupling.verbosity import set_verbosity, warning_line
set_verbosity(quiet={quiet}, terminal=False)
warnings.showwarning = warning_line
from blockcoupling.runs.executor import ray_each

def unit(i):
    import sys, warnings
    from blockcoupling.verbosity import grouped_layer_warnings
    with grouped_layer_warnings():
        for layer in (1, 2, 3):
            warnings.warn(f"fallback for layer {{layer}}")
    warnings.warn("shared by every unit")
    print(f"chatter of unit {{i}}", file=sys.stderr, flush=True)
    import time
    time.sleep(3)  # Ray forwards a worker's output asynchronously: let it reach the driver
    return i

got = []
ray_each(unit, [((i,), {{"num_cpus": 1}}) for i in range(2)],
         lambda i, v, err: got.append(v), address={address!r})
print("results", sorted(got))
"""


@pytest.mark.slow  # a Ray cluster; CI runs every test
@pytest.mark.parametrize("quiet", [False, True], ids=["normal", "quiet"])
def test_ray_workers_warn_in_the_drivers_format(quiet: bool, ray_cluster: str,
                                                tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(_WORKER_SCRIPT.format(quiet=quiet, address=ray_cluster)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "results [0, 1]" in proc.stdout
    err = proc.stderr
    assert "UserWarning" not in err and "warnings.warn" not in err  # not Python's two lines
    assert "\x1b[" not in err  # no colour codes on a log file
    warned = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    # each text once, for the whole run, in the driver's own format; -q hides chatter, never
    # warnings (as on the driver)
    assert sorted(warned) == ["warning: fallback for layers 1-3",
                              "warning: shared by every unit"], err
    assert not any("fallback" in ln for ln in err.splitlines() if "pid=" in ln)
    assert ("chatter of unit" in err) == (not quiet), err  # a worker's print: -q silences it
