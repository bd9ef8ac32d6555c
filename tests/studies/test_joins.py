"""Joins by content identity (issue 40 item 2): every command that combines inputs joins them
through ``studies.joins``: prompts by their text, tokens by what each run measured, scores by
the model identity a row names, checkpoints by what was loaded. The same inputs in another
order give bit-identical JSON; an input whose content does not match is one line."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies import joins
from tests.helpers.synthetic_runs import write_synthetic_run
from tests.helpers.tiny_runs import cli, measure_rated

SRC = Path(__file__).resolve().parents[2] / "src" / "blockcoupling"
LEVELS = [0.2, 0.35, 0.5, 0.6, 0.8]


def _one_line_error(r: object, want: str) -> None:
    out = r.output.strip()  # type: ignore[attr-defined]
    assert r.exit_code in (1, 2), out  # type: ignore[attr-defined]
    assert "Traceback" not in out and out.splitlines()[-1].startswith("error: "), out
    assert want in out.splitlines()[-1], out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("joins")
    return [write_synthetic_run(root / f"run{i}", lv, label=f"m{i}", model=f"org/model-{i}",
                                seed=i) for i, lv in enumerate(LEVELS)]


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    return pd.DataFrame({"model": [f"m{i}" for i in range(5)],
                         "score": [20.0, 30, 41, 45, 62], "params_b": [1.0, 2, 3, 5, 8],
                         "group": ["a", "a", "a", "b", "b"]})


def _shuffled_csv(df: pd.DataFrame, path: Path, seed: int) -> Path:
    rows = list(range(len(df)))
    random.Random(seed).shuffle(rows)
    df.iloc[rows].to_csv(path, index=False)
    return path


# ------------------------------------------------------------------------ the rule itself
def test_prompts_are_identified_by_their_text_or_their_tensors() -> None:
    assert joins.prompt_key("a", "the cat") == joins.prompt_key("zz", "the cat")
    assert joins.prompt_key("a", "the cat") != joins.prompt_key("a", "the dog")
    # ready-made inputs: the hash their id carries, whatever their position or description
    one, two = "input-00003-0123456789", "input-00007-0123456789"
    assert joins.prompt_key(one, "<image 3x8x8>") == joins.prompt_key(two, "<4 token ids>")
    assert joins.prompt_key(one, "<image 3x8x8>") != joins.prompt_key(
        "input-00003-abcdefabcd", "<image 3x8x8>")
    a = pd.DataFrame({"prompt_id": ["x", "y"], "text": ["one", "two"]})
    b = pd.DataFrame({"prompt_id": ["q", "p"], "text": ["two", "one"]})
    assert joins.prompt_set_key(a) == joins.prompt_set_key(b)
    assert joins.match_prompts(a, b) == {"x": "p", "y": "q"}
    with pytest.raises(BlockCouplingError, match="only in run A: y; only in run B: q"):
        joins.match_prompts(a, b.assign(text=["three", "one"]))
    with pytest.raises(BlockCouplingError, match="are the same text"):
        joins.match_prompts(a.assign(text=["one", "one"]), b)


def test_values_attach_to_prompts_by_text_in_any_order() -> None:
    prompts = pd.DataFrame({"prompt_id": ["s-0001", "s-0003"], "text": ["b", "d"]})
    table = pd.DataFrame({"prompt_id": [f"s-{i:04d}" for i in range(4)],
                          "text": ["a", "b", "c", "d"], "rating": [0.1, 0.2, 0.3, 0.4]})
    got = joins.attach_to_prompts(prompts, table, "rating", source="t", fix="fix it")
    assert got.tolist() == [0.2, 0.4]
    reordered = table.iloc[::-1].assign(prompt_id=table["prompt_id"])  # the ids follow the row
    assert joins.attach_to_prompts(prompts, reordered, "rating", source="t",
                                   fix="x").tolist() == [0.2, 0.4]
    with pytest.raises(BlockCouplingError, match="1 measured prompt.*no rating in t.*s-0003"):
        joins.attach_to_prompts(prompts, table.assign(text=["a", "b", "c", "e"]), "rating",
                                source="t", fix="fix it")
    twice = pd.concat([table, table.iloc[[1]].assign(rating=0.9)])
    with pytest.raises(BlockCouplingError, match="one prompt text has two ratings"):
        joins.attach_to_prompts(prompts, twice, "rating", source="t", fix="x")
    same = pd.concat([table, table.iloc[[1]]])  # listed twice with one value: one rating
    assert joins.attach_to_prompts(prompts, same, "rating", source="t",
                                   fix="x").tolist() == [0.2, 0.4]


def _depth(tokens: dict[str, list[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"prompt_id": p, "kind": "depth", "token_out_a": t}
                         for p, ts in tokens.items() for t in ts])


def test_tokens_are_what_each_run_measured() -> None:
    prompts = pd.DataFrame({"prompt_id": ["p0", "p1"], "n_tokens": [3, 5]})
    every = joins.measured_tokens(_depth({"p0": [0, 1, 2], "p1": [0, 1, 2, 3, 4]}), prompts,
                                  "last")
    last = joins.measured_tokens(_depth({"p0": [2], "p1": [4]}), prompts, "last")
    zero = joins.measured_tokens(_depth({"p0": [0], "p1": [0]}), prompts, "last")
    assert every.roles == last.roles == {("end", (0,))}
    assert zero.describe() == "position 0 (each prompt's first token)"
    assert joins.common_tokens({"a": every, "b": last}, "last") == (
        "position -1 (each prompt's last token)")
    with pytest.raises(BlockCouplingError, match=r"the runs measured other tokens.*position -1 "
                       r"\(each prompt's last token\): a, b; position 0 \(each prompt's first "
                       r"token\): c.*--tokens"):
        joins.common_tokens({"a": every, "b": last, "c": zero}, "last")
    # the same rule on runs measured at token 0 is one position in all of them
    first = joins.measured_tokens(_depth({"p0": [0, 1, 2], "p1": [0, 1, 2, 3, 4]}), prompts,
                                  "first")
    assert joins.common_tokens({"a": first, "c": zero}, "first").startswith("position 0")
    # all tokens: every position of each prompt, or the same positions of each
    assert joins.measured_tokens(_depth({"p0": [0, 1, 2], "p1": [0, 1, 2, 3, 4]}), prompts,
                                 "all").roles == {("every", ())}
    some = joins.measured_tokens(_depth({"p0": [0, 1], "p1": [0, 1]}), prompts, "all")
    assert some.describe() == "position(s) 0,1 of each prompt"
    mixed = joins.measured_tokens(_depth({"p0": [1], "p1": [2]}), prompts, "last")
    assert not mixed.roles and "other positions in each prompt" in mixed.describe()
    same_length = pd.DataFrame({"prompt_id": ["p0", "p1"], "n_tokens": [4, 4]})
    at3 = joins.measured_tokens(_depth({"p0": [3], "p1": [3]}), same_length, "last")
    assert ("end", (0,)) in at3.roles and ("start", (3,)) in at3.roles  # both are true


def test_score_rows_name_models_once() -> None:
    rows = [["org/a"], ["b", "B-printed"], ["other/c"], ["org/d@r1"], ["org/d"]]
    keys = {"a": (["a", "org/a"], ["a", "org/a"]), "b": (["b-printed"], ["b-printed"]),
            "c": (["c"], ["c"]), "d": (["org/d@r1"], ["org/d@r1"]),
            "e": (["zzz/c-other"], ["zzz/c-other"])}
    assert joins.match_names(keys, rows) == {"a": 0, "b": 1, "c": 2, "d": 3, "e": None}
    # a hub id never takes another organisation's model of the same name
    assert joins.match_names({"x": (["mine/c"], ["mine/c"])}, rows) == {"x": None}
    with pytest.raises(BlockCouplingError, match="the run a is named by 2 rows"):
        joins.match_names({"a": (["org/a", "b"], [])}, rows)
    with pytest.raises(BlockCouplingError, match="runs a, z all match the score row 'org/a'"):
        joins.match_names({"a": (["org/a"], []), "z": (["a"], ["a"])}, rows)
    with pytest.raises(BlockCouplingError, match="'x' is listed by 2 rows"):
        joins.match_names({"q": (["x"], [])}, [["x"], ["y", "X "]])
    with pytest.raises(BlockCouplingError, match="listed twice: Org/M = org/m"):
        joins.check_unique_names(["org/m", "b", "Org/M"], "t.csv")


def test_checkpoints_are_what_was_loaded() -> None:
    assert joins.loaded({"revision": "step10"}, "step10", where="u") == "step10"
    assert joins.loaded({}, "step10", where="u") == "step10"
    assert joins.loaded({"revision": "step10"}, float("nan"), where="u") == "step10"
    with pytest.raises(BlockCouplingError, match="u: its catalogue names revision 'step20' "
                                                 "but the run loaded 'step10'"):
        joins.loaded({"revision": "step10"}, "step20", where="u")
    joins.check_distinct_weights({"a": "h1", "b": "h2", "c": None, "d": None})
    with pytest.raises(BlockCouplingError, match="runs a, c measured the same weights"):
        joins.check_distinct_weights({"a": "h1", "b": "h2", "c": "h1"})


def test_tables_join_on_every_key_once() -> None:
    left = pd.DataFrame({"run": ["a", "b"], "step": [1, 2], "x": [1.0, 2.0]})
    right = pd.DataFrame({"run": ["b", "a"], "step": [2, 1], "y": [20.0, 10.0]})
    got = joins.join_on(left, right, ["run", "step"], names=("L", "R"), what="redo")
    assert got["y"].tolist() == [10.0, 20.0]
    with pytest.raises(BlockCouplingError, match=r"only R has \('c', 3\).*; redo"):
        joins.join_on(left, pd.concat([right, pd.DataFrame({"run": ["c"], "step": [3],
                                                             "y": [0.0]})]),
                      ["run", "step"], names=("L", "R"), what="redo")
    more = pd.concat([right, pd.DataFrame({"run": ["c"], "step": [3], "y": [0.0]})])
    assert joins.join_on(left, more, ["run", "step"], names=("L", "R"), what="redo",
                         right_may_have_more=True)["y"].tolist() == [10.0, 20.0]
    with pytest.raises(BlockCouplingError, match=r"only L has \('b', 2\)"):
        joins.join_on(left, more.iloc[1:], ["run", "step"], names=("L", "R"), what="redo",
                      right_may_have_more=True)
    with pytest.raises(BlockCouplingError, match=r"L lists \('a', 1\) twice"):
        joins.join_on(pd.concat([left, left.iloc[[0]]]), right, ["run", "step"],
                      names=("L", "R"), what="redo")


# --------------------------------------------------------------- correlate and its K sweep
def _correlate_outputs(runs: list[Path], scores: pd.DataFrame, tmp_path: Path,
                       runs_of: list[list[str]]) -> None:
    """``correlate --json`` (each option list of ``runs_of``) on the runs and the score rows in
    two other orders: one output per option list."""
    outs = []
    for seed in range(2):
        order = list(runs)
        random.Random(seed).shuffle(order)
        csv = _shuffled_csv(scores, tmp_path / f"s{seed}.csv", seed)
        for i, extra in enumerate(runs_of):
            r = cli("correlate", *map(str, order), "--scores", str(csv), "--json", *extra)
            assert r.exit_code == 0, r.output
            outs.append((i, r.output.replace(str(csv), "CSV")))
    for i in range(len(runs_of)):
        same = {out for j, out in outs if j == i}
        assert len(same) == 1, "another order of the runs or the score rows changed the JSON"
    data = json.loads(outs[0][1])
    assert [m["label"] for m in data["models"]] == sorted(scores["model"])


def test_correlate_is_the_same_for_inputs_in_any_order(runs: list[Path], scores: pd.DataFrame,
                                                       tmp_path: Path) -> None:
    _correlate_outputs(runs, scores, tmp_path, [["--n-boot", "0"], ["--k", "2,3", "--n-boot",
                                                                    "0"]])


@pytest.mark.slow  # 11 models and their bootstrap
def test_correlate_bootstrap_is_the_same_for_inputs_in_any_order(tmp_path: Path) -> None:
    """From 10 models the bootstrap interval of R^2 is computed, resampling rows by their
    position: the models are in one order, whatever the inputs'."""
    n = 11
    runs = [write_synthetic_run(tmp_path / f"run{i}", 0.2 + 0.05 * i, label=f"m{i:02d}",
                                model=f"org/model-{i}", seed=i) for i in range(n)]
    scores = pd.DataFrame({"model": [f"m{i:02d}" for i in range(n)],
                           "score": [20.0 + 3 * i + (i % 3) for i in range(n)]})
    _correlate_outputs(runs, scores, tmp_path, [["--n-boot", "50"]])
    r = cli("correlate", *map(str, runs), "--scores", str(tmp_path / "s0.csv"), "--json",
            "--n-boot", "50")
    r2_ci = json.loads(r.output)["predictors"]["coupling_mean"]["r2_ci"]
    assert r2_ci[0] is not None and r2_ci[0] < r2_ci[1]  # the bootstrap ran


