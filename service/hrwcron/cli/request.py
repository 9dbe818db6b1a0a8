"""Sending a verb's request to whichever replica answers ``hrwcron.admin.<verb>``.

A command needs nothing but a NATS connection (``--config FILE``, ``--nats-url URL`` or
``HRWCRON_NATS_URL``). Exit codes: 0 done, 2 the request was refused (bad input, unknown job,
stale revision: raised as InvalidInput), 1 the cluster could not serve it (no replica,
timeout, server error). Long requests show a progress bar on stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from hrwcron.cli.output import emit, print_json
from hrwcron.cli.progress import Progress
from hrwcron.cli.verb import Request, Show
from hrwcron.core.config import Config, load_config, redact_url
from hrwcron.core.errors import HrwcronError, InvalidInput, NatsSetupError, Problem

if TYPE_CHECKING:
    from hrwcron.admin.client import AdminClient

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_REFUSED = 2


def connection_config(args: argparse.Namespace, fallback: str | None = None) -> Config:
    """The configuration whose ``nats`` section says how to connect: ``--config`` (or
    ``fallback``), environment variables, then ``--nats-url`` over everything."""
    env = dict(os.environ)
    if getattr(args, "nats_url", None):
        env["HRWCRON_NATS_URL"] = args.nats_url
        env.pop("HRWCRON_NATS_SERVERS", None)
    return load_config(args.config or fallback, env)


def ask(args: argparse.Namespace, request: Request, show: Show) -> int:
    """Send ``request`` and print its reply: as JSON with ``--json``, else ``show``'s lines."""

    async def work(admin: AdminClient) -> int:
        reply = await request(args, admin)
        if args.json:
            print_json(reply)
        else:
            emit(show(args, reply))
        return EXIT_OK

    return run_admin(args, work)


def run_admin(
    args: argparse.Namespace,
    work: Callable[[AdminClient], Awaitable[int]],
    *,
    config: Config | None = None,
) -> int:
    """Connect, run ``work`` with an admin client, and turn errors into exit codes: a refused
    request raises InvalidInput (exit 2 in ``cli.main``), anything else prints and exits 1."""
    from hrwcron.adapters.jetstream.connect import connect
    from hrwcron.admin.api import CALLER_ERRORS
    from hrwcron.admin.client import AdminClient, AdminError

    config = config or connection_config(args)

    async def main() -> int:
        # The shared connect retries forever (right for a replica); a command gives up.
        try:
            client = await asyncio.wait_for(
                connect(config.nats, name_suffix="-cli"), timeout=args.timeout
            )
        except TimeoutError:
            servers = ", ".join(redact_url(s) for s in config.nats.servers)
            raise NatsSetupError(
                f"cannot connect to NATS at {servers} within {args.timeout:g} s"
            ) from None
        try:
            return await work(AdminClient(client, timeout=args.timeout))
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except AdminError as exc:
        if exc.code in CALLER_ERRORS:
            problems = [Problem(f, m) for f, m in exc.problems] or [Problem("", exc.message)]
            raise InvalidInput(problems) from None
        _fail(args, exc.message)
    except InvalidInput:
        raise
    except HrwcronError as exc:
        _fail(args, str(exc))
    return EXIT_SERVER


def _fail(args: argparse.Namespace, message: str) -> None:
    print(f"hrwcron {args.command}: error: {message}", file=sys.stderr)


def progress(args: argparse.Namespace, label: str, total: int | None = None) -> Progress:
    enabled = False if getattr(args, "quiet", False) else None
    width = shutil.get_terminal_size().columns
    return Progress(label, total, stream=sys.stderr, enabled=enabled, width=width)


def counting(bar: Progress) -> Callable[[int, int], None]:
    def update(done: int, total: int) -> None:
        bar.set_total(total)
        bar.update(done)

    return update
