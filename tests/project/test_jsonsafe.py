"""``blockcoupling.jsonsafe.jsonable``: the one rule behind manifests, study JSON and --json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from blockcoupling.jsonsafe import jsonable
from blockcoupling.store.fileio import write_json


def test_values_become_plain_json() -> None:
    data = {1: (np.float32(0.5), np.int64(3), np.bool_(True)), "a": {"b", "a"},
            "arr": np.arange(3).reshape(3, 1), "t": torch.tensor(2.5), "dt": torch.bfloat16,
            "na": pd.NA, "nat": pd.NaT, "path": Path("x/y"),
            "df": pd.DataFrame({"x": [1.0, math.nan], "y": ["p", "q"]})}
    out = jsonable(data)
    assert out == {"1": [0.5, 3, True], "a": ["a", "b"], "arr": [[0], [1], [2]], "t": 2.5,
                   "dt": "bfloat16", "na": None, "nat": None, "path": "x/y",
                   "df": [{"x": 1.0, "y": "p"}, {"x": None, "y": "q"}]}
    assert type(out["1"][1]) is int and type(out["1"][2]) is bool
    json.dumps(out, allow_nan=False)  # strict JSON


@pytest.mark.parametrize(("mode", "expected"), [("null", [None, None, None, 1.0]),
                                                 ("string", ["nan", "inf", "-inf", 1.0])])
def test_nonfinite_floats(mode: str, expected: list[object]) -> None:
    values = [math.nan, np.float64(math.inf), -math.inf, 1.0]
    assert jsonable(values, nonfinite=mode) == expected  # type: ignore[arg-type]


def test_write_json_is_strict_and_makes_folders(tmp_path: Path) -> None:
    path = write_json(tmp_path / "a" / "b.json", {"x": math.nan, "y": np.int32(2)})
    assert json.loads(path.read_text()) == {"x": None, "y": 2}
