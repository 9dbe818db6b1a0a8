"""``hrwcron dev``: an embedded nats-server, three replicas as processes, sample jobs, and every
trigger printed as it arrives. Ctrl-C at any moment, start-up included, stops all of it and
removes the temporary directory; a second Ctrl-C kills everything at once."""

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
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from hrwcron.core import hrw
from hrwcron.core.config import Config, NatsConfig
from hrwcron.core.errors import HrwcronError
from hrwcron.core.model import Heartbeat, JobSpec, TriggerMessage
from hrwcron.engine.jobsync import apply_diff, diff_jobs
from hrwcron.process.app import open_stores
from hrwcron.process.children import die_with_parent
from hrwcron.process.embedded import EmbeddedServer

# A replica stops within a second or two; one that does not (stuck, paused) is killed.
REPLICA_STOP_TIMEOUT = 5.0
EXIT_INTERRUPTED = 130

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
    """The playground's processes. Replicas run in sessions of their own, so a Ctrl-C reaches
    only this process, which stops them before the server; all of them die with it."""

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
                subprocess.Popen(
                    [sys.executable, "-m", "hrwcron", "run"],
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            )
            print(
                f"replica scheduler-{index}: pid {self.children[-1].pid}, "
                f"http://127.0.0.1:{port}/ (metrics, readyz, console)",
                flush=True,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Start everything, then print triggers until ``stop``. Cancelling it at any await,
        start-up included, leaves what was started to :meth:`shutdown`."""
        await self.server.start()
        print(
            f"nats-server with JetStream at {self.server.url} (store {self.server.directory})",
            flush=True,
        )
        config = Config(nats=NatsConfig(servers=[self.server.url]))
        stores = await open_stores(config)
        watcher: asyncio.Task[None] | None = None
        try:
            await apply_diff(stores.jobs, await diff_jobs(stores.jobs, SAMPLE_JOBS, prune=False))
            for spec in SAMPLE_JOBS:
                print(f"job {spec.name:<18} {spec.schedule:<16} {spec.tz}")
            self._spawn_replicas()
            print(
                "time (UTC)    job                due (UTC)      late    node   (Ctrl-C stops)",
                flush=True,
            )

            async def on_trigger(msg: Msg) -> None:
                try:
                    trigger = msgspec.json.decode(msg.data, type=TriggerMessage)
                except msgspec.MsgspecError:
                    return
                stamp = msg.metadata.timestamp
                stored = stamp.timestamp() * 1000 if stamp else time.time() * 1000
                print(
                    f"{_stamp(stored)}  {trigger.job:<18} {_stamp(trigger.due_ms)}  "
                    f"{stored - trigger.due_ms:5.0f} ms  {trigger.node}",
                    flush=True,
                )

            # What the stream stored, as a worker gets it: a publish the stream refused (a
            # repeat while replicas start together and do not know each other yet) is not a
            # trigger, though a plain subscription on the subjects would print it too.
            await stores.client.jetstream().subscribe(
                f"{config.scheduler.subject_prefix}.>",
                stream=config.scheduler.stream,
                cb=on_trigger,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
            watcher = asyncio.create_task(self._watch_members(stores.members))
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stores.client.close(), timeout=1.0)

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

    async def shutdown(self, timeout: float = REPLICA_STOP_TIMEOUT) -> None:
        """Replicas first (SIGTERM: they leave the membership), then the server. Waits in a
        thread, so the event loop still hears a second Ctrl-C and can :meth:`kill`."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self._wait_replicas, time.monotonic() + timeout)
        self._kill_replicas(wait=True)
        await self.server.stop()
        print("stopped: replicas, nats-server, temporary directory removed", flush=True)

    def kill(self, *, wait: bool = True) -> None:
        """Everything at once (SIGKILL) and the temporary directory removed."""
        self._kill_replicas(wait=wait)
        self.server.kill(wait=wait)

    def _wait_replicas(self, deadline: float) -> None:
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(max(0.0, deadline - time.monotonic()))

    def _kill_replicas(self, *, wait: bool) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            if wait:
                child.wait()


def run_dev(replicas: int = 3) -> int:
    dev = DevRun(replicas)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                dev.kill(wait=False)
                print("stopped at once: replicas and nats-server killed", flush=True)
                os._exit(EXIT_INTERRUPTED)
            stop.set()
            print("stopping (Ctrl-C again to stop at once)", flush=True)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        playground = asyncio.create_task(dev.run(stop))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({playground, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        # A stop during start-up cancels the start-up where it is instead of finishing it.
        playground.cancel()
        try:
            await playground
        except asyncio.CancelledError:
            pass
        finally:
            await dev.shutdown()

    try:
        asyncio.run(main())
    except HrwcronError as exc:
        print(f"hrwcron dev: error: {exc}", file=sys.stderr)
        return 1
    finally:
        dev.kill()  # a no-op after a clean shutdown; anything left after an error
    return 0
