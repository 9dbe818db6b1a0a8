"""Run the shipped nats/ configurations on loopback: the cluster node files with their ports,
routes and store directory rewritten, the accounts file untouched."""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import nats
from nats.aio.client import Client

from harness import LOOPBACK, NatsServer, NatsServerError, free_ports, wait_for, wait_for_async

ROOT = Path(__file__).resolve().parents[2]
NATS_DIR = ROOT / "nats"
ACCOUNTS = NATS_DIR / "accounts.conf"
NODE_FILES = sorted((NATS_DIR / "cluster").glob("node-*.conf"))
CONFIG_FILES = [NATS_DIR / "single.conf", *NODE_FILES]
ROLES = ("scheduler", "worker", "admin")
# Where the WORKERS account of accounts.conf imports the scheduler account's JetStream API.
WORKER_API_PREFIX = "$JS.hrwcron.API"


def password_env(role: str) -> str:
    return f"NATS_{role.upper()}_PASSWORD"


def random_passwords() -> dict[str, str]:
    """A password per role; starting with a letter, as accounts.conf asks."""
    return {role: f"p{secrets.token_hex(12)}" for role in ROLES}


def passwords_env(passwords: Mapping[str, str]) -> dict[str, str]:
    return {password_env(role): password for role, password in passwords.items()}


def _replace_once(text: str, pattern: str, replacement: str, what: str) -> str:
    new, count = re.subn(pattern, replacement, text)
    if count != 1:
        raise AssertionError(f"expected one {what} ({pattern!r}) in the node config, found {count}")
    return new


def rewrite_node(
    text: str,
    *,
    client_port: int,
    monitor_port: int,
    route_ports: Mapping[str, int],
    own_route_port: int,
    store_dir: Path,
) -> str:
    """The node config with every address on loopback and every port replaced. Each setting
    must occur exactly once, so a config that grows a second listener fails loudly here."""
    text = _replace_once(
        text, r"(?m)^listen: 0\.0\.0\.0:4222$", f"listen: {LOOPBACK}:{client_port}", "client"
    )
    text = _replace_once(
        text, r"(?m)^http: 0\.0\.0\.0:8222$", f"http: {LOOPBACK}:{monitor_port}", "monitor"
    )
    text = _replace_once(
        text,
        r"(?m)^(\s+)listen: 0\.0\.0\.0:6222$",
        rf"\g<1>listen: {LOOPBACK}:{own_route_port}",
        "cluster listener",
    )
    text = _replace_once(
        text, r'(?m)^(\s+)store_dir: "[^"]*"$', rf'\g<1>store_dir: "{store_dir}"', "store_dir"
    )
    for host, port in route_ports.items():
        text = _replace_once(
            text, rf"nats://{re.escape(host)}:6222", f"nats://{LOOPBACK}:{port}", f"route {host}"
        )
    return text


class ShippedCluster:
    """The three nats/cluster/node-*.conf servers on loopback, formed into one cluster.

    Each node's rewritten config lives in ``<base>/node-i/server.conf`` beside a copy of
    ``accounts.conf`` one level up, so the file's own ``include "../accounts.conf"`` resolves
    exactly as in the repository. The passwords must be in the environment when it starts.
    """

    def __init__(self, base_dir: Path, *, attempts: int = 3, timeout: float = 30.0) -> None:
        self.base_dir = base_dir
        self.attempts = attempts
        self.timeout = timeout
        self.servers: list[NatsServer] = []

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def start(self) -> ShippedCluster:
        error: NatsServerError | None = None
        for attempt in range(self.attempts):
            self.servers = self._build(self.base_dir / f"attempt{attempt}")
            try:
                for server in self.servers:
                    server.launch()
                for server in self.servers:
                    server.wait_started(self.timeout)
            except NatsServerError as exc:
                error = exc
                self.stop()
                if "address already in use" in str(exc):
                    continue
                raise
            wait_for(self.formed, timeout=self.timeout, interval=0.1, message="cluster formed")
            return self
        raise NatsServerError(f"ports kept being taken after {self.attempts} attempts: {error}")

    def _build(self, base: Path) -> list[NatsServer]:
        base.mkdir(parents=True)
        shutil.copy(ACCOUNTS, base / "accounts.conf")
        ports = free_ports(3 * len(NODE_FILES))
        count = len(NODE_FILES)
        clients, monitors, routes = ports[:count], ports[count : 2 * count], ports[2 * count :]
        hosts = [f"nats-{i + 1}" for i in range(count)]
        route_ports = dict(zip(hosts, routes, strict=True))
        servers = []
        for i, path in enumerate(NODE_FILES):
            node_dir = base / f"node-{i + 1}"
            text = rewrite_node(
                path.read_text(),
                client_port=clients[i],
                monitor_port=monitors[i],
                route_ports=route_ports,
                own_route_port=routes[i],
                store_dir=node_dir / "store",
            )
            # jetstream=False only stops the harness adding -js/-sd flags: the config file
            # itself enables JetStream, which is what is under test.
            servers.append(
                NatsServer(
                    config_text=text,
                    port=clients[i],
                    monitor_port=monitors[i],
                    jetstream=False,
                    base_dir=node_dir,
                    start_timeout=self.timeout,
                )
            )
        return servers

    def formed(self) -> bool:
        """Every node names the same meta leader, the leader sees every other node current
        (else an R3 stream created now finds "no suitable peers"), and all pass /healthz."""
        leaders = set()
        peers_current = 0
        for server in self.servers:
            if not server.healthy():
                return False
            with contextlib.suppress(OSError, NatsServerError, ValueError):
                meta = server.jsz().get("meta_cluster", {})
                leaders.add(meta.get("leader", ""))
                replicas = meta.get("replicas") or []
                peers_current = max(
                    peers_current,
                    sum(1 for r in replicas if r.get("current") and not r.get("offline")),
                )
        formed = len(leaders) == 1 and "" not in leaders
        return formed and peers_current == len(self.servers) - 1

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def logs(self) -> Iterator[tuple[str, str]]:
        for i, server in enumerate(self.servers, 1):
            yield f"nats-{i}", server.log_text()


class Session:
    """A connection as one role, with every asynchronous error the server sent it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Client | None = None

    async def open(self, urls: list[str], user: str, password: str) -> Session:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(
            servers=urls,
            user=user,
            password=password,
            error_cb=on_error,
            max_reconnect_attempts=2,
            connect_timeout=5,
        )
        return self

    @property
    def client(self) -> Client:
        assert self.nc is not None
        return self.nc

    def violations(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e.lower()]

    async def denied(self, subject: str) -> str:
        """Publish to ``subject`` and return the server's permission error about it."""
        await self.client.publish(subject, b"{}")
        await self.client.flush(timeout=5)
        wanted = f'publish to "{subject.lower()}"'

        def seen() -> list[str]:
            return [e for e in self.violations() if wanted in e.lower()]

        found = await wait_for_async(seen, timeout=10, message=f"permission error for {subject}")
        return found[0]

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()
