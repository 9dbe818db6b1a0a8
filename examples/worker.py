"""An example worker: prints every trigger of the `make run` playground, once per tick.

    make run                                   # prints "nats-server with JetStream at nats://..."
    HRWCRON_NATS_URL=nats://127.0.0.1:PORT .venv/bin/python examples/worker.py

Options: ``--subjects 'hrwcron.trigger.reports.>'`` to take a subset, ``--durable NAME`` to run
a second, independent group of workers, ``--fail-every N`` to make every N-th run fail and see
the retry with backoff. Start the script twice with the same --durable: the two share the work
and each tick still runs once. Ctrl-C stops it after the running handlers finish.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time

import nats

from hrwcron.worker import Trigger, Worker


async def main(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats_url)
    runs = 0

    async def handle(trigger: Trigger) -> None:
        nonlocal runs
        runs += 1
        late = time.time() * 1000 - trigger.message.due_ms
        print(
            f"{trigger.job:<18} {trigger.tick:<32} kind={trigger.message.kind:<9} "
            f"from={trigger.message.node:<12} late={late:6.0f} ms delivery={trigger.delivered}",
            flush=True,
        )
        if args.fail_every and runs % args.fail_every == 0:
            raise RuntimeError("failing on purpose to show the retry")

    worker = Worker(nc, handle, durable=args.durable, subjects=args.subjects)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {worker.name}: consumer {args.durable} on {', '.join(worker.subjects)}")
    try:
        await worker.run(stop)
    finally:
        s = worker.stats
        print(f"handled {s.handled}, failed {s.failed}, redelivered duplicates {s.duplicates}")
        await nc.drain()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nats-url", default=os.environ.get("HRWCRON_NATS_URL", "nats://127.0.0.1:4222")
    )
    parser.add_argument("--durable", default="example-worker")
    parser.add_argument("--subjects", nargs="+", default=["hrwcron.trigger.>"])
    parser.add_argument("--fail-every", type=int, default=0)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(parser.parse_args()))
