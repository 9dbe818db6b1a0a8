"""Child processes for integration and chaos tests: hrwcron replicas, optionally under libfaketime.

Every child runs in its own process group so a replica and anything it spawns can be
signalled together, and so a Ctrl-C aimed at pytest does not reach it half-way through a
scenario. Children still alive when the interpreter exits are SIGKILLed by an atexit hook,
because a leaked server or replica would keep ports and JetStream state busy for the next run;
when the interpreter is killed instead, the kernel kills them (PR_SET_PDEATHSIG) and the run
directory's reaper removes their stores (see ``rundir.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from hrwcron.process.children import die_with_parent

from .rundir import register_process, run_dir

__all__ = [
    "DEBIAN_LIBFAKETIME",
    "ExitStatus",
    "FaketimeUnavailable",
    "ReplicaProcess",
    "faketime_available",
    "faketime_env",
    "find_libfaketime",
    "marked_processes",
]

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_CHILDREN_LOCK = threading.Lock()


def register_child(proc: subprocess.Popen[bytes]) -> None:
    """Remember a child so the atexit hook can kill it if a test forgets to, and so the run
    directory's reaper can if this process is killed before it could."""
    with _CHILDREN_LOCK:
        _CHILDREN[proc.pid] = proc
    register_process(proc.pid)


def forget_child(proc: subprocess.Popen[bytes]) -> None:
    with _CHILDREN_LOCK:
        _CHILDREN.pop(proc.pid, None)


