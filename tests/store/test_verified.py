"""The one reader of stored files (``store/verified.py``): every fault is one line naming the
file and the caller's repair, never a traceback or a value read unchecked."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pandas as pd
import pytest

from blockcoupling.errors import RunDirError
from blockcoupling.store.fileio import sha256_bytes, temp_path
from blockcoupling.store.verified import (
    MAX_DEPTH,
    Ledger,
    load_json,
    load_sealed,
    parquet_bytes,
    verified_bytes,
    write_sealed,
)

HINT = "Run `blockcoupling fix-it` again."


def _one_line(err: pytest.ExceptionInfo[RunDirError], path: Path) -> str:
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and msg.endswith(HINT), msg
    return msg


@pytest.mark.parametrize("fault,words", [
    ("missing", "is missing"), ("folder", "is a folder"), ("flipped", "checksum does not match"),
    ("truncated", "checksum does not match"), ("empty", "checksum does not match"),
])
def test_verified_bytes_names_each_fault(tmp_path: Path, fault: str, words: str) -> None:
    path = tmp_path / "f.bin"
    data = b"0123456789" * 10
    path.write_bytes(data)
    if fault == "missing":
        path.unlink()
    elif fault == "folder":
        path.unlink()
        path.mkdir()
    elif fault == "flipped":
        path.write_bytes(data[:5] + b"X" + data[6:])
    elif fault == "truncated":
        path.write_bytes(data[:50])
    elif fault == "empty":
        path.write_bytes(b"")
    with pytest.raises(RunDirError, match=words) as err:
        verified_bytes(path, sha256_bytes(data), HINT)
    _one_line(err, path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text("{}")
    path.chmod(0)
    try:
        with pytest.raises(RunDirError, match="cannot be read") as err:
            load_json(path, HINT)
        _one_line(err, path)
    finally:
        path.chmod(0o644)


def test_a_committed_temporary_file_is_served(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    temp_path(path).write_bytes(b"new")  # a write killed after its record's commit
    path.write_bytes(b"old")
    assert verified_bytes(path, sha256_bytes(b"new"), HINT) == b"new"


@pytest.mark.parametrize("content,words", [
    (b"", "is empty"), (b"{\"a\": 1", "is not valid JSON"), (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "holds a JSON list where a JSON object"), (b"3", "holds a whole number"),
    (b"true", "holds true or false"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),  # the parser's own recursion limit
    (b"{\"a\": " * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "nested deeper"),
])
def test_json_of_another_shape_is_one_line(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(content)
    with pytest.raises(RunDirError, match=words) as err:
        load_json(path, HINT)
    _one_line(err, path)


def test_sealed_record_round_trip_edit_and_legacy(tmp_path: Path) -> None:
    path = write_sealed(tmp_path / "a" / "rec.json", {"x": 1.5, "y": [1, None], "z": "ü"})
    assert load_sealed(path, HINT) == {**json.loads(path.read_text()), "x": 1.5}
    path.write_text(path.read_text().replace("1.5", "2.5"))
    with pytest.raises(RunDirError, match="changed after blockcoupling wrote it") as err:
        load_sealed(path, HINT)
    _one_line(err, path)
    path.write_text(json.dumps({"x": 1}))  # written before records were sealed
    assert load_sealed(path, HINT) == {"x": 1}
    with pytest.warns(UserWarning, match="unverified"):
        load_sealed(path, HINT, legacy="warn")
    with pytest.raises(RunDirError, match="no checksum"):
        load_sealed(path, HINT, legacy="refuse")


def test_ledger_writes_records_and_verifies(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "out", HINT)
    led.write_json("settings.json", {"a": 1, "b": float("nan")})
    df = pd.DataFrame({"x": [1.0, 2.0], "s": ["a", "b"]})
    led.write("parts/00000.parquet", parquet_bytes(df))
    fresh = Ledger(tmp_path / "out", HINT)  # another process reading it
    assert fresh.json("settings.json") == {"a": 1, "b": None}
    pd.testing.assert_frame_equal(fresh.parquet("parts/00000.parquet"), df)
    assert fresh.check() is None and fresh.has("settings.json") and not fresh.has("other")
    part = tmp_path / "out" / "parts" / "00000.parquet"
    part.write_bytes(part.read_bytes()[:-9])
    with pytest.raises(RunDirError, match="checksum does not match") as err:
        Ledger(tmp_path / "out", HINT).parquet("parts/00000.parquet")
    _one_line(err, part)
    assert "00000.parquet" in str(Ledger(tmp_path / "out", HINT).check())
    (tmp_path / "out" / "extra.json").write_text("{}")
    with pytest.raises(RunDirError, match="is not recorded in"):
        Ledger(tmp_path / "out", HINT).json("extra.json")
    ledger = tmp_path / "out" / "checksums.json"
    ledger.write_text(ledger.read_text().replace('"a"', '"b"', 1).replace("sha256:", "sha256:0", 1))
    with pytest.raises(RunDirError, match="changed after blockcoupling wrote it") as err:
        Ledger(tmp_path / "out", HINT).json("settings.json")
    _one_line(err, ledger)


def test_a_folder_without_a_ledger_is_refused_or_read_as_its_legacy_says(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"a": 1}')
    with pytest.raises(RunDirError, match="no recorded checksum"):
        Ledger(tmp_path, HINT).json("s.json")
    assert Ledger(tmp_path, HINT, legacy="accept").json("s.json") == {"a": 1}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Ledger(tmp_path, HINT, legacy="warn").json("s.json")
    assert any("unverified" in str(w.message) for w in seen)


def test_sealed_blob_round_trip_damage_and_legacy(tmp_path: Path) -> None:
    from blockcoupling.store.verified import load_sealed_bytes, sealed_bytes

    path = tmp_path / "ckpt.pt"
    path.write_bytes(sealed_bytes(b"payload \x00\x01 bytes"))
    assert load_sealed_bytes(path, HINT) == b"payload \x00\x01 bytes"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(RunDirError, match="checksum does not match") as err:
        load_sealed_bytes(path, HINT)
    _one_line(err, path)
    path.write_bytes(b"PK\x03\x04 an older checkpoint")
    assert load_sealed_bytes(path, HINT) == b"PK\x03\x04 an older checkpoint"
    with pytest.raises(RunDirError, match="no checksum"):
        load_sealed_bytes(path, HINT, legacy="refuse")


def test_sealed_log_numbers_lines_and_refuses_any_change(tmp_path: Path) -> None:
    from blockcoupling.store.verified import SealedLog

    path = tmp_path / "loss.jsonl"
    log = SealedLog(path, HINT)
    for step in range(4):
        log.append({"step": step, "loss": 1.0 / (step + 1)})
    assert SealedLog(path, HINT).read() == [{"step": s, "loss": 1.0 / (s + 1)} for s in range(4)]
    lines = path.read_text().splitlines(keepends=True)
    for changed in (lines[:1] + lines[2:],  # a line deleted
                    [lines[1], lines[0], *lines[2:]],  # two lines swapped
                    [lines[0].replace("1.0", "2.0"), *lines[1:]],  # a value edited
                    [*lines[:-1], lines[-1][:20]]):  # cut short
        path.write_text("".join(changed))
        with pytest.raises(RunDirError) as err:
            SealedLog(path, HINT).read()
        assert "\n" not in str(err.value) and str(path) in str(err.value)
        assert str(err.value).endswith(HINT)
    path.write_text("".join(lines[:2]) + lines[2][:15])  # an append killed half-way
    with pytest.warns(UserWarning, match="cut short"):
        SealedLog(path, HINT).append({"step": 9, "loss": 0.5})
    assert [r["step"] for r in SealedLog(path, HINT).read()] == [0, 1, 9]
    path.write_text('{"step": 1, "loss": 2.0}\n')  # written before logs were sealed
    assert SealedLog(path, HINT).read() == [{"step": 1, "loss": 2.0}]