def test_a_run_measured_at_other_tokens_is_refused(runs: list[Path], scores: pd.DataFrame,
                                                   tmp_path: Path) -> None:
    """The tester's case: a run measured at --tokens 0 declares the headline rule 'last' like
    the others and entered the correlation with its token-0 value, silently."""
    zero = write_synthetic_run(tmp_path / "zero", 0.9, label="m4", model="org/model-4",
                               seed=4, token=0)
    csv = _shuffled_csv(scores, tmp_path / "s.csv", 0)
    for extra in ([], ["--k", "2,3"]):
        r = cli("correlate", *map(str, runs[:4]), str(zero), "--scores", str(csv),
                "--n-boot", "0", *extra)
        _one_line_error(r, "the runs measured other tokens")
        assert "position 0 (each prompt's first token): m4" in r.output
    # where every run measured token 0 the rule 'first' reads one position in all of them
    ok = cli("correlate", *map(str, runs[:4]), str(zero), "--scores", str(csv), "--n-boot",
             "0", "--tokens", "first")
    assert ok.exit_code == 0, ok.output


def test_other_prompt_texts_and_one_model_twice_are_refused(
        runs: list[Path], scores: pd.DataFrame, tmp_path: Path) -> None:
    other = write_synthetic_run(tmp_path / "other", 0.9, label="m4", model="org/model-4",
                                seed=4, text="another text {}")
    csv = _shuffled_csv(scores, tmp_path / "s.csv", 1)
    r = cli("correlate", *map(str, runs[:4]), str(other), "--scores", str(csv), "--n-boot", "0")
    _one_line_error(r, "measured on 2 different prompt sets")
    twins = [write_synthetic_run(tmp_path / f"w{i}", lv, label=f"m{i}", model=f"org/w-{i}",
                                 seed=i, weights_hash="ab" * 32 if i in (1, 3) else f"{i}" * 64)
             for i, lv in enumerate(LEVELS)]
    r = cli("correlate", *map(str, twins), "--scores", str(csv), "--n-boot", "0")
    _one_line_error(r, "runs m1, m3 measured the same weights (weights hash abababababab)")


