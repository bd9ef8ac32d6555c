"""Shared helpers for the benchmarks: machine description, phase timer with peak RSS, JSON out.

Peak memory on the CPU: ``tracemalloc`` does not see torch's allocator, and ``ru_maxrss`` is a
process-wide high-water mark that never goes down, so each phase samples the resident set size
(``psutil``) every few milliseconds in a thread and reports ``peak_rss_mb`` (highest RSS seen
during the phase) and ``peak_rss_delta_mb`` (that peak minus the RSS at the start of the phase).
On CUDA the phase also reports ``torch.cuda.max_memory_allocated`` (reset at phase start).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

#: where results are saved; a smoke test points BLOCKCOUPLING_BENCH_RESULTS elsewhere
RESULTS = Path(os.environ.get("BLOCKCOUPLING_BENCH_RESULTS")
               or Path(__file__).resolve().parent / "results")


def machine() -> dict[str, Any]:
    """nproc, CPU model, load, torch / transformers versions, GPU if any."""
    import transformers

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": os.getloadavg()[0],
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


class Phase:
    """Timing and memory of one phase (filled in by :func:`phase`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # process CPU time (all threads): robust to a loaded machine
        self.peak_rss_mb = 0.0
        self.peak_rss_delta_mb = 0.0
        self.cuda_peak_mb: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": round(self.seconds, 4),
                               "cpu_seconds": round(self.cpu_seconds, 4),
                               "peak_rss_mb": round(self.peak_rss_mb, 1),
                               "peak_rss_delta_mb": round(self.peak_rss_delta_mb, 1)}
        if self.cuda_peak_mb is not None:
            out["cuda_peak_mb"] = round(self.cuda_peak_mb, 1)
        return out


@contextmanager
def phase(name: str, device: torch.device | str = "cpu", interval: float = 0.005) -> Iterator[Phase]:
    import psutil  # the bench extra; the guard (guard_fastpath.py) runs without it

    ph = Phase(name)
    proc = psutil.Process()
    start_rss = proc.memory_info().rss
    peak = [start_rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(interval)

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield ph
    finally:
        if cuda:
            torch.cuda.synchronize()
        ph.seconds = time.perf_counter() - t0
        ph.cpu_seconds = time.process_time() - c0
        stop.set()
        th.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        ph.peak_rss_mb = peak[0] / 2**20
        ph.peak_rss_delta_mb = (peak[0] - start_rss) / 2**20
        if cuda:
            ph.cuda_peak_mb = torch.cuda.max_memory_allocated() / 2**20


class PhaseCPU:
    """CPU seconds per ``measure()`` phase: the process time between one event and the
    previous one goes to the later event's phase (events come when a piece of work ends)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._mark = time.process_time()

    def __call__(self, ev: Any) -> None:
        now = time.process_time()
        self.cpu[ev.phase] = self.cpu.get(ev.phase, 0.0) + now - self._mark
        self._mark = now


def word_tokenizer(spec: str = "builtin:benchmark_styles") -> Any:
    """A word-level tokenizer of the words of a prompt set (the hub's tokenizers are not
    reachable here): whitespace-split words, ``[PAD]`` and ``[UNK]``."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    import blockcoupling as bc

    words = sorted({w for p in bc.load_prompts(spec) for w in p.text.split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


def emit(record: dict[str, Any], sink: list[dict[str, Any]]) -> None:
    """Print one JSON line and keep it for the results file."""
    print(json.dumps(record), flush=True)
    sink.append(record)


def save(records: list[dict[str, Any]], name: str) -> Path:
    """benchmarks/results/<date>_<host>_<name>.json with every record of the run (and the same
    file in ``$OUT`` when that environment variable names a folder, as on a lent GPU machine)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().replace("/", "_")
    path = RESULTS / f"{stamp}_{host}_{name}.json"
    text = json.dumps(records, indent=1)
    path.write_text(text)
    print(f"# saved {path}", flush=True)
    out = os.environ.get("OUT")
    if out and Path(out).is_dir():
        (Path(out) / path.name).write_text(text)
        print(f"# saved {Path(out) / path.name}", flush=True)
    return path
