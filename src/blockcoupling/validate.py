"""Checks of numeric and named options, in one place for the CLI, YAML specs and the Python API.

Every option's rule is one of these, declared once where the option is declared (a record's
field: ``fields.opt(check=SEED)``; a command's own option: ``cli.options.checked(COUNT)``)
and applied when the option is parsed, before anything is written: a value of the wrong
type, ``nan``/``inf``, out of range or not among the choices is an `OptionError` naming the
option and what it accepts, never a silent default, a slice or a traceback. Every device
name is checked here against this torch's build (`device_name`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

from blockcoupling.errors import BlockCouplingError

#: model dtypes ``load_model`` accepts (``loading.MODEL_DTYPES``), without importing torch
DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
#: the largest seed: every consumer takes it (``random.Random``, ``numpy.random.default_rng``,
#: ``torch.manual_seed``, and the seeds a study derives as ``seed * 1_000_003 + 17``)
SEED_MAX = 2**32 - 1
#: the largest whole number of any option: a 64-bit integer (what torch, numpy and Parquet
#: hold); a larger one is refused by `whole` whatever the option's own bounds
WHOLE_MAX = 2**63 - 1
T = TypeVar("T")


class OptionError(BlockCouplingError):
    """An option (a command-line flag or a spec file's key) has the wrong type, is out of
    range, or breaks a rule between options: the message names it. The command line exits
    with 2 (bad usage) on it, before anything is written."""


class Rule(NamedTuple):
    """A field's or an option's check, declared once: ``check(value, name, **bounds)``
    (`whole`, `number`, `choice`, ...) and its bounds. ``rule(value, name)`` applies it
    (``None`` passes: an option not given); a record's field declares it with
    ``opt(check=rule)``, a command's own option with ``cli.options.checked(rule)``."""

    check: Callable[..., Any]
    bounds: dict[str, Any] = {}

    def __call__(self, value: Any, name: str) -> Any:
        return optional(self.check, value, name, **self.bounds)


def rule(check: Callable[..., Any], **bounds: Any) -> Rule:
    """`Rule` of ``check`` with ``bounds`` (``rule(whole, minimum=1)``)."""
    return Rule(check, bounds)


def _num(v: float) -> str:
    """A bound as written: ``4294967295``, ``0.5``, ``1e-05``."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e16 else f"{v:g}"


def _range(minimum: float | None, maximum: float | None, above: float | None,
           below: float | None) -> str:
    parts = []
    if minimum is not None:
        parts.append(f">= {_num(minimum)}")
    if above is not None:
        parts.append(f"> {_num(above)}")
    if maximum is not None:
        parts.append(f"<= {_num(maximum)}")
    if below is not None:
        parts.append(f"< {_num(below)}")
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
    if abs(value) > WHOLE_MAX:
        raise OptionError(f"{name} must be a whole number of at most 63 bits (at most "
                          f"{WHOLE_MAX:,} in size), not {value!r}")
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


def _device_built(kind: str) -> bool:
    """Whether this torch was built with the backend of device type ``kind`` (asked without
    starting it: no CUDA context is made)."""
    import torch

    if kind == "cpu":
        return True
    if kind == "cuda":  # a ROCm build's GPUs are cuda devices too
        return bool(torch.backends.cuda.is_built())
    if kind == "mps":
        return bool(torch.backends.mps.is_built())
    if kind == "xpu":
        return bool(getattr(torch.xpu, "_is_compiled", lambda: False)())
    try:  # hip, xla, ipu, privateuseone, ...: only where a plug-in registered the backend
        torch.empty(0, device=kind)
        return True
    except Exception:  # noqa: BLE001 - each backend fails its own way (Runtime, NotImplemented)
        return False


def devices_built() -> tuple[str, ...]:
    """The device names this torch can run a model on (``auto`` and ``cpu`` always)."""
    return ("auto", "cpu", *(k for k in ("cuda", "mps", "xpu") if _device_built(k)))


def _device_absent(dev: Any) -> str | None:
    """Why the device ``dev`` (built into this torch) is not on this machine, or None."""
    import torch

    if dev.type == "cpu":
        return None
    backend = torch.backends.mps if dev.type == "mps" else getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is not None and not available():
        return f"no {dev.type} device is visible to this torch"
    count = getattr(getattr(torch, dev.type, None), "device_count", None)
    if dev.index is not None and count is not None and dev.index >= int(count()):
        n = int(count())
        return f"this machine has {n} {dev.type} device{'s' * (n != 1)} (numbered from 0)"
    return None


def device_name(value: Any, name: str = "device", *, present: bool = False) -> str:
    """``auto``, or a device this torch was built for: ``cpu``; ``cuda``/``cuda:N`` on a CUDA
    or ROCm build; ``mps``, ``xpu`` on builds with them; another type only where a plug-in
    registered its backend (``xla`` with torch_xla). Every device name of every option
    and spec key is checked here, when it is parsed; ``present``: also that this machine
    has it (the index too), which loading checks (a spec may name a GPU its workers have).
    ``meta`` holds no weights and is refused."""
    import torch

    if value == "auto":
        return "auto"
    choose = f"choose {', '.join(devices_built())}"
    try:
        dev = torch.device(value) if isinstance(value, str) and value.strip() else None
    except (RuntimeError, ValueError):
        dev = None
    if dev is None:
        raise OptionError(f"{name} {value!r} is not a device name; {choose} (as torch names "
                          "them: cuda:1)")
    if dev.type == "meta":
        raise OptionError(f"{name} meta holds no weights and measures nothing; {choose}")
    if not _device_built(dev.type):
        raise OptionError(f"{name} {value}: this torch ({torch.__version__}) was built without "
                          f"{dev.type} support; {choose}")
    why = _device_absent(dev) if present else None
    if why is not None:
        raise OptionError(f"{name} {value}: {why}; {choose.replace('choose ', 'use ')} "
                          "(auto: a GPU where one is visible)")
    return value


def choice(value: Any, name: str, *, choices: Iterable[Any], hint: str = "") -> Any:
    """One of ``choices`` (compared as given: a string, a number)."""
    options = tuple(choices)
    if isinstance(value, bool) or value not in options:
        shown = ", ".join(str(c) for c in options)
        raise OptionError(f"{name} {value!r}: choose from {shown}{f' ({hint})' if hint else ''}")
    return value


#: a count of things: 1, 2, ...
COUNT = rule(whole, minimum=1)
#: a count that may be 0: 0, 1, 2, ...
COUNT0 = rule(whole, minimum=0)
#: a seed: 0 .. `SEED_MAX`
SEED = rule(whole, minimum=0, maximum=SEED_MAX)
#: bootstrap resamples (0: no bootstrap interval)
N_BOOT = rule(whole, minimum=0)
#: Ray retries of a unit whose worker died (a spec's ``retries``, ``sweep --retries``)
RETRIES = rule(whole, minimum=0)
#: where a collection's units or a study's runs run
EXECUTOR = rule(choice, choices=("ray", "local"))


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
