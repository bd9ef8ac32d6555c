"""Reading a collection of any kind (a sweep, a monitor directory, a ViT grid):
[`open_collection`][blockcoupling.runs.read.open_collection] (alias
[`open_sweep`][blockcoupling.runs.read.open_sweep]) -> [`Sweep`][blockcoupling.runs.read.Sweep],
naming no kind (the manifest says it, through `blockcoupling.runs.kinds`). Nothing is loaded
until asked for: [`Sweep.table`][blockcoupling.runs.read.Sweep.table] is one DuckDB query over
the Parquet tables of every finished unit joined with the catalogue, and
[`Sweep.sql`][blockcoupling.runs.read.Sweep.sql] runs any aggregate without materialising rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.results import TABLES
from blockcoupling.engine.statistic import (
    DEFAULT_CI,
    DEFAULT_N_BOOT,
    HEADLINE_VARIANTS,
    STATISTIC_COLUMNS,
    KSpec,
    StatisticRule,
    rule_and_ks,
    statistic_table,
)
from blockcoupling.errors import BlockCouplingError, require
from blockcoupling.runs import integrity, kinds
from blockcoupling.store import collection as store

#: the unit columns put in front of every table read from a sweep
UNIT_COLUMNS = ("unit_id", "label", "model", "revision", "step", "prompt_set")


def unit_columns_in(files: list[str], table: str) -> list[str]:
    """The unit columns (store/schema.py UNIT_KEYS) the files of ``table`` carry themselves:
    the catalogue's are the ones a sweep's tables show."""
    import pyarrow.parquet as pq

    from blockcoupling.store.schema import unit_columns

    names: set[str] = set()
    for f in files:
        names.update(pq.read_schema(f).names)
    return [c for c in unit_columns(table) if c in names]


def _duckdb() -> Any:
    return require("duckdb", what="reading a sweep", install="'blockcoupling[sweep]'")


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _rows(con: Any, query: str, what: str) -> pd.DataFrame:
    """The query's rows; a DuckDB error (a bad ``where``, an unknown column) is one line."""
    try:
        return con.execute(query).df()
    except Exception as err:
        if type(err).__module__.startswith("duckdb"):
            raise BlockCouplingError(f"{what}: {str(err).splitlines()[0]}") from err
        raise


def load_manifest(root: Path) -> dict[str, Any]:
    """The collection's manifest (`store.collection.load_manifest`), of a kind this library
    has registered (else one line: `kinds.get`), with its ``kind`` (`kinds.manifest_kind`:
    one of format 1 records none)."""
    manifest = store.load_manifest(root)
    manifest["kind"] = kinds.get(kinds.manifest_kind(manifest), root / store.MANIFEST).name
    return manifest


