"""Replies page by bytes as well as by count: any set of valid jobs can be listed, shown and
applied, and any history read, through the admin API and the CLI."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from harness import wait_for_async
from harness.commands import hrwcron
from harness.inprocess_replicas import Cluster
from hrwcron.core.model import JobSpec

DEADLINE = 30.0


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}, "c": {}})
    yield c
    await c.stop()


async def test_jobs_status_history_and_apply_work_with_jobs_too_big_for_one_reply(
    cluster: Cluster, tmp_path: Path
) -> None:
    """17 jobs with the largest payload allowed (64 KiB) are more than one 1 MiB reply."""
    admin = cluster.admin
    payload = "x" * (64 * 1024 - 2)
    specs = [JobSpec(name=f"big{i:02d}", schedule="@hourly", payload=payload) for i in range(17)]
    for spec in specs:
        await admin.put_job(spec, 0)
    for i in range(17):
        await admin.trigger("big00", f"t{i:02d}")
    url = cluster.url

    ls = await hrwcron(url, "jobs", "ls")
    assert ls.code == 0, ls.err
    assert ls.out.splitlines()[-1] == "17 jobs"

    async def all_loaded() -> bool:
        status = await admin.full_status(prefix="big")
        return len(status.jobs) == 17

    await wait_for_async(all_loaded, DEADLINE, message="every replica loaded the jobs")
    status = await hrwcron(url, "status", "--all", "--json")
    assert status.code == 0, status.err
    assert [j["name"] for j in json.loads(status.out)["jobs"]] == [s.name for s in specs]

    history = await hrwcron(url, "history", "big00", "-n", "17", "--json")
    assert history.code == 0, history.err
    ticks = [t["tick"] for t in json.loads(history.out)["triggers"]]
    assert ticks == [f"big00:manual:t{i:02d}" for i in reversed(range(17))]

    spec_file = tmp_path / "jobs.json"
    spec_file.write_bytes(msgspec.json.encode(specs))
    applied = await hrwcron(url, "apply", str(spec_file), "--dry-run")
    assert (applied.code, applied.out) == (0, "no changes\n"), applied.err

    # Pages: small ones when asked, each says where the next one starts.
    page = await admin.list_jobs(max_bytes=200_000)
    assert [e.name for e in page.jobs] == ["big00", "big01", "big02"] and page.next == "big02"
    older = await admin.history("big00", 17, max_bytes=150_000)
    assert len(older.triggers) == 17
