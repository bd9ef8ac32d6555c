"""The record of a ``vit-train`` output folder: ``metrics.json``, sealed, holding the saved
model's checksum; written by the training, read back verified (``store.verified``) by every
reader (the grid, the study, `load_vit`), or one line naming the damage and the repair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError
from blockcoupling.store.fileio import atomic_write_text
from blockcoupling.store.folder import VIT_TRAINING

METRICS_FILE = VIT_TRAINING.record
FORMAT = "blockcoupling-vit-train"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """``metrics.json`` sealed (``store.verified.sealed_text``): an edit is detected."""
    from blockcoupling.store.verified import sealed_text

    atomic_write_text(path, sealed_text(data))


#: what a reader of a damaged training record is told
DAMAGED_HINT = ("a grid point is trained again by running the same vit-grid command; a "
                "vit-train output: train into a new --out (or delete that folder)")


_REPAIR = f"The training's record is damaged: {DAMAGED_HINT}"


def _load_metrics(out_dir: str | Path) -> dict[str, Any]:
    """The ``metrics.json`` of a ``vit-train`` folder, verified (`metrics_problem`), or one
    `RunDirError` line naming the damage and `DAMAGED_HINT`."""
    from blockcoupling.store.verified import load_sealed, stored_error

    path = Path(out_dir) / METRICS_FILE
    data = load_sealed(path, _REPAIR)
    if data.get("format") != FORMAT:
        raise stored_error(path, "is not a vit-train metrics file", _REPAIR)
    want = data.get("model_sha256")
    if want is not None and _model_sha256(Path(out_dir)) != want:
        raise stored_error(Path(out_dir) / MODEL_WEIGHTS, "is missing or damaged (its checksum "
                           "does not match the one recorded when it was trained)", _REPAIR)
    return data


def metrics_problem(out_dir: str | Path) -> str | None:
    """Why the ``metrics.json`` of a ``vit-train`` folder cannot be trusted (missing,
    unreadable, not a metrics file, edited, or a finished training whose saved model no
    longer matches the checksum recorded with it), or None. A record written before records
    were sealed is accepted (None) and reported by `read_metrics` as unverified."""
    from blockcoupling.errors import RunDirError

    try:
        _load_metrics(out_dir)
    except RunDirError as err:
        return str(err).removesuffix(_REPAIR).rstrip(". ")
    return None


def read_metrics(out_dir: str | Path) -> dict[str, Any]:
    """The ``metrics.json`` of a ``vit-train`` output folder, verified (its seal and the
    saved model's checksum: `metrics_problem`); one line naming the damage and the
    repair otherwise. A record without a seal (an older blockcoupling) is read with a
    warning that it is unverified."""
    import warnings

    path = Path(out_dir) / METRICS_FILE
    trained = any((Path(out_dir) / p).exists() for p in ("model", "coupling", "checkpoint.pt"))
    if not path.exists() and not trained:
        raise BlockCouplingError(f"{out_dir} has no {METRICS_FILE}; is it a vit-train output?")
    data = _load_metrics(out_dir)
    if "digest" not in data:
        warnings.warn(f"{path} has no checksum (written by an older blockcoupling): read "
                      "unverified", UserWarning, stacklevel=2)
    return data


#: the saved model's weights, whose checksum a finished training records
MODEL_WEIGHTS = "model/model.safetensors"


def _model_sha256(out: Path) -> str | None:
    from blockcoupling.store.fileio import sha256_bytes

    try:
        return sha256_bytes((out / MODEL_WEIGHTS).read_bytes())
    except OSError:
        return None



__all__ = ["DAMAGED_HINT", "FORMAT", "METRICS_FILE", "MODEL_WEIGHTS", "metrics_problem",
           "read_metrics"]
