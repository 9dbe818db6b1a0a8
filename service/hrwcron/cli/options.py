"""Argument types and the arguments many verbs share (``--json``, ``--quiet``, connection).

An argument type turns the text of one argument into its value or raises
``argparse.ArgumentTypeError`` with the message argparse prints after the flag's name.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

from hrwcron.cli.verb import Group, arg
from hrwcron.core.config import ENV_CONFIG_PATH
from hrwcron.core.model import job_name_problem
from hrwcron.core.ticks import format_ms, parse_instant

T = TypeVar("T", int, float)

MAX_COUNT = 10_000


def checked(parse: Callable[[str], T], ok: Callable[[T], bool], message: str) -> Callable[[str], T]:
    """An argument type: ``parse`` the text and accept it when ``ok``; ``message`` may name
    the text as ``{text!r}``."""

    def check(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(message.format(text=text)) from None
        if not ok(value):
            raise argparse.ArgumentTypeError(message.format(text=text))
        return value

    return check


count = checked(int, lambda n: 1 <= n <= MAX_COUNT, f"must be a whole number from 1 to {MAX_COUNT}")
history_count = checked(int, lambda n: 1 <= n <= 1000, "must be a whole number from 1 to 1000")
status_limit = checked(int, lambda n: n >= 1, "must be a whole number of at least 1")
revision = checked(int, lambda n: n >= 0, "must be a whole number >= 0 (0: create only)")
seconds = checked(float, lambda s: 0 < s <= 3600, "must be a number of seconds from 0 to 3600")
timeout = checked(
    float, lambda s: s > 0 and math.isfinite(s), "{text!r} is not a number of seconds above 0"
)


def instant(text: str) -> int:
    """An ISO-8601 instant with ``Z`` or a UTC offset, as epoch milliseconds."""
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def iso(text: str) -> str:
    """An ISO-8601 instant, written the way the admin API takes it."""
    return format_ms(instant(text))


def job_name(text: str) -> str:
    problem = job_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


JOB = arg("name", metavar="JOB", type=job_name)
PREFIX = arg("--prefix", default="", help="only jobs whose name starts with this")
JSON = arg("--json", action="store_true", help="print the API reply as JSON")
QUIET = arg(
    "-q",
    "--quiet",
    action="store_true",
    help="no progress bar (shown on stderr when it is a terminal and the command takes "
    "more than a second)",
)
CONFIG = arg("--config", metavar="FILE", help="TOML configuration file")

CONNECTION = Group(
    title="connection",
    args=(
        arg(
            "--config",
            metavar="FILE",
            default_env=ENV_CONFIG_PATH,
            help=f"TOML configuration file for the NATS connection (default: ${ENV_CONFIG_PATH})",
        ),
        arg(
            "--nats-url",
            metavar="URL",
            help="NATS server URL(s), comma-separated (default: HRWCRON_NATS_URL, the config "
            "file, or nats://127.0.0.1:4222)",
        ),
        arg(
            "--timeout",
            type=seconds,
            default=5.0,
            metavar="SECONDS",
            help="how long to wait for a replica's answer (default: 5)",
        ),
    ),
)
