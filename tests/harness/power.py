"""Power failures for real nats-server processes: each node's store on a :mod:`powerfs` mount
that keeps unsynced writes in memory, and a cut that SIGKILLs the node and drops them.

``fuse_unavailable()`` says why FUSE cannot be used here (no ``/dev/fuse``, no libfuse, not
root and no ``fusermount3``), so tests skip with that reason instead of failing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import powerfs
from .nats import NatsCluster, NatsServer
from .procs import forget_child, register_child
from .wait import wait_for

__all__ = [
    "DEFAULT_SYNC",
    "SYNC_ALWAYS",
    "Cut",
    "PowerCluster",
    "PowerMount",
    "fuse_unavailable",
    "sync_config",
]

SYNC_ALWAYS = "always"
DEFAULT_SYNC = "default"  # nats-server's own: flush every 2 minutes


def sync_config(sync: str) -> str | None:
    """The nats-server config text for a ``sync`` setting (None: the server's default)."""
    if sync == DEFAULT_SYNC:
        return None
    return "jetstream {\n  sync_interval: " + sync + "\n}\n"


def fuse_unavailable() -> str | None:
    """None when a powerfs mount can work here, else the reason it cannot."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (FUSE is not available in this environment)"
    try:
        import mfusepy  # noqa: F401
    except ImportError as exc:
        return f"mfusepy is not installed (pip install -e '.[dev]'): {exc}"
    except OSError as exc:  # libfuse itself is missing
        return f"libfuse is not installed (apt-get install fuse3): {exc}"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 to mount FUSE (apt-get install fuse3)"
    return None


_OPEN: set[PowerMount] = set()


@atexit.register
def _unmount_leftovers() -> None:
    # Runs before the harness's own hook SIGKILLs leftover children (atexit is last in, first
    # out): a FUSE daemon killed outright leaves a dead mount that nothing can delete.
    for mount in list(_OPEN):
        with contextlib.suppress(Exception):
            mount.close()


@dataclass(frozen=True)
class Cut:
    """What one power cut dropped on one node."""

    node: str
    files: int
    bytes: int


class PowerMount:
    """One powerfs process serving ``mountpoint`` from ``backing``."""

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log_path = log_path
        # Unix socket paths are limited to ~107 bytes; a test's tmp dir can be longer.
        self.control = Path(
            f"/tmp/powerfs-{os.getpid()}-{abs(hash(str(mountpoint))) % 10**10}.sock"
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> PowerMount:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    powerfs.__file__,
                    str(self.backing),
                    str(self.mountpoint),
                    str(self.control),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        register_child(self._proc)
        _OPEN.add(self)

        def mounted() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"powerfs exited with {self._proc.returncode}: "
                    + self.log_path.read_text(errors="replace")[-2000:]
                )
            return os.path.ismount(self.mountpoint) and self.request("ping") == "pong"

        wait_for(
            mounted,
            timeout=timeout,
            message=f"powerfs mounted on {self.mountpoint}",
            ignore=(OSError,),
        )
        return self

    def request(self, command: str, timeout: float = 10.0) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.control))
            sock.sendall(command.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        return answer.decode().strip()

    def _counts(self, answer: str) -> tuple[int, int]:
        fields = dict(part.split("=", 1) for part in answer.split())
        values = list(fields.values())
        return int(values[0]), int(values[1])

    def stats(self) -> tuple[int, int]:
        """(files, bytes) written and not yet fsynced."""
        return self._counts(self.request("stats"))

    def cut(self) -> tuple[int, int]:
        """Drop every unsynced write; (files, bytes) dropped."""
        return self._counts(self.request("cut"))

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # libfuse unmounts on SIGTERM once no request is in flight.
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            forget_child(proc)
        if os.path.ismount(self.mountpoint):
            # A daemon that died leaves a dead mount ("transport endpoint is not connected").
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)
        with contextlib.suppress(FileNotFoundError):
            self.control.unlink()
        _OPEN.discard(self)


class PowerCluster(NatsCluster):
    """A :class:`NatsCluster` whose nodes keep their stores on powerfs mounts, with
    ``sync_interval`` set as asked (``"always"``, a duration, or ``"default"``).

    :meth:`power_cut` is a power failure of some nodes at one instant: each is SIGKILLed, then
    its unsynced writes are dropped; :meth:`power_on` starts them again on the same ports and
    store, like a machine booting.
    """

    def __init__(self, size: int = 3, *, sync: str = SYNC_ALWAYS, **kwargs: Any) -> None:
        if kwargs.get("config_text") is not None:
            raise ValueError("PowerCluster writes its own config text (sync_interval)")
        super().__init__(size, config_text=sync_config(sync), **kwargs)
        self.sync = sync
        self.mounts: list[PowerMount] = []
        self.cuts: list[Cut] = []

    def start(self) -> PowerCluster:
        try:
            super().start()
        except BaseException:
            self._unmount()
            raise
        return self

    def _build(self, cluster_ports: list[int], attempt: int) -> list[NatsServer]:
        self._unmount()
        servers = super()._build(cluster_ports, attempt)
        for server in servers:
            mount = PowerMount(
                server.base_dir / "disk", server.store_dir, server.base_dir / "powerfs.log"
            )
            self.mounts.append(mount.start())
        return servers

    def power_cut(self, nodes: list[int]) -> list[Cut]:
        """Every node in ``nodes`` loses power at once (all are killed before any is cut)."""
        for i in nodes:
            self.servers[i].kill()
        found = []
        for i in nodes:
            files, size = self.mounts[i].cut()
            found.append(Cut(self.names[i], files, size))
        self.cuts += found
        return found

    def power_on(
        self, nodes: list[int], timeout: float | None = None, *, formed: bool = True
    ) -> None:
        """Start the nodes again and (unless ``formed`` is false: with a node paused the
        cluster may not form) wait until the cluster has formed with them."""
        timeout = self.start_timeout if timeout is None else timeout
        for i in nodes:
            self.servers[i].launch()
        for i in nodes:
            self.servers[i].wait_started(timeout)
        if formed:
            self.wait_formed(timeout)

    def unsynced(self) -> list[tuple[int, int]]:
        return [mount.stats() for mount in self.mounts]

    def _unmount(self) -> None:
        for mount in self.mounts:
            mount.close()
        self.mounts = []

    def cleanup(self) -> None:
        self.stop()
        self._unmount()
        super().cleanup()
