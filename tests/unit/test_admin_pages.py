"""Admin replies that always fit in one message: lists page by bytes as well as by count and
say where the next page starts; error replies are cut to fit, never lost."""

from __future__ import annotations

import asyncio
import re

import msgspec

from harness.admin_calls import call, refusal
from harness.serving import serving
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin import replies as admin_replies
from hrwcron.admin.api import ErrorBody, ErrorReply, JobList, ProblemBody
from hrwcron.core.model import JobSpec


def test_an_error_with_every_problem_of_a_huge_request_still_fits_one_message() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        spec = {"name": "tags", "schedule": "@every 1s", "tags": ["bad tag!" * 8] * 20_000}
        async with serving(jobs, max_payload=64 * 1024) as svc:
            req = await call(svc, "jobs.put", {"spec": spec})
        status, body = refusal(req)
        assert req.error is not None and len(req.error[2]) <= 64 * 1024 - 1024
        assert status == "400" and body.field == "spec.tags[0]"
        assert 1 < len(body.problems) < 20_000
        assert re.fullmatch(r"\.\.\. and \d+ more problems", body.problems[-1].message)

    asyncio.run(scenario())


def test_error_replies_are_cut_to_their_limit_whatever_they_hold() -> None:
    body = ErrorBody(
        code="bad_request",
        message="m" * 1_000_000,
        field="f" * 100_000,
        problems=[ProblemBody(field="x" * 1000, message="y" * 100_000)] * 1000,
    )
    for limit in (2_000, 10_000, 100_000):
        data = admin_replies.error_reply(body, limit)
        assert len(data) <= limit
        decoded = msgspec.json.decode(data, type=ErrorReply).error
        assert decoded.code == "bad_request" and decoded.message.startswith("mmm")


def test_listing_jobs_that_do_not_fit_one_reply_pages_by_bytes() -> None:
    """17 jobs with 64 KiB payloads made jobs.list answer 413 with a 1 MiB server limit."""

    async def scenario() -> None:
        jobs = MemoryJobs()
        for i in range(17):
            spec = JobSpec(name=f"big{i:02d}", schedule="@every 1s", payload="x" * 65_000)
            await jobs.put(spec, 0)
        async with serving(jobs, max_payload=1024 * 1024) as svc:
            seen: list[str] = []
            after = ""
            pages = 0
            while True:
                req = await call(svc, "jobs.list", {"after": after})
                assert req.reply is not None, req.error
                assert len(req.reply) <= 1024 * 1024
                page = msgspec.json.decode(req.reply, type=JobList)
                assert all(e.spec is not None for e in page.jobs)
                seen += [e.name for e in page.jobs]
                pages += 1
                if not page.next:
                    break
                after = page.next
            assert seen == [f"big{i:02d}" for i in range(17)] and pages == 2
            # Count and bytes both bound a page: the smaller wins.
            req = await call(svc, "jobs.list", {"limit": 3})
            assert len(msgspec.json.decode(req.reply or b"", type=JobList).jobs) == 3
            req = await call(svc, "jobs.list", {"max_bytes": 200_000})
            small = msgspec.json.decode(req.reply or b"", type=JobList)
            assert len(small.jobs) == 3 and small.next == "big02"
            # A page holds at least one job, however small max_bytes is.
            req = await call(svc, "jobs.list", {"max_bytes": 1})
            assert [e.name for e in msgspec.json.decode(req.reply or b"", type=JobList).jobs] == [
                "big00"
            ]

    asyncio.run(scenario())
