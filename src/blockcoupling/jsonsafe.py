"""The one rule that turns results into JSON-safe data.

Bottom layer (imports nothing of the package, and neither numpy nor pandas nor torch: it
recognises their values by duck typing), so that the run manifest, the studies' JSON outputs
and the command line's ``--json`` all call it:

- mappings become dicts with string keys; lists and tuples lists; sets sorted lists;
- a table (anything with ``columns`` and ``to_dict``, e.g. a pandas DataFrame) a list of
  records; arrays and numpy / torch scalars (anything with ``tolist``) plain Python values;
- a non-finite float ``null`` (``nonfinite="null"``, the default: what JSON readers expect) or
  the strings ``"nan"``, ``"inf"``, ``"-inf"`` (``nonfinite="string"``: the run manifest, which
  keeps them);
- pandas' missing values (``NA``, ``NaT``) ``null``; a torch dtype its name (``float32``);
  anything else its ``str``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["dumps", "jsonable"]


def jsonable(obj: Any, *, nonfinite: Literal["null", "string"] = "null") -> Any:
    """A JSON-safe copy of ``obj`` (see the module docstring)."""
    def again(value: Any) -> Any:
        return jsonable(value, nonfinite=nonfinite)

    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if nonfinite == "null":
            return None
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {str(k): again(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return [again(v) for v in sorted(obj, key=str)]
    if isinstance(obj, (list, tuple)):
        return [again(v) for v in obj]
    if type(obj).__name__ in ("NAType", "NaTType"):
        return None
    if hasattr(obj, "columns") and hasattr(obj, "to_dict"):  # a table: (rows,) of records
        return [again(r) for r in obj.to_dict(orient="records")]
    if callable(getattr(obj, "tolist", None)):  # numpy / torch arrays and scalars
        return again(obj.tolist())
    text = str(obj)
    return text.removeprefix("torch.") if type(obj).__module__ == "torch" else text


def dumps(obj: Any) -> str:
    """``obj`` as the JSON text of every output (``--json`` on stdout, ``--json-out`` and
    every JSON file a command writes through ``store.fileio.write_json``): `jsonable`
    (missing values ``null``), indented by one, never ``NaN``."""
    import json

    return json.dumps(jsonable(obj), indent=1, allow_nan=False)
