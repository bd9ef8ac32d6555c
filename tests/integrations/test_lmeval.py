"""lm-evaluation-harness results as scores: (model, revision) rows matched to model@revision
runs, model_num_parameters, every file name the harness writes, the Leaderboard's exact tasks
(truthfulqa -> mc2 only) and shots, and malformed files as one error line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from blockcoupling.studies import correlate as C
from blockcoupling.studies.lmeval import LmEvalError, read_lmeval

BOARD = {"arc_challenge": {"acc,none": 0.4, "acc_norm,none": 0.5},
         "hellaswag": {"acc,none": 0.3, "acc_norm,none": 0.6},
         "truthfulqa_mc2": {"acc,none": 0.38},
         "winogrande": {"acc,none": 0.7},
         "gsm8k": {"exact_match,strict-match": 0.1, "exact_match,flexible-extract": 0.2}}
SHOTS = {"arc_challenge": 25, "hellaswag": 10, "truthfulqa_mc2": 0, "winogrande": 5,
         "gsm8k": 5, "mmlu": 5}
BOARD_MEAN = 100 * (0.5 + 0.6 + 0.38 + 0.7 + 0.1 + 0.3) / 6


def _results(model: str, revision: str | None = None, *, results: dict[str, Any] | None = None,
             shots: dict[str, int] | None = None, params: int | None = None) -> dict[str, Any]:
    args = f"pretrained={model}" + (f",revision={revision}" if revision else "")
    config: dict[str, Any] = {"model": "hf", "model_args": args}
    if revision:
        config["model_revision"] = revision
    if params:
        config["model_num_parameters"] = params
    return {"results": {**(BOARD if results is None else results), "mmlu_anatomy": {"acc,none": 0.9}},
            "groups": {"mmlu": {"acc,none": 0.3}}, "group_subtasks": {"mmlu": ["mmlu_anatomy"]},
            "n-shot": {**SHOTS, **(shots or {})}, "config": config, "model_name": model}


def _write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_two_revisions_are_two_rows_matched_to_their_runs(tmp_path: Path) -> None:
    root = tmp_path / "lm"
    _write(root / "org__m" / "results_2024-01-01T00-00-00.json",
           _results("org/m", "step1000", params=160_000_000,
                    results={**BOARD, "hellaswag": {"acc_norm,none": 0.2}}))
    _write(root / "org__m" / "results_2024-02-01T00-00-00.json",
           _results("org/m", "step2000", params=160_000_000))
    with warnings.catch_warnings():  # a complete Leaderboard run: nothing to warn about
        warnings.simplefilter("error")
        scores = C.read_lmeval_dir(root)
    assert sorted(scores["model"]) == ["org/m@step1000", "org/m@step2000"]
    s = scores.set_index("model")
    assert s.loc["org/m@step2000", "score"] == pytest.approx(BOARD_MEAN)
    assert s.loc["org/m@step1000", "score"] == pytest.approx(BOARD_MEAN - 100 * 0.4 / 6)
    assert (s["params_b"] == 0.16).all() and (s["leaderboard_tasks"] == 6).all()
    # each run of org/m at a revision gets its own row
    units = [C.ModelUnit(label=f"m-{r}", model="org/m", revision=r, coupling=pd.DataFrame(),
                         hidden_size=16, num_layers=2) for r in ("step2000", "step1000")]
    models = pd.DataFrame({"label": ["m-step2000", "m-step1000"], "layers_run": [2, 2],
                           "d_model_run": [16, 16]})
    table, excluded = C.match_scores(models, units, scores)
    assert list(table["score_model"]) == ["org/m@step2000", "org/m@step1000"] and not excluded


def test_every_file_name_the_harness_writes(tmp_path: Path) -> None:
    # --output_path out.json writes out_<date>.json; a results file may be given directly
    f = _write(tmp_path / "out_2024-05-01T10-00-00.123.json", _results("org/a"))
    _write(tmp_path / "notes.json", {"something": "else"})  # not a results file: skipped
    assert C.read_lmeval_dir(tmp_path)["model"].tolist() == ["org/a"]
    scores, source = C.read_scores(f)
    assert scores["score"].iloc[0] == pytest.approx(BOARD_MEAN) and "lm-evaluation" in source


def test_truthfulqa_tag_counts_mc2_only_and_shots_are_compared(tmp_path: Path) -> None:
    results = {**BOARD, "truthfulqa_mc1": {"acc,none": 0.01}, "truthfulqa_gen": {"bleu_acc,none": 0.02},
               "lambada_openai": {"acc,none": 0.05}}
    _write(tmp_path / "x" / "results_2024-01-01.json",
           _results("org/t", results=results, shots={"arc_challenge": 0}))
    with pytest.warns(UserWarning) as rec:
        s = read_lmeval(tmp_path)
    assert s["score"].iloc[0] == pytest.approx(BOARD_MEAN)  # mc1, gen, lambada not averaged in
    text = str(rec[0].message)
    assert "arc_challenge was run 0-shot, the Leaderboard's is 25-shot" in text
    assert "lambada_openai" in text and "truthfulqa_mc1" in text
    assert "truthfulqa_mc2:acc,none" in s["tasks"].iloc[0]


def test_no_leaderboard_task_falls_back_with_a_warning(tmp_path: Path) -> None:
    doc = _results("org/o", results={"piqa": {"acc,none": 0.6}, "lambada_openai": {"acc,none": 0.4}})
    doc["results"].pop("mmlu_anatomy")
    doc.pop("groups")
    _write(tmp_path / "results_1.json", doc)
    with pytest.warns(UserWarning, match="not comparable with the Leaderboard"):
        s = read_lmeval(tmp_path)
    assert s["score"].iloc[0] == pytest.approx(50.0) and s["leaderboard_tasks"].iloc[0] == 0


@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"{not json", "not a readable JSON"),
    (json.dumps({"results": {"arc_challenge": 0.5}, "model_name": "m"}).encode(), "not an object of metrics"),
    (json.dumps({"results": {}, "config": ["x"], "model_name": "m"}).encode(), "'config' is a list"),
    (json.dumps({"results": [1, 2]}).encode(), "no 'results' object"),
    (json.dumps({"results": {"arc_challenge": {"acc_norm": 0.5}}}).encode(), "cannot tell the model"),
])
def test_malformed_files_are_one_line_errors(tmp_path: Path, content: bytes, match: str) -> None:
    (tmp_path / "results_2024.json").write_bytes(content)
    with pytest.raises(LmEvalError, match=match) as err:
        read_lmeval(tmp_path)
    assert "\n" not in str(err.value) and "results_2024.json" in str(err.value)
