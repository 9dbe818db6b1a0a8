"""Clocks a test moves while the process runs: a file holds the offset in seconds (``+0``,
``-2``, ``+30``) and the process's wall clock follows it; its monotonic clock stays true, as
under a bad NTP step.

Two ways to put a process under a clock file:

* a replica (a dynamically linked Python) through libfaketime, a preload library
  (``harness.procs.faketime_env``, the chaos world's ``clock_file_env``);
* a nats-server, a statically linked Go program that reads the clock through the kernel's vDSO
  where no preload library reaches, through ``clockshift.c``: a small tracer that hides the
  vDSO so the clock is read by system call, and answers only the wall clock calls itself
  (``shifted_command``). It is compiled on first use with the machine's C compiler.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from .rundir import run_dir

__all__ = [
    "ClockShiftUnavailable",
    "clockshift_binary",
    "clockshift_unavailable",
    "needs_clockshift",
    "shifted_command",
    "write_clock",
]

SOURCE = Path(__file__).with_name("clockshift.c")
_lock = threading.Lock()


class ClockShiftUnavailable(RuntimeError):
    """This machine cannot move a nats-server's clock (no C compiler, not x86-64 Linux)."""


def write_clock(path: Path, offset_s: float | str) -> None:
    """Set the offset a clock file holds. Replaced, not rewritten: a reader must never see it
    empty or half written."""
    text = offset_s if isinstance(offset_s, str) else f"{offset_s:+g}"
    temporary = path.with_suffix(".new")
    temporary.write_text(text + "\n")
    os.replace(temporary, path)


def clockshift_binary() -> str:
    """The compiled tracer, built once per version of its source into the run directory."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise ClockShiftUnavailable(
            f"clockshift answers x86-64 Linux system calls; this is "
            f"{platform.system()} {platform.machine()}"
        )
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = run_dir() / f"clockshift-{digest}"
    with _lock:
        if target.exists():
            return str(target)
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise ClockShiftUnavailable(f"building {SOURCE.name} needs a C compiler (cc or gcc)")
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        built = subprocess.run(
            [compiler, "-O2", "-o", str(partial), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            raise ClockShiftUnavailable(f"{compiler} could not build {SOURCE}:\n{built.stderr}")
        os.replace(partial, target)
    return str(target)


def clockshift_unavailable() -> str | None:
    """Why a NATS server's clock cannot be moved here, or None when it can (the tracer is
    built on the way), for a test to skip with the reason or a run to go on without."""
    try:
        clockshift_binary()
    except ClockShiftUnavailable as exc:
        return str(exc)
    return None


# A test that moves a server's clock: skipped, with the reason, where that cannot be done (the
# ``clockshift`` fixture of tests/chaos/conftest.py).
needs_clockshift = pytest.mark.usefixtures("clockshift")


def shifted_command(clock_file: Path, command: list[str]) -> list[str]:
    """``command`` with its wall clock at ``clock_file``'s offset (started at ``+0`` if the
    file is not there yet)."""
    if not clock_file.exists():
        write_clock(clock_file, 0)
    return [clockshift_binary(), str(clock_file), *command]