class Sweep:
    """A collection directory of any kind (sweep, monitor, vit-grid), finished or not.
    Tables hold the rows of the units that are ``done``, with the unit columns ``unit_id,
    label, model, revision, step, prompt_set`` in front."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest = load_manifest(root)
        self.catalogue: pd.DataFrame = store.catalogue(root, self.manifest)
        self._verified = False

    @property
    def default_tokens(self) -> str:
        """The token rule of this collection's headline (`kinds.collection_tokens`): as its
        manifest states it (``headline_tokens``: a ViT grid writes its ``--tokens``), else
        its kind's ([CLS] = ``"first"`` for a ViT grid), else the paper's last token."""
        return kinds.collection_tokens(self.manifest)

    @property
    def kind(self) -> str:
        """The collection's kind, as its manifest records it: sweep, monitor or vit-grid."""
        return str(self.manifest["kind"])

    def verify(self) -> None:
        """Check every done unit's run directory as ``open_run`` does (sealed manifest,
        checksum of every file, prompt rows counted against the manifest, the unit's
        identity); a `UnitDamagedError` names the
        first damaged unit and the command that measures it again. Every table read calls
        it (once per [`Sweep`][blockcoupling.runs.read.Sweep])."""
        if self._verified:
            return
        damaged = integrity.damaged_units(self.root)
        if damaged:
            uid, problem = next(iter(damaged.items()))
            more = f" (and {len(damaged) - 1} other unit(s))" if len(damaged) > 1 else ""
            raise store.UnitDamagedError(
                f"unit {uid} of {self.root} is damaged{more}: {problem}; "
                + integrity.repair_command(self.root, self.manifest.get("kind")))
        self._verified = True

    def __repr__(self) -> str:
        counts = self.catalogue["status"].value_counts().to_dict() if len(self.catalogue) else {}
        return (f"Sweep({str(self.root)!r}, kind={self.kind}, units={len(self.catalogue)}, "
                f"{counts})")

    # ------------------------------------------------------------------ units
    @property
    def units(self) -> pd.DataFrame:
        """The catalogue: one row per unit (status, message, weights hash, duplicate_of)."""
        return self.catalogue

    def done(self) -> pd.DataFrame:
        return self.catalogue[self.catalogue["status"] == "done"]

    def run_dir(self, unit_id: str) -> Path:
        """The unit's run directory (``units/<id>``; a vit-grid unit's ``units/<id>/<run>``)."""
        at = self.catalogue["unit_id"] == unit_id
        if not at.any():
            raise BlockCouplingError(f"no unit {unit_id!r} in {self.root}; see "
                                     "`blockcoupling sweep-status` for the unit ids")
        return self.root / str(self.catalogue.loc[at, "run_dir"].iloc[0])

    def open_unit(self, unit_id: str) -> Any:
        """The unit's [`Measurement`][blockcoupling.engine.results.Measurement] (``open_run``)."""
        from blockcoupling.store.reader import open_run

        return open_run(self.run_dir(unit_id))

    def duplicates(self) -> pd.DataFrame:
        """Units whose weights (and prompt set, config) repeat an earlier unit's: some hubs
        serve the same weights under different revision names."""
        return self.catalogue[self.catalogue["duplicate_of"].notna()]

    # ------------------------------------------------------------------ tables
    def _connection(self) -> Any:
        duckdb = _duckdb()
        self.verify()
        con = duckdb.connect()
        done = self.done()
        cat = done[list(UNIT_COLUMNS) + ["duplicate_of"]].copy()
        cat["step"] = cat["step"].astype("Int64")
        cat["_unit_order"] = range(len(cat))
        con.register("units", cat)
        for name in TABLES:
            pairs = [(str((self.root / rd / f"{name}.parquet").resolve()), str(uid))
                     for rd, uid in zip(done["run_dir"], done["unit_id"], strict=True)]
            pairs = [(f, uid) for f, uid in pairs if Path(f).is_file()]
            if not pairs:
                continue
            files = [f for f, _ in pairs]
            file_map = pd.DataFrame({"_file": files, "_unit": [uid for _, uid in pairs]})
            con.register(f"_files_{name}", file_map)
            flist = ", ".join(_sql_str(f) for f in files)
            drop = ", ".join(["filename", "file_row_number", *unit_columns_in(files, name)])
            con.execute(
                f"CREATE VIEW {name} AS SELECT u.unit_id, u.label, u.model, u.revision, "
                f"u.step, u.prompt_set, t.* EXCLUDE ({drop}), "
                f"u._unit_order, t.file_row_number AS _row FROM read_parquet([{flist}], "
                f"filename=true, file_row_number=true, union_by_name=true) t "
                f"JOIN _files_{name} f "
                f"ON t.filename = f._file JOIN units u ON u.unit_id = f._unit")
        return con

    def sql(self, query: str) -> pd.DataFrame:
        """Run a DuckDB query over the views ``units`` (the done units) and one view per
        table (``coupling``, ``trajectory``, ``token_metrics``, ``spectra``, ``influence``,
        ``prompts``, ``diagnostics``) holding every done unit's rows (plus ``_unit_order``
        and ``_row``, which order the rows as the catalogue and the files do)."""
        con = self._connection()
        try:
            return _rows(con, query, "query failed")
        finally:
            con.close()

    def table(self, name: str, *, where: str | None = None,
              columns: list[str] | None = None) -> pd.DataFrame:
        """One table across the done units, filtered while reading (``where`` is a DuckDB
        condition such as ``"kind = 'depth' AND k = 10"``)."""
        if name not in TABLES:
            raise BlockCouplingError(f"unknown table {name!r}; tables are {', '.join(TABLES)}")
        from blockcoupling.engine.results import SCHEMAS

        con = self._connection()
        try:
            exists = con.execute("SELECT count(*) FROM information_schema.tables "
                                 f"WHERE table_name = {_sql_str(name)}").fetchone()[0]
            if not exists:
                cols = list(UNIT_COLUMNS) + list(SCHEMAS[name])
                return pd.DataFrame({c: pd.Series(dtype="object") for c in columns or cols})
            sel = ", ".join(f'"{c}"' for c in columns) if columns else \
                "* EXCLUDE (_unit_order, _row)"
            q = (f"SELECT {sel} FROM {name}" + (f" WHERE {where}" if where else "")
                 + " ORDER BY _unit_order, _row")
            df = _rows(con, q, f"reading {name}")
        finally:
            con.close()
        return _unit_types(df)

    coupling = property(lambda self: self.table("coupling"))
    trajectory = property(lambda self: self.table("trajectory"))
    token_metrics = property(lambda self: self.table("token_metrics"))
    spectra = property(lambda self: self.table("spectra"))
    influence = property(lambda self: self.table("influence"))
    prompts = property(lambda self: self.table("prompts"))
    diagnostics = property(lambda self: self.table("diagnostics"))

    # ------------------------------------------------------------------ statistic
    def coupling_statistic(self, *, variants: Sequence[str] | None = None,
                           k: KSpec | Sequence[int] = None, p: float | None = 1.0,
                           orientation: str = "ujv", tokens: str | None = None,
                           diagonal: bool = False, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
                           ci: float = DEFAULT_CI, include_duplicates: bool = False,
                           allow_mixed_k: bool = False, interval: str = "t") -> pd.DataFrame:
        """The headline statistic (``engine.statistic``) of every done unit: the unit
        columns, then one row per variant and K. ``k=None`` is the smallest measured K, which
        must be the same for every unit (a sweep with mixed K is refused: pass ``k``) unless
        ``allow_mixed_k`` (each unit's own smallest K, as [`summary`][blockcoupling.runs.read.Sweep.summary] shows them).
        ``tokens=None`` is the collection's own ([`default_tokens`][blockcoupling.runs.read.Sweep.default_tokens]).
        The keywords are the fields of `StatisticRule`; `statistic` takes the rule whole."""
        rule, ks = rule_and_ks(k, p=p, orientation=orientation,
                               tokens=self.default_tokens if tokens is None else tokens,
                               diagonal=diagonal, n_boot=n_boot, seed=seed, ci=ci,
                               interval=interval)
        return self.statistic(rule, variants=variants, ks=ks,
                              include_duplicates=include_duplicates, allow_mixed_k=allow_mixed_k)

    def statistic(self, rule: StatisticRule, *, variants: Sequence[str] | None = None,
                  ks: Sequence[int] | None = None, include_duplicates: bool = False,
                  allow_mixed_k: bool = False) -> pd.DataFrame:
        """`coupling_statistic` under one `StatisticRule`, passed whole to each unit's
        `statistic_table`."""
        done = self.done()
        if not include_duplicates:
            done = done[done["duplicate_of"].isna()]
        cols = list(UNIT_COLUMNS)
        empty = pd.DataFrame(columns=cols + list(STATISTIC_COLUMNS))
        if done.empty:
            return empty
        coupling = self.table("coupling", where=f"kind = 'depth' AND orientation = "
                                                 f"{_sql_str(rule.orientation)}")
        by_unit = dict(tuple(coupling.groupby("unit_id", sort=False))) if len(coupling) else {}
        frames = []
        for _, unit in done.iterrows():
            uid = str(unit["unit_id"])
            rows = by_unit.get(uid)
            where = f"unit {uid} ({unit['label']})"
            if rows is None:
                raise BlockCouplingError(f"{where}: no depth-wise coupling rows; measure the "
                                         "sweep with coupling: [depth]")
            d = self.unit_meta(uid).get("hidden_size")
            t = statistic_table(rows, rule, variants=variants, ks=ks,
                                d_model=int(d) if d else None, where=where)
            front = pd.DataFrame({c: [unit[c]] * len(t) for c in cols})
            frames.append(pd.concat([front, t], axis=1))
        out = pd.concat(frames, ignore_index=True)
        if (ks is None and rule.k is None and not allow_mixed_k
                and out.groupby("variant")["k"].nunique().max() > 1):
            ks_seen = sorted(int(x) for x in out["k"].unique())
            raise BlockCouplingError(
                f"{self.root}: the units' smallest measured K differ ({ks_seen}); pass one K "
                "that every unit measured (k=..., --k), or k='d/10' for the paper's per-model "
                "rule")
        return _unit_types(out)

    def unit_meta(self, unit_id: str) -> dict[str, Any]:
        """A done unit's ``meta`` (model, hidden_size, num_layers, ...) from its manifest."""
        from blockcoupling.store.manifest import load_manifest

        path = self.run_dir(unit_id)
        return dict(load_manifest(path).get("meta") or {})

    # ------------------------------------------------------------------ summary
    def summary(self, *, k: KSpec = None, p: float = 1.0, orientation: str = "ujv",
                tokens: str | None = None, diagonal: bool = False,
                include_duplicates: bool = False) -> pd.DataFrame:
        """Per done unit: the headline statistic (`coupling_statistic`) in wide form,
        ``coupling_vs_rotated_mean, coupling_vs_rotated_se, coupling_vs_null_mean,
        coupling_vs_null_se, coupling_mean, coupling_se, coupling_chance`` (each unit's K in
        ``k``: ``k=None`` takes each unit's smallest
        measured K; a variant the unit did not measure is NaN),
        mean ``lss`` and median ``expodistance`` (heavy-tailed). Units that duplicate an
        earlier unit's weights are left out unless ``include_duplicates``."""
        rule = StatisticRule(k=k, p=p, orientation=orientation, diagonal=diagonal, n_boot=0,
                             tokens=self.default_tokens if tokens is None else tokens)
        cols = list(UNIT_COLUMNS) + ["weights_hash", "duplicate_of", "n_prompts"]
        base = self.done()[cols].copy()
        if not include_duplicates:
            base = base[base["duplicate_of"].isna()]
        out = base.drop(columns=["duplicate_of"]).reset_index(drop=True)
        stat_cols = ["k", *SUMMARY_STATISTIC_COLUMNS, "lss", "expodistance"]
        for c in stat_cols:
            out[c] = pd.Series([float("nan")] * len(out), dtype="float64")
        if out.empty:
            out["k"] = out["k"].astype("Int64")
            return out
        has_depth = not self.table("coupling", where="kind = 'depth'",
                                   columns=["unit_id"]).empty
        for variant in HEADLINE_VARIANTS:
            if not has_depth:
                break
            try:
                t = self.statistic(rule, variants=(variant,),
                                   include_duplicates=include_duplicates, allow_mixed_k=True)
            except BlockCouplingError as err:
                if "was not measured" in str(err):
                    continue
                raise
            t = t.set_index("unit_id")
            out["k"] = out["unit_id"].map(t["k"]).astype("float64")
            for c in ("mean", "se"):
                out[f"{variant}_{c}"] = out["unit_id"].map(t[c]).astype("float64")
            if variant == "coupling":
                out["coupling_chance"] = out["unit_id"].map(t["chance"]).astype("float64")
        q_traj = """SELECT unit_id, avg(lss) AS lss, median(expodistance) AS expodistance
                    FROM token_metrics GROUP BY unit_id"""
        con = self._connection()
        try:
            names = set(con.execute("SELECT table_name FROM information_schema.tables")
                        .df()["table_name"])
            traj = con.execute(q_traj).df() if "token_metrics" in names else None
        finally:
            con.close()
        if traj is not None:
            traj = traj.set_index("unit_id")
            for c in traj.columns:
                out[c] = out["unit_id"].map(traj[c]).astype("float64")
        out["k"] = out["k"].astype("Int64")
        return out


