"""``hrwcron dev``: an embedded nats-server, three replicas as processes, sample jobs, and every
trigger printed as it arrives. Ctrl-C stops all of it and removes the temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import msgspec

from . import hrw
from .app import open_stores
from .config import Config, NatsConfig
from .embedded import EmbeddedServer
from .jobsync import apply_diff, diff_jobs
from .model import Heartbeat, JobSpec, TriggerMessage

SAMPLE_JOBS = [
    JobSpec(name="heartbeat.fast", schedule="@every 1s", payload={"sample": True}),
    JobSpec(name="reports.every-2s", schedule="*/2 * * * * *", payload={"report": "sales"}),
    JobSpec(name="billing.sweep", schedule="*/5 * * * * *", tz="Europe/Berlin", jitter=0.5),
    JobSpec(name="tokyo.batch", schedule="*/3 * * * * *", tz="Asia/Tokyo"),
    JobSpec(name="cleanup.minutely", schedule="* * * * *"),
    JobSpec(name="ny.market-open", schedule="30 9 * * 1-5", tz="America/New_York"),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stamp(epoch_ms: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch_ms / 1000)) + f".{int(epoch_ms) % 1000:03d}"


class DevRun:
    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.server = EmbeddedServer()
        self.children: list[subprocess.Popen[bytes]] = []

    def _spawn_replicas(self) -> None:
        for index in range(self.replicas):
            port = _free_port()
            env = dict(
                os.environ,
                HRWCRON_NATS_URL=self.server.url,
                HRWCRON_NODE_ID=f"scheduler-{index}",
                HRWCRON_HTTP_LISTEN=f"127.0.0.1:{port}",
                HRWCRON_LOG_LEVEL="warning",
            )
            self.children.append(
                subprocess.Popen([sys.executable, "-m", "hrwcron", "run"], env=env)
            )
            print(
                f"replica scheduler-{index}: pid {self.children[-1].pid}, "
                f"http://127.0.0.1:{port}/ (metrics, readyz, status page)"
            )

    async def run(self, stop: asyncio.Event) -> None:
        self.server.start()
        print(f"nats-server with JetStream at {self.server.url} (store {self.server.directory})")
        config = Config(nats=NatsConfig(servers=[self.server.url]))
        stores = await open_stores(config)
        await apply_diff(stores.jobs, await diff_jobs(stores.jobs, SAMPLE_JOBS, prune=False))
        for spec in SAMPLE_JOBS:
            print(f"job {spec.name:<18} {spec.schedule:<16} {spec.tz}")
        self._spawn_replicas()
        print("time (UTC)    job                due (UTC)      late    node   (Ctrl-C stops)")

        async def on_trigger(msg: object) -> None:
            try:
                trigger = msgspec.json.decode(msg.data, type=TriggerMessage)  # type: ignore[attr-defined]
            except msgspec.MsgspecError:
                return
            late = time.time() * 1000 - trigger.due_ms
            print(
                f"{_stamp(time.time() * 1000)}  {trigger.job:<18} {_stamp(trigger.due_ms)}  "
                f"{late:5.0f} ms  {trigger.node}",
                flush=True,
            )

        await stores.client.subscribe(f"{config.scheduler.subject_prefix}.>", cb=on_trigger)
        watcher = asyncio.create_task(self._watch_members(stores.members))
        await stop.wait()
        watcher.cancel()
        with contextlib.suppress(Exception):
            await stores.client.drain()

    async def _watch_members(self, members: object) -> None:
        live: dict[str, Heartbeat] = {}
        while True:
            snapshot = await members.snapshot()  # type: ignore[attr-defined]
            current = {node: record.heartbeat for node, record in snapshot.items()}
            if set(current) != set(live):
                joined, left = set(current) - set(live), set(live) - set(current)
                nodes = sorted(current)
                owned = {node: 0 for node in nodes}
                for spec in SAMPLE_JOBS:
                    if nodes:
                        owned[hrw.rank(spec.name, nodes)[0]] += 1
                change = " ".join(
                    [f"+{n}" for n in sorted(joined)] + [f"-{n}" for n in sorted(left)]
                )
                share = ", ".join(f"{n}: {c} jobs" for n, c in owned.items())
                print(f"members {change}  -> owners {share or 'none'}", flush=True)
            live = current
            await asyncio.sleep(0.5)

    def shutdown(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 6
        for child in self.children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.server.stop()
        print("stopped: replicas, nats-server, temporary directory removed")


def run_dev(replicas: int = 3) -> int:
    dev = DevRun(replicas)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await dev.run(stop)

    try:
        asyncio.run(main())
    finally:
        dev.shutdown()
    return 0
