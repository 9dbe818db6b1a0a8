"""Admin API wire format, the in-memory trigger history, and CLI input checks that need no NATS."""

from __future__ import annotations

import pytest

from hrwcron.adapters.memory import MemoryTriggers
from hrwcron.admin.api import (
    REQUEST_TYPES,
    VERBS,
    BackfillJob,
    RequestProblem,
    decode_request,
    manual_id_problem,
)
from hrwcron.cli import main
from hrwcron.engine.ports import HEADER_MSG_ID


def test_every_verb_has_a_request_type() -> None:
    assert set(REQUEST_TYPES) == set(VERBS)


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("jobs.get", b"{}", "name"),
        ("jobs.get", b'{"name": "a", "nmae": 1}', "nmae"),
        ("jobs.put", b'{"spec": {"name": "a"}}', "spec.schedule"),
        ("jobs.put", b'{"spec": {"name": "a", "schedule": "@daily", "colour": 1}}', "spec.colour"),
        ("jobs.put", b'{"spec": {"name": "a", "schedule": "@daily", "overlap": "x"}}',
         "spec.overlap"),
        ("jobs.put", b'{"spec": {"name": "a", "schedule": "@daily"}, "revision": -1}', "revision"),
        ("jobs.list", b'{"limit": 100000}', "limit"),
        ("backfill", b'{"name": "a", "from": "2026-01-01T00:00:00", "to": "2026-01-01T00:00Z"}',
         "from"),
        ("history", b'{"name": "a", "limit": "ten"}', "limit"),
        ("status", b"[1]", ""),
        ("status", b"{nope", ""),
    ],
)  # fmt: skip
def test_decode_names_the_offending_field(verb: str, body: bytes, field: str) -> None:
    with pytest.raises(RequestProblem) as problem:
        decode_request(body, REQUEST_TYPES[verb])
    assert problem.value.field == field
    assert problem.value.message


def test_empty_body_is_an_empty_object_and_from_to_are_renamed() -> None:
    assert decode_request(b"", REQUEST_TYPES["status"]).limit == 1000
    request = decode_request(
        b'{"name": "a", "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00+01:00"}',
        BackfillJob,
    )
    assert request.start == request.end


@pytest.mark.parametrize(
    ("value", "ok"),
    [("rerun-1", True), ("a", True), ("123", True), ("-5000", True), ("has space", False),
     ("x" * 65, False), ("a:b", False), ("a.b", False), ("", False)],
)  # fmt: skip
def test_manual_ids(value: str, ok: bool) -> None:
    assert (manual_id_problem(value) is None) is ok


async def test_memory_history_and_since_match_the_port_contract() -> None:
    triggers = MemoryTriggers()
    for i in range(5):
        await triggers.publish("s.a", b"a%d" % i, {HEADER_MSG_ID: f"a:{i}"}, i and (2 * i - 1))
        await triggers.publish("s.b", b"b%d" % i, {HEADER_MSG_ID: f"b:{i}"}, i and 2 * i)
    recent = await triggers.history("s.a", 3)
    assert [r.msg_id for r in recent] == ["a:2", "a:3", "a:4"]
    assert [r.body for r in recent] == [b"a2", b"a3", b"a4"]
    assert await triggers.history("s.none", 3) == []
    since = await triggers.since("s.b", 0, 2)
    assert [r.msg_id for r in since] == ["b:0", "b:1"]
    assert all(r.body == b"" for r in since)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["backfill", "job", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"], "ISO-8601"),
        (["backfill", "job", "--from", "2026-01-01T00:00:00", "--to", "2026-01-01T00:00:00Z"],
         "no UTC offset"),
        (["trigger", "bad job"], "bad token"),
        (["history", "job", "-n", "0"], "from 1 to 1000"),
        (["jobs", "put", "job"], "give JOB and --schedule"),
        (["jobs", "put", "job", "--schedule", "@daily", "--payload", "{x"], "--payload"),
        (["jobs", "put", "-f", "/nonexistent/job.json"], "cannot read"),
        (["jobs", "rm", "job", "--revision", "-3"], "whole number"),
        (["next", "some.job", "--tz", "UTC"], "own time zone"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_input_before_connecting(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    # No NATS server is running: each of these must fail on its input alone.
    assert main([*argv, "--nats-url", "nats://127.0.0.1:1", "--timeout", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err