#: the statistic's columns in [`Sweep.summary`][blockcoupling.runs.read.Sweep.summary] (wide form, chance-corrected first)
SUMMARY_STATISTIC_COLUMNS: tuple[str, ...] = (
    "coupling_vs_rotated_mean", "coupling_vs_rotated_se", "coupling_vs_null_mean",
    "coupling_vs_null_se", "coupling_mean", "coupling_se", "coupling_chance")


def _unit_types(df: pd.DataFrame) -> pd.DataFrame:
    """The unit columns typed alike in every sweep: ``step`` Int64, the others string."""
    for col in UNIT_COLUMNS:
        if col in df.columns:
            df[col] = df[col].astype("Int64" if col == "step" else "string")
    return df


def open_collection(path: str | os.PathLike[str]) -> Sweep:
    """Open a collection of any kind (a sweep, a monitor directory, a ViT grid: finished,
    running or interrupted); ``.kind`` says which. The old ViT grid layout is one line
    saying how to convert it."""
    return Sweep(Path(path))


open_sweep = open_collection
"""The earlier name of [`open_collection`][blockcoupling.runs.read.open_collection] (kept): opens a collection of any kind."""


def sweep_status(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Per unit: ``unit_id, label, revision, step, prompt_set, status, attempts, message``.
    ``running`` units of a sweep whose driver is gone are shown as ``interrupted``; ``done``
    units whose files fail the integrity check as ``damaged`` (message: what is wrong and
    the command that measures them again)."""
    root = Path(path)
    manifest = load_manifest(root)
    kind = manifest.get("kind")
    cat = store.catalogue(root, manifest)
    if cat.empty:
        return cat
    if not store.is_locked(root):
        cat["status"] = cat["status"].where(cat["status"] != "running", "interrupted")
        cat["status"] = cat["status"].where(cat["status"] != "pending", "not started")
    for uid, problem in integrity.damaged_units(root).items():
        at = cat["unit_id"] == uid
        cat.loc[at, "status"] = "damaged"
        cat.loc[at, "message"] = f"{problem}; {integrity.repair_command(root, kind)}"
    return cat[["unit_id", "label", "revision", "step", "prompt_set", "status", "attempts",
                "duplicate_of", "message"]]
