"""How much the libraries blockcoupling drives say: the CLI's ``-q`` / ``-v`` passed on to
transformers and huggingface_hub (logging, model-loading and download bars) and to Ray
(``ray.init``'s logging level, and the workers: `worker_call`). Quiet hides progress and
chatter, never results or errors.

Warnings are one line each (`warning_line`, the CLI's format; ``-v``: Python's own, with
the source line). A warning said once per layer is said once for all its layers
(`grouped_layer_warnings`), and a Ray worker's warnings reach the driver in the driver's
format and verbosity (`worker_call`, `say_worker_warnings`), not as Ray's
prefixed copies of the worker's stderr; with ``-q`` the workers' other output (library
chatter, prints) does not reach the driver at all.

Nothing heavy is imported here: a library not imported yet reads the environment variables
set here when it is; one already imported is told directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

_RAY_LEVEL = {"quiet": "ERROR", "normal": "WARNING", "verbose": "INFO"}
_state = {"level": "normal"}


def set_verbosity(*, quiet: bool = False, verbose: bool = False, terminal: bool = True) -> None:
    """``quiet``: only errors from transformers, huggingface_hub, Ray and torch's import-time
    notices, no progress bars;
    ``verbose``: their info messages too; neither: their defaults (as blockcoupling sets
    them). Their progress bars (model loading, saving, downloads) show on a terminal only:
    ``terminal=False`` (the CLI passes whether stderr is one) turns them off, as the project's
    own progress turns into plain lines there. Environment variables the user set are kept unless a flag asks
    otherwise."""
    level = "verbose" if verbose else "quiet" if quiet else "normal"
    _state["level"] = level
    if level == "quiet":
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    elif level == "verbose":
        os.environ["TRANSFORMERS_VERBOSITY"] = "info"
    if level != "normal" and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        if level == "quiet":
            hf_logging.set_verbosity_error()
        else:
            hf_logging.set_verbosity_info()
    if level != "quiet" and not terminal:  # a log file gets no bars (\r, cursor codes)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # what the user set stays
    if not terminal:  # nor Ray's colour codes around its worker prefixes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    bars = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "") not in ("1", "true", "yes", "on")
    if not bars and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if not bars and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "ray" in sys.modules:
        logging.getLogger("ray").setLevel(ray_logging_level())
    # import-time notices of torchao (which transformers imports where it is installed): its
    # GPU kernels that a CPU build cannot load, and torch's note on the enums it registers
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR if level == "quiet" else logging.NOTSET)


def quiet() -> bool:
    """Whether ``-q`` was given."""
    return _state["level"] == "quiet"


def ray_logging_level() -> str:
    """``ray.init(logging_level=...)``: ERROR with ``-q``, INFO with ``-v``, else WARNING."""
    return _RAY_LEVEL[_state["level"]]


def level() -> str:
    """``"quiet"``, ``"normal"`` or ``"verbose"``: what `set_verbosity` was told."""
    return _state["level"]


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning`` of the command line: ``warning: <message>``, one line on
    stderr (Python's format adds the source file and line: ``-v`` keeps it)."""
    text = " ".join(str(message).split())
    print(f"warning: {text}", file=sys.stderr if file is None else file)


# ====================================================================== one line, not one per layer
_LAYER = re.compile(r"\blayer (\d+)\b")
#: where the warnings passed on by `grouped_layer_warnings` are remembered ("default" filters
#: show each text once per place, as for a warning raised directly)
_REGISTRY: dict[Any, Any] = {}


def _ranges(numbers: Sequence[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


@contextlib.contextmanager
def grouped_layer_warnings() -> Iterator[None]:
    """Warnings raised inside that name one layer (``... layer 3 ...``) are said once at the
    end for every layer that raised the same text (``... layers 1-3, 5 ...``); other warnings
    are said as they were. The filters in force outside decide what is shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    groups: dict[tuple[str, type[Warning]], list[int]] = {}
    for w in caught:
        text = str(w.message)
        found = _LAYER.search(text)
        if found is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                   registry=_REGISTRY)
            continue
        key = (_LAYER.sub("\0", text, count=1), w.category)
        groups.setdefault(key, []).append(int(found.group(1)))
    for (template, category), layers in groups.items():
        many = len(set(layers)) > 1
        words = f"layer{'s' if many else ''} {_ranges(layers)}"
        warnings.warn(template.replace("\0", words), category, stacklevel=3)


# ====================================================================== Ray workers
def worker_call(fn: Callable[..., Any], driver_level: str, *args: Any) -> tuple[Any, list[str]]:
    """Run ``fn(*args)`` in a Ray worker at the driver's verbosity (``driver_level``:
    `level` on the driver); returns ``(value, warnings)``, the warnings it raised as
    one line each (in order, each text once) for `say_worker_warnings` on the driver,
    so that they are neither printed by the worker (Ray would forward them with its
    prefixes) nor lost."""
    set_verbosity(quiet=driver_level == "quiet", verbose=driver_level == "verbose",
                  terminal=False)
    with warnings.catch_warnings(record=True) as caught:  # the filters in force stay
        value = fn(*args)
    said = list(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
    return value, said


def say_worker_warnings(lines: Sequence[str], seen: set[str], where: str = "") -> None:
    """Say a worker's warnings on the driver (``warnings.warn``: the driver's format and
    filters; ``-q`` hides chatter, never warnings, on the driver as in the workers), each
    text once per ``seen`` (one sweep)."""
    for text in lines:
        if text not in seen:
            seen.add(text)
            warnings.warn(f"{where}{text}", UserWarning, stacklevel=2)
