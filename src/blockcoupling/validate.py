"""Checks of numeric and named options, in one place for the CLI, YAML specs and the Python API.

Every study option (a sweep spec's ``limit``/``seed``/``retries``/resources, a ViT training's
rates and sizes, a monitor's ``every``/``steps``, dtypes and devices) is checked here when it
is parsed, before anything is written: a value of the wrong type, ``nan``/``inf``, or out of
range is a `OptionError` naming the option and what it accepts, never a silent
default, a slice or a traceback.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

from blockcoupling.errors import BlockCouplingError

#: model dtypes ``load_model`` accepts (``loading.MODEL_DTYPES``), without importing torch
DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
T = TypeVar("T")


class OptionError(BlockCouplingError):
    """An option has the wrong type or is out of range (the message names it)."""


def _range(minimum: float | None, maximum: float | None, above: float | None,
           below: float | None) -> str:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if above is not None:
        parts.append(f"> {above:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    if below is not None:
        parts.append(f"< {below:g}")
    return " and ".join(parts)


def whole(value: Any, name: str, *, minimum: int | None = None,
          maximum: int | None = None) -> int:
    """``value`` as an int: a whole number (an integral float such as ``2.0`` too; not a
    bool, a fraction, a string, nan or inf) within ``[minimum, maximum]``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and math.isfinite(value) and value.is_integer():
        ok = True
    if not ok or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        rng = _range(minimum, maximum, None, None)
        raise OptionError(f"{name} must be a whole number{' ' + rng if rng else ''}, "
                          f"not {value!r}")
    return int(value)


def number(value: Any, name: str, *, minimum: float | None = None,
           maximum: float | None = None, above: float | None = None,
           below: float | None = None) -> float:
    """``value`` as a finite float (not a bool, a string, nan or inf) within the bounds
    (``minimum``/``maximum`` inclusive, ``above``/``below`` exclusive)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    if not ok or not math.isfinite(v) or (minimum is not None and v < minimum) or (
            maximum is not None and v > maximum) or (above is not None and v <= above) or (
            below is not None and v >= below):
        rng = _range(minimum, maximum, above, below)
        raise OptionError(f"{name} must be a finite number{' ' + rng if rng else ''}, "
                          f"not {value!r}")
    return v


def optional(check: Any, value: Any, name: str, **bounds: Any) -> Any:
    """``None`` stays ``None``; anything else goes through ``check`` (`whole` or
    `number`)."""
    return None if value is None else check(value, name, **bounds)


def dtype_name(value: Any, name: str = "dtype") -> str:
    """A model dtype name of `DTYPES`."""
    if not isinstance(value, str) or value not in DTYPES:
        raise OptionError(f"{name} {value!r}: choose one of {', '.join(DTYPES)}")
    return value


INITS = ("pretrained", "random")
"""Weights a model is measured with: the checkpoint's, or its config at seeded random init."""


def init_name(value: Any, name: str = "--init") -> str:
    """An init of `INITS`."""
    if not isinstance(value, str) or value not in INITS:
        raise OptionError(f"{name} {value!r}: choose pretrained (the checkpoint's weights) or "
                          "random (the same config, seeded random weights)")
    return value


def device_name(value: Any, name: str = "device") -> str:
    """``auto``, or a device that torch can name (``cpu``, ``cuda``, ``cuda:N``, ``mps``,
    ``xpu``, ...); whether it is present is checked when the model is loaded."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        import torch

        try:
            torch.device(value)
            return value
        except (RuntimeError, ValueError):
            pass
    raise OptionError(f"{name} {value!r}: choose auto, cpu, cuda, cuda:N, mps or another "
                      "device torch knows")


def flag(value: Any, name: str) -> bool:
    """A switch: ``True`` or ``False`` (not ``"yes"``, not 1)."""
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be true or false, not {value!r}")
    return value


def text(value: Any, name: str, *, example: str = "") -> str:
    """A string (``example``: one the message shows)."""
    if not isinstance(value, str):
        such = f" such as {example}" if example else ""
        raise OptionError(f"{name} must be a string{such}, not {value!r}")
    return value


def one_value(raw: Any, flag: str, parse: Callable[[str], T]) -> T:
    """The one value of a list option in a command that uses one: ``--k``, ``--p`` and
    ``--variant`` take comma-separated lists in every command (``measure --k 10,30``), and a
    command that uses a single value takes a list of one (``correlate --k 10``)."""
    parts = [v.strip() for v in str(raw).split(",") if v.strip()]
    if len(parts) != 1:
        raise OptionError(f"{flag} {raw}: this command uses one value (e.g. {flag} "
                          f"{parts[0] if parts else '10'}); lists are for measure")
    try:
        return parse(parts[0])
    except ValueError as err:
        raise OptionError(f"{flag} {raw}: not a valid value ({err})") from err
