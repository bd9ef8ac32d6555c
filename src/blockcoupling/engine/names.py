"""The names of the measurement's options, in one place (no torch, no numbers).

``metrics``, ``config`` and the report read these lists; nothing else writes them out again.
"""

from __future__ import annotations

import math

#: coupling kinds (DEFINITIONS.md, "Coupling kinds")
KINDS: tuple[str, ...] = ("depth", "self", "fixed_input", "fixed_output")
"""Which Jacobians are compared (the ``kind`` column): depth-wise, token-wise (``self``), and the two context kinds."""
#: orientations of the coupling matrix: A = U2^T J1 V2 (ujv) or V2^T J1 U2 (vju)
ORIENTATIONS: tuple[str, ...] = ("ujv", "vju")
"""Orientations of the coupling matrix: ``ujv`` (A = U2^T J1 V2) or ``vju`` (V2^T J1 U2)."""
#: every coupling variant, in table order
VARIANTS: tuple[str, ...] = (
    "coupling",
    "miscoupling",
    "released_norm",
    "released_trace",
    "offdiag_ratio",
    "coupling_vs_null",
)
"""Every coupling variant (the ``variant`` column), in table order; definitions in docs/conventions.md."""
#: variants whose normaliser takes the user-chosen p (one row per p)
P_VARIANTS: tuple[str, ...] = ("coupling", "miscoupling")
#: variants with a fixed p: released_norm is always reported with p = 2, the others with no p
#: (an empty cell). coupling_vs_null = 1 - m / m_null does not depend on p (m and m_null are
#: both divided by the same ||s1K||_p), so it is stored once, with p empty.
FIXED_P: dict[str, float | None] = {
    "released_norm": 2.0,
    "released_trace": None,
    "offdiag_ratio": None,
    "coupling_vs_null": None,
}
#: the norms p of the miscoupling's normaliser
VALID_P: tuple[float, ...] = (1.0, 2.0, math.inf)
#: how the Jacobians are computed
METHODS: tuple[str, ...] = ("auto", "dense", "matrix_free")

__all__ = ["FIXED_P", "KINDS", "METHODS", "ORIENTATIONS", "P_VARIANTS", "VALID_P", "VARIANTS"]
