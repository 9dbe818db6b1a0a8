"""The ``hrwcron`` command line, built from one table of verbs.

Each verb (:class:`~hrwcron.cli.verb.Verb`) declares its arguments and either a local handler or
an admin request with the way its reply is printed; the verb groups only declare them, and
this module builds the parsers from :data:`VERBS` and runs the chosen verb. A new command is a
``Verb`` added to the table.

Handlers report bad input by raising :class:`~hrwcron.core.errors.InvalidInput`; :func:`main`
turns that into messages on stderr and exit code 2. A handler computes everything before it
prints, so a failing command leaves stdout empty.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TypeAlias

from hrwcron import __version__
from hrwcron.cli.apply import APPLY
from hrwcron.cli.cluster import BACKFILL, HISTORY, STATUS, TRIGGER
from hrwcron.cli.importing import IMPORT
from hrwcron.cli.jobs import JOBS
from hrwcron.cli.output import format_instant
from hrwcron.cli.provision import PROVISION
from hrwcron.cli.request import ask
from hrwcron.cli.run import DEV, RUN
from hrwcron.cli.schedule import CHECK_CONFIG, HASH_PASSWORD, NEXT, OWNER
from hrwcron.cli.verb import Handler, Verb, add_args
from hrwcron.core.config import ConfigFileError
from hrwcron.core.errors import InvalidInput

__all__ = ["VERBS", "build_parser", "format_instant", "main"]

_Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXIT_USAGE = 2
_RAW = argparse.RawDescriptionHelpFormatter

VERBS: tuple[Verb, ...] = (
    NEXT,
    OWNER,
    CHECK_CONFIG,
    RUN,
    DEV,
    JOBS,
    TRIGGER,
    BACKFILL,
    STATUS,
    HISTORY,
    APPLY,
    IMPORT,
    PROVISION,
    HASH_PASSWORD,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hrwcron",
        description=(
            "Highly available cron for NATS: every replica knows every schedule, rendezvous "
            "hashing picks the replica that fires each tick, JetStream makes it exactly-once."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hrwcron {__version__}")
    _add_verbs(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), VERBS)
    return parser


def _add_verbs(sub: _Subparsers, verbs: Sequence[Verb]) -> None:
    for verb in verbs:
        parser = sub.add_parser(
            verb.name,
            help=verb.help,
            description=verb.description,
            epilog=verb.epilog,
            formatter_class=_RAW if verb.raw else argparse.HelpFormatter,
        )
        add_args(parser, verb.args)
        if verb.verbs:
            _add_verbs(
                parser.add_subparsers(dest="verb", metavar="VERB", required=True), verb.verbs
            )
        else:
            parser.set_defaults(handler=_handler(verb), **verb.defaults)


def _handler(verb: Verb) -> Handler:
    if verb.run is not None:
        return verb.run
    request, show = verb.request, verb.show
    if request is None or show is None:
        raise TypeError(f"verb {verb.name!r} needs run, or request and show")
    return lambda args: ask(args, request, show)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors end inside argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler = args.handler
    try:
        return handler(args)
    except ConfigFileError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
    except InvalidInput as exc:
        for problem in exc.problems:
            print(f"{parser.prog} {args.command}: error: {problem}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at /dev/null so the interpreter's final
        # flush does not fail again and print a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return EXIT_USAGE
