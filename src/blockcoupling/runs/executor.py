"""The executors of every collection kind: ``ray`` (one Ray task per unit on the cluster
`connect_ray` finds or starts) and ``local`` (in this process, in order). `run_each` is
the one task loop: a sweep's units, a ViT grid's trainings, any kind's units run through it.
The cluster: `resolve_ray_address`, `connect_ray`, `ray_session`, `start_ray`."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.errors import BlockCouplingError, require
from blockcoupling.verbosity import (
    level,
    quiet,
    ray_logging_level,
    say_worker_warnings,
    worker_call,
)

EXECUTORS = ("ray", "local")
#: environment variables that reach every Ray worker (offline mode and caches)
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME",
                 "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE",
                 "HF_DATASETS_CACHE", "TORCH_HOME", "XDG_CACHE_HOME", "TRANSFORMERS_VERBOSITY",
                 "HF_HUB_DISABLE_PROGRESS_BARS")
#: object store of a local cluster: units return small records, never tensors
LOCAL_OBJECT_STORE_BYTES = 200 * 2**20


class ExecutorError(BlockCouplingError):
    """The executor cannot start or reach its cluster (the message says what to do)."""


SweepError = ExecutorError
"""The sweep's name of `ExecutorError` (kept: the messages and handlers use it)."""


def import_ray() -> Any:
    """``ray``, or a SweepError saying how to install it."""
    return require("ray", what="the Ray executor", install="'blockcoupling[sweep]'",
                   alternative="or run with --executor local, in this process", error=SweepError)


def check_executor(executor: str) -> str:
    """``executor`` if it is one of `EXECUTORS` (``ray``: installed), else one line."""
    if executor not in EXECUTORS:
        raise ExecutorError(f"executor {executor!r}: choose ray or local")
    if executor == "ray":
        import_ray()  # a missing ray is said before anything runs
    return executor


def worker_env() -> dict[str, str]:
    """The environment variables sent to every worker (``FORWARDED_ENV`` that are set)."""
    return {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}


#: seconds a connection to an existing cluster may take (TCP probe and ``ray.init``)
CONNECT_TIMEOUT_S = 60.0
#: seconds the TCP probe of ``host:port`` may take before ``ray.init`` is tried
PROBE_TIMEOUT_S = 10.0
_TOKEN_AUTH_HELP = ("the cluster uses token authentication (Ray 2.60's `ray start` enables it "
                    "when a token exists): set RAY_AUTH_MODE=token here and make the cluster's "
                    "token available (~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH); "
                    "see https://docs.ray.io/en/latest/ray-security/token-auth.html")


#: Ray's warning for ``ray.init`` outside the main thread (the deadline's thread): not news
_NOISE = "SIGTERM handler is not set"


@dataclass(frozen=True)
class RayCluster:
    """The Ray cluster a sweep runs on: its ``address`` (the GCS ``host:port``, or the
    ``ray://`` address of a client connection), where that address came from (``source``:
    ``"--address"``, ``"RAY_ADDRESS"``, ``"ray start"`` (the cluster ``ray start`` left on
    this node, as ``ray.init()`` finds it), ``"started here"`` or ``"this process"`` (Ray was
    already initialised)) and whether this process started it (then it is shut down after)."""

    address: str
    source: str
    started_here: bool

    def describe(self) -> str:
        """One line for the user, e.g. ``Ray: connected to the cluster at h:p (RAY_ADDRESS)``."""
        if self.started_here:
            return f"Ray: started a local cluster at {self.address} (stopped at the end)"
        how = {"--address": "--address", "RAY_ADDRESS": "from RAY_ADDRESS",
               "ray start": "started by `ray start` on this node",
               "this process": "already initialised in this process"}.get(self.source,
                                                                          self.source)
        return f"Ray: using the cluster at {self.address} ({how})"

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "source": self.source,
                "started_here": self.started_here}


