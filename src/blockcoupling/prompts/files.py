"""Prompt files: ``.txt`` (one prompt per line), ``.jsonl`` and ``.csv`` (a ``text`` column or the
one named), with ids and labels from the file where it has them (see
`blockcoupling.prompts.sources`)."""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from blockcoupling.errors import BlockCouplingError
from blockcoupling.prompts.prompt import (
    Prompt,
    check_text,
)


def _cell_str(value: Any) -> str | None:
    """A table cell as text, or None when missing (None / NaN)."""
    if value is None:
        return None
    if isinstance(value, float) and value != value:
        return None
    return str(value)


def _read_text(path: Path) -> str:
    """A prompt file's text, without the byte-order mark some editors write first (else it
    would be part of the first prompt); a clear error if it is not UTF-8 or cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BlockCouplingError(f"cannot read the prompt file {path} ({err.strerror})") from None
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BlockCouplingError(
            f"{path}, line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file "
            "as UTF-8"
        ) from None


def _records_to_prompts(
    records: Iterable[tuple[str, Mapping[str, Any]]], stem: str, text_key: str, source: str
) -> list[Prompt]:
    """Prompts from ``(where, row)`` pairs of a .jsonl/.csv file; ``where`` names the
    line for error messages."""
    prompts: list[Prompt] = []
    for index, (where, row) in enumerate(records):
        if text_key not in row:
            have = ", ".join(map(str, row)) or "none"
            raise BlockCouplingError(
                f"{source}, {where}: no field {text_key!r} (fields: {have}); pass "
                "column=<name> (CLI: --prompt-column) to use another field"
            )
        text = _cell_str(row[text_key])
        pid = _cell_str(row.get("prompt_id", row.get("id")))
        if pid is None or not pid.strip():
            pid = f"{stem}-{index:04d}"
        if text is None or not text.strip():
            raise BlockCouplingError(
                f"{source}, {where} (prompt id {pid!r}): the prompt text is empty; "
                "remove the row or give it a text"
            )
        check_text(text, f"{source}, {where}")
        label = _cell_str(row.get("label")) or "file"
        prompts.append(Prompt(pid, text, label))
    return prompts


def _load_txt(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    # universal newlines (\n, \r\n, \r), as a file opened in text mode reads them
    for lineno, line in enumerate(io.StringIO(_read_text(path), newline=None), start=1):
        text = line.rstrip("\r\n")
        if text.strip():
            check_text(text, f"{path}, line {lineno}")
            prompts.append(Prompt(f"{path.stem}-{len(prompts):04d}", text, "file"))
    return prompts


def _load_jsonl(path: Path, column: str | None) -> list[Prompt]:
    records: list[tuple[str, Mapping[str, Any]]] = []
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BlockCouplingError(
                f"{path}, line {lineno}: not valid JSON ({exc.msg}); a .jsonl file needs "
                "one JSON object per line"
            ) from None
        except RecursionError:
            raise BlockCouplingError(
                f"{path}, line {lineno}: nested too deeply to be a prompt record; a .jsonl "
                "file needs one flat JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise BlockCouplingError(
                f"{path}, line {lineno}: expected a JSON object like "
                '{"text": "..."}, got ' + type(row).__name__
            )
        records.append((f"line {lineno}", row))
    return _records_to_prompts(records, path.stem, column or "text", str(path))


def _load_csv(path: Path, column: str | None) -> list[Prompt]:
    try:
        df = pd.read_csv(io.StringIO(_read_text(path)), dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return []
    except pd.errors.ParserError as err:
        raise BlockCouplingError(
            f"{path} is not a valid CSV file ({str(err).strip()}); check its quoting and "
            "separators, or use .jsonl"
        ) from None
    key = column or "text"
    if key not in df.columns:
        raise BlockCouplingError(
            f"{path}: no column {key!r} (columns: {', '.join(map(str, df.columns))}); pass "
            "column=<name> (CLI: --prompt-column) to use another column"
        )
    # line numbers count the header as line 1 (rows with embedded newlines shift them)
    records = [(f"row {i + 1} (line {i + 2})", row) for i, row in enumerate(df.to_dict("records"))]
    return _records_to_prompts(records, path.stem, key, str(path))


def load_file(path: Path, column: str | None) -> list[Prompt]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        if column is not None:
            raise BlockCouplingError(
                f"column={column!r} does not apply to a .txt file (one prompt per line); "
                "drop it or use a .jsonl/.csv file"
            )
        return _load_txt(path)
    if suffix == ".jsonl":
        return _load_jsonl(path, column)
    if suffix == ".csv":
        return _load_csv(path, column)
    raise BlockCouplingError(
        f"{path}: unsupported prompt file type {suffix or '(none)'!r}; use .txt (one prompt "
        "per line), .jsonl (field 'text') or .csv (column 'text')"
    )
