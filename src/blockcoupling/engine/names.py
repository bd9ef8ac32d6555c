"""The names of the measurement's options, in one place (no numbers).

``metrics``, ``config`` and the report read these lists; nothing else writes them out again.
The variant lists are built from the variant records (``engine/variants.py``).
"""

from __future__ import annotations

import math

from blockcoupling.engine.variants import P_FREE, P_USER, REGISTRY

#: coupling kinds (DEFINITIONS.md, "Coupling kinds")
KINDS: tuple[str, ...] = ("depth", "self", "fixed_input", "fixed_output")
"""Which Jacobians are compared (the ``kind`` column): depth-wise, token-wise (``self``), and the two context kinds."""
#: orientations of the coupling matrix: A = U2^T J1 V2 (ujv) or V2^T J1 U2 (vju)
ORIENTATIONS: tuple[str, ...] = ("ujv", "vju")
"""Orientations of the coupling matrix: ``ujv`` (A = U2^T J1 V2) or ``vju`` (V2^T J1 U2)."""
#: every coupling variant, in table order: built from the variant records
#: (engine/variants.py, one record per variant; definitions in docs/conventions.md)
VARIANTS: tuple[str, ...] = tuple(REGISTRY)
"""Every coupling variant (the ``variant`` column), in table order; definitions in docs/conventions.md."""
#: variants whose normaliser takes the user-chosen p (one row per p)
P_VARIANTS: tuple[str, ...] = tuple(n for n, v in REGISTRY.items() if v.p == P_USER)
#: variants with a fixed p: released_norm is always reported with p = 2, the others with no p
#: (an empty cell). coupling_vs_null = 1 - m / m_null and coupling_vs_rotated = 1 - m / m_rot
#: do not depend on p (m and the null share the denominator ||s1K||_p), so they are stored
#: once, with p empty.
FIXED_P: dict[str, float | None] = {
    n: (v.p if isinstance(v.p, float) else None) for n, v in REGISTRY.items() if v.p != P_USER}
#: variants whose value does not depend on p (any p is accepted and has no effect)
P_FREE_VARIANTS: tuple[str, ...] = tuple(n for n, v in REGISTRY.items() if v.p == P_FREE)
#: variant -> True where a larger value means more coupled
HIGHER_IS_COUPLED: dict[str, bool] = {n: v.higher_is_coupled for n, v in REGISTRY.items()}
#: variants measured against a null (0 at that null): their chance level is 0 by construction
NULL_VARIANTS: dict[str, str] = {n: v.null for n, v in REGISTRY.items() if v.null is not None}
#: variants whose presence enters MeasureConfig.config_hash (those of its first version; a
#: variant added later adds rows and changes no number, so every earlier identity stays)
HASHED_VARIANTS: tuple[str, ...] = tuple(n for n, v in REGISTRY.items() if v.hashed)
#: the norms p of the miscoupling's normaliser
VALID_P: tuple[float, ...] = (1.0, 2.0, math.inf)
#: how the Jacobians are computed
METHODS: tuple[str, ...] = ("auto", "dense", "matrix_free")

__all__ = ["FIXED_P", "HASHED_VARIANTS", "HIGHER_IS_COUPLED", "KINDS", "METHODS", "NULL_VARIANTS", "ORIENTATIONS",
           "P_FREE_VARIANTS", "P_VARIANTS", "VALID_P", "VARIANTS"]
