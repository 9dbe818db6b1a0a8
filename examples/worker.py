"""An example worker: prints every trigger of an hrwcron deployment, once per tick.

    make run                                   # prints "nats-server with JetStream at nats://..."
    HRWCRON_NATS_URL=nats://127.0.0.1:PORT .venv/bin/python examples/worker.py

It connects the way the hrwcron CLI does: the [nats] section of ``--config FILE`` (default
$HRWCRON_CONFIG) with servers, user and password, token, creds file, NKEY seed file and TLS
files, overlaid with HRWCRON_NATS_* variables (HRWCRON_NATS_URL, HRWCRON_NATS_USER,
HRWCRON_NATS_PASSWORD, HRWCRON_NATS_TOKEN, HRWCRON_NATS_CREDS, HRWCRON_NATS_NKEY_SEED,
HRWCRON_NATS_TLS_CA, HRWCRON_NATS_TLS_CERT, HRWCRON_NATS_TLS_KEY), then ``--nats-url`` over
both. The trigger stream and subject prefix come from the same file's [scheduler] section.

Options: ``--subjects 'hrwcron.trigger.reports.>'`` to take a subset, ``--durable NAME`` to run
a second, independent group of workers, ``--api-prefix '$JS.hrwcron.API'`` as the ``worker``
user of nats/accounts.conf (whose group's consumer ``hrwcron provision --worker-group NAME``
creates), ``--fail-every N`` to make every N-th run fail and see
the retry with backoff. Start the script twice with the same --durable: the two share the work
and each tick still runs once. Ctrl-C stops it after the running handlers finish.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from hrwcron.cli.request import connection_config
from hrwcron.core.config import ENV_CONFIG_PATH, Config, ConfigFileError
from hrwcron.core.errors import HrwcronError
from hrwcron.adapters.jetstream.connect import connect
from hrwcron.worker import Trigger, Worker


async def main(args: argparse.Namespace, config: Config) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Like a replica, keep trying until NATS answers (it may start after the worker), but let
    # Ctrl-C end the waiting.
    connecting = asyncio.ensure_future(connect(config.nats, name_suffix="-example-worker"))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        return
    nc = connecting.result()
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

    subjects = args.subjects or [f"{config.scheduler.subject_prefix}.>"]
    worker = Worker(
        nc,
        handle,
        durable=args.durable,
        subjects=subjects,
        stream=config.scheduler.stream,
        api_prefix=args.api_prefix,
    )
    print(f"worker {worker.name}: consumer {args.durable} on {', '.join(worker.subjects)}")
    try:
        await worker.run(stop)
    finally:
        s = worker.stats
        print(f"handled {s.handled}, failed {s.failed}, redelivered duplicates {s.duplicates}")
        await nc.drain()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog=(__doc__ or "").split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_PATH),
        help=f"hrwcron TOML configuration to connect with (default: ${ENV_CONFIG_PATH})",
    )
    parser.add_argument(
        "--nats-url",
        metavar="URL",
        help="NATS server URL(s), comma-separated, over the file and HRWCRON_NATS_URL",
    )
    parser.add_argument("--durable", default="example-worker", help="consumer (worker group)")
    parser.add_argument(
        "--subjects", nargs="+", help="trigger subjects to take (default: every job's)"
    )
    parser.add_argument(
        "--api-prefix",
        metavar="PREFIX",
        help="where the trigger stream's JetStream API answers: $JS.API (default) in the "
        "scheduler's account, $JS.hrwcron.API as the worker user of nats/accounts.conf",
    )
    parser.add_argument(
        "--fail-every", type=int, default=0, metavar="N", help="fail every N-th run on purpose"
    )
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    try:
        settings = connection_config(arguments)
    except ConfigFileError as exc:
        sys.exit("\n".join(exc.lines()))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(main(arguments, settings))
    except HrwcronError as exc:
        sys.exit(f"worker: {exc}")
