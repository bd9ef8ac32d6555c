"""lm-evaluation-harness results as a score table (the harness is not run).

The score of a model is the Open LLM Leaderboard (v1) average: 100 x the mean of its six
tasks, each with the Leaderboard's metric and number of shots (`LEADERBOARD`):

| task | metric | shots |
|---|---|---|
| arc_challenge | acc_norm | 25 |
| hellaswag | acc_norm | 10 |
| mmlu (the group; old ``hendrycksTest-*`` averaged) | acc | 5 |
| truthfulqa_mc2 | mc2 (``acc`` in the new harness) | 0 |
| winogrande | acc | 5 |
| gsm8k | exact_match (strict-match) | 5 |

A tag or group a user ran expands to those tasks only: ``truthfulqa`` yields
``truthfulqa_mc1``, ``_mc2`` and ``_gen``, of which only mc2 counts (the others are left out
with a warning, never averaged in). Other tasks, a missing Leaderboard task, and a number of
shots that differs from the Leaderboard's are warned about. A file without any Leaderboard
task falls back to the mean of its top-level tasks, with a warning that it is not the
Leaderboard's score.

Files: every JSON file the harness writes under ``--output_path``:
``DIR/<model_sanitized>/results_<iso-date>.json``, ``x_<iso-date>.json`` for ``--output_path
x.json``, and the old ``results.json``; a single results file may be given too. Rows are keyed
by (model, revision): ``model`` is ``model_name`` (else ``pretrained=`` of
``config.model_args``), with ``@<revision>`` when ``config.model_revision`` (or ``revision=``
of the model arguments) names one other than ``main``, so that a run of the same revision
matches it (``ModelUnit.match_keys``: ``model@revision``). Files of one (model, revision) are
merged, later dates overriding earlier ones task by task. ``config.model_num_parameters``
gives ``params_b``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError

#: the Open LLM Leaderboard (v1) tasks: name -> (metric keys, most wanted first; shots)
LEADERBOARD: dict[str, tuple[tuple[str, ...], int]] = {
    "arc_challenge": (("acc_norm",), 25),
    "hellaswag": (("acc_norm",), 10),
    "mmlu": (("acc",), 5),
    "truthfulqa_mc2": (("mc2", "acc"), 0),
    "winogrande": (("acc",), 5),
    "gsm8k": (("exact_match,strict-match", "exact_match"), 5),
}
#: names of the Leaderboard tasks in older harness versions
_OLD_NAMES = {"truthfulqa_mc": "truthfulqa_mc2", "arc:challenge": "arc_challenge",
              "harness|arc:challenge": "arc_challenge"}
#: a task outside the Leaderboard: its usual metric, most wanted first
_OTHER_METRICS = ("acc_norm", "acc", "exact_match", "mc2")


class LmEvalError(BlockCouplingError):
    """An lm-evaluation-harness results folder or file that cannot be read as scores."""


def _metric(values: Mapping[str, Any], wanted: tuple[str, ...], where: str = ""
            ) -> tuple[str, float] | None:
    """The first metric of ``wanted`` in ``values``: a fraction in [0, 1], as the harness
    writes every one of these metrics (a value outside is a LmEvalError naming it: a file
    written in percent would otherwise become a score 100 times too large)."""
    for name in wanted:
        for key in (name, f"{name},none"):
            v = values.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                if not 0.0 <= v <= 1.0:
                    raise LmEvalError(
                        f"{where}[{key!r}] is {v:g}, not a fraction between 0 and 1 as the "
                        "harness writes it (30 % is 0.30); fix the file (divide percentages "
                        "by 100)")
                return key, float(v)
    return None


def _leaderboard_name(task: str) -> str | None:
    if task in LEADERBOARD:
        return task
    if task in _OLD_NAMES:
        return _OLD_NAMES[task]
    if task.startswith("hendrycksTest-"):
        return "mmlu"
    return None


def _model_args(config: Mapping[str, Any]) -> dict[str, str]:
    args = config.get("model_args") or ""
    if isinstance(args, Mapping):
        return {str(k): str(v) for k, v in args.items() if v is not None}
    out = {}
    for part in str(args).split(","):
        key, _, value = part.partition("=")
        if key.strip() and value.strip():
            out[key.strip()] = value.strip()
    return out


def _identity(data: Mapping[str, Any], config: Mapping[str, Any], f: Path
              ) -> tuple[str, str | None]:
    """(model, revision) a results file names: the model identity its score is joined by
    (``studies.joins.match_names``); a field of the wrong type is one line naming it."""
    args = config.get("model_args")
    if args is not None and not isinstance(args, str | Mapping):
        raise LmEvalError(f"{f}: config.model_args is a {type(args).__name__}, not a string "
                          "or an object; is this an lm-evaluation-harness results file?")
    for where, value in (("model_name", data.get("model_name")),
                         ("config.model_revision", config.get("model_revision"))):
        if value is not None and not isinstance(value, str):
            raise LmEvalError(f"{f}: {where} is a {type(value).__name__}, not a string; is "
                              "this an lm-evaluation-harness results file?")
    parsed = _model_args(config)
    model = data.get("model_name") or parsed.get("pretrained")
    if not isinstance(model, str) or not model.strip():
        raise LmEvalError(f"{f}: cannot tell the model (no model_name and no pretrained= in "
                          "config.model_args)")
    revision = config.get("model_revision") or parsed.get("revision")
    revision = str(revision).strip() if revision not in (None, "") else None
    return model.strip(), None if revision in (None, "main") else revision


def _shots(data: Mapping[str, Any], config: Mapping[str, Any], task: str) -> int | None:
    for source in (data.get("n-shot"), data.get("n_shot")):
        if isinstance(source, Mapping) and isinstance(source.get(task), int):
            return int(source[task])
    configs = data.get("configs")
    if isinstance(configs, Mapping) and isinstance(configs.get(task), Mapping):
        n = configs[task].get("num_fewshot")
        if isinstance(n, int):
            return n
    n = config.get("num_fewshot")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else None


def _load(f: Path, named_results: bool) -> dict[str, Any] | None:
    """The parsed results file; None for a JSON file that is not one (skipped) unless it is
    named like one (then a `LmEvalError`)."""
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        if not named_results:
            return None
        raise LmEvalError(f"{f}: not UTF-8 text; is this an lm-evaluation-harness results "
                          "file?") from None
    except (OSError, ValueError) as err:
        if not named_results:
            return None
        raise LmEvalError(f"{f}: not a readable JSON file ({err})") from None
    except RecursionError:  # nested deeper than the parser follows: never a results file
        if not named_results:
            return None
        raise LmEvalError(f"{f}: nested too deeply to be an lm-evaluation-harness results "
                          "file; pass the harness's own output") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        if not named_results:
            return None
        raise LmEvalError(f"{f}: no 'results' object; is this an lm-evaluation-harness results "
                          "file?")
    if not isinstance(data.get("config", {}), dict):
        raise LmEvalError(f"{f}: 'config' is a {type(data['config']).__name__}, not an object; "
                          "is this an lm-evaluation-harness results file?")
    return data


def results_files(path: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every lm-eval results file under ``path`` (or ``path`` itself), parsed, in name order
    (ISO dates: oldest first)."""
    root = Path(path)
    if root.is_file():
        data = _load(root, named_results=True)
        return [(root, data)] if data is not None else []
    found = []
    for f in sorted(root.rglob("*.json")) if root.is_dir() else []:
        data = _load(f, named_results=f.name.startswith("results"))
        if data is not None:
            found.append((f, data))
    if not found:
        raise LmEvalError(f"{root}: no lm-evaluation-harness results files found (results_<date>"
                          ".json, or <name>_<date>.json for --output_path <name>.json); pass "
                          "the harness's --output_path folder or file")
    return found