@atexit.register
def _kill_leftover_children() -> None:
    with _CHILDREN_LOCK:
        leftovers = list(_CHILDREN.values())
        _CHILDREN.clear()
    for proc in leftovers:
        # poll() first: an unreaped child still owns its PID, so the signal cannot hit a
        # recycled PID belonging to someone else.
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def marked_processes(name: str, value: str) -> list[int]:
    """Live processes whose environment has ``name=value``: a whole process tree, however its
    members were re-parented, when its root was started with that variable (children inherit
    it). Zombies count as gone. Linux only (reads /proc)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


class ExitStatus(NamedTuple):
    returncode: int
    elapsed: float


class ReplicaProcess:
    """One ``python -m hrwcron ...`` child with its combined stdout/stderr in ``log_path``.

    ``module=None`` runs ``[sys.executable, *args]`` instead, for helpers and self-tests.
    ``env`` is layered over the current environment unless ``inherit_env`` is false.
    """

    def __init__(
        self,
        args: Iterable[str],
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        *,
        module: str | None = "hrwcron",
        cwd: str | os.PathLike[str] | None = None,
        inherit_env: bool = True,
        start: bool = True,
    ) -> None:
        self.args = list(args)
        self.env = dict(env or {})
        self.module = module
        self.cwd = cwd
        self.inherit_env = inherit_env
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="replica-", suffix=".log", dir=run_dir())
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._paused = False
        if start:
            self.start()

    @property
    def argv(self) -> list[str]:
        prefix = [sys.executable] if self.module is None else [sys.executable, "-m", self.module]
        return [*prefix, *self.args]

    def start(self) -> ReplicaProcess:
        if self.running:
            raise RuntimeError(f"replica already running as pid {self.pid}")
        env = dict(os.environ) if self.inherit_env else {}
        # Unbuffered so wait_for_log sees lines as they are written, not at exit.
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Appending keeps a previous incarnation's output for post-mortems; output() only
        # returns this incarnation's part.
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self._paused = False
        register_child(self._proc)
        return self

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("replica was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def kill(self) -> int | None:
        """SIGKILL the whole process group: the crash the protocol has to survive."""
        self._signal_group(signal.SIGKILL)
        return self.wait(10.0)

    def pause(self) -> None:
        self._signal_group(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)
        self._paused = False

    def wait(self, timeout: float | None = None) -> int | None:
        if self._proc is None:
            return None
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        forget_child(self._proc)
        return code

    def terminate(self, timeout: float = 10.0) -> ExitStatus:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; return the code and the time taken.

        The elapsed time is part of the result because graceful shutdown latency is itself
        something tests assert on.
        """
        if self._proc is None:
            raise RuntimeError("replica was never started")
        started = time.monotonic()
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if self._paused:
                # A stopped process does not act on SIGTERM until it is continued.
                self.resume()
            code = self.wait(timeout)
            if code is None:
                self._signal_group(signal.SIGKILL)
                code = self.wait(10.0)
        else:
            code = self._proc.returncode
        if code is None:
            raise RuntimeError(f"replica pid {self.pid} survived SIGKILL")
        return ExitStatus(code, time.monotonic() - started)

    def output(self) -> str:
        """This incarnation's combined stdout and stderr so far."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                data = log.read()
        except FileNotFoundError:
            return ""
        return data.decode("utf-8", errors="replace")

    def mark(self) -> int:
        """Position in ``output()``; pass as ``since`` to only match lines written later."""
        return len(self.output())

    def wait_for_log(
        self, pattern: str | re.Pattern[str], timeout: float = 10.0, *, since: int = 0
    ) -> re.Match[str]:
        """Wait until ``pattern`` (a regex, searched multiline) appears in the output.

        Fails early, with the output's tail, if the process exits without printing it.
        """
        regex = re.compile(pattern, re.MULTILINE) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            exited = not self.running
            text = self.output()
            match = regex.search(text, since)
            if match:
                return match
            if exited:
                raise AssertionError(
                    f"pid {self.pid} exited with {self.returncode} before logging "
                    f"{regex.pattern!r}; output tail:\n{_tail(text)}"
                )
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout:.1f}s waiting for {regex.pattern!r} from pid "
                    f"{self.pid}; output tail:\n{_tail(text)}"
                )
            time.sleep(0.02)

    def __enter__(self) -> ReplicaProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.running:
            self.kill()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited({self.returncode})"
        pid = self._proc.pid if self._proc else None
        return f"ReplicaProcess(pid={pid}, {state}, args={self.args!r})"


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --- libfaketime --------------------------------------------------------------------------

DEBIAN_LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class FaketimeUnavailable(RuntimeError):
    """libfaketime is not installed; clock-skew tests should skip rather than fail."""


def find_libfaketime() -> str:
    override = os.environ.get("HRWCRON_LIBFAKETIME")
    if override:
        if Path(override).is_file():
            return override
        raise FaketimeUnavailable(f"HRWCRON_LIBFAKETIME={override} does not exist")
    if Path(DEBIAN_LIBFAKETIME).is_file():
        return DEBIAN_LIBFAKETIME
    # Other architectures keep it under their own multiarch directory; the package
    # manifest knows where.
    dpkg = shutil.which("dpkg")
    if dpkg:
        try:
            listing = subprocess.run(
                [dpkg, "-L", "libfaketime"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            listing = ""
        for line in listing.splitlines():
            if line.endswith("/libfaketime.so.1") and Path(line).is_file():
                return line
    raise FaketimeUnavailable(
        "libfaketime is not installed (apt-get install libfaketime); clock-skew tests need it"
    )


def faketime_available() -> bool:
    try:
        find_libfaketime()
    except FaketimeUnavailable:
        return False
    return True


def faketime_env(offset_seconds: float) -> dict[str, str]:
    """Environment additions that shift a child's wall clock by ``offset_seconds``.

    Only the real-time clock moves: monotonic clocks stay true, as with a badly set NTP
    clock, so leases and timeouts measured on the monotonic clock remain honest.
    """
    lib = find_libfaketime()
    preload = os.environ.get("LD_PRELOAD", "")
    return {
        "LD_PRELOAD": f"{lib}:{preload}" if preload else lib,
        "FAKETIME": _format_offset(offset_seconds),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _format_offset(offset_seconds: float) -> str:
    if float(offset_seconds).is_integer():
        return f"{int(offset_seconds):+d}s"
    return f"{offset_seconds:+.6f}".rstrip("0") + "s"
