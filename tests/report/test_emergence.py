"""Emergence figures: numeric (log) step axis, one line per model, the chance level drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from blockcoupling.report import emergence as E
from blockcoupling.report.figures import FigureUnavailable


def _summary() -> pd.DataFrame:
    rows = []
    for label, steps in (("pythia-a", [0, 128, 1000, 143000]), ("pythia-b", [0, 1000])):
        for i, s in enumerate(steps):
            rows.append({"unit_id": f"{label}-{s}", "label": label, "step": s,
                         "coupling_mean": 0.2 + 0.1 * i, "coupling_se": 0.01,
                         "coupling_chance": 0.1, "coupling_vs_null_mean": 0.1 * i,
                         "coupling_vs_null_se": 0.02, "lss": 2.0 - 0.1 * i,
                         "expodistance": 0.5 + i})
    rows.append({"unit_id": "gpt2", "label": "gpt2", "step": None, "coupling_mean": 0.4,
                 "coupling_se": 0.01, "coupling_chance": 0.15, "coupling_vs_null_mean": 0.3,
                 "coupling_vs_null_se": 0.02, "lss": 1.5, "expodistance": 0.3})
    df = pd.DataFrame(rows)
    df["step"] = df["step"].astype("Int64")
    return df


class _Data:
    """An error-bar data line with float data (matplotlib keeps them as object arrays)."""

    def __init__(self, line: object) -> None:
        self.line = line

    def get_xdata(self) -> np.ndarray:
        return np.asarray(self.line.get_xdata(), dtype=float)

    def get_ydata(self) -> np.ndarray:
        return np.asarray(self.line.get_ydata(), dtype=float)

    def get_color(self) -> object:
        return self.line.get_color()


def _lines(ax: object) -> dict:
    """Labelled lines of an axes: plain lines and the data lines of error-bar plots."""
    out = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    out.update({c.get_label(): _Data(c.lines[0]) for c in ax.containers
                if hasattr(c, "has_yerr") and not c.get_label().startswith("_")})
    return out


def test_coupling_vs_step_axis_lines_and_chance() -> None:
    fig = E.plot_coupling_vs_step(_summary())
    null, ax, bars = fig.axes[0], fig.axes[1], fig.axes[3]
    assert ax.get_xscale() == "symlog"  # numeric log axis that keeps step 0
    # the headline panel first: coupling above chance with its standard errors
    head = _lines(null)
    np.testing.assert_allclose(head["pythia-a"].get_ydata(), [0.0, 0.1, 0.2, 0.3])
    assert "above chance" in null.get_ylabel()
    lines = _lines(ax)
    assert set(lines) == {"pythia-a", "pythia-a: chance", "pythia-b", "pythia-b: chance"}
    np.testing.assert_array_equal(lines["pythia-a"].get_xdata(), [0, 128, 1000, 143000])
    np.testing.assert_allclose(lines["pythia-a"].get_ydata(), [0.2, 0.3, 0.4, 0.5])
    np.testing.assert_allclose(lines["pythia-b: chance"].get_ydata(), [0.1, 0.1])
    assert lines["pythia-a"].get_color() == lines["pythia-a: chance"].get_color()
    assert lines["pythia-a"].get_color() != lines["pythia-b"].get_color()
    # the model without steps is a bar, not a point on the step axis
    assert [t.get_text() for t in bars.get_xticklabels()] == ["gpt2"]


def test_trajectory_vs_step_and_unavailable() -> None:
    fig = E.plot_trajectory_vs_step(_summary())
    lss = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    np.testing.assert_allclose(lss["pythia-b"].get_ydata(), [2.0, 1.9])
    positive = _summary()
    positive = positive[positive["step"].fillna(0) > 0]
    assert E.plot_coupling_vs_step(positive).axes[0].get_xscale() == "log"
    with pytest.raises(FigureUnavailable):
        E.plot_coupling_vs_step(_summary().iloc[0:0])
    no_steps = _summary()
    no_steps["step"] = pd.array([None] * len(no_steps), dtype="Int64")
    with pytest.raises(FigureUnavailable, match="step"):
        E.plot_trajectory_vs_step(no_steps)