def _file_tasks(f: Path, data: dict[str, Any]) -> tuple[dict[str, tuple[str, float]],
                                                         dict[str, tuple[str, float]],
                                                         list[str]]:
    """(Leaderboard tasks, other top-level tasks, notes) of one results file."""
    results = dict(data["results"])
    groups = data.get("groups")
    if isinstance(groups, dict):  # group scores may be listed only under "groups"
        results = {**{g: v for g, v in groups.items() if g not in results}, **results}
    sub: set[str] = set()
    subtasks = data.get("group_subtasks")
    if isinstance(subtasks, dict):
        for members in subtasks.values():
            if isinstance(members, list):
                sub.update(str(m) for m in members)
    config = data.get("config") or {}
    board: dict[str, tuple[str, float]] = {}
    other: dict[str, tuple[str, float]] = {}
    notes: list[str] = []
    mmlu_old: list[float] = []
    for task, values in results.items():
        if not isinstance(values, Mapping):
            raise LmEvalError(f"{f}: results[{task!r}] is a {type(values).__name__}, not an "
                              "object of metrics")
        name = _leaderboard_name(str(task))
        where = f"{f}: results[{task!r}]"
        if name is None:
            if task not in sub and (picked := _metric(values, _OTHER_METRICS, where)) is not None:
                other[str(task)] = picked
            continue
        picked = _metric(values, LEADERBOARD[name][0], where)
        if picked is None:
            notes.append(f"{task} has no {'/'.join(LEADERBOARD[name][0])} metric")
            continue
        shots = _shots(data, config, str(task))
        if shots is not None and shots != LEADERBOARD[name][1]:
            notes.append(f"{task} was run {shots}-shot, the Leaderboard's is "
                         f"{LEADERBOARD[name][1]}-shot")
        if str(task).startswith("hendrycksTest-"):
            mmlu_old.append(picked[1])
        else:
            board[name] = picked
    if mmlu_old and "mmlu" not in board:
        board["mmlu"] = ("acc (mean of hendrycksTest-*)", sum(mmlu_old) / len(mmlu_old))
    return board, other, notes


