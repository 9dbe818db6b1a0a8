"""Generated job specs at and just beyond every limit, fed to three real replica processes
through the admin API. Whatever arrives: no replica crashes or restarts, a spec beyond a limit
is refused with 400 naming its field and writes nothing, and a spec at the limit is accepted,
listed, shown in status and fired."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from harness import NatsServer, ReplicaProcess, wait_for_async
from harness.commands import HTTP_AT, replica
from harness.nats import http_get
from hrwcron.admin import AdminClient, AdminError
from hrwcron.core.model import (
    DEFAULT_MAX_PAYLOAD,
    MAX_PAYLOAD_DEPTH,
    MAX_SUBJECT_LENGTH,
    MAX_SUBJECT_TOKENS,
)
from hrwcron.core.schedule import MAX_EVERY_MS, MAX_EXPRESSION_LENGTH

DEADLINE = 30.0
PREFIX = "hrwcron.trigger"
NODES = ("q0", "q1", "q2")
TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=1)


@dataclass
class Fleet:
    server: NatsServer
    procs: list[ReplicaProcess]
    bases: list[str]
    instances: list[str]


def _instance(base: str) -> str:
    code, body = http_get(f"{base}/status")
    assert code == 200
    return str(json.loads(body)["instance"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base_dir = Path(tmp_path_factory.mktemp("limits"))
    server = NatsServer(name="limits", base_dir=base_dir / "nats").start()
    procs = [replica(server.url, node, base_dir / f"{node}.log") for node in NODES]
    try:
        bases = []
        for node, proc in zip(NODES, procs, strict=True):
            proc.wait_for_log(rf"replica {node} started", DEADLINE)
            bases.append(proc.wait_for_log(HTTP_AT, DEADLINE).group(1))
        started = Fleet(server, procs, bases, [_instance(b) for b in bases])
        yield started
        for proc in procs:
            # Not one crash or restart in the whole run.
            assert proc.running, proc.output()[-3000:]
            assert "Traceback" not in proc.output() and "closed for good" not in proc.output()
        assert [_instance(b) for b in bases] == started.instances
    finally:
        for proc in procs:
            proc.kill()
        server.cleanup()


# --- each limit, at it and just beyond it ---------------------------------------------------


@dataclass(frozen=True)
class Limit:
    field: str  # where a refusal must point
    make: Callable[[st.DrawFn, str, bool], dict[str, Any]]  # (draw, name, beyond) -> fields


def _text(draw: st.DrawFn, size: int) -> str:
    """``size`` characters of letters and digits, different every time."""
    seed = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8))
    return (seed * (size // len(seed) + 1))[:size]


def _name_tokens(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    extra = [draw(TOKEN) for _ in range(8 if beyond else 7)]
    return {"name": ".".join([name, *extra])}


def _name_token_length(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"name": f"{name}.{_text(draw, 65 if beyond else 64)}"}


def _subject_length(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    """A subject of exactly the longest length (or one more) in tokens of at most 64."""
    head = f"{PREFIX}.{name}"
    rest = MAX_SUBJECT_LENGTH + beyond - len(head)  # each token costs its dot too
    sizes = [64] * (rest // 65)
    left = rest - 65 * len(sizes)
    if left == 1:  # no room for ".x": borrow a character from the last full token
        sizes[-1] -= 1
        left += 1
    if left:
        sizes.append(left - 1)
    subject = ".".join([head, *(_text(draw, size) for size in sizes)])
    assert len(subject) == MAX_SUBJECT_LENGTH + beyond
    return {"subject": subject}


def _subject_tokens(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    head = [*PREFIX.split("."), name]
    extra = [draw(TOKEN) for _ in range(MAX_SUBJECT_TOKENS + beyond - len(head))]
    return {"subject": ".".join([*head, *extra])}


def _schedule_length(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    expression = draw(st.sampled_from(["0 0 * * *", "@hourly", "*/30 * * * * *"]))
    return {"schedule": expression + " " * (MAX_EXPRESSION_LENGTH + beyond - len(expression))}


def _every(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"schedule": f"@every {MAX_EVERY_MS + beyond}ms"}


def _payload_depth(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    value: Any = draw(st.one_of(st.integers(), st.text(max_size=5), st.none()))
    for _ in range(MAX_PAYLOAD_DEPTH + beyond):
        value = [value] if draw(st.booleans()) else {"k": value}
    return {"payload": value}


def _payload_size(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    # A JSON string: its quotes count.
    return {"payload": _text(draw, DEFAULT_MAX_PAYLOAD - 2 + beyond)}


def _zone(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    good = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Etc/GMT-14"]
    bad = ["localtime", "posix/Europe/Berlin", "right/UTC", "Factory", "Mars/Olympus"]
    return {"tz": draw(st.sampled_from(bad if beyond else good))}


def _description(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"description": _text(draw, 1024 + beyond)}


def _lateness(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"max_lateness": 600.5 if beyond else 600.0}  # the stream's duplicate window


def _jitter(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"jitter": 3600.001 if beyond else 3600.0}


def _tag(draw: st.DrawFn, name: str, beyond: bool) -> dict[str, Any]:
    return {"tags": [_text(draw, 65 if beyond else 64)]}


LIMITS = {
    "name tokens": Limit("spec.name", _name_tokens),
    "name token length": Limit("spec.name", _name_token_length),
    "subject length": Limit("spec.subject", _subject_length),
    "subject tokens": Limit("spec.subject", _subject_tokens),
    "schedule length": Limit("spec.schedule", _schedule_length),
    "@every range": Limit("spec.schedule", _every),
    "payload depth": Limit("spec.payload", _payload_depth),
    "payload size": Limit("spec.payload", _payload_size),
    "time zone": Limit("spec.tz", _zone),
    "description": Limit("spec.description", _description),
    "max_lateness": Limit("spec.max_lateness", _lateness),
    "jitter": Limit("spec.jitter", _jitter),
    "tag length": Limit("spec.tags[0]", _tag),
}
_serial = itertools.count()
EXAMPLES = 5  # per limit and side


@st.composite
def specs(draw: st.DrawFn, limit: str, beyond: bool) -> dict[str, Any]:
    """A spec, as JSON-ready fields, at ``limit`` or just beyond it."""
    name = f"lim{next(_serial):04d}"
    spec: dict[str, Any] = {"name": name, "schedule": "@hourly"}
    spec.update(LIMITS[limit].make(draw, name, beyond))
    return spec


# --- the property ----------------------------------------------------------------------------


async def _revisions(client: Client) -> int:
    info = await client.jetstream().stream_info("KV_hrwcron_jobs")
    return int(info.state.last_seq or 0)


async def _has_subject_claim(client: Client, subject: str) -> bool:
    try:
        await client.jetstream().get_last_msg(
            "KV_hrwcron_claims", f"$KV.hrwcron_claims.=subject.{subject}"
        )
    except NotFoundError:
        return False
    return True


async def _check(fleet: Fleet, limit: str, beyond: bool, spec: dict[str, Any]) -> None:
    client = await nats.connect(fleet.server.url)
    try:
        admin = AdminClient(client, timeout=20)
        subject = spec.get("subject") or f"{PREFIX}.{spec['name']}"
        before = await _revisions(client)
        body = msgspec.json.encode({"spec": spec})
        if beyond:
            with pytest.raises(AdminError) as refused:
                await admin.call("jobs.put", {"spec": spec}, msgspec.Struct)
            error = refused.value
            assert (error.code, error.field) == ("bad_request", LIMITS[limit].field), error
            assert await _revisions(client) == before, "a refused spec was written"
            assert not await _has_subject_claim(client, subject)
            return
        reply = await client.request("hrwcron.admin.jobs.put", body, timeout=20)
        assert not reply.headers, reply.data[:500]
        name = spec["name"]
        # Listed, shown by every replica (whichever answers), fired, then removed again.
        listed = await admin.all_jobs(name)
        assert [e.name for e in listed if e.name == name] == [name]
        assert listed[0].spec is not None and listed[0].spec.trigger_subject() == subject

        def shown() -> bool:
            for base in fleet.bases:
                code, doc = http_get(f"{base}/status")
                jobs = {j["name"]: j for j in json.loads(doc)["jobs"]} if code == 200 else {}
                if name not in jobs or jobs[name]["subject"] != subject:
                    return False
            return True

        await wait_for_async(shown, DEADLINE, interval=0.1, message=f"{name} on every replica")
        assert all(http_get(f"{base}/")[0] == 200 for base in fleet.bases)
        status = await admin.status(name)
        assert [j.subject for j in status.jobs] == [subject]
        fired = await admin.trigger(name, "limit")
        assert fired.outcome == "started"
        history = await admin.history(name, 1)
        assert [t.tick for t in history.triggers] == [f"{name}:manual:limit"]
        assert history.subject == subject
        await admin.delete_job(name)
    finally:
        await client.close()


@pytest.mark.parametrize("beyond", [False, True], ids=["at", "beyond"])
@pytest.mark.parametrize("limit", sorted(LIMITS))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_specs_at_and_beyond_every_limit_never_harm_a_replica(
    fleet: Fleet, limit: str, beyond: bool, data: st.DataObject
) -> None:
    spec = data.draw(specs(limit, beyond), label="spec")
    asyncio.run(_check(fleet, limit, beyond, spec))
    for node, proc in zip(NODES, fleet.procs, strict=True):
        assert proc.running, f"{node} died of {limit} ({'beyond' if beyond else 'at'} the limit)"
