"""Joins by content identity: the one rule by which inputs of several files and runs are put
side by side (``docs/conventions.md``, "Joins by content", states it in full).

Every command that combines inputs joins them here, never by a row's position or by what a
file declares: prompts by their content (`prompt_key`; `attach_to_prompts`, `match_prompts`,
`prompt_set_key`, `check_prompt_sets`), tokens by what was measured (`measured_tokens`,
`common_tokens`), scores by the model identity they name (`match_names`, `name_key`,
`check_unique_names`), checkpoints by what was loaded (`check_distinct_weights`, `loaded`) and
a study's tables by their keys (`join_on`). Every joined output is in one canonical order
(`canonical_order`). Pure functions over plain tables; errors are `BlockCouplingError` lines
that say what to do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from blockcoupling.engine.inputs import content_of_id
from blockcoupling.errors import BlockCouplingError
from blockcoupling.hashing import canonical_hash

__all__ = [
    "JoinedModel",
    "MeasuredTokens",
    "attach_to_prompts",
    "canonical_order",
    "check_distinct_runs",
    "check_distinct_weights",
    "check_models",
    "check_prompt_sets",
    "check_unique_names",
    "common_tokens",
    "join_on",
    "loaded",
    "match_names",
    "match_prompts",
    "measured_tokens",
    "name_key",
    "prompt_key",
    "prompt_keys",
    "prompt_set_key",
    "same_weights",
]


# ------------------------------------------------------------------------------- prompts
def prompt_key(prompt_id: object, text: object) -> str:
    """A prompt's content identity: sha256 of its text, or for a ready-made input (its id made
    by ``engine.inputs.content_id``) the hash of its tensors that the id carries."""
    tensors = content_of_id(str(prompt_id))
    if tensors is not None:
        return "tensors:" + tensors
    if text is None or (isinstance(text, float) and math.isnan(text)):
        raise BlockCouplingError(f"prompt {prompt_id!r} has no text, so it cannot be "
                                 "identified by its content; the run's prompts table is damaged")
    return canonical_hash(str(text))


def prompt_keys(prompts: pd.DataFrame) -> dict[str, str]:
    """``prompt_id -> prompt_key`` of a prompts table (``prompt_id``, ``text``)."""
    return {str(pid): prompt_key(pid, text)
            for pid, text in zip(prompts["prompt_id"], prompts["text"], strict=True)}


def prompt_set_key(prompts: pd.DataFrame) -> str:
    """The content of a prompt set: sha256 of its prompts' keys, sorted (the ids and the
    order do not count)."""
    return canonical_hash(sorted(prompt_keys(prompts).values()), compact=False)


def _show(items: Sequence[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def _groups(pairs: Iterable[tuple[Any, str]]) -> dict[Any, list[str]]:
    """``key -> the items of that key`` (in the order given): who shares a key."""
    out: dict[Any, list[str]] = {}
    for key, item in pairs:
        out.setdefault(key, []).append(item)
    return out


def _first_shared(pairs: Iterable[tuple[Any, str]]) -> tuple[Any, list[str]] | None:
    """The first key (in sorted order) that two or more items share, with its items."""
    shared = sorted((key, items) for key, items in _groups(pairs).items() if len(items) > 1)
    return shared[0] if shared else None


def _by_key(prompts: pd.DataFrame, where: str) -> dict[str, str]:
    """``prompt_key -> prompt_id``; one line where two prompts of one table are one text."""
    out: dict[str, str] = {}
    for pid, key in prompt_keys(prompts).items():
        if key in out:
            raise BlockCouplingError(
                f"{where}: prompts {out[key]!r} and {pid!r} are the same text, so they cannot "
                "be told apart by their content; measure each text once")
        out[key] = pid
    return out


def match_prompts(a: pd.DataFrame, b: pd.DataFrame, *, names: tuple[str, str] = ("run A", "run B")
                  ) -> dict[str, str]:
    """``a``'s prompt ids -> ``b``'s prompt ids of the same content (`prompt_key`), every
    prompt of each matched; else one line naming what only one side measured."""
    ka, kb = _by_key(a, names[0]), _by_key(b, names[1])
    only_a = sorted(pid for key, pid in ka.items() if key not in kb)
    only_b = sorted(pid for key, pid in kb.items() if key not in ka)
    if only_a or only_b:
        raise BlockCouplingError(
            f"{names[0]} and {names[1]} measured other prompts (joined by their text)"
            + (f"; only in {names[0]}: {_show(only_a)}" if only_a else "")
            + (f"; only in {names[1]}: {_show(only_b)}" if only_b else "")
            + ": a prompt of one id but another text is another prompt; measure both on the "
            "same prompts")
    return {ka[key]: kb[key] for key in sorted(ka, key=ka.__getitem__)}


def attach_to_prompts(prompts: pd.DataFrame, values: pd.DataFrame, column: str, *,
                      source: str, fix: str) -> pd.Series:
    """``values[column]`` of the row of each prompt's content (``values`` has ``text`` and, for
    ready-made inputs, ``prompt_id``), aligned with ``prompts``' rows. A measured prompt the
    table does not have, or a content the table lists twice with two values, is one line
    (``fix`` says what to give instead); a table in another order gives the same values."""
    lacking = [c for c in ("text", column) if c not in values.columns]
    if lacking:
        raise BlockCouplingError(f"{source}: no {' or '.join(lacking)} column; a table joined "
                                 f"to prompts gives each prompt's text and its {column}")
    want = prompt_keys(prompts)
    ids = values["prompt_id"] if "prompt_id" in values.columns else [""] * len(values)
    keys = [prompt_key(pid, text) for pid, text in zip(ids, values["text"], strict=True)]
    found: dict[str, float] = {}
    for key, value in zip(keys, values[column], strict=True):
        v = float(value)
        if key in found and not (found[key] == v or (math.isnan(found[key]) and math.isnan(v))):
            raise BlockCouplingError(
                f"{source}: one prompt text has two {column}s ({found[key]:g} and {v:g}); "
                f"the {column} of a text must be one value: fix the file")
        found.setdefault(key, v)
    missing = sorted(pid for pid, key in want.items() if key not in found)
    if missing:
        raise BlockCouplingError(
            f"{len(missing)} measured prompt(s) have no {column} in {source} (prompts are "
            f"joined by their text): {_show(missing, 4)}; {fix}")
    return pd.Series([found[want[str(pid)]] for pid in prompts["prompt_id"]],
                     index=prompts.index, name=column, dtype="float64")


# -------------------------------------------------------------------------------- tokens
@dataclass(frozen=True)
class MeasuredTokens:
    """Where a run's per-prompt values were read: the positions (relative to each prompt's
    start and to its end) that hold for every prompt (``roles``; empty where no position is
    common to all of them), and one prompt as an example."""

    roles: frozenset[tuple[str, tuple[int, ...]]]
    example: str

    def describe(self) -> str:
        return _describe_roles(self.roles) or f"other positions in each prompt ({self.example})"


_ROLE_ORDER = {"end": 0, "every": 1, "start": 2}


def _describe_roles(roles: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    """The first role in words (`MeasuredTokens`), as ``--tokens`` writes positions."""
    for kind, pos in sorted(roles, key=lambda r: (_ROLE_ORDER[r[0]], r[1])):
        if kind == "every":
            return "every token of each prompt"
        if kind == "end":
            shown = ",".join(str(-(j + 1)) for j in sorted(pos, reverse=True))
            return (f"position {shown} (each prompt's last token)" if pos == (0,)
                    else f"positions {shown} from each prompt's end")
        shown = ",".join(map(str, pos))
        return ("position 0 (each prompt's first token)" if pos == (0,)
                else f"position(s) {shown} of each prompt")
    return ""


def measured_tokens(coupling: pd.DataFrame, prompts: pd.DataFrame, tokens: str, *,
                    where: str = "run") -> MeasuredTokens:
    """The token positions a statistic under the token rule ``tokens`` (``last``, ``first``,
    ``all``: ``engine.statistic.TOKEN_RULES``) reads in one run: from its depth-wise rows
    (``token_out_a`` per prompt) and its prompts' lengths (``n_tokens``), what it measured,
    whatever it declares."""
    depth = coupling.loc[coupling["kind"] == "depth", ["prompt_id", "token_out_a"]]
    if "n_tokens" not in prompts.columns:
        raise BlockCouplingError(f"{where}: its prompts table has no n_tokens, so the tokens "
                                 "it measured are unknown; measure it again")
    lengths = dict(zip(prompts["prompt_id"].astype(str), prompts["n_tokens"].astype(int),
                       strict=True))
    picked: dict[str, tuple[int, ...]] = {}
    for pid, ts in depth.groupby(depth["prompt_id"].astype(str), sort=True)["token_out_a"]:
        pos = sorted({int(t) for t in ts})
        picked[str(pid)] = (pos[-1],) if tokens == "last" else (pos[0],) if tokens == "first" \
            else tuple(pos)
    unknown = sorted(set(picked) - set(lengths))
    if unknown:
        raise BlockCouplingError(f"{where}: prompt(s) {_show(unknown)} of its coupling table are "
                                 "not in its prompts table; the run is damaged")
    if not picked:
        return MeasuredTokens(frozenset(), "no depth-wise rows")
    start = {pos for pos in picked.values()}
    end = {tuple(sorted(lengths[p] - 1 - t for t in pos)) for p, pos in picked.items()}
    roles: set[tuple[str, tuple[int, ...]]] = set()
    if len(start) == 1:
        roles.add(("start", next(iter(start))))
    if len(end) == 1:
        roles.add(("end", next(iter(end))))
    if all(pos == tuple(range(lengths[p])) for p, pos in picked.items()):
        roles.add(("every", ()))
    pid = next(iter(picked))
    example = f"{pid}: {','.join(map(str, picked[pid]))} of {lengths[pid]} tokens"
    return MeasuredTokens(frozenset(roles), example)


def common_tokens(measured: Mapping[str, MeasuredTokens], tokens: str) -> str:
    """The positions every run's values were read at (in words), where one is common to all
    of ``measured`` (label -> `measured_tokens`); else one line naming which runs read which
    positions (a run measured at ``--tokens 0`` beside runs at each prompt's last token)."""
    if not measured:
        return ""
    shared = frozenset.intersection(*(m.roles for m in measured.values()))
    if shared:
        return _describe_roles(shared)
    groups = _groups((m.describe(), label) for label, m in measured.items())
    listed = "; ".join(f"{what}: {_show(labels)}" for what, labels in
                       sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])))
    raise BlockCouplingError(
        f"the runs measured other tokens, so the token rule {tokens!r} reads other positions "
        f"in them ({listed}); measure every run at the same tokens (--tokens)")


