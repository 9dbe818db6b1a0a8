"""One temporary directory per test run, holding every store, log and pytest's own temporary
directories, and removed however the run ends.

A normal exit removes it from an atexit hook. A test process killed with SIGKILL runs no hook,
so a small reaper process (``reaper.py``, in a session of its own) is started with the
directory: it blocks reading a pipe that only the test process holds open, and when the test
process ends, by any means, the read returns; the reaper then kills the process groups the
harness registered (any PR_SET_PDEATHSIG missed) and removes the directory. Should the reaper
itself be killed too, the next run removes directories whose owner is gone.

``HRWCRON_KEEP_NATS_DIRS=1`` keeps the directory for a post-mortem.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .reaper import kill_registered, remove, start_time

__all__ = ["KEEP_DIRS_ENV", "keep_dirs", "register_process", "run_dir"]

KEEP_DIRS_ENV = "HRWCRON_KEEP_NATS_DIRS"
PREFIX = "hrwcron-run-"
# Written into the directory: "<pid> <start time>" per line, read by the reaper.
CHILDREN_FILE = "children"
KEEP_MARK = "keep"
REAPER = Path(__file__).with_name("reaper.py")

_lock = threading.Lock()
_dir: Path | None = None
_reaper: subprocess.Popen[bytes] | None = None


def keep_dirs() -> bool:
    return bool(os.environ.get(KEEP_DIRS_ENV))


def run_dir() -> Path:
    """This process's run directory, created (and its reaper started) on first use."""
    global _dir, _reaper
    with _lock:
        if _dir is None:
            remove_stale()
            path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
            if keep_dirs():
                (path / KEEP_MARK).touch()
            _reaper = subprocess.Popen(
                [sys.executable, str(REAPER), str(path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: whatever kills this process's group must not take it along.
                start_new_session=True,
            )
            atexit.register(_remove, path)
            _dir = path
        return _dir


def register_process(pid: int) -> None:
    """Note a child (a process-group leader) for the reaper to kill if this process dies
    without stopping it."""
    started = start_time(pid)
    if started is None:
        return
    registry = run_dir() / CHILDREN_FILE
    with _lock, open(registry, "a") as out:
        out.write(f"{pid} {started}\n")


def _remove(path: Path) -> None:
    # Children a test left running are killed first, so none writes into a removed store.
    kill_registered(path)
    remove(path)
    if _reaper is not None and _reaper.stdin is not None:
        # The reaper finds nothing left to do, and exits.
        with contextlib.suppress(OSError):
            _reaper.stdin.close()


def remove_stale(base: str | None = None) -> list[Path]:
    """Remove run directories of earlier runs whose process is gone (killed together with
    its reaper); kept ones stay."""
    removed = []
    for path in Path(base or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid_text = path.name[len(PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or (path / KEEP_MARK).exists():
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:
            continue
    return removed
