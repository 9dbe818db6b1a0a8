"""A worker SDK process for fault-injection tests: run it by path (``python -P``), kill it,
pause it, cut it off.

Its handler appends one JSON line per event to ``--runs`` (``start``, ``end``, ``cancelled``),
each written with a single ``write`` on an ``O_APPEND`` descriptor, so a ``kill -9`` can cut a run
short but never a line, and several processes can share one file. A test reads the file to
count how often each tick's handler ran and whether a run was a takeover. SIGTERM stops the
worker gracefully and prints its stats as one JSON line. Failpoints come from
``HRWCRON_FAILPOINTS`` as in the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import sys
import time

import nats

from hrwcron.worker import Trigger, Worker


def _append(fd: int, **event: object) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


async def main(args: argparse.Namespace) -> None:
    options: dict[str, object] = dict(
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        ping_interval=1,
        max_outstanding_pings=2,
        name=args.name,
    )
    if args.no_buffer:
        options["pending_size"] = 0  # refuse writes while disconnected instead of buffering
    nc = await nats.connect(args.url, **options)
    fd = os.open(args.runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rng = random.Random(f"{args.name}-{os.getpid()}")

    async def handle(trigger: Trigger) -> None:
        _append(
            fd,
            event="start",
            tick=trigger.tick,
            worker=args.name,
            pid=os.getpid(),
            takeover=trigger.takeover,
            delivered=trigger.delivered,
            at=time.time(),
        )
        try:
            await asyncio.sleep(rng.uniform(args.work_min, args.work_max))
        except asyncio.CancelledError:
            _append(fd, event="cancelled", tick=trigger.tick, worker=args.name, pid=os.getpid())
            raise
        _append(fd, event="end", tick=trigger.tick, worker=args.name, pid=os.getpid())

    worker = Worker(
        nc,
        handle,
        durable=args.durable,
        subjects=args.subjects,
        concurrency=args.concurrency,
        ack_wait=args.ack_wait,
        heartbeat=args.heartbeat,
        max_deliver=args.max_deliver,
        backoff=[0.2],
        name=args.name,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await worker.start()
    print(f"worker {args.name} ready", flush=True)
    try:
        await stop.wait()
    finally:
        await worker.stop(timeout=args.stop_timeout)
        print(json.dumps({"stats": dataclasses.asdict(worker.stats)}), flush=True)
        os.close(fd)
        await nc.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", required=True, help="file the handler appends its events to")
    parser.add_argument("--name", required=True)
    parser.add_argument("--durable", default="chaos")
    parser.add_argument("--subjects", nargs="+", default=["hrwcron.trigger.>"])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--ack-wait", type=float, default=2.0)
    parser.add_argument("--heartbeat", type=float, default=0.4)
    parser.add_argument("--max-deliver", type=int, default=-1)
    parser.add_argument("--work-min", type=float, default=0.05)
    parser.add_argument("--work-max", type=float, default=0.6)
    parser.add_argument("--stop-timeout", type=float, default=5.0)
    parser.add_argument("--no-buffer", action="store_true")
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        sys.exit(130)