# ---------------------------------------------------------------------- model identities
def name_key(name: object) -> str:
    """How a model's name compares: without surrounding blanks, case-insensitively."""
    return str(name).strip().casefold()


def check_unique_names(names: Sequence[object], where: str) -> None:
    """One line where two rows name one model (`name_key`)."""
    seen = _groups((name_key(name), str(name).strip()) for name in names)
    dup = sorted(" = ".join(sorted(set(v))) for v in seen.values() if len(v) > 1)
    if dup:
        raise BlockCouplingError(f"{where}: model(s) listed twice: {', '.join(dup)} (names "
                                 "compare without case and blanks); keep one row per model")


def match_names(keys: Mapping[str, tuple[Sequence[str], Sequence[str]]],
                rows: Sequence[Sequence[str]], *, where: str = "score table"
                ) -> dict[str, int | None]:
    """Each item's row: ``keys`` maps an item (a run's label) to its exact names (most
    specific first) and its fallback names (tried in order only where no exact name is
    listed); ``rows`` gives each row's names, its hub id first. A name matches a row that
    lists it (`name_key`); as a fallback, a name without ``/`` also matches a row whose hub id
    ends in ``/<name>``, and a hub id a row that lists its last part (the model without its
    organisation, never another organisation's model of that name). The exact names of an item that lead to two rows, a name that two rows
    share, or two items taking one row are one line each; an item no row names maps to None
    (the caller lists them)."""
    index: dict[str, set[int]] = {}
    tails: dict[str, set[int]] = {}
    for i, names in enumerate(rows):
        for name in names:
            index.setdefault(name_key(name), set()).add(i)
        tails.setdefault(name_key(str(names[0]).rsplit("/", 1)[-1]), set()).add(i)

    def rows_of(name: str, table: dict[str, set[int]]) -> set[int]:
        hit = table.get(name_key(name), set())
        if len(hit) > 1:
            raise BlockCouplingError(
                f"{where}: the name {name!r} is listed by {len(hit)} rows "
                f"({', '.join(repr(str(rows[i][0])) for i in sorted(hit))}); keep one")
        return hit

    chosen: dict[str, int | None] = {}
    for item, (exact, fallback) in keys.items():
        hits = {i for name in exact for i in rows_of(name, index)}
        if len(hits) > 1:
            raise BlockCouplingError(
                f"{where}: the run {item} is named by {len(hits)} rows "
                f"({', '.join(repr(str(rows[i][0])) for i in sorted(hits))}: its label, model "
                "id or folder name); keep the one row of that model")
        for name in fallback if not hits else ():
            hits = (rows_of(name, index) or rows_of(name, tails) if "/" not in name
                    else rows_of(name, index) or rows_of(name.rsplit("/", 1)[-1], index))
            if hits:
                break
        chosen[item] = next(iter(hits)) if hits else None
    clash = _first_shared((row, item) for item, row in chosen.items() if row is not None)
    if clash:
        row, items = clash
        raise BlockCouplingError(
            f"runs {', '.join(items)} all match the score row {str(rows[row][0])!r}; give "
            "each run its own label and put the labels in the score table's 'model' column")
    return chosen


