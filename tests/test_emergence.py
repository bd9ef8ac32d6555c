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
                         "mean_depth_coupling": 0.2 + 0.1 * i, "chance_coupling": 0.1,
                         "lss": 2.0 - 0.1 * i, "expodistance": 0.5 + i})
    rows.append({"unit_id": "gpt2", "label": "gpt2", "step": None, "mean_depth_coupling": 0.4,
                 "chance_coupling": 0.15, "lss": 1.5, "expodistance": 0.3})
    df = pd.DataFrame(rows)
    df["step"] = df["step"].astype("Int64")
    return df


def test_coupling_vs_step_axis_lines_and_chance() -> None:
    fig = E.plot_coupling_vs_step(_summary())
    ax, bars = fig.axes[0], fig.axes[1]
    assert ax.get_xscale() == "symlog"  # numeric log axis that keeps step 0
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
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
