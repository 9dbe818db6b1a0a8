"""One benchmark replica: hrwcron's own ``start_replica`` in a process of its own, plus the probes
the benchmark reads from its stdout.

This is ``hrwcron run`` (``app.serve``: the same composition, metrics and HTTP endpoint) plus two
probes: the observer also reports readiness, membership changes and owned-job recounts as
``BENCH {json}`` lines, and an event-loop lag probe, switched on and off with SIGUSR1, measures
the longest stall inside the process without changing the engine. Configuration comes from
``HRWCRON_*`` variables exactly as for ``hrwcron run``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from hrwcron.core.config import Config, load_config
from hrwcron.core.errors import HrwcronError
from hrwcron.engine.clock import Clock
from hrwcron.engine.ports import NullObserver
from hrwcron.process.app import node_id, start_replica
from hrwcron.process.logs import setup_logging

PREFIX = "BENCH "
# The probe sleeps this long and records how much later than asked it woke up. A stall of S ms
# shows up as at least S - PROBE_INTERVAL ms, so it stays short; 100 wake-ups a second cost well
# under 1% of a core, and the probe is off while idle CPU is measured.
PROBE_INTERVAL = 0.010


def emit(kind: str, **fields: Any) -> None:
    sys.stdout.write(PREFIX + json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def make_observer(config: Config, env: Mapping[str, str]) -> Any:
    """The observer ``hrwcron run`` would use (metrics, traces, the HTTP endpoint), extended to
    report the events the benchmark times. Falls back to a bare observer where telemetry is not
    available, and says so in the ``boot`` event."""
    try:
        from hrwcron.adapters.telemetry import Telemetry
    except ImportError:
        Telemetry = None

    base: Any = Telemetry if Telemetry is not None else NullObserver

    class BenchObserver(base):  # type: ignore[misc, valid-type]
        changed_at: float | None = None

        def membership(self, live: list[str], changed_owners: int) -> None:
            super().membership(live, changed_owners)
            if self.changed_at is None:
                self.changed_at = time.perf_counter()
            emit("membership", live=live)

        def owned(self, count: int) -> None:
            super().owned(count)
            took = None
            if self.changed_at is not None:
                took = (time.perf_counter() - self.changed_at) * 1000
                self.changed_at = None
            emit("owned", count=count, since_membership_ms=took)

        def readiness(self, ready: bool, reason: str) -> None:
            super().readiness(ready, reason)
            emit("readiness", ready=ready, reason=reason)

    if Telemetry is None:
        return BenchObserver()
    # start_replica builds the scheduler's clock itself; on one machine the server offset is
    # ~0, so a plain clock for the metrics' lateness changes nothing measured here.
    return BenchObserver.from_config(config, node=node_id(config), env=env, now_ms=Clock().now_ms)


class LagProbe:
    """How much later than asked a short sleep wakes up. A late wake-up is either this process
    computing (the loop is blocked) or the OS not running it (a busy machine); the CPU time the
    thread used meanwhile tells the two apart, so both are reported."""

    def __init__(self) -> None:
        self.on = False
        self.window = (0.0, 0.0)
        self.total_max = 0.0

    def toggle(self) -> None:
        self.on = not self.on
        self.window = (0.0, 0.0)
        emit("probe", on=self.on)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_report = loop.time()
        while True:
            if not self.on:
                await asyncio.sleep(0.2)
                last_report = loop.time()
                continue
            asked, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(PROBE_INTERVAL)
            now = loop.time()
            lag = (now - asked - PROBE_INTERVAL) * 1000
            # Blocked by our own work: the part of the lag the thread spent on the CPU.
            busy = min(lag, (time.thread_time() - cpu) * 1000)
            self.window = (max(self.window[0], lag), max(self.window[1], busy))
            self.total_max = max(self.total_max, lag)
            if now - last_report >= 1.0:
                emit("lag", max_ms=round(self.window[0], 2), busy_ms=round(self.window[1], 2))
                self.window = (0.0, 0.0)
                last_report = now


async def main() -> int:
    config = load_config(None, os.environ)
    setup_logging(config.telemetry.log_level, config.telemetry.log_format, node_id(config))
    observer = make_observer(config, os.environ)
    emit("boot", pid=os.getpid(), observer=type(observer).__mro__[1].__name__)
    probe = LagProbe()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, probe.toggle)
    if os.environ.get("BENCH_PROBE") == "1":
        probe.toggle()
    probe_task = asyncio.create_task(probe.run())
    try:
        replica = await start_replica(config, os.environ, observer)
    except HrwcronError as exc:
        emit("error", message=str(exc))
        return 1
    emit("started", node=replica.scheduler.node, jobs=len(replica.scheduler.jobs))
    fatal = asyncio.create_task(replica.scheduler.failed.wait())
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({fatal, waiter}, return_when=asyncio.FIRST_COMPLETED)
    fatal.cancel()
    waiter.cancel()
    began = time.perf_counter()
    await replica.stop()
    probe_task.cancel()
    emit("stopped", took_ms=(time.perf_counter() - began) * 1000, max_lag_ms=probe.total_max)
    return 1 if replica.scheduler.fatal else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
