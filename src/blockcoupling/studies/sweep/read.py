"""Reading a sweep: :func:`open_sweep` -> :class:`Sweep`, tables across units via DuckDB.

Nothing is loaded until asked for: :meth:`Sweep.table` runs one DuckDB query over the Parquet
tables of every finished unit (``read_parquet`` of the files, joined with the catalogue), so
a filter or a column selection is applied while reading, and :meth:`Sweep.sql` lets any
aggregate run without materialising the rows. :meth:`Sweep.summary` is such an aggregate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.engine.results import TABLES
from blockcoupling.errors import BlockCouplingError
from blockcoupling.studies.sweep import store

#: the unit columns put in front of every table read from a sweep
UNIT_COLUMNS = ("unit_id", "label", "model", "revision", "step", "prompt_set")


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as err:
        raise BlockCouplingError("reading a sweep needs duckdb: pip install "
                                 "'blockcoupling[sweep]'") from err
    return duckdb


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class Sweep:
    """A sweep (or monitor) directory, finished or not. Tables hold the rows of the units
    that are ``done``, with the unit columns ``unit_id, label, model, revision, step,
    prompt_set`` in front."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest = store.load_manifest(root)
        self.catalogue: pd.DataFrame = store.catalogue(root, self.manifest)
        self._verified = False

    def verify(self) -> None:
        """Check every done unit's run directory as ``open_run`` does (sealed manifest,
        checksum of every file, prompt rows counted against the manifest, the unit's
        identity); a :class:`~blockcoupling.studies.sweep.store.UnitDamagedError` names the
        first damaged unit and the command that measures it again. Every table read calls
        it (once per :class:`Sweep`)."""
        if self._verified:
            return
        damaged = store.damaged_units(self.root)
        if damaged:
            uid, problem = next(iter(damaged.items()))
            more = f" (and {len(damaged) - 1} other unit(s))" if len(damaged) > 1 else ""
            raise store.UnitDamagedError(
                f"unit {uid} of {self.root} is damaged{more}: {problem}; "
                + store.repair_command(self.root, self.manifest.get("kind")))
        self._verified = True

    def __repr__(self) -> str:
        counts = self.catalogue["status"].value_counts().to_dict() if len(self.catalogue) else {}
        return f"Sweep({str(self.root)!r}, units={len(self.catalogue)}, {counts})"

    # ------------------------------------------------------------------ units
    @property
    def units(self) -> pd.DataFrame:
        """The catalogue: one row per unit (status, message, weights hash, duplicate_of)."""
        return self.catalogue

    def done(self) -> pd.DataFrame:
        return self.catalogue[self.catalogue["status"] == "done"]

    def run_dir(self, unit_id: str) -> Path:
        if unit_id not in set(self.catalogue["unit_id"]):
            raise BlockCouplingError(f"no unit {unit_id!r} in {self.root}; see "
                                     "`blockcoupling sweep-status` for the unit ids")
        return store.unit_dir(self.root, unit_id)

    def open_unit(self, unit_id: str) -> Any:
        """The unit's :class:`~blockcoupling.engine.results.Measurement` (``open_run``)."""
        from blockcoupling.store.rundir import open_run

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
            files = [str((self.root / rd / f"{name}.parquet").resolve())
                     for rd in done["run_dir"]]
            files = [f for f in files if Path(f).is_file()]
            if not files:
                continue
            file_map = pd.DataFrame({"_file": files,
                                     "_unit": [Path(f).parent.name for f in files]})
            con.register(f"_files_{name}", file_map)
            flist = ", ".join(_sql_str(f) for f in files)
            con.execute(
                f"CREATE VIEW {name} AS SELECT u.unit_id, u.label, u.model, u.revision, "
                f"u.step, u.prompt_set, t.* EXCLUDE (filename, file_row_number), "
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
            return con.execute(query).df()
        except Exception as err:
            if type(err).__module__.startswith("duckdb"):
                raise BlockCouplingError(f"query failed: {str(err).splitlines()[0]}") from err
            raise
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
            try:
                df = con.execute(q).df()
            except Exception as err:
                if type(err).__module__.startswith("duckdb"):
                    raise BlockCouplingError(f"reading {name}: {str(err).splitlines()[0]}"
                                             ) from err
                raise
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

    # ------------------------------------------------------------------ summary
    def summary(self, *, k: int | None = None, p: float = 1.0, orientation: str = "ujv",
                include_duplicates: bool = False) -> pd.DataFrame:
        """Per done unit: ``mean_depth_coupling`` (mean over prompts and layer pairs
        l != l' of ``coupling``, smallest measured K unless ``k``), its ``chance_coupling``
        (the mean chance level c_null, from ``coupling_vs_null`` where it was measured) and
        ``coupling_vs_null``; mean ``lss``; median ``expodistance`` (heavy-tailed). Units
        that duplicate an earlier unit's weights are left out unless ``include_duplicates``."""
        cols = list(UNIT_COLUMNS) + ["weights_hash", "duplicate_of", "n_prompts"]
        base = self.done()[cols].copy()
        if not include_duplicates:
            base = base[base["duplicate_of"].isna()]
        base = base.drop(columns=["duplicate_of"])
        out = base.reset_index(drop=True)
        for c in ("k", "mean_depth_coupling", "chance_coupling", "coupling_vs_null",
                  "lss", "expodistance"):
            out[c] = pd.Series([float("nan")] * len(out), dtype="float64")
        if out.empty:
            return out
        kk = f"k = {int(k)}" if k is not None else "k = (SELECT min(k) FROM coupling c2 " \
            "WHERE c2.unit_id = c.unit_id AND c2.kind = 'depth')"
        q_depth = f"""
            WITH c AS (SELECT * FROM coupling c WHERE kind = 'depth' AND layer_a <> layer_b
                       AND orientation = {_sql_str(orientation)} AND {kk}),
            -- coupling_vs_null does not depend on p: stored once, with p empty
            v AS (SELECT unit_id, prompt_id, layer_a, layer_b, token_out_a, k,
                         max(CASE WHEN variant = 'coupling' AND p = {float(p)} THEN value END) AS c,
                         max(CASE WHEN variant = 'coupling_vs_null' THEN value END) AS v
                  FROM c GROUP BY ALL)
            SELECT unit_id, min(k) AS k, avg(c) AS mean_depth_coupling,
                   avg(CASE WHEN v < 1 THEN (c - v) / (1 - v) END) AS chance_coupling,
                   avg(v) AS coupling_vs_null
            FROM v GROUP BY unit_id"""
        q_traj = """SELECT unit_id, avg(lss) AS lss, median(expodistance) AS expodistance
                    FROM token_metrics GROUP BY unit_id"""
        con = self._connection()
        try:
            names = set(con.execute("SELECT table_name FROM information_schema.tables")
                        .df()["table_name"])
            parts = []
            if "coupling" in names:
                parts.append(con.execute(q_depth).df())
            if "token_metrics" in names:
                parts.append(con.execute(q_traj).df())
        finally:
            con.close()
        for part in parts:
            part = part.set_index("unit_id")
            for c in part.columns:
                out[c] = out["unit_id"].map(part[c]).astype("float64")
        out["k"] = out["k"].astype("Int64")
        return out


def _unit_types(df: pd.DataFrame) -> pd.DataFrame:
    """The unit columns typed alike in every sweep: ``step`` Int64, the others string."""
    for col in UNIT_COLUMNS:
        if col in df.columns:
            df[col] = df[col].astype("Int64" if col == "step" else "string")
    return df


def open_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Open a sweep or monitor directory (finished, running or interrupted)."""
    return Sweep(Path(path))


def sweep_status(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Per unit: ``unit_id, label, revision, step, prompt_set, status, attempts, message``.
    ``running`` units of a sweep whose driver is gone are shown as ``interrupted``; ``done``
    units whose files fail the integrity check as ``damaged`` (message: what is wrong and
    the command that measures them again)."""
    root = Path(path)
    manifest = store.load_manifest(root)
    kind = manifest.get("kind")
    cat = store.catalogue(root, manifest)
    if cat.empty:
        return cat
    if not store.is_locked(root):
        cat["status"] = cat["status"].where(cat["status"] != "running", "interrupted")
        cat["status"] = cat["status"].where(cat["status"] != "pending", "not started")
    for uid, problem in store.damaged_units(root).items():
        at = cat["unit_id"] == uid
        cat.loc[at, "status"] = "damaged"
        cat.loc[at, "message"] = f"{problem}; {store.repair_command(root, kind)}"
    return cat[["unit_id", "label", "revision", "step", "prompt_set", "status", "attempts",
                "duplicate_of", "message"]]
