"""The operator commands with more jobs than one reply holds: ``apply``, ``jobs put -f``,
``jobs ls`` and ``status`` as a person runs them, against replicas on a nats-server whose
max_payload is lowered to 32 KiB, so 1,500 jobs take several requests and pages each."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from harness import NatsServer, wait_for_async
from harness.commands import hrwcron
from harness.inprocess_replicas import Cluster
from hrwcron.core.model import JobSpec

MAX_PAYLOAD = 32 * 1024
JOBS = 1_500
DEADLINE = 60.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    server = NatsServer(config_text=f"max_payload: {MAX_PAYLOAD}\n", base_dir=tmp_path / "nats")
    server.start()
    try:
        # A job's payload plus a trigger's envelope must fit the server's max_payload.
        options = {"max_payload": 16 * 1024}
        c = await Cluster.start(server.url, {"a": options, "b": options})
        try:
            yield c
        finally:
            await c.stop()
    finally:
        server.cleanup()


def specs(count: int = JOBS) -> list[JobSpec]:
    return [
        JobSpec(name=f"bulk.{i:04d}", schedule="@hourly", jitter=3600.0, description="a job")
        for i in range(count)
    ]


async def loaded_everywhere(cluster: Cluster, count: int) -> None:
    async def loaded() -> bool:
        return all(len(r.scheduler.jobs) == count for r in cluster.replicas.values())

    await wait_for_async(loaded, DEADLINE, message=f"every replica loaded {count} jobs")


async def test_apply_writes_checks_and_reports_more_jobs_than_one_request_holds(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url
    wanted = specs()
    bad = JobSpec(name="bulk.bad", schedule="61 * * * *")
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_bytes(msgspec.json.encode([*wanted, bad]))
    assert len(jobs_file.read_bytes()) > 3 * MAX_PAYLOAD

    applied = await hrwcron(url, "apply", str(jobs_file))
    assert applied.code == 2, applied.err
    lines = applied.out.splitlines()
    assert len(lines) == JOBS + 2 and lines[0] == "+ bulk.0000 (@hourly)"
    assert (
        lines[-1] == "applied: 1500 created, 0 updated, 0 deleted; 1 not applied (listed on stderr)"
    )
    assert "bulk.bad: refused: spec.schedule: minute:" in applied.err
    stored = {e.name: e for e in await cluster.admin.all_jobs()}
    assert sorted(stored) == [s.name for s in wanted]
    assert all(stored[s.name].spec == s for s in wanted)

    jobs_file.write_bytes(msgspec.json.encode(wanted))
    same = await hrwcron(url, "apply", str(jobs_file))
    assert (same.code, same.out, same.err) == (0, "no changes\n", "")

    # 1% changed, and with --atomic one refused spec keeps every change out.
    changed = [
        msgspec.structs.replace(s, description="changed") if i % 100 == 0 else s
        for i, s in enumerate(wanted)
    ]
    jobs_file.write_bytes(msgspec.json.encode([*changed, bad]))
    atomic = await hrwcron(url, "apply", str(jobs_file), "--atomic")
    assert atomic.code == 2 and "bulk.bad: refused" in atomic.err
    assert "1 refused; nothing written (--atomic)" in atomic.err
    assert not any(line.startswith("applied:") for line in atomic.out.splitlines())
    assert (await cluster.admin.get_job("bulk.0000")).spec == wanted[0]

    dry = await hrwcron(url, "apply", str(jobs_file), "--dry-run", "--json")
    assert dry.code == 2
    report = json.loads(dry.out)
    assert len(report["update"]) == 15 and report["create"] == ["bulk.bad"]
    assert [r["name"] for r in report["refused"]] == ["bulk.bad"]

    jobs_file.write_bytes(msgspec.json.encode(changed))
    updated = await hrwcron(url, "apply", str(jobs_file), "--atomic")
    assert updated.code == 0, updated.err
    assert updated.out.splitlines()[-1] == "applied: 0 created, 15 updated, 0 deleted"
    assert (await cluster.admin.get_job("bulk.0100")).spec == changed[100]

    pruned_file = tmp_path / "fewer.json"
    pruned_file.write_bytes(msgspec.json.encode(changed[:1000]))
    pruned = await hrwcron(url, "apply", str(pruned_file), "--prune")
    assert pruned.code == 0, pruned.err
    assert pruned.out.splitlines()[-1] == "applied: 0 created, 0 updated, 500 deleted"
    assert len(await cluster.admin.all_jobs()) == 1000


async def test_jobs_put_with_an_array_answers_each_job(cluster: Cluster, tmp_path: Path) -> None:
    url = cluster.url
    array = tmp_path / "array.json"
    first = specs(600)
    array.write_bytes(msgspec.json.encode(first))
    created = await hrwcron(url, "jobs", "put", "-f", str(array))
    assert created.code == 0, created.err
    lines = created.out.splitlines()
    assert len(lines) == 600 and lines[0].startswith("bulk.0000: created (revision ")

    taken = JobSpec(name="thief", schedule="@daily", subject="hrwcron.trigger.bulk.0001")
    again = [msgspec.structs.replace(first[0], schedule="@daily"), first[1], taken]
    array.write_bytes(msgspec.json.encode(again))
    result = await hrwcron(url, "jobs", "put", "-f", str(array), "--json")
    assert result.code == 2
    answers = {a["name"]: a for a in json.loads(result.out)}
    assert answers["bulk.0000"]["outcome"] == "updated"
    assert answers["bulk.0001"]["outcome"] == "unchanged"
    assert answers["thief"]["outcome"] == "refused"
    assert answers["thief"]["problems"][0]["field"] == "spec.subject"
    assert "thief: refused: spec.subject:" in result.err


async def test_ls_and_status_page_through_more_jobs_than_one_reply_holds(
    cluster: Cluster,
) -> None:
    url = cluster.url
    wanted = specs()
    puts, _ = await cluster.admin.write_jobs([(s, 0) for s in wanted])
    assert {p.outcome for p in puts} == {"created"}
    await cluster.admin.pause("bulk.0007")
    await loaded_everywhere(cluster, JOBS)

    ls = await hrwcron(url, "jobs", "ls")
    assert ls.code == 0, ls.err
    lines = ls.out.splitlines()
    assert lines[-1] == "1500 jobs" and len(lines) == JOBS + 2
    assert [line.split()[0] for line in lines[1:-1]] == [s.name for s in wanted]
    listed = await hrwcron(url, "jobs", "ls", "--json", "--prefix", "bulk.00")
    assert [e["name"] for e in json.loads(listed.out)] == [f"bulk.{i:04d}" for i in range(100)]

    def recounted() -> bool:
        # Owned jobs are recounted a second after the job set stops changing.
        replicas = cluster.replicas.values()
        return all(sum(r.scheduler.owned_counts.values()) == JOBS for r in replicas)

    await wait_for_async(recounted, DEADLINE, message="owned jobs recounted")
    screen = await hrwcron(url, "status")
    assert screen.code == 0, screen.err
    text = screen.out.splitlines()
    assert "jobs: 1,500 (1 paused, 0 bad); missed in the last hour: 0" in text
    (owned,) = [line for line in text if line.startswith("owned: ")]
    counts = dict(part.rsplit(" ", 1) for part in owned[len("owned: ") :].split(", "))
    assert sorted(counts) == ["a", "b"]
    assert sum(int(n.replace(",", "")) for n in counts.values()) == JOBS
    assert text[-1] == (
        "showing the 14 of 1,500 jobs due soonest; --limit N for more, --all for every one"
    )

    every = await hrwcron(url, "status", "--all", "--json")
    assert every.code == 0, every.err
    reply = json.loads(every.out)
    assert len(reply["jobs"]) == JOBS and not reply["truncated"]
    assert reply["summary"]["jobs"] == JOBS and reply["summary"]["paused"] == 1
    fires = [j["next_fire"] for j in reply["jobs"][:-1]]
    assert fires == sorted(fires) and reply["jobs"][-1]["name"] == "bulk.0007"

    some = await hrwcron(url, "status", "--prefix", "bulk.01", "--limit", "30", "--json")
    part = json.loads(some.out)
    assert len(part["jobs"]) == 30 and part["total_jobs"] == 100 and part["truncated"]
    assert all(j["name"].startswith("bulk.01") for j in part["jobs"])
