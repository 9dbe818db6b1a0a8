"""Shared pieces of the benchmarks: servers, replica processes, job loading, reading a stream with
the server's timestamps, and the statistics every section reports.

Every clock in a benchmark is this machine's: the servers, the replicas and the benchmark run on
loopback, so a JetStream message timestamp and ``time.time()`` in the benchmark are the same
clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from hrwcron.core.config import Config, load_config
from hrwcron.core.model import JobSpec
from hrwcron.process.app import Stores, open_stores

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def harness() -> Any:
    """The test suite's server and process fixtures (``tests/harness``), reused as they are."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import harness as found

    return found


# ----------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks; NaN for
    no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100, not {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Summary:
    count: int
    p50: float
    p99: float
    max: float
    min: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        return cls(
            count=len(values),
            p50=percentile(values, 50),
            p99=percentile(values, 99),
            max=max(values) if values else math.nan,
            min=min(values) if values else math.nan,
        )


def ratio(value: float, floor: float) -> float:
    """``value / floor``; NaN when the floor is not a positive number."""
    if not floor > 0 or math.isnan(value):
        return math.nan
    return value / floor


def fmt(value: float, digits: int = 1) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


# ------------------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    load = "unknown"
    with contextlib.suppress(OSError):
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {
        "cpu": model,
        # What nproc prints: the CPUs this process may run on.
        "cores": str(len(os.sched_getaffinity(0))),
        "memory": memory,
        "load": load,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def nats_server_version() -> str:
    import subprocess

    binary = harness().nats_server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or out.stderr.strip()


# ------------------------------------------------------------------------------ processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def fleet_cpu(replicas: Iterable[Replica]) -> float:
    """CPU seconds used so far by every running replica, summed."""
    total = 0.0
    for replica in replicas:
        if replica.running:
            with contextlib.suppress(OSError, ValueError):
                total += cpu_seconds(replica.pid)
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it is truthy; raise naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


_COUNTER = re.compile(
    r"^hrwcron_(ticks|claim_contention|claim_ops)_total\{([^}]*)\} ([0-9.e+-]+)$", re.MULTILINE
)
_LABEL = re.compile(r'(?:outcome|reason|op)="([^"]*)"')


@dataclass
class Event:
    kind: str
    t: float
    data: dict[str, Any]


class Replica:
    """A ``python -m bench.replica`` process and the BENCH events it printed."""

    def __init__(self, node: str, env: dict[str, str], log_dir: Path) -> None:
        self.node = node
        self.env = env
        self.log_path = log_dir / f"{node}.log"
        self.proc: Any = None
        self.spawned_at = 0.0
        self._offset = 0
        self._buffer = ""
        self.events: list[Event] = []

    def start(self) -> Replica:
        h = harness()
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._buffer = ""
        self.events = []
        self.spawned_at = time.time()
        if self.proc is None:
            self.proc = h.ReplicaProcess(
                [], env=self.env, log_path=self.log_path, module="bench.replica", cwd=ROOT
            )
        else:
            self.proc.start()
        return self

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def running(self) -> bool:
        return self.proc is not None and bool(self.proc.running)

    def poll(self) -> list[Event]:
        """Read new BENCH lines from the log; returns every event of this incarnation."""
        with contextlib.suppress(FileNotFoundError), open(self.log_path, "rb") as log:
            log.seek(self._offset)
            chunk = log.read().decode("utf-8", errors="replace")
            self._offset += len(chunk.encode("utf-8"))
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            if line.startswith("BENCH "):
                data = json.loads(line[6:])
                self.events.append(Event(data.pop("kind"), data.pop("t"), data))
        return self.events

    def last(self, kind: str) -> Event | None:
        found = [e for e in self.poll() if e.kind == kind]
        return found[-1] if found else None

    def ready(self) -> bool:
        event = self.last("readiness")
        return event is not None and bool(event.data["ready"])

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        self.proc.kill()

    def terminate(self, timeout: float = 15.0) -> float:
        return float(self.proc.terminate(timeout).elapsed)

    def metrics(self) -> dict[str, float]:
        """The replica's Prometheus counters of tick outcomes and claim contention, summed
        over jobs: ``{"ticks:started": 12.0, "contention:lock_busy": 3.0, ...}``."""
        url = f"http://{self.env['HRWCRON_HTTP_LISTEN']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        found: dict[str, float] = {}
        for match in _COUNTER.finditer(text):
            name, labels, value = match.groups()
            label = _LABEL.search(labels)
            if label is None:
                continue
            key = f"{name}:{label.group(1)}"
            found[key] = found.get(key, 0.0) + float(value)
        return found

    def toggle_probe(self) -> None:
        import signal

        os.kill(self.pid, signal.SIGUSR1)


@dataclass
class Fleet:
    """Replica processes against one NATS deployment; stopped together."""

    nats_url: str
    log_dir: Path
    replicas_setting: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    members: list[Replica] = field(default_factory=list)

    def env(self, node: str) -> dict[str, str]:
        env = {
            "HRWCRON_NATS_URL": self.nats_url,
            "HRWCRON_NODE_ID": node,
            # Served as in production (metrics, probes), on a port nobody else has.
            "HRWCRON_HTTP_LISTEN": f"127.0.0.1:{harness().free_ports(1)[0]}",
            "HRWCRON_SCHEDULER_REPLICAS": str(self.replicas_setting),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        env.update(self.extra_env)
        return env

    def add(self, node: str) -> Replica:
        replica = Replica(node, self.env(node), self.log_dir)
        self.members.append(replica)
        return replica

    def start(self, count: int, prefix: str = "scheduler") -> list[Replica]:
        started = [self.add(f"{prefix}-{i}").start() for i in range(count)]
        return started

    async def wait_ready(self, replicas: Iterable[Replica] | None = None, timeout=60.0) -> None:
        chosen = list(self.members if replicas is None else replicas)

        def check() -> bool:
            for r in chosen:
                if not r.running:
                    raise RuntimeError(f"replica {r.node} exited:\n{r.tail()}")
            return all(r.ready() for r in chosen)

        await until(check, timeout, f"replicas {[r.node for r in chosen]} to be ready")

    async def wait_members(self, live: Sequence[str], timeout: float = 30.0) -> None:
        """Until every running replica's last membership report is exactly ``live``."""
        wanted = sorted(live)

        def check() -> bool:
            for r in self.members:
                if not r.running:
                    continue
                event = r.last("membership")
                if event is None or sorted(event.data["live"]) != wanted:
                    return False
            return True

        await until(check, timeout, f"every replica to see members {wanted}")

    def stop(self) -> None:
        for r in self.members:
            if r.running:
                with contextlib.suppress(Exception):
                    r.terminate(10.0)


SYNCS = ("default", "always")


class Deployment:
    """A single nats-server or a 3-node cluster from the test harness, in a temp directory.

    ``sync`` is the servers' JetStream ``sync_interval``: ``default`` (nats-server's own, a
    flush every two minutes) or ``always`` (flush before every acknowledgement, as shipped)."""

    def __init__(self, kind: str, sync: str = "default") -> None:
        if kind not in ("single", "R3"):
            raise ValueError(f"deployment is 'single' or 'R3', not {kind!r}")
        if sync not in SYNCS:
            raise ValueError(f"sync is one of {', '.join(SYNCS)}, not {sync!r}")
        self.kind = kind
        self.sync = sync
        self.base = Path(tempfile.mkdtemp(prefix=f"hrwcron-bench-{kind}-{sync}-"))
        self.server: Any = None

    @property
    def replicas(self) -> int:
        return 3 if self.kind == "R3" else 1

    async def start(self) -> Deployment:
        h = harness()
        conf = None
        if self.sync == "always":
            conf = "jetstream {\n  sync_interval: always\n}\n"
        if self.kind == "single":
            self.server = h.NatsServer(name="bench", base_dir=self.base / "nats", config_text=conf)
        else:
            self.server = h.NatsCluster(
                3, cluster_name="hrwcron-bench", base_dir=self.base / "c", config_text=conf
            )
        await asyncio.to_thread(self.server.start)
        return self

    @property
    def url(self) -> str:
        return str(self.server.url)

    def config(self, **scheduler: str) -> Config:
        env = {"HRWCRON_NATS_URL": self.url, "HRWCRON_SCHEDULER_REPLICAS": str(self.replicas)}
        env.update({f"HRWCRON_SCHEDULER_{k.upper()}": v for k, v in scheduler.items()})
        return load_config(None, env)

    def fleet(self, name: str, **extra_env: str) -> Fleet:
        log_dir = self.base / "logs" / name
        log_dir.mkdir(parents=True, exist_ok=True)
        return Fleet(self.url, log_dir, self.replicas, dict(extra_env))

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.cleanup)
        shutil.rmtree(self.base, ignore_errors=True)


async def connect(url: str) -> Client:
    return await nats.connect(servers=url.split(","), max_reconnect_attempts=-1)


# ------------------------------------------------------------------------------------ jobs


async def gather_limited(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    slots = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with slots:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


async def put_jobs(stores: Stores, specs: Sequence[JobSpec], limit: int = 256) -> float:
    """Write every spec (unconditionally); returns the seconds it took."""
    began = time.perf_counter()
    await gather_limited((stores.jobs.put(spec, None) for spec in specs), limit)
    return time.perf_counter() - began


async def delete_jobs(stores: Stores, names: Sequence[str], limit: int = 256) -> None:
    await gather_limited((stores.jobs.delete(name, None) for name in names), limit)


async def stores_for(config: Config) -> Stores:
    return await open_stores(config)


# --------------------------------------------------------------------------- stream reading


@dataclass(frozen=True)
class Stored:
    subject: str
    seq: int
    stored_ms: float  # the stream leader's timestamp of the message, epoch ms
    headers: dict[str, str]
    data: bytes


def _stored_ns(reply: str) -> int:
    tokens = reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending> (9 tokens), or the
    # v2 form with domain and account hash in front (12 tokens).
    return int(tokens[7] if len(tokens) == 9 else tokens[Msg.Ack.Timestamp])


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    start_seq: int = 1,
    headers_only: bool = True,
    timeout: float = 120.0,
) -> list[Stored]:
    """Every message of ``stream`` on ``subject`` from ``start_seq`` up to the stream's last
    message at the time of the call, with the server's timestamp of each."""
    info = await js.stream_info(stream)
    last = int(info.state.last_seq or 0)
    if last < start_seq:
        return []
    out: list[Stored] = []
    done = asyncio.Event()

    async def deliver(msg: Msg) -> None:
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        if seq <= last:
            out.append(
                Stored(
                    msg.subject,
                    seq,
                    _stored_ns(msg.reply) / 1e6,
                    dict(msg.headers or {}),
                    b"" if headers_only else msg.data,
                )
            )
        if seq >= last or meta.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        subject,
        stream=stream,
        cb=deliver,
        ordered_consumer=True,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            headers_only=headers_only,
        ),
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    try:
        # A filter that matches nothing after start_seq delivers nothing at all.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=2.0)
        if not done.is_set():
            pending = (await sub.consumer_info()).num_pending
            if pending:
                await asyncio.wait_for(done.wait(), timeout=timeout)
    finally:
        await sub.unsubscribe()
    return out


async def last_seq(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq or 0)


def now_ms() -> float:
    return time.time() * 1000


async def sleep_until(epoch_ms: float) -> None:
    delay = (epoch_ms - now_ms()) / 1000
    if delay > 0:
        await asyncio.sleep(delay)