def loaded(meta: Mapping[str, Any], declared: object, *, where: str) -> str | None:
    """The revision a run loaded (its meta's ``revision``), checked against the one a
    catalogue or a spec declares for it (``declared``; empty: not checked): one line where
    they differ. None for a run of no revision."""
    got = meta.get("revision")
    got_s = str(got) if got not in (None, "") else None
    want_s = str(declared) if isinstance(declared, str) and declared else None
    if got_s is not None and want_s is not None and got_s != want_s:
        raise BlockCouplingError(
            f"{where}: its catalogue names revision {want_s!r} but the run loaded {got_s!r}; "
            "the collection was edited or damaged: measure the unit again (blockcoupling "
            "sweep-status names the command)")
    return got_s if got_s is not None else want_s


def check_distinct_weights(weights: Mapping[str, str | None]) -> None:
    """One line where two runs (label -> the weights hash their meta records) measured the
    same weights: one model counted twice."""
    twice = _first_shared((str(h), label) for label, h in weights.items() if h)
    if twice:
        h, labels = twice
        raise BlockCouplingError(
            f"runs {', '.join(labels)} measured the same weights (weights hash "
            f"{h.removeprefix('sha256:')[:12]}): one model counted as several; pass each model "
            "once")


def check_distinct_runs(records: Iterable[tuple[str, str | None]]) -> None:
    """One line where two runs ((label, the seal of the record it holds: its manifest's
    digest) each) are one run: a run directory given twice, or a copy of it, shown as two."""
    twice = _first_shared((str(d), label) for label, d in records if d)
    if twice:
        raise BlockCouplingError(f"runs {', '.join(twice[1])} are one run (the same record: "
                                 "a run directory given twice, or a copy of it); pass each run "
                                 "once")


