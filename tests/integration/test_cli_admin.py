"""The operator CLI as a person runs it: ``python -m hrwcron ...`` processes against replicas
on a real nats-server, checking output, ``--json`` and exit codes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import xxhash

from harness import NatsServer, wait_for_async
from harness.commands import Result, hrwcron
from harness.inprocess_replicas import Cluster
from hrwcron.core.model import JobSpec
from hrwcron.core.schedule import Schedule
from hrwcron.core.ticks import format_ms


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}})
    yield c
    await c.stop()


async def test_jobs_verbs_change_what_the_replicas_run(cluster: Cluster) -> None:
    # Revision 1 of the jobs bucket is its layout marker (core/partitions.py).
    url = cluster.url
    put = await hrwcron(url, "jobs", "put", "cli.job", "--schedule", "@every 1s", "--tags", "")
    assert put == Result(0, "cli.job: created (revision 2)\n", "")

    ls = await hrwcron(url, "jobs", "ls")
    assert ls.code == 0
    assert ls.out.splitlines()[0].split() == ["JOB", "SCHEDULE", "TZ", "STATE", "TAGS", "REV"]
    assert "cli.job" in ls.out and "1 job" in ls.out

    got = await hrwcron(url, "jobs", "get", "cli.job", "--json")
    entry = json.loads(got.out)
    assert entry["revision"] == 2 and entry["spec"]["schedule"] == "@every 1s"

    async def fired() -> bool:
        return len(await cluster.ticks("cli.job")) >= 1

    await wait_for_async(fired, timeout=20, interval=0.2)

    paused = await hrwcron(url, "jobs", "pause", "cli.job")
    assert paused == Result(0, "cli.job: paused (revision 3)\n", "")
    again = await hrwcron(url, "jobs", "pause", "cli.job")
    assert again.out == "cli.job: already paused (revision 3)\n"
    stale = await hrwcron(
        url, "jobs", "put", "cli.job", "--schedule", "@every 5s", "--revision", "2"
    )
    assert stale.code == 2 and "changed since revision 2" in stale.err and stale.out == ""
    resumed = await hrwcron(url, "jobs", "resume", "cli.job", "--json")
    assert json.loads(resumed.out)["paused"] is False

    spec = json.dumps({"name": "cli.file", "schedule": "0 9 * * MON", "tz": "Europe/Berlin"})
    from_file = await hrwcron(url, "jobs", "put", "-f", "-", stdin=spec.encode())
    assert from_file.code == 0 and "created" in from_file.out

    nxt = await hrwcron(url, "next", "cli.file", "--count", "2", "--after", "2026-03-07T00:00:00Z")
    expected = Schedule.parse("0 9 * * MON", "Europe/Berlin").due_between(
        1_772_841_600_000, 1_772_841_600_000 + 14 * 86_400_000
    )[:2]
    assert nxt.code == 0
    assert nxt.out.split() == [format_ms(t).replace(".000Z", "Z") for t in expected]

    removed = await hrwcron(url, "jobs", "rm", "cli.job")
    assert removed == Result(0, "cli.job: deleted\n", "")
    gone = await hrwcron(url, "jobs", "get", "cli.job")
    assert gone.code == 2 and "no job named 'cli.job'" in gone.err


async def test_extended_cron_forms_through_the_admin_api_and_the_cli(cluster: Cluster) -> None:
    url = cluster.url
    put = await hrwcron(
        url, "jobs", "put", "ops.month-end", "--schedule", "0 0 L * *", "--tz", "Europe/Berlin"
    )
    assert put == Result(0, "ops.month-end: created (revision 2)\n", "")
    nxt = await hrwcron(
        url, "next", "ops.month-end", "--count", "3", "--after", "2026-01-15T00:00:00Z"
    )
    # Midnight in Berlin on the last day: CET in January and February, CEST in March.
    expected = ["2026-01-30T23:00:00Z", "2026-02-27T23:00:00Z", "2026-03-30T22:00:00Z"]
    assert nxt == Result(0, "".join(f"{line}\n" for line in expected), "")

    # H is hashed from the job's own name, in the replicas and in `hrwcron next JOB` alike.
    await hrwcron(url, "jobs", "put", "ops.spread", "--schedule", "H H * * *")
    minute = xxhash.xxh3_64_intdigest(b"ops.spread\x00minute") % 60
    hour = xxhash.xxh3_64_intdigest(b"ops.spread\x00hour") % 24
    spread = await hrwcron(url, "next", "ops.spread", "--after", "2026-01-01T00:00:00Z")
    assert spread == Result(0, f"2026-01-01T{hour:02d}:{minute:02d}:00Z\n", "")
    dry = await hrwcron(url, "backfill", "ops.spread", "--from", "2026-01-01T00:00:00Z",
                        "--to", "2026-01-04T00:00:00Z", "--dry-run")  # fmt: skip
    assert dry.code == 0 and "3 due instants; would publish 3" in dry.out

    bad = await hrwcron(url, "jobs", "put", "ops.bad", "--schedule", "0 9 * * 1#6")
    assert bad.code == 2 and bad.out == ""
    assert "schedule: day-of-week:" in bad.err and "k is from 1 to 5" in bad.err
    never = await hrwcron(url, "jobs", "put", "ops.never", "--schedule", "0 0 31W 4 *")
    assert never.code == 2 and "day-of-month:" in never.err and "never fires" in never.err
    listed = await hrwcron(url, "jobs", "ls")
    assert "ops.bad" not in listed.out and "ops.never" not in listed.out


async def test_trigger_history_status_and_backfill(cluster: Cluster) -> None:
    url = cluster.url
    await cluster.admin.put_job(JobSpec(name="ops.job", schedule="@every 2s"), 0)
    fired = await hrwcron(url, "trigger", "ops.job", "--id", "by-hand")
    assert fired.code == 0 and fired.out.startswith("ops.job:manual:by-hand: published by ")
    twice = await hrwcron(url, "trigger", "ops.job", "--id", "by-hand")
    assert twice.out == "ops.job:manual:by-hand: already fired before; nothing published\n"

    history = await hrwcron(url, "history", "ops.job", "-n", "5")
    assert history.code == 0
    lines = history.out.splitlines()
    assert lines[0].split()[:3] == ["SEQ", "TICK", "KIND"]
    (manual,) = [line for line in lines if "ops.job:manual:by-hand" in line]
    assert manual.split()[2] == "manual"

    status = await hrwcron(url, "status", "--json")
    reply = json.loads(status.out)
    assert {m["node"] for m in reply["members"]} == {"a", "b"}
    (job,) = reply["jobs"]
    assert job["owner"] in ("a", "b") and sorted(job["order"]) == ["a", "b"]
    table = await hrwcron(url, "status")
    assert table.code == 0 and "MEMBER" in table.out and "ops.job" in table.out

    start = "2026-01-01T00:00:00Z"
    dry = await hrwcron(url, "backfill", "ops.job", "--from", start, "--to", "2026-01-01T00:00:10Z",
                        "--dry-run")  # fmt: skip
    assert dry.code == 0 and "would publish 6" in dry.out
    day = "2026-01-02T00:00:00Z"
    too_many = await hrwcron(url, "backfill", "ops.job", "--from", start, "--to", day)
    assert too_many.code == 2 and "more than 1000" in too_many.err and too_many.out == ""
    naive = await hrwcron(url, "backfill", "ops.job", "--from", "2026-01-01T00:00", "--to", start)
    assert naive.code == 2 and "no UTC offset" in naive.err


async def test_apply_shows_the_diff_and_prunes(cluster: Cluster, tmp_path: Path) -> None:
    url = cluster.url
    await cluster.admin.put_job(JobSpec(name="old", schedule="@daily"), 0)
    config = tmp_path / "jobs.toml"
    config.write_text(
        '[[jobs]]\nname = "a.one"\nschedule = "@hourly"\n\n'
        '[[jobs]]\nname = "a.two"\nschedule = "*/5 * * * *"\ntz = "Asia/Tokyo"\n'
    )
    dry = await hrwcron(url, "apply", str(config), "--prune", "--dry-run")
    assert dry == Result(0, "+ a.one (@hourly)\n+ a.two (*/5 * * * *)\n- old\n", "")
    assert [e.name for e in await cluster.admin.all_jobs()] == ["old"]

    applied = await hrwcron(url, "apply", str(config))
    assert applied.code == 0
    assert applied.out.splitlines() == [
        "+ a.one (@hourly)",
        "+ a.two (*/5 * * * *)",
        "applied: 2 created, 0 updated, 0 deleted",
    ]
    pruned = await hrwcron(url, "apply", str(config), "--prune", "--json")
    assert json.loads(pruned.out) == {
        "create": [],
        "update": [],
        "delete": ["old"],
        "unchanged": ["a.one", "a.two"],
        "expired": [],
        "dry_run": False,
    }
    assert [e.name for e in await cluster.admin.all_jobs()] == ["a.one", "a.two"]
    same = await hrwcron(url, "apply", str(config), "--prune")
    assert same == Result(0, "no changes\n", "")

    # A one-time job whose instant has passed is not created again (the admin API would refuse
    # it), and the apply does not fail on it: a file applied after its jobs ran keeps working.
    later = tmp_path / "later.toml"
    later.write_text(
        config.read_text() + '\n[[jobs]]\nname = "a.once"\nschedule = "@at 2020-01-01T09:00:00Z"\n'
    )
    again = await hrwcron(url, "apply", str(later))
    assert again.code == 0, again.err
    assert again.out.startswith(
        "= a.once (not created: schedule: @at 2020-01-01T09:00:00.000Z is not in the future"
    )
    assert [e.name for e in await cluster.admin.all_jobs()] == ["a.one", "a.two"]

    bad = tmp_path / "bad.toml"
    bad.write_text('[[jobs]]\nname = "x"\nschedule = "99 * * * *"\n')
    refused = await hrwcron(url, "apply", str(bad))
    assert refused.code == 2 and "jobs[0].schedule" in refused.err and refused.out == ""


async def test_no_replica_is_a_server_error(tmp_path: Path) -> None:
    with NatsServer(base_dir=tmp_path / "empty") as server:
        result = await hrwcron(server.url, "jobs", "ls", "--timeout", "2")
    assert result.code == 1
    assert "no hrwcron replica answers on hrwcron.admin.jobs.list" in result.err
    unreachable = await hrwcron("nats://127.0.0.1:1", "status")
    assert unreachable.code == 1 and "cannot connect to NATS" in unreachable.err
