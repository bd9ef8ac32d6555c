"""What every stored column means: Parquet key-value metadata and ``SCHEMA.md``.

One description per column (meaning and unit), the direction of every coupling variant and
the indexing conventions, written into the metadata of every Parquet file (key
``blockcoupling.schema``; ``blockcoupling.unit`` for a sweep unit) and as ``SCHEMA.md`` into
each finished run directory; readers ignore both. A sweep unit's tables also carry its
``unit_id``, ``label``, ``step`` and ``revision`` as constant columns (`unit_columns`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from blockcoupling.engine.results import SCHEMAS
from blockcoupling.engine.variants import REGISTRY

__all__ = ["COLUMNS", "INDEXING", "SCHEMA_FILE", "UNIT_KEYS", "VARIANTS", "parquet_metadata",
           "schema_markdown", "unit_columns", "unit_identity"]

SCHEMA_FILE = "SCHEMA.md"
UNIT_KEYS: tuple[str, ...] = ("unit_id", "label", "step", "revision")

INDEXING = ("layers are 1-based (layer l = block l; layer 0 in `trajectory` is the input of "
            "block 1, x^0); token positions are 0-based; side a of a coupling pair is the "
            "measured Jacobian J1, side b the basis J2; J^l_{t_in t_out} = d f^l(X)_{t_out} / "
            "d x_{t_in} (rows = output coordinates); causal models have no pair with "
            "token_in > token_out")

#: variant -> direction (which way is more coupled) and range: each variant's record
#: (engine/variants.py)
VARIANTS: dict[str, str] = {name: v.schema_entry for name, v in REGISTRY.items()}

_ID = ("identifier of the prompt / input", "")
#: the key of a table with one row per Jacobian J^l_{t_in t_out} (or per its metric)
_JACOBIAN_KEY = {"prompt_id": _ID, "layer": ("layer l (1-based: block l)", ""),
                 "token_in": ("input token position t_in (0-based)", ""),
                 "token_out": ("output token position t_out (0-based)", "")}

#: table -> column -> (meaning, unit); "" = dimensionless / not a quantity
COLUMNS: dict[str, dict[str, tuple[str, str]]] = {
    "coupling": {
        "prompt_id": _ID,
        "kind": ("which Jacobians are compared: depth, self, fixed_input, fixed_output", ""),
        "layer_a": ("layer of the measured Jacobian J1 (1-based)", ""),
        "layer_b": ("layer of the basis Jacobian J2 (1-based)", ""),
        "token_in_a": ("input token of J1 (0-based)", ""),
        "token_out_a": ("output token of J1 (0-based)", ""),
        "token_in_b": ("input token of J2 (0-based)", ""),
        "token_out_b": ("output token of J2 (0-based)", ""),
        "k": ("number K of top singular vectors of J2 in the basis", "count"),
        "variant": ("the statistic in value (directions under 'variants')", ""),
        "p": ("the norm ||s1K||_p normalising miscoupling / coupling (null where the variant "
              "has none)", ""),
        "orientation": ("ujv: A = U2K^T J1 V2K; vju: A = V2K^T J1 U2K", ""),
        "value": ("the variant's value for the pair", "dimensionless"),
    },
    "trajectory": {
        "prompt_id": _ID,
        "token": ("token position (0-based)", ""),
        "layer": ("layer l (0 = input of block 1, else output of block l)", ""),
        "norm": ("||x^l||, Euclidean norm of the hidden state", "hidden-state units"),
        "step_norm": ("||x^l - x^{l-1}|| (null at layer 0)", "hidden-state units"),
        "pca_x": ("first coordinate of x^l in the 2-D PCA of the last layer's states",
                  "hidden-state units"),
        "pca_y": ("second PCA coordinate", "hidden-state units"),
        "lss_window": ("line-shape score of the centred layer window (>= 1; 1 = straight)",
                       "dimensionless"),
        "logit_entropy": ("logit lens: entropy of softmax(W_U N(x^l)), N the final norm, W_U "
                          "the unembedding (null unless measured with logit_lens)", "nats"),
    },
    "token_metrics": {
        "prompt_id": _ID,
        "token": ("token position (0-based)", ""),
        "lss": ("line-shape score of the whole trajectory (>= 1; 1 = straight line)",
                "dimensionless"),
        "expodistance": ("Var(alpha) / Mean(alpha)^2 of the log norm ratios (0 = exact "
                         "exponential growth)", "dimensionless"),
        "equidistance_cv": ("coefficient of variation of ||x^l - x^{l-1}|| over l",
                            "dimensionless"),
        "linearisation_cosine": ("cosine between prod_l (I + J^l_tt) x^0_t and x^L_t",
                                 "dimensionless, -1..1"),
    },
    "spectra": {
        **_JACOBIAN_KEY,
        "rank": ("rank of the singular value (1 = largest)", ""),
        "singular_value": ("singular value of J^l_{t_in t_out}", "dimensionless (gain)"),
    },
    "influence": {
        **_JACOBIAN_KEY,
        "metric": ("frobenius, spectral, participation_ratio or effective_rank of "
                   "J^l_{t_in t_out}", ""),
        "value": ("the metric's value", "dimensionless"),
    },
    "prompts": {
        "prompt_id": _ID,
        "text": ("the prompt text (or a description of ready-made inputs)", ""),
        "n_tokens": ("number of real tokens", "count"),
        "label": ("the prompt's label (e.g. its source dataset)", ""),
    },
    "diagnostics": {
        **_JACOBIAN_KEY,
        "method": ("how the Jacobian's SVD was computed: dense or matrix_free", ""),
        "residual": ("max_i ||J v_i - s_i u_i|| / s_1 of the top-K factors (null if exact)",
                     "dimensionless"),
        "seconds": ("time spent on this Jacobian", "s"),
        "trace_over_d": ("tr(J)/d, the coefficient of J's isotropic part (tr(J)/d) I (exact on "
                         "the dense path, a Hutchinson estimate on the matrix-free one; null "
                         "in runs made before it was stored)", "dimensionless (gain)"),
        "isotropic_share": ("d (tr(J)/d)^2 / ||J||_F^2: the share of ||J||_F^2 in the "
                            "isotropic part (0..1)", "dimensionless"),
        "uv_overlap": ("||U_K^T V_K||_F^2 / K of J's own top-K singular vectors at the run's "
                       "smallest K (0..1; about K/d for unrelated U, V; 1 for a symmetric J)",
                       "dimensionless"),
    },
}
_UNIT_COLUMNS: dict[str, tuple[str, str]] = {
    "unit_id": ("the sweep unit (run directory) the row comes from", ""),
    "label": ("the unit's label (model name given in the sweep)", ""),
    "step": ("training step of the checkpoint (null for none)", "optimizer steps"),
    "revision": ("hub revision of the checkpoint (null for none)", ""),
}
assert all(set(COLUMNS[t]) == set(SCHEMAS[t]) for t in SCHEMAS), "a column is undocumented"


def _describe(table: str) -> dict[str, Any]:
    cols = {c: {"meaning": m, "unit": u} for c, (m, u) in COLUMNS[table].items()}
    return {"table": table, "columns": cols, "variants": VARIANTS, "indexing": INDEXING,
            "sweep_columns": {c: {"meaning": m, "unit": u} for c, (m, u) in _UNIT_COLUMNS.items()}}


def unit_columns(table: str) -> list[str]:
    """The unit keys stored as columns of ``table``: all but a name the table has itself
    (``prompts.label`` is the prompt's label)."""
    return [k for k in UNIT_KEYS if k not in SCHEMAS[table]]


def unit_identity(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """``unit_id``, ``label``, ``step``, ``revision`` of a run's meta, where present."""
    return {k: meta[k] for k in UNIT_KEYS if meta and meta.get(k) is not None}


def parquet_metadata(table: str, meta: Mapping[str, Any] | None = None) -> dict[bytes, bytes]:
    """Key-value metadata of the Parquet file of ``table`` (and of the run's unit)."""
    out = {b"blockcoupling.schema": json.dumps(_describe(table), sort_keys=True).encode()}
    unit = unit_identity(meta)
    if unit:
        out[b"blockcoupling.unit"] = json.dumps(unit, sort_keys=True, default=str).encode()
    return out


def schema_markdown(meta: Mapping[str, Any] | None = None) -> str:
    """``SCHEMA.md`` of a run directory: every table's columns, the variants, the indexing."""
    lines = ["# Tables of this run directory", "",
             "Each `<table>.parquet` holds one table (long format, one value per row); the "
             "same text is in each file's Parquet key-value metadata (`blockcoupling.schema`).",
             "", f"Indexing: {INDEXING}.", ""]
    unit = unit_identity(meta)
    if unit:
        lines += ["Sweep unit: " + ", ".join(f"`{k}` = {v}" for k, v in unit.items())
                  + " (`blockcoupling.unit` in the metadata; a sweep's tables carry them as "
                  "columns).", ""]
    lines += ["## Variants (`coupling.variant`)", "", "| variant | direction |", "|---|---|"]
    lines += [f"| `{v}` | {d} |" for v, d in VARIANTS.items()]
    for table, cols in COLUMNS.items():
        lines += ["", f"## `{table}`", "", "| column | meaning | unit |", "|---|---|---|"]
        lines += [f"| `{c}` | {m} | {u or '-'} |" for c, (m, u) in cols.items()]
    lines += ["", "## Columns added by a sweep's tables (`open_sweep(...).table(name)`)", "",
              "| column | meaning | unit |", "|---|---|---|"]
    lines += [f"| `{c}` | {m} | {u or '-'} |" for c, (m, u) in _UNIT_COLUMNS.items()]
    return "\n".join(lines) + "\n"