def same_weights(recorded: object, loaded: str, *, what: str) -> None:
    """One line (``what``: which model to give) where a model's weights hash is not the one a
    run recorded (nothing to check where it recorded none)."""
    if recorded and str(recorded) != loaded:
        raise BlockCouplingError(f"{what} (its weights hash {loaded[:12]} is not the "
                                 f"recorded {str(recorded)[:12]})")


# ---------------------------------------------------------------------------- models
class JoinedModel(Protocol):
    """What `check_models` reads of a model (``studies.model_units.ModelUnit`` is one)."""

    label: str
    coupling: pd.DataFrame
    prompts: pd.DataFrame | None
    weights_hash: str | None


def check_prompt_sets(prompt_sets: Mapping[str, str], *, allow_mixed: bool = False) -> None:
    """Refuse models (label -> `prompt_set_key`) measured on different prompt contents (their
    means are not comparable) unless ``allow_mixed``."""
    sets = _groups((key, label) for label, key in prompt_sets.items())
    if len(sets) > 1 and not allow_mixed:
        listed = "; ".join(f"{key[:10]}: {_show(labs)}" for key, labs in sorted(sets.items()))
        raise BlockCouplingError(
            f"the models were measured on {len(sets)} different prompt sets ({listed}); measure "
            "them on one prompt set, or pass --allow-mixed-prompts to correlate them anyway")


