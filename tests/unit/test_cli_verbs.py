"""The table of CLI verbs: every verb is complete, and the parser is built from the table."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from hrwcron.cli import VERBS, build_parser, main
from hrwcron.cli.verb import Verb, arg


def leaves(verbs: tuple[Verb, ...] | list[Verb], path: str = "") -> Iterator[tuple[str, Verb]]:
    for verb in verbs:
        name = f"{path} {verb.name}".strip()
        if verb.verbs:
            yield from leaves(list(verb.verbs), name)
        else:
            yield name, verb


@pytest.mark.parametrize(
    ("name", "verb"), list(leaves(VERBS)), ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_verb_runs_locally_or_asks_a_replica_and_prints_the_reply(
    name: str, verb: Verb
) -> None:
    asks = verb.request is not None and verb.show is not None
    assert (verb.run is not None) != asks, name


def test_the_parser_offers_exactly_the_verbs_of_the_table() -> None:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(commands.choices) == [verb.name for verb in VERBS]
    jobs = next(verb for verb in VERBS if verb.name == "jobs")
    [verbs] = [
        a for a in commands.choices["jobs"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    assert list(verbs.choices) == [verb.name for verb in jobs.verbs]


def test_a_verb_with_neither_a_handler_nor_a_request_is_refused_when_the_parser_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hrwcron.cli as cli

    broken = Verb("broken", help="declares no way to run", args=(arg("--x"),))
    monkeypatch.setattr(cli, "VERBS", (*VERBS, broken))
    with pytest.raises(TypeError, match="'broken' needs run, or request and show"):
        main(["broken"])


def test_an_argument_default_read_from_the_environment_is_read_when_the_parser_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HRWCRON_CONFIG", "first.toml")
    first = build_parser().parse_args(["history", "a.job"])
    monkeypatch.setenv("HRWCRON_CONFIG", "second.toml")
    second = build_parser().parse_args(["history", "a.job"])
    assert (first.config, second.config) == ("first.toml", "second.toml")
