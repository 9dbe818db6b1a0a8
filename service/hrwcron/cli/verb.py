"""The shape of one CLI verb: its arguments, and either a local handler or an admin request
with the way its reply is printed.

Verb groups only declare :class:`Verb` values; :mod:`hrwcron.cli` builds the argparse parsers
from them and runs the chosen one, so no verb module imports another.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from hrwcron.admin.client import AdminClient

Handler: TypeAlias = Callable[[argparse.Namespace], int]
# The admin call of a verb, and the text lines its reply prints as (--json prints the reply).
Request: TypeAlias = "Callable[[argparse.Namespace, AdminClient], Awaitable[Any]]"
Show: TypeAlias = Callable[[argparse.Namespace, Any], Sequence[str]]


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call; ``default_env`` reads its default when the parser is built."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]
    default_env: str | None = None


def arg(*flags: str, default_env: str | None = None, **options: Any) -> Arg:
    return Arg(flags, options, default_env)


@dataclass(frozen=True)
class Group:
    """Arguments shown under a heading (``title``), or of which at most one may be given."""

    args: Sequence[Arg]
    title: str | None = None
    exclusive: bool = False


@dataclass(frozen=True)
class Verb:
    """A command: ``run`` handles it locally, or ``request`` asks a replica and ``show`` prints
    the reply; ``verbs`` are its subcommands instead."""

    name: str
    help: str
    description: str | None = None
    epilog: str | None = None
    args: Sequence[Arg | Group] = ()
    run: Handler | None = None
    request: Request | None = None
    show: Show | None = None
    verbs: Sequence[Verb] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # Keep the line breaks of description and epilog (the examples) as written.
    raw: bool = True


def add_args(parser: argparse.ArgumentParser, args: Sequence[Arg | Group]) -> None:
    for item in args:
        if isinstance(item, Arg):
            _add(parser, item)
        elif item.exclusive:
            exclusive = parser.add_mutually_exclusive_group()
            for one in item.args:
                _add(exclusive, one)
        else:
            group = parser.add_argument_group(item.title)
            for one in item.args:
                _add(group, one)


def _add(target: argparse._ActionsContainer, item: Arg) -> None:
    options = dict(item.options)
    if item.default_env is not None:
        options["default"] = os.environ.get(item.default_env)
    target.add_argument(*item.flags, **options)