def resolve_ray_address(address: str | None = None) -> tuple[str | None, str]:
    """Which cluster ``ray.init(address=address)`` would use, and where that came from:
    ``address`` if given (``"local"``: a new one), else ``RAY_ADDRESS``, else the cluster
    ``ray start`` recorded on this node (Ray's own lookup, which honours ``RAY_TMPDIR``), else
    ``(None, "started here")``: a new local cluster."""
    if address in (None, ""):
        env = os.environ.get("RAY_ADDRESS", "")
        if env:
            address, source = env, "RAY_ADDRESS"
        else:
            address, source = _ray_start_address(), "ray start"
    else:
        source = "--address"
    if address in (None, "local"):
        return None, "started here"
    if address == "auto":  # Ray's legacy form: the cluster `ray start` left, or any local one
        found = _ray_start_address(auto=True)
        if found is None:
            raise SweepError("--address auto: no running Ray cluster was found on this node; "
                             "start one with `ray start --head`, or leave --address out to "
                             "start a local one")
        return found, source
    return address, source


def _ray_start_address(auto: bool = False) -> str | None:
    try:  # Ray's private lookup (the file `ray start` writes); None if there is none
        from ray._private import services

        return services.get_ray_address_from_environment("auto" if auto else None, None)  # type: ignore[arg-type]
    except (ImportError, AttributeError):
        return None
    except ConnectionError:
        return None


