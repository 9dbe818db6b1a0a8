"""Applying a list of job specs: a one-time job whose instant has passed is not brought back."""

from __future__ import annotations

from hrwcron.adapters.memory import MemoryJobs
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import parse_instant
from hrwcron.engine.jobsync import apply_diff, diff_jobs

NOW = parse_instant("2026-06-01T12:00:00Z")


async def test_a_passed_one_time_job_is_left_out_but_an_existing_one_is_kept() -> None:
    store = MemoryJobs()
    ran = JobSpec(name="ran", schedule="@at 2026-05-01T09:00:00Z", description="old")
    await store.put(ran, 0)
    specs = [
        JobSpec(name="ran", schedule="@at 2026-05-01T09:00:00Z", description="edited"),
        JobSpec(name="gone", schedule="@at 2026-05-02T09:00:00Z", delete_after=60),
        JobSpec(name="over", schedule="0 * * * *", end="2026-05-31T00:00:00Z"),
        JobSpec(name="soon", schedule="@at 2026-06-02T09:00:00Z"),
    ]
    diff = await diff_jobs(store, specs, prune=False, now_ms=NOW)
    assert [s.name for s in diff.create] == ["soon"]
    # An edit of a job that is still there goes through: it does not fire again.
    assert [s.name for s, _ in diff.update] == ["ran"]
    assert [name for name, _ in diff.expired] == ["gone", "over"]
    assert "= gone (not created: schedule: @at 2026-05-02T09:00:00.000Z is not in the future" in (
        "\n".join(diff.lines())
    )
    await apply_diff(store, diff)
    assert sorted(await store.snapshot()) == ["ran", "soon"]
    # Without a time (as before), every missing job is created.
    plain = await diff_jobs(MemoryJobs(), specs, prune=False)
    assert [s.name for s in plain.create] == ["ran", "gone", "over", "soon"]