# ------------------------------------------------------------------------ hostile scores
def _lmeval(root: Path, content: str) -> Path:
    root.mkdir()
    (root / "results_2024-01-01T00-00-00.json").write_text(content)
    return root


def _good(model: str) -> dict:
    return {"results": {"arc_challenge": {"acc_norm,none": 0.5}}, "model_name": model}


HOSTILE = {
    "deep.json": ('{"results": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    "model_list": (json.dumps({**_good("m0"), "model_name": ["m0"]}),
                   "model_name is a list, not a string"),
    "revision_dict": (json.dumps({**_good("m0"), "config": {"model_revision": {"a": 1}}}),
                      "config.model_revision is a dict"),
    "args_list": (json.dumps({"results": _good("x")["results"],
                              "config": {"model_args": ["pretrained=m0"]}}),
                  "config.model_args is a list"),
    "params_inf": ('{"results": {"arc_challenge": {"acc_norm": 0.5}}, "model_name": "m0", '
                   '"config": {"model_num_parameters": Infinity}}',
                   "config.model_num_parameters is inf"),
    "percent": (json.dumps({"results": {"arc_challenge": {"acc_norm": 50.0}},
                            "model_name": "m0"}), "not a fraction between 0 and 1"),
}
CSV_HOSTILE = {
    "case_twice": ("model,score\nm0,1\nm1,2\nm2,3\nm3,4\nm4,5\nM1,6\n",
                   "listed twice: M1 = m1 (names compare without case and blanks)"),
    "blank_twice": ("model,score\nm0,1\nm1,2\nm2,3\nm3,4\nm4,5\n m1 ,6\n", "listed twice: m1"),
    "two_rows_one_run": ("model,score\nm0,1\nm1,2\nm2,3\nm3,4\nm4,5\norg/model-1,7\n",
                         "the run m1 is named by 2 rows ('m1', 'org/model-1'"),
    "params_inf": ("model,score,params_b\nm0,1,1\nm1,2,inf\nm2,3,1\nm3,4,1\nm4,5,1\n",
                   "'params_b' is not a positive finite number for m1"),
    "params_negative": ("model,score,params_b\nm0,1,1\nm1,2,-3\nm2,3,1\nm3,4,1\nm4,5,1\n",
                        "'params_b' is not a positive finite number for m1"),
    "no_score_for_a_run": ("model,score\nm0,1\nm1,2\nm2,3\nm3,4\n",
                           "no score for 1 run(s): m4"),
    "bool_score": ("model,score\nm0,1\nm1,True\nm2,3\nm3,4\nm4,5\n",
                   "'score' is not a number for m1"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_lmeval_results_are_one_line(case: str, runs: list[Path], tmp_path: Path) -> None:
    content, want = HOSTILE[case]
    folder = _lmeval(tmp_path / "lm", content)
    for args in (["correlate", *map(str, runs), "--n-boot", "0"], ["chance-floor"]):
        _one_line_error(cli(*args, "--scores", str(folder)), want)


@pytest.mark.parametrize("case", sorted(CSV_HOSTILE))
def test_hostile_score_tables_are_one_line(case: str, runs: list[Path], tmp_path: Path) -> None:
    content, want = CSV_HOSTILE[case]
    csv = tmp_path / "s.csv"
    csv.write_text(content)
    _one_line_error(cli("correlate", *map(str, runs), "--scores", str(csv), "--n-boot", "0"),
                    want)


def test_nonfinite_scores_are_a_stated_exclusion(runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    csv.write_text("model,score\nm0,1\nm1,inf\nm2,3\nm3,4\nm4,1e400\n")
    r = cli("correlate", *map(str, runs), "--scores", str(csv), "--n-boot", "0", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["n_models"] == 3 and [e["label"] for e in data["excluded"]] == ["m1", "m4"]
    assert all("not a finite number" in e["reason"] for e in data["excluded"])


# ------------------------------------------------------------------------- chance-floor
def test_chance_floor_is_the_same_for_rows_in_any_order(tmp_path: Path) -> None:
    from blockcoupling.studies.chance_floor import chance_floor
    from blockcoupling.studies.scores import paper_scores

    paper = paper_scores()
    outs = set()
    for seed in range(3):
        csv = _shuffled_csv(paper, tmp_path / f"p{seed}.csv", seed)
        r = cli("chance-floor", "--scores", str(csv), "--json")
        assert r.exit_code == 0, r.output
        outs.add(r.output.replace(str(csv), "CSV"))
    assert len(outs) == 1
    frame = paper.iloc[::-1].reset_index(drop=True)
    assert chance_floor(frame).to_dict() == chance_floor(paper).to_dict()
    with pytest.raises(BlockCouplingError, match="listed twice"):
        chance_floor(pd.concat([paper, paper.iloc[[0]].assign(model=paper["model"][0].upper())]))
    with pytest.raises(BlockCouplingError, match="not a list"):
        chance_floor([1, 2])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- difficulty
@pytest.fixture(scope="module")
def rated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return measure_rated(tmp_path_factory.mktemp("rated"))


def test_difficulty_joins_ratings_by_the_prompt_text(rated: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    """The tester's case: the same ratings file in another order gave most prompts another
    prompt's rating, silently (ratings were named by their row number)."""
    run, rows = rated
    lines = rows.read_text().splitlines()
    outs = set()
    for seed in range(3):
        shuffled = tmp_path / f"r{seed}.jsonl"
        order = list(lines)
        random.Random(seed).shuffle(order)
        shuffled.write_text("\n".join(order) + "\n")
        r = cli("difficulty", str(run), "--ratings", f"hf:e2h-arc@{shuffled}", "--n-boot",
                "300", "--json")
        assert r.exit_code == 0, r.output
        data = json.loads(r.output)
        data.pop("ratings")  # the file's name
        outs.add(json.dumps(data))
    assert len(outs) == 1
    want = {json.loads(line)["question"]: json.loads(line)["rating"] for line in lines}
    from blockcoupling.store import open_run

    texts = open_run(run).prompts.set_index("prompt_id")["text"]
    for row in json.loads(outs.pop())["prompts"]:
        question = texts[row["prompt_id"]].split("\n")[0].removeprefix("Question: ")
        assert row["rating"] == want[question]
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(line.replace('"question": "', '"question": "X ')
                                for line in lines) + "\n")
    _one_line_error(cli("difficulty", str(run), "--ratings", f"hf:e2h-arc@{edited}"),
                    "have no rating")
    twice = tmp_path / "twice.jsonl"
    changed = json.loads(lines[0])
    changed["rating"] = 0.999
    twice.write_text("\n".join([*lines, json.dumps(changed)]) + "\n")
    _one_line_error(cli("difficulty", str(run), "--ratings", f"hf:e2h-arc@{twice}"),
                    "one prompt text has two ratings")


# ------------------------------------------------------------- every command goes through it
#: the commands that combine inputs of several files or runs, and the modules that join them
COMBINING = {
    "correlate": ("studies.correlate", "studies.model_units", "studies.scores",
                  "studies.vary_k"),
    "chance-floor": ("studies.chance_floor", "studies.scores"),
    "difficulty": ("studies.difficulty",),
    "cross": ("studies.cross",),
    "study lm-family": ("studies.lm_study.run", "studies.lm_study.analysis"),
    "study generalization": ("studies.generalization.analysis", "studies.generalization.run"),
    "study intervention": ("studies.intervention.analysis", "studies.intervention.run"),
}
#: the commands that join nothing across files or runs, and why
NOT_COMBINING = {
    "measure": "one model on one prompt set", "models": "lists architectures",
    "demo": "runs its own models", "show": "one run", "perturb": "one model on one prompt set",
    "report": "each run's own numbers on one page; nothing joined across runs",
    "sweep": "writes a collection", "sweep-status": "one collection's own units",
    "collection upgrade": "one collection", "vit-train": "one training",
    "vit-grid": "writes a collection", "vit-figures": "each training folder's own records",
}
#: the tests that plant a mismatch in each combining command
PLANTED = {
    "correlate": "test_a_run_measured_at_other_tokens_is_refused",
    "chance-floor": "test_hostile_score_tables_are_one_line",
    "difficulty": "test_difficulty_joins_ratings_by_the_prompt_text",
    "cross": "tests/studies/test_trust.py::test_cross_compares_prompt_texts_not_ids",
    "study lm-family": "test_tables_join_on_every_key_once",
    "study generalization": "test_tables_join_on_every_key_once",
    "study intervention": "test_tables_join_on_every_key_once",
}


def _commands() -> set[str]:
    import typer.main

    from blockcoupling.cli import app

    out: set[str] = set()

    def walk(cmd: object, prefix: str) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            if getattr(sub, "commands", None):
                walk(sub, f"{prefix}{name} ")
            else:
                out.add(prefix + name)
    walk(typer.main.get_command(app), "")
    return out


def _tree(module: str) -> ast.Module:
    path = SRC.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(module: str) -> set[str]:
    """The package's modules ``module`` imports (also inside functions)."""
    out: set[str] = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("blockcoupling."):
            base = node.module.removeprefix("blockcoupling.")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("blockcoupling.") for a in node.names
                       if a.name.startswith("blockcoupling."))
    return {m for m in out if SRC.joinpath(*m.split(".")).with_suffix(".py").is_file()
            or (SRC.joinpath(*m.split(".")) / "__init__.py").is_file()}


def _reaches_joins(module: str) -> bool:
    """Whether ``module`` imports ``studies.joins``, itself or through the study modules it
    imports."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m == "studies.joins":
            return True
        todo += [x for x in _imported(m) if x.startswith("studies.") and x != "studies"]
    return False


def test_every_command_is_classified() -> None:
    """A new command is either a join of inputs (then it goes through studies.joins and has
    a planted mismatch) or says why it joins nothing."""
    new = _commands() - set(COMBINING) - set(NOT_COMBINING)
    assert not new, (f"commands {sorted(new)}: add each to COMBINING (it joins inputs of several "
                     "files or runs: through studies.joins, with a planted mismatch in PLANTED) "
                     "or to NOT_COMBINING with the reason it joins nothing")
    assert _commands() == set(COMBINING) | set(NOT_COMBINING), "a listed command is gone"
    assert set(PLANTED) == set(COMBINING)
    here = Path(__file__).read_text(encoding="utf-8")
    for test in PLANTED.values():
        if "::" in test:
            path, name = test.split("::")
            assert f"def {name}(" in (SRC.parents[1] / path).read_text(encoding="utf-8")
        else:
            assert f"def {test}(" in here


@pytest.mark.parametrize("command", sorted(COMBINING))
def test_every_combining_command_joins_through_the_one_module(command: str) -> None:
    for module in COMBINING[command]:
        assert _reaches_joins(module), f"{module} ({command}) joins without studies.joins"
    assert not _reaches_joins("studies.regression")  # the check can fail: pure statistics


def _hand_joins(tree: ast.Module) -> list[int]:
    """Lines of DataFrame joins written by hand: ``.merge(``, ``pd.merge(``, ``.join(...,
    on=...)``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name == "merge" or (name == "join" and any(k.arg == "on" for k in node.keywords)):
                lines.append(node.lineno)
    return lines


def test_no_join_is_written_by_hand() -> None:
    """studies/ and cli/ join tables only through studies.joins (its `join_on`)."""
    found = {}
    for path in sorted((SRC / "studies").rglob("*.py")) + sorted((SRC / "cli").rglob("*.py")):
        if path.name == "joins.py":
            continue
        lines = _hand_joins(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[str(path.relative_to(SRC))] = lines
    assert not found, f"joins written by hand (use studies.joins): {found}"
    assert _hand_joins(ast.parse("a.merge(b, on='x')\nc.join(d, on='k')\n','.join(x)")) == [1, 2]


def test_the_rule_is_stated_once_in_the_conventions() -> None:
    """The rule in docs/conventions.md; the how-tos of correlate, cross and difficulty link
    it (and restate none of it)."""
    docs = SRC.parents[1] / "docs"
    conventions = (docs / "conventions.md").read_text(encoding="utf-8")
    assert conventions.count("## Joins by content") == 1
    for page in ("how-to/correlate.md", "how-to/bases.md", "paper.md"):
        assert "conventions.md#joins-by-content" in (docs / page).read_text(encoding="utf-8")
    design = (docs / "DESIGN.md").read_text(encoding="utf-8")
    assert "joins.py" in design and "conventions.md#joins-by-content" in design


def test_one_run_given_twice_is_refused() -> None:
    """Runs side by side are told apart by the record they hold (its seal), not by their
    path: the same directory twice, or a copy, is one line; runs without a seal pass."""
    joins.check_distinct_runs([("a", "d1"), ("b", "d2"), ("c", None), ("d", None)])
    with pytest.raises(BlockCouplingError, match="runs a, a are one run"):
        joins.check_distinct_runs([("a", "d1"), ("a", "d1")])
    with pytest.raises(BlockCouplingError, match="runs a, copy are one run"):
        joins.check_distinct_runs([("a", "d1"), ("b", "d2"), ("copy", "d1")])