def _host_port(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://").rsplit("/", 1)[0] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        if address.startswith("ray://"):
            return rest, 10001  # Ray Client's default port
        raise SweepError(f"Ray address {address!r} is not host:port (e.g. 10.0.0.1:6379 or "
                         "ray://head:10001)")
    return host.strip("[]"), int(port)


def _probe(address: str, source: str, timeout: float) -> None:
    """Refuse an address nothing listens on within ``timeout`` seconds (``ray.init`` would
    wait for ever)."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        why = (f"no answer within {timeout:g} s" if isinstance(err, TimeoutError)
               else (err.strerror or str(err)).lower())
        raise SweepError(f"cannot reach the Ray cluster at {address} ({_source_words(source)}): "
                         f"{why}; check that it runs (`ray status` on its "
                         "head node) and the address, or unset it to start a local cluster"
                         ) from err


def _source_words(source: str) -> str:
    return {"--address": "--address", "RAY_ADDRESS": "from RAY_ADDRESS",
            "ray start": "the cluster `ray start` left on this node; `ray stop` it or set "
                         "RAY_ADDRESS=local for a new one"}.get(source, source)


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 (Ray's C++ core logs there) written to ``path`` meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _ray_reason(err: BaseException | None, log: str) -> str:
    """Ray's own reason for a failed connection: token authentication (from the exception or
    the core's log lines), else the exception's first line."""
    text = f"{err or ''}\n{log}"
    if any(w in text for w in ("Unauthenticated", "InvalidAuthToken", "AuthenticationError",
                               "Token authentication is enabled but no")):
        said = next((ln.split("RPC error:")[-1].strip() for ln in log.splitlines()
                     if "InvalidAuthToken" in ln), None)
        if said is None and err is not None:
            said = str(err).split(". ")[0]
        return f"Ray says: {said}; {_TOKEN_AUTH_HELP}"
    if err is None:
        lines = [ln.split("] ", 1)[-1].strip() for ln in log.splitlines()
                 if "Failed" in ln or "rror" in ln]
        return (f"Ray says: {lines[-1]}" if lines else
                "no answer from a Ray GCS there (the head's GCS port is 6379 by default)")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"Ray says: {first}"


def _init_with_deadline(ray: Any, timeout: float, **kwargs: Any) -> None:
    """``ray.init(**kwargs)`` that gives up after ``timeout`` seconds (Ray retries an
    unreachable or refusing cluster for ever): a `SweepError` with Ray's reason."""
    box: dict[str, BaseException] = {}

    def init() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as err:  # handed to the caller below
            box["err"] = err

    where, source = kwargs["address"], kwargs.pop("_source")
    with tempfile.TemporaryDirectory(prefix="blockcoupling-ray-") as tmp:
        log_path = Path(tmp) / "stderr"
        with _stderr_to(log_path):
            th = threading.Thread(target=init, name="ray.init", daemon=True)
            th.start()
            th.join(timeout)
        log = log_path.read_text(errors="replace")
    if th.is_alive() or "err" in box:
        err = box.get("err")
        if isinstance(err, ImportError) or "ray[client]" in f"{err}":
            raise SweepError(f"the Ray Client address {where} needs Ray's client extra: pip "
                             "install 'ray[client]' (or 'blockcoupling[sweep]')") from err
        late = f"no connection within {timeout:g} s" if th.is_alive() else "connection failed"
        raise SweepError(f"cannot connect to the Ray cluster at {where} "
                         f"({_source_words(source)}): {late}; {_ray_reason(err, log)}") from err
    said = "".join(ln for ln in log.splitlines(keepends=True) if _NOISE not in ln)
    if said.strip() and ray_logging_level() != "ERROR":
        sys.stderr.write(said)  # what Ray said while connecting, now that it worked


def connect_ray(address: str | None = None, *, num_cpus: int | None = None,
                object_store_memory: int | None = LOCAL_OBJECT_STORE_BYTES,
                connect_timeout: float = CONNECT_TIMEOUT_S) -> RayCluster:
    """Reach the cluster ``ray.init()`` would use (``address``, ``RAY_ADDRESS``, or the one
    ``ray start`` left on this node), or start a small local one (no dashboard, a 200 MB
    object store, ``num_cpus``) when there is none. Offline mode and cache settings reach the
    workers. ``num_cpus`` / ``object_store_memory`` only size a new local cluster (Ray
    refuses them when connecting). A connection has a deadline (``connect_timeout`` seconds:
    a TCP probe of host:port, then ``ray.init``); a failure is one `SweepError` with
    Ray's own reason. Uses the Ray already initialised in this process, if any."""
    ray = import_ray()
    if ray.is_initialized():
        return RayCluster(_gcs_address(ray, None), "this process", started_here=False)
    target, source = resolve_ray_address(address)
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": worker_env()}}
    if target is not None and target.startswith("ray://"):
        require("grpc", what=f"the Ray Client address {target}", package="Ray's client extra",
                install="'ray[client]'", alternative="or 'blockcoupling[sweep]'", error=SweepError)
        _probe(target, source, min(PROBE_TIMEOUT_S, connect_timeout))
        _init_with_deadline(ray, connect_timeout, address=target, _source=source, **kwargs)
        return RayCluster(target, source, started_here=False)
    kwargs |= {"include_dashboard": False, "log_to_driver": not quiet(),  # -q: no chatter
               "logging_level": ray_logging_level()}
    if target is not None:
        if num_cpus is not None:
            warnings.warn(f"num_cpus={num_cpus} sizes only a local cluster started here; the "
                          f"cluster at {target} keeps its own resources", stacklevel=2)
        _probe(target, source, min(PROBE_TIMEOUT_S, connect_timeout))
        _init_with_deadline(ray, connect_timeout, address=target, _source=source, **kwargs)
        return RayCluster(_gcs_address(ray, target), source, started_here=False)
    try:
        ray.init(address="local", num_cpus=num_cpus, object_store_memory=object_store_memory,
                 **kwargs)
    except Exception as err:  # ray raises bare Exception, e.g. a node start-up timeout
        raise SweepError(f"could not start a local Ray cluster: {_ray_reason(err, '')}; try "
                         "again on a less busy machine, or use --executor local") from err
    return RayCluster(_gcs_address(ray, None), "started here", started_here=True)


def _gcs_address(ray: Any, fallback: str | None) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # a client connection has no GCS address of its own
        return str(fallback)


def start_ray(address: str | None = None, *, num_cpus: int | None = None,
              object_store_memory: int | None = LOCAL_OBJECT_STORE_BYTES,
              connect_timeout: float = CONNECT_TIMEOUT_S) -> str:
    """`connect_ray`, returning the cluster's address (Ray stays initialised)."""
    return connect_ray(address, num_cpus=num_cpus, object_store_memory=object_store_memory,
                       connect_timeout=connect_timeout).address


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None,
                connect_timeout: float = CONNECT_TIMEOUT_S) -> Iterator[RayCluster]:
    """`connect_ray` for the ``with`` block; a cluster this process initialised is
    shut down at its end (a cluster it connected to keeps running)."""
    ray = import_ray()
    initialised_here = not ray.is_initialized()
    cluster = connect_ray(address, num_cpus=num_cpus, connect_timeout=connect_timeout)
    try:
        yield cluster
    finally:
        if initialised_here:
            ray.shutdown()