def check_models(models: Sequence[JoinedModel], *, tokens: str,
                 allow_mixed_prompts: bool = False) -> list[Any]:
    """The join of several measured models: one prompt content (`check_prompt_sets`, unless
    ``allow_mixed_prompts``), values read at the same positions under ``tokens``
    (`common_tokens`), distinct weights (`check_distinct_weights`); returns the models in
    `canonical_order` (by label)."""
    missing = [m.label for m in models if m.prompts is None]
    if missing:
        raise BlockCouplingError(
            f"model(s) {_show(missing)} carry no prompts table, so what they measured cannot be "
            "joined; read them from run directories (load_units) or give prompts=")
    check_prompt_sets({m.label: prompt_set_key(m.prompts) for m in models},
                      allow_mixed=allow_mixed_prompts)
    common_tokens({m.label: measured_tokens(m.coupling, m.prompts, tokens,
                                            where=m.label) for m in models}, tokens)
    check_distinct_weights({m.label: m.weights_hash for m in models})
    return canonical_order(models, key=lambda m: (name_key(m.label), m.label))


# ---------------------------------------------------------------------------- tables
def canonical_order(items: Iterable[Any], key: Any) -> list[Any]:
    """``items`` sorted by ``key`` (a unique name): the one order of every joined output."""
    return sorted(items, key=key)


def join_on(left: pd.DataFrame, right: pd.DataFrame, on: Sequence[str], *,
            names: tuple[str, str], what: str, right_may_have_more: bool = False
            ) -> pd.DataFrame:
    """``left`` with ``right``'s columns on the key columns ``on``, in ``left``'s order: each
    key once on each side and on both sides (``right_may_have_more``: every key of ``left``
    in ``right``), else one line naming the keys (``names`` name the two tables, ``what``
    what to do)."""
    on = list(on)
    for name, df in zip(names, (left, right), strict=True):
        dup = df[df.duplicated(on, keep=False)]
        if len(dup):
            shown = [str(tuple(r)) for r in dup[on].drop_duplicates().itertuples(index=False)]
            raise BlockCouplingError(f"{name} lists {_show(shown)} twice; {what}")
    keys_l = set(left[on].itertuples(index=False, name=None))
    keys_r = set(right[on].itertuples(index=False, name=None))
    for name, extra in ((names[0], keys_l - keys_r),
                        (names[1], set() if right_may_have_more else keys_r - keys_l)):
        if extra:
            shown = [str(k) for k in sorted(extra, key=str)]
            raise BlockCouplingError(f"only {name} has {_show(shown)} ({', '.join(on)}); {what}")
    return left.merge(right, on=on, how="left", validate="one_to_one")
