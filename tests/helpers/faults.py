"""Child processes for the fault tests: the CLI run in a new process that kills itself at a
chosen point of a run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import child_env

SEED = int(os.environ.get("BLOCKCOUPLING_FAULT_SEED", "20261122"))


def child(point: str, nth: int, sig: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a new process that sends itself ``sig`` at the ``nth`` ``point``."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        from tests.helpers.tiny_runs import install_probes
        seen = 0
        def trip(point):
            global seen
            if point == {point!r}:
                seen += 1
                if seen == {nth}:
                    os.kill(os.getpid(), signal.{sig})
        install_probes(trip)
        from blockcoupling.cli import main
        sys.argv = ["blockcoupling", *{argv!r}]
        main()
    """)
    import torch

    # the same number of threads as this process: a matmul's reduction order, hence its
    # float32 rounding, depends on it (bit-identity holds for the same machine and threads)
    env = child_env(OMP_NUM_THREADS=str(torch.get_num_threads()), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


def one_error_line(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert "Traceback" not in output, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]
