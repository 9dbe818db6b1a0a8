"""Clean up after a test run that could not: ``python reaper.py RUN_DIR``, with standard input
a pipe the test process holds open (see ``rundir.py``).

When the pipe closes, the test process has ended. Every process group it registered in
``RUN_DIR/children`` that still runs (same PID and start time) is killed, and once they are
gone the directory is removed, unless it carries the ``keep`` mark. Runs as a plain script:
it imports nothing from the harness, which may be what broke.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def kill_registered(run_dir: Path, timeout: float = 10.0) -> None:
    """SIGKILL every registered process group still running, and wait until they are gone."""
    alive = []
    with contextlib.suppress(OSError):
        for line in (run_dir / "children").read_text().splitlines():
            pid_text, _, started = line.partition(" ")
            pid = int(pid_text)
            if start_time(pid) == started:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                alive.append((pid, started))
    deadline = time.monotonic() + timeout
    while any(start_time(p) == s for p, s in alive) and time.monotonic() < deadline:
        time.sleep(0.05)


def remove(run_dir: Path) -> None:
    """Remove the directory unless it is marked to be kept."""
    if (run_dir / "keep").exists():
        return
    for _ in range(3):
        shutil.rmtree(run_dir, ignore_errors=True)
        if not run_dir.exists():
            return
        time.sleep(0.1)


def main(run_dir: Path) -> None:
    sys.stdin.buffer.read()
    kill_registered(run_dir)
    remove(run_dir)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
