"""Progress of every long loop (prompts, sweep units, grid runs, training steps), one helper
for all: a tqdm bar where stderr is a terminal; elsewhere (a log file, a pipe, CI) one plain
line per finished item, with no escape codes and no carriage returns. Inner bars
(``leave=False``: a prompt's layers, an epoch's batches) are shown on a terminal only.

tqdm is imported only where a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


def interactive(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr) is a terminal, where bars may redraw in place."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class Lines:
    """A tqdm stand-in that writes ``desc: 3/8 prompt (12.0 s)`` once per `update`;
    silent when ``enabled`` is false. Supports what the project uses of tqdm: ``update``,
    ``set_postfix``, ``close``, ``disable``, iteration and ``with``."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: int | None = None,
                 desc: str = "", unit: str = "it", initial: int = 0, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.disable = not enabled
        self.stream = stream
        self.postfix = ""
        self.t0 = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disable or n <= 0:
            return
        of = f"/{self.total}" if self.total is not None else ""
        extra = f", {self.postfix}" if self.postfix else ""
        line = (f"{self.desc}: {self.n}{of} {self.unit}{extra} "
                f"({time.monotonic() - self.t0:.1f} s)")
        print(line, file=self.stream or sys.stderr, flush=True)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "",
        unit: str = "it", initial: int = 0, enabled: bool = True, leave: bool = True) -> Any:
    """A progress bar: tqdm on a terminal, `Lines` elsewhere (nothing for an inner
    ``leave=False`` bar). Disabled (``enabled=False``, e.g. ``-q``) it prints nothing."""
    if enabled and interactive():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave,
                    dynamic_ncols=True)
    return Lines(iterable, total=total, desc=desc, unit=unit, initial=initial,
                 enabled=enabled and leave)


def write(message: str, *, stream: TextIO | None = None) -> None:
    """One line on ``stream`` (default: stdout) that does not break a bar being drawn."""
    stream = sys.stdout if stream is None else stream
    if interactive():
        from tqdm.auto import tqdm

        tqdm.write(message, file=stream)
    else:
        print(message, file=stream, flush=True)
