"""``hrwcron import ... --apply`` as a person runs it: ``python -m hrwcron`` against replicas on
a real nats-server, through the same diff, checks and writes as ``apply``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.commands import Result, hrwcron
from harness.inprocess_replicas import Cluster
from hrwcron.core.model import JobSpec

CORPUS = Path(__file__).resolve().parents[1] / "vectors" / "imports"


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}})
    yield c
    await c.stop()


async def stored(cluster: Cluster) -> dict[str, JobSpec]:
    return {e.name: e.spec for e in await cluster.admin.all_jobs() if e.spec is not None}


async def test_a_crontab_is_applied_through_the_diff_and_again_changes_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url
    tab = str(CORPUS / "system.crontab")
    args = ("import", "crontab", tab, "--system", "--prefix", "host1", "--tz", "Europe/Paris")
    dry = await hrwcron(url, *args, "--apply", "--dry-run")
    assert dry.code == 0, dry.err
    assert len([line for line in dry.out.splitlines() if line.startswith("+ host1.")]) == 10
    assert await stored(cluster) == {}

    applied = await hrwcron(url, *args, "--apply")
    assert applied.code == 0, applied.err
    assert applied.out.splitlines()[-1] == "applied: 10 created, 0 updated, 0 deleted"
    jobs = await stored(cluster)
    vacuum = jobs["host1.vacuumdb-all-analyze-in-stages"]
    assert (vacuum.schedule, vacuum.tz) == ("@daily", "Europe/Paris")
    assert vacuum.payload == {
        "command": "/usr/bin/vacuumdb --all --analyze-in-stages",
        "user": "postgres",
        "env": {
            "SHELL": "/bin/sh",
            "PATH": "/usr/local/sbin:/usr/local/bin:/sbin:/bin:/usr/sbin:/usr/bin",
            "MAILTO": "",
        },
    }
    # The printed specs, applied as a file, are the same jobs: nothing to change.
    printed = await hrwcron(url, *args)
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(printed.out)
    again = await hrwcron(url, "apply", str(jobs_file))
    assert again == Result(0, "no changes\n", "")


async def test_cronjobs_are_applied_and_a_refused_file_writes_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url
    manifests = [str(CORPUS / name) for name in ("cronjobs.yaml", "list.yaml")]
    applied = await hrwcron(url, "import", "kubernetes", *manifests, "--apply", "--json")
    # As apply does, a job the replicas refuse with their settings (here a lateness window past
    # the default duplicate window, which the import notes) is listed and the others written.
    assert applied.code == 2
    assert "skipped Service web" in applied.err
    assert "CronJob billing/invoices: startingDeadlineSeconds 3600: replicas take" in applied.err
    assert "billing.invoices: refused: spec.max_lateness" in applied.err
    doc = json.loads(applied.out)
    assert len(doc["create"]) == 10 and [r["name"] for r in doc["refused"]] == ["billing.invoices"]
    jobs = await stored(cluster)
    assert len(jobs) == 9 and "billing.invoices" not in jobs
    backup = jobs["prod.db-backup"]
    assert (backup.schedule, backup.tz, backup.overlap, backup.max_lateness) == (
        "30 2 * * *",
        "Europe/Berlin",
        "skip",
        600.0,
    )
    assert jobs["reporting.weekday-report"].paused is True
    assert jobs["ops.odd-days-or-monday"].schedule == "0 6 1-31/2 * 1"

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (CORPUS / "cronjobs.yaml").read_text().replace("concurrencyPolicy: Forbid", "")
        + "---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {name: late}\n"
        "spec: {schedule: '0 * * * *', concurrencyPolicy: Replace, jobTemplate: {}}\n"
    )
    refused = await hrwcron(url, "import", "kubernetes", str(bad), "--apply")
    assert (refused.code, refused.out) == (2, "")
    assert f"{bad}:" in refused.err and "concurrencyPolicy Replace" in refused.err
    assert await stored(cluster) == jobs  # the changed db-backup was not written either