def _differences(board: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """How a model's score differs from the Leaderboard's: Leaderboard tasks missing, other
    tasks left out, or (none of the Leaderboard's) the mean of the others."""
    if not board:
        return [f"none of the Leaderboard's tasks; the score is the mean of "
                f"{', '.join(sorted(other))} and not comparable with the Leaderboard's"]
    notes = []
    missing = [t for t in LEADERBOARD if t not in board]
    if missing:
        notes.append(f"averages {len(board)} of the 6 Leaderboard tasks "
                     f"(missing {', '.join(missing)})")
    if other:
        notes.append(f"left out tasks that are not the Leaderboard's: {', '.join(sorted(other))}")
    return notes


def read_lmeval(path: str | Path) -> pd.DataFrame:
    """One row per (model, revision) of the results under ``path``: ``model`` (with
    ``@revision``), ``revision``, ``score`` (Leaderboard average x 100), ``params_b`` (from
    ``config.model_num_parameters``, else NaN), ``tasks`` (``task:metric`` list) and
    ``leaderboard_tasks`` (how many of the six). Differences from the Leaderboard are warned
    about (`UserWarning`), one warning per model."""
    rows: dict[tuple[str, str | None], dict[str, Any]] = {}
    for f, data in results_files(path):
        config = data.get("config") or {}
        model, revision = _identity(data, config, f)
        row = rows.setdefault((model, revision), {"board": {}, "other": {}, "notes": [],
                                                  "params": None})
        board, other, notes = _file_tasks(f, data)
        row["board"].update(board)
        row["other"].update(other)
        row["notes"] += notes
        n = config.get("model_num_parameters")
        if n is not None and not (isinstance(n, int | float) and not isinstance(n, bool)
                                  and math.isfinite(n) and n >= 0):
            raise LmEvalError(f"{f}: config.model_num_parameters is {n!r}, not a number of "
                              "parameters; fix or remove it")
        if n:
            row["params"] = float(n)
    out = []
    for (model, revision), row in rows.items():
        name = f"{model}@{revision}" if revision else model
        tasks = row["board"] or row["other"]
        if not tasks:
            raise LmEvalError(f"{path}: no task with an acc/acc_norm/mc2/exact_match metric for "
                              f"{name}")
        notes = list(dict.fromkeys(row["notes"])) + _differences(row["board"], row["other"])
        if notes:
            warnings.warn(f"lm-eval scores of {name}: " + "; ".join(notes), UserWarning,
                          stacklevel=2)
        out.append({"model": name, "revision": revision,
                    "score": 100.0 * sum(v for _, v in tasks.values()) / len(tasks),
                    "params_b": row["params"] / 1e9 if row["params"] else float("nan"),
                    "tasks": ", ".join(f"{t}:{m}" for t, (m, _) in sorted(tasks.items())),
                    "leaderboard_tasks": len(row["board"])})
    return pd.DataFrame(out)
