"""The one recipe for content hashes: sha256 of the canonical JSON of a value.

Bottom layer (imports nothing of the package), so that the engine's ``config_hash``, the
store's manifest seal and the studies' unit ids and cache keys all call it. The options keep
the exact bytes that earlier releases hashed, so stored hashes (run directories, sweep unit
ids, caches) stay valid:

- ``compact`` (default): separators ``","`` and ``":"``; ``compact=False`` is ``json.dumps``'s
  default ``", "`` and ``": "`` (the unit ids and cache keys were made that way);
- ``ascii`` (default): non-ASCII written as ``\\u`` escapes; ``ascii=False`` keeps UTF-8 (the
  run manifest's seal);
- ``strict`` (default): NaN and infinities are refused (``ValueError``); ``strict=False``
  writes them as ``NaN``/``Infinity``;
- ``default``: called for values JSON cannot encode (e.g. ``str``);
- keys are always sorted; ``digits`` keeps the first hex digits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any


def canonical_json(obj: Any, *, compact: bool = True, ascii: bool = True, strict: bool = True,
                   default: Callable[[Any], Any] | None = None) -> str:
    """``obj`` as JSON with sorted keys (see the module docstring for the options)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":") if compact else None,
                      ensure_ascii=ascii, allow_nan=not strict, default=default)


def canonical_hash(obj: Any, *, digits: int | None = None, compact: bool = True,
                   ascii: bool = True, strict: bool = True,
                   default: Callable[[Any], Any] | None = None) -> str:
    """Hex sha256 of the UTF-8 of `canonical_json` (first ``digits`` hex digits)."""
    text = canonical_json(obj, compact=compact, ascii=ascii, strict=strict, default=default)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return digest if digits is None else digest[:digits]


__all__ = ["canonical_hash", "canonical_json"]
