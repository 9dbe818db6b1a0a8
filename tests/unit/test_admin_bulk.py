"""``jobs.bulk``: every item decoded and validated on its own, answered on its own; atomic
requests write nothing when one item is refused; dry runs write nothing; replies fit."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from harness.admin_calls import call
from harness.serving import serving
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin.api import BulkResult
from hrwcron.core.model import JobSpec

PREFIX = "hrwcron.trigger"


def job(name: str, schedule: str = "@every 1s", **fields: Any) -> dict[str, Any]:
    return {"name": name, "schedule": schedule, **fields}


async def bulk(svc: Any, **request: Any) -> BulkResult:
    req = await call(svc, "jobs.bulk", request)
    assert req.reply is not None, req.error
    return msgspec.json.decode(req.reply, type=BulkResult)


async def stored(jobs: MemoryJobs) -> dict[str, str]:
    return {n: e.spec.schedule for n, e in (await jobs.snapshot()).items() if e.spec}


def test_each_item_is_checked_on_its_own_and_only_the_valid_ones_are_written() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        kept = await jobs.put(JobSpec(name="kept", schedule="@every 1s"), 0)
        await jobs.put(JobSpec(name="owner", schedule="@hourly", subject=f"{PREFIX}.taken"), 0)
        await jobs.put(JobSpec(name="old", schedule="@daily"), 0)
        same = await jobs.put(JobSpec(name="same", schedule="@every 1s"), 0)
        await jobs.put(JobSpec(name="other", schedule="@weekly"), 0)
        async with serving(jobs) as svc:
            result = await bulk(
                svc,
                jobs=[
                    {"spec": job("new.one")},
                    {"spec": job("bad.cron", "99 * * * *")},
                    {"spec": job("odd"), "colour": "red"},
                    {"spec": job("new.one", "@hourly")},  # twice in one request
                    {"spec": job("thief", subject=f"{PREFIX}.taken")},
                    {"spec": job("kept", "@every 2s"), "revision": kept + 5},
                    {"spec": job("same"), "revision": 0},  # identical: nothing to write
                    {"spec": job("pair.a", subject=f"{PREFIX}.pair")},
                    {"spec": job("pair.b", subject=f"{PREFIX}.pair")},
                    {"spec": job("owner", "@daily", subject=f"{PREFIX}.taken"), "revision": 2},
                ],
                delete=[{"name": "old"}, {"name": "never"}, {"name": "other", "revision": 99}],
            )
            outcomes = [(o.name, o.outcome) for o in result.jobs]
            assert outcomes == [
                ("new.one", "created"),
                ("bad.cron", "refused"),
                ("odd", "refused"),
                ("new.one", "refused"),
                ("thief", "refused"),
                ("kept", "conflict"),
                ("same", "unchanged"),
                ("pair.a", "created"),
                ("pair.b", "refused"),
                ("owner", "updated"),
            ]
            fields = [[p.field for p in o.problems] for o in result.jobs]
            assert fields[1] == ["spec.schedule"]
            assert fields[2] == ["jobs[2].colour"]
            assert fields[3] == ["spec.name"] and fields[4] == ["spec.subject"]
            assert fields[5] == ["revision"] and fields[8] == ["spec.subject"]
            taken = result.jobs[4].problems[0].message
            assert "already the trigger subject of job 'owner'" in taken
            assert result.jobs[6].revision == same
            assert [(o.name, o.outcome) for o in result.deleted] == [
                ("old", "deleted"),
                ("never", "absent"),
                ("other", "conflict"),
            ]
            assert all(o.revision > 0 for o in result.jobs if o.outcome in ("created", "updated"))
        assert await stored(jobs) == {
            "kept": "@every 1s",
            "same": "@every 1s",
            "other": "@weekly",
            "owner": "@daily",
            "new.one": "@every 1s",
            "pair.a": "@every 1s",
        }

    asyncio.run(scenario())


def test_an_atomic_request_with_a_refusal_writes_nothing() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        await jobs.put(JobSpec(name="old", schedule="@daily"), 0)
        async with serving(jobs) as svc:
            items = [{"spec": job("a")}, {"spec": job("b", "61 * * * *")}]
            result = await bulk(svc, jobs=items, delete=[{"name": "old"}], atomic=True)
            assert [o.outcome for o in result.jobs] == ["skipped", "refused"]
            assert [o.outcome for o in result.deleted] == ["skipped"]
            assert "atomic" in result.jobs[0].problems[0].message
            assert await stored(jobs) == {"old": "@daily"}
            # Without the bad one the same request writes everything.
            result = await bulk(svc, jobs=items[:1], delete=[{"name": "old"}], atomic=True)
            assert [o.outcome for o in (*result.jobs, *result.deleted)] == ["created", "deleted"]
        assert await stored(jobs) == {"a": "@every 1s"}

    asyncio.run(scenario())


def test_a_dry_run_says_what_would_happen_and_writes_nothing() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        await jobs.put(JobSpec(name="a", schedule="@daily"), 0)
        async with serving(jobs) as svc:
            result = await bulk(
                svc,
                jobs=[{"spec": job("a")}, {"spec": job("b")}, {"spec": job("c", "x")}],
                delete=[{"name": "a"}],
                dry_run=True,
            )
        # "a" is both written and deleted: refused as ambiguous.
        assert [o.outcome for o in result.jobs] == ["updated", "created", "refused"]
        assert [o.outcome for o in result.deleted] == ["refused"] and result.dry_run
        assert await stored(jobs) == {"a": "@daily"}

    asyncio.run(scenario())


def test_a_reply_full_of_refusals_is_cut_to_fit_one_message() -> None:
    async def scenario() -> None:
        limit = 64 * 1024
        items = [
            {"spec": job(f"j{i}", "@daily", tags=["bad tag!"] * 50, tz="Nowhere/" + "x" * 500)}
            for i in range(300)
        ]
        async with serving(MemoryJobs(), max_payload=limit) as svc:
            req = await call(svc, "jobs.bulk", {"jobs": items})
        assert req.reply is not None and len(req.reply) <= limit - 1024
        result = msgspec.json.decode(req.reply, type=BulkResult)
        assert [o.outcome for o in result.jobs] == ["refused"] * 300
        assert all(o.name == f"j{i}" for i, o in enumerate(result.jobs))

    asyncio.run(scenario())


def test_a_request_larger_than_allowed_is_refused_as_a_whole() -> None:
    async def scenario() -> None:
        async with serving(MemoryJobs()) as svc:
            req = await call(svc, "jobs.bulk", {"jobs": [{"spec": job("a")}] * 10_001})
        assert req.error is not None and req.error[0] == "400"

    asyncio.run(scenario())
