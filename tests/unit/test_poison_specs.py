"""The chaos run's poison-job fault (tests/chaos/faults.py) writes each of ``POISON_SPECS``
through the admin API, which must refuse it as ``bad_request`` naming a field, or straight into
the jobs bucket, where every replica must skip it. Both expectations are checked here for every
spec in memory, so a spec added to the list that the API would take, or a replica would load,
fails here and not an hour into a chaos run. The list holds the exclusions of issue 25."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from chaos.faults import POISON_SPECS
from harness.engine_parts import table
from harness.serving import serving
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin.api import ErrorReply
from hrwcron.core.model import decode_job
from hrwcron.core.plan import SEARCH_BUDGET, TickPlan
from hrwcron.engine.ports import JobEvent


class Request:
    """What the admin service reads of a nats.micro request, asked from a client's inbox."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        # The message behind it: replicas answer only on an inbox.
        self._msg = SimpleNamespace(reply="_INBOX.test")
        self._msg = SimpleNamespace(reply="_INBOX.poison")
        self.reply: bytes | None = None
        self.error: tuple[str, bytes] | None = None

    async def respond(self, data: bytes) -> None:
        self.reply = data

    async def respond_error(self, code: str, description: str, data: bytes = b"") -> None:
        self.error = (code, data)


def name_of(text: str) -> str:
    # As the fault reads it.
    return text.split('"name": "', 1)[1].split('"', 1)[0]


def test_the_list_holds_the_exclusions_a_bounded_search_cannot_decide() -> None:
    undecidable = []
    for text in POISON_SPECS.values():
        if '"exclude"' not in text:
            continue  # (one of the others is too deep for a plain decode)
        spec = msgspec.json.decode(text)
        if "exclude" in spec:
            plan = TickPlan.parse(spec["schedule"], job=spec["name"], exclude=spec["exclude"])
            found = plan.search(0)
            assert (found.due, found.complete, found.steps) == (None, False, SEARCH_BUDGET)
            undecidable.append(spec["name"])
    assert "poison.excl" in undecidable and len(undecidable) >= 2


@pytest.mark.parametrize("case", sorted(POISON_SPECS))
def test_the_admin_api_refuses_each_poison_spec_naming_a_field(case: str) -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        body = b'{"spec": ' + POISON_SPECS[case].encode() + b"}"  # as the fault sends it
        req = Request(body)
        async with serving(jobs) as svc:
            await svc._endpoint("jobs.put", svc._handlers["jobs.put"])(req)  # type: ignore[arg-type]
        assert req.error is not None, req.reply
        status, data = req.error
        error = msgspec.json.decode(data, type=ErrorReply).error
        assert (status, error.code) == ("400", "bad_request")
        assert error.field and error.field.startswith("spec"), error
        assert await jobs.snapshot() == {}

    asyncio.run(scenario())


@pytest.mark.parametrize("case", sorted(POISON_SPECS))
def test_a_replica_skips_each_poison_spec_found_in_the_bucket(case: str) -> None:
    text = POISON_SPECS[case]
    name = name_of(text)
    try:  # as the JetStream jobs port turns a stored value into an event
        event = JobEvent(name, decode_job(text.encode(), where=name), 7)
    except Exception as exc:
        event = JobEvent(name, None, 7, error=str(exc))
    jobs, hooks, _ = table()
    jobs.apply(event)
    assert name not in jobs.jobs and hooks.loaded_jobs == []
    revision, why = jobs.skipped[name]
    assert revision == 7 and why
    if "exclude" in text:
        assert "exclude" in why and "cannot be decided" in why, why
