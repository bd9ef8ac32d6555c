"""Sweeps on Ray clusters as Ray users run them: a cluster started with `ray start` (found
through RAY_ADDRESS or, like ray.init(), through the address `ray start` recorded), token
authentication, and addresses that cannot be reached (a deadline, one error line, nothing
written). The cluster runs with its own RAY_TMPDIR so that no other Ray on this machine sees
it; it is started once for this module and stopped by its process group (never `ray stop`,
which would stop every Ray cluster of this user)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.sweeps import MEASURE, PROMPTS, save_model

pytestmark = pytest.mark.slow  # real Ray clusters (ray start): CI runs every test

pytest.importorskip("ray", reason="ray is not installed: pip install 'blockcoupling[sweep]'")

#: the most a failing connection may take here (the CLI's --connect-timeout is 5 s)
DEADLINE_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k not in ("HOME",)}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HOME=os.environ.get("HOME", "/tmp"))
    env.update(extra)
    return env


class Cluster:
    def __init__(self, proc: subprocess.Popen[bytes], address: str, tmpdir: str, token: str):
        self.proc, self.address, self.tmpdir, self.token = proc, address, tmpdir, token

    def env(self, **extra: str) -> dict[str, str]:
        """A client's environment: this cluster's RAY_TMPDIR and token, and ``extra``."""
        return _env(**({"RAY_TMPDIR": self.tmpdir, "RAY_AUTH_MODE": "token",
                         "RAY_AUTH_TOKEN": self.token} | extra))

    def running(self) -> bool:
        host, port = self.address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return self.proc.poll() is None
        except OSError:
            return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """`ray start --head --block` (1 CPU, no dashboard, token authentication) in its own
    process group and RAY_TMPDIR; stopped at the end of the module."""
    tmpdir = tempfile.mkdtemp(prefix="bcray", dir="/tmp")  # short: Ray's socket paths
    token = secrets.token_hex(32)
    ray_exe = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    env = _env(RAY_TMPDIR=tmpdir, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    log = open(Path(tmpdir) / "start.log", "wb")  # noqa: SIM115  (closed in teardown)
    proc = subprocess.Popen(
        [ray_exe, "start", "--head", f"--port={port}", "--num-cpus=1",
         "--include-dashboard=false", "--disable-usage-stats", "--block"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address_file = Path(tmpdir) / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 180
        while not address_file.is_file() or not address_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ray start did not come up:\n"
                            + (Path(tmpdir) / "start.log").read_text()[-3000:])
            time.sleep(0.5)
        yield Cluster(proc, address_file.read_text().strip(), tmpdir, token)
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)  # the group this fixture started, nothing else
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-unit sweep: a tiny GPT-2 on two prompts."""
    root = tmp_path_factory.mktemp("raystudy")
    save_model(root / "gpt2", "gpt2", 0)
    (root / "prompts.txt").write_text("\n".join(PROMPTS[:2]) + "\n")
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump({"models": [{"label": "gpt2", "model": "gpt2"}],
                                    "prompts": ["prompts.txt"], "measure": MEASURE}))
    return path


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blockcoupling", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=DEADLINE_S)


def _session(out: Path) -> dict[str, Any]:
    return json.loads((out / "sweep.json").read_text())["sessions"][-1]


def test_ray_address_is_used_recorded_and_left_running(cluster: Cluster, spec: Path) -> None:
    out = spec.parent / "s"
    r = _cli(["sweep", str(spec), "--out", str(out)], cluster.env(RAY_ADDRESS=cluster.address),
             spec.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Ray: using the cluster at {cluster.address} (from RAY_ADDRESS)" in r.stderr
    assert f"1 of 1 units done, 0 failed on the Ray cluster at {cluster.address}" in r.stdout
    sess = _session(out)
    assert sess["address"] == cluster.address
    assert sess["cluster"] == {"address": cluster.address, "source": "RAY_ADDRESS",
                               "started_here": False}
    assert cluster.running()  # a cluster the sweep did not start is left running


def test_ray_start_cluster_found_like_ray_init(cluster: Cluster, spec: Path) -> None:
    """No --address, no RAY_ADDRESS: the cluster `ray start` recorded on this node (here in
    its RAY_TMPDIR), as ray.init() finds it; never num_cpus / object_store_memory for it."""
    out = spec.parent / "found"
    r = _cli(["sweep", str(spec), "--out", str(out), "--num-cpus", "1"], cluster.env(),
             spec.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"using the cluster at {cluster.address} (started by `ray start`" in r.stderr
    assert _session(out)["cluster"]["source"] == "ray start"
    assert cluster.running()


def test_token_authentication_failure_says_what_to_set(cluster: Cluster, spec: Path) -> None:
    out = spec.parent / "noauth"
    env = cluster.env(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="disabled")
    r = _cli(["sweep", str(spec), "--out", str(out), "--connect-timeout", "5"], env, spec.parent)
    assert r.returncode == 1
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert cluster.address in errors[0] and "RAY_AUTH_MODE=token" in errors[0]
    assert "Authentication token is missing or incorrect" in errors[0]  # Ray's own words
    assert not out.exists()
    assert cluster.running()


@pytest.mark.parametrize("kind", ["closed", "silent", "client"])
def test_unreachable_address_one_line_no_out(spec: Path, kind: str) -> None:
    """Nothing listening (refused at once), a listener that never speaks Ray (the
    --connect-timeout deadline), and a ray:// address: exit 1, one line, no --out."""
    out = spec.parent / f"unreachable-{kind}"
    listener = None
    if kind == "silent":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
    else:
        address = f"{'ray://' if kind == 'client' else ''}127.0.0.1:{_free_port()}"
    try:
        r = _cli(["sweep", str(spec), "--out", str(out), "--address", address,
                  "--connect-timeout", "5"], _env(RAY_TMPDIR=tempfile.gettempdir()),
                 spec.parent)
    finally:
        if listener is not None:
            listener.close()
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert address in errors[0] and "--address" in errors[0]
    assert not out.exists()