def ray_each(fn: Callable[..., Any],
             calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]],
             on_result: Callable[[int, Any, BaseException | None], None], *,
             address: str | None = None, num_cpus: int | None = None,
             on_start: Callable[[RayCluster], None] | None = None) -> str:
    """Run ``fn(*args)`` as one Ray task per ``(args, options)`` of ``calls`` (``options``:
    ``ray.remote(...).options``: resources, retries, name) and call ``on_result(i, value,
    None)`` as each finishes, or ``on_result(i, None, err)`` where its worker died past its
    retries (a ``RayError``). Uses the Ray already initialised in this process, or the cluster
    `connect_ray` finds or starts (shut down afterwards if this process initialised
    it); ``on_start(cluster)`` once it is reached. Returns the cluster address. The one task
    loop of sweeps and ViT grids. The workers run at this process's verbosity, and their
    warnings are said here, in this process's format, each text once (``-q``: not at all):
    `blockcoupling.verbosity.worker_call`."""
    ray = import_ray()
    with ray_session(address, num_cpus=num_cpus) as cluster:
        if on_start is not None:
            on_start(cluster)
        task = ray.remote(worker_call)
        refs = {task.options(**opts).remote(fn, level(), *args): i
                for i, (args, opts) in enumerate(calls)}
        seen: set[str] = set()
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                i = refs.pop(ref)
                try:
                    value, said = ray.get(ref)
                except ray.exceptions.RayError as err:
                    on_result(i, None, err)
                else:
                    say_worker_warnings(said, seen)
                    on_result(i, value, None)
    return cluster.address


def died(err: BaseException) -> str:
    """``"RayTaskError: <first line>"`` of a dead worker's error, for a status message."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {first}"


def run_each(fn: Callable[..., Any],
             calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]],
             on_result: Callable[[int, Any, BaseException | None], None], *,
             executor: str = "ray", address: str | None = None,
             num_cpus: int | None = None,
             on_start: Callable[[RayCluster], None] | None = None,
             on_submit: Callable[[int], None] | None = None) -> str | None:
    """Run ``fn(*args)`` for every ``(args, options)`` of ``calls`` on ``executor``:
    ``"local"`` calls it in this process, in order (``options``, Ray's, are not used), and
    ``on_result(i, value, None)`` after each; ``"ray"`` is `ray_each`. Returns the cluster
    address (None: local). ``on_submit(i)``, if given, is called as call ``i`` is handed
    over: just before it runs (local), or once the cluster is reached (ray)."""
    check_executor(executor)
    if executor == "local":
        for i, (args, _opts) in enumerate(calls):
            if on_submit is not None:
                on_submit(i)
            on_result(i, fn(*args), None)
        return None
    if not calls:  # nothing left to run: no cluster needed
        return None

    def started(cluster: RayCluster) -> None:
        if on_start is not None:
            on_start(cluster)
        if on_submit is not None:
            for i in range(len(calls)):
                on_submit(i)

    return ray_each(fn, calls, on_result, address=address, num_cpus=num_cpus,
                    on_start=started)
