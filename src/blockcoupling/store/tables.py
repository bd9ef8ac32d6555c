"""Tables and arrays as bytes: Parquet with explicit Arrow types (int32, float64, string; no
pandas metadata, missing floats as nulls), ``.npz`` without pickles. Readers take bytes the
caller already verified against a checksum.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from blockcoupling.engine.results import LATER_COLUMNS, SCHEMAS, TABLES, Measurement, conform
from blockcoupling.errors import BlockCouplingError, RunDirError
from blockcoupling.store.schema import parquet_metadata, unit_columns, unit_identity

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int32": pa.int32(),
    "float64": pa.float64(),
}


def table_bytes(name: str, df: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> bytes:
    """Parquet bytes of one table: explicit Arrow types for the schema columns, inferred types
    for extra columns, no pandas metadata; key-value metadata describing every column (and
    the run's sweep unit, from ``meta``: store/schema.py)."""
    df = conform(name, df)
    unit = unit_identity(meta) if meta and meta.get("unit_id") else {}  # sweep units only
    cols = [c for c in unit_columns(name) if c in unit]
    if cols:  # a sweep unit's identity as constant columns (replacing those of its parts)
        df = df.assign(**{c: pd.Series([unit[c]] * len(df), index=df.index,
                                       dtype="int64" if c == "step" else "string")
                          for c in cols})
    arrays: list[pa.Array] = []
    names: list[str] = []
    for col in df.columns:
        dtype = SCHEMAS[name].get(col)
        try:
            arr = pa.array(df[col], type=_ARROW_TYPES[dtype] if dtype else None, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeEncodeError) as err:
            raise BlockCouplingError(
                f"table {name!r}: column {col!r} cannot be stored in Parquet ({err}); "
                "give it one plain type (numbers, strings or booleans) and valid text"
            ) from err
        arrays.append(arr)
        names.append(str(col))
    table = pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(
        parquet_metadata(name, meta))
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def read_table(data: bytes, name: str, path: Path, hint: str) -> pa.Table:
    """Parse the Parquet bytes of table ``name`` read from ``path``."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except Exception as err:  # pyarrow raises several types for damaged files
        raise RunDirError(
            f"cannot read {path} ({type(err).__name__}: {err}); the file is damaged. {hint}"
        ) from err
    later = LATER_COLUMNS.get(name, frozenset())
    missing = [c for c in SCHEMAS[name] if c not in table.column_names and c not in later]
    if missing:
        raise RunDirError(
            f"{path} does not hold a valid {name!r} table (no column {', '.join(missing)}). "
            + hint
        )
    return table


def to_frame(name: str, tables: list[pa.Table], where: Path) -> pd.DataFrame:
    """Concatenate Arrow tables of one kind and type them as ``SCHEMAS[name]`` says."""
    if not tables:
        return conform(name, [])
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
        return conform(name, table.to_pandas())
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as err:
        raise RunDirError(
            f"the {name!r} tables under {where} do not fit together ({err}); a file was "
            "altered. Re-run the measurement into a new --out."
        ) from err


def arrays_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise BlockCouplingError(f"array key {key!r} must be a string such as 'A/p0/ujv'")
        if np.asarray(value).dtype == object:
            raise BlockCouplingError(f"array {key!r} has dtype object; store numeric arrays only")
    sink = io.BytesIO()
    # sorted keys: the file's bytes depend only on its content, not on insertion order
    named: dict[str, Any] = {k: np.asarray(arrays[k]) for k in sorted(arrays)}
    np.savez(sink, **named)
    return sink.getvalue()


def read_arrays(data: bytes, path: Path, hint: str) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as err:
        raise RunDirError(f"cannot read {path} ({type(err).__name__}: {err}). {hint}") from err


def order_rows(df: pd.DataFrame, order: Mapping[str, int]) -> pd.DataFrame:
    """Rows stably sorted by the position of their prompt in the manifest."""
    if df.empty:
        return df.reset_index(drop=True)
    key = pd.Index(list(order), dtype=object).get_indexer(df["prompt_id"].astype(object))
    key = np.where(key < 0, len(order), key)  # prompts unknown to the manifest go last
    idx = np.argsort(key, kind="stable")
    return df.iloc[idx].reset_index(drop=True)


def part_prompt_ids(part: Measurement) -> list[str]:
    """The prompts a part covers: its ``prompts`` table, else every prompt id in its tables."""
    if len(part.prompts):
        ids = part.prompts["prompt_id"].astype(str).tolist()
    else:
        ids = []
        for name in TABLES:
            ids.extend(part.table(name)["prompt_id"].dropna().astype(str).tolist())
    return list(dict.fromkeys(ids))
