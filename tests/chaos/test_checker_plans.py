"""The checker knows the whole plan: a window, exclusions, one-time ``@at`` jobs and
``max_runs``. A stream built from an independent reading of the chaos job mix (croniter for the
cron part, arithmetic for windows, ranges and run counts) passes; each planted violation (a
tick outside the window, an excluded tick, a tick past max_runs, an @at fired at the wrong
instant or not at all) is caught by kind."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest
from croniter import croniter

from harness.chaos import Trigger, parse_trigger
from hrwcron.core.model import JobSpec

from .checker import check
from .faults import Timings
from .jobmix import PLAN_PREFIX, chaos_jobs, plan_jobs

T0 = 1_800_000_000_000  # a whole second, 2027-01-15T08:00:00Z
SPAN_S = 120.0
TIMINGS = Timings(max_lateness=15.0)
JOBS = {job.name: job for job in plan_jobs(TIMINGS, T0, SPAN_S)}
WINDOW = (T0 + 2_000.0, T0 + SPAN_S * 1000)


def croniter_seconds(expr: str, after_ms: float, until_ms: float) -> list[int]:
    """Every instant of a six-field expression in (after, until], by croniter."""
    start = dt.datetime.fromtimestamp(after_ms / 1000, dt.UTC)
    it = croniter(expr, start, second_at_beginning=True)
    found = []
    while (at := int(it.get_next(float) * 1000)) <= until_ms:
        found.append(at)
    return found


def parse_iso(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def independent_dues(job: JobSpec, window: tuple[float, float]) -> list[int]:
    """What must fire in ``window``, read without hrwcron's plan code."""
    lo, hi = window
    if job.schedule.startswith("@at "):
        at = parse_iso(job.schedule.removeprefix("@at "))
        return [at] if lo <= at <= hi else []
    if job.name.endswith("window"):
        assert job.start and job.end
        first, last = parse_iso(job.start), parse_iso(job.end)
        return [t for t in range(int(lo), int(hi) + 1, 1000) if first <= t <= last]
    if job.name.endswith("excluded"):
        gap = job.exclude[1].split("..")
        gap_from, gap_to = (parse_iso(x + "Z") for x in gap)
        every = croniter_seconds("* * * * * *", lo - 1, hi)
        thirds = set(croniter_seconds("*/3 * * * * *", lo - 1, hi))
        return [t for t in every if t not in thirds and not gap_from <= t < gap_to]
    if job.name.endswith("runs"):
        assert job.max_runs is not None
        # Runs count from the first tick after the job was written (T0), not from the window.
        ticks = [t for t in range(T0 + 2000, int(hi) + 1, 2000)][: job.max_runs]
        return [t for t in ticks if lo <= t]
    raise AssertionError(f"no independent reading of {job.name}")


def trigger(seq: int, job: str, due: int, *, run: int | None = None, late: int = 20) -> Trigger:
    headers = {"Nats-Msg-Id": f"{job}:{due}", "Hrwcron-Job": job}
    if run is not None:
        headers["Hrwcron-Run"] = str(run)
    body = msgspec.json.encode({"job": job, "due_ms": due, "node": "r0", "attempt": 1})
    return parse_trigger(seq, f"hrwcron.trigger.{job}", body, headers, due + late)


def perfect_stream() -> list[Trigger]:
    """Every tick the independent reading expects, in due order; the run-limited job's runs
    before the window too, numbered from 1."""
    stream: list[Trigger] = []
    for name, job in JOBS.items():
        if name.endswith("runs"):
            assert job.max_runs is not None
            dues = [T0 + 2000 * (i + 1) for i in range(job.max_runs)]
            stream += [trigger(0, name, d, run=i + 1) for i, d in enumerate(dues)]
        else:
            stream += [trigger(0, name, d) for d in independent_dues(job, WINDOW)]
    stream.sort(key=lambda t: t.due_ms)
    return [
        parse_trigger(i + 1, t.subject, _body(t), dict(t.headers), t.stored_ms)
        for i, t in enumerate(stream)
    ]


def _body(t: Trigger) -> bytes:
    return msgspec.json.encode({"job": t.job, "due_ms": t.due_ms, "node": t.node, "attempt": 1})


def test_the_job_mix_has_every_plan_shape_and_the_plain_jobs() -> None:
    jobs = chaos_jobs(TIMINGS, T0, SPAN_S)
    assert len([j for j in jobs if not j.name.startswith(PLAN_PREFIX)]) == 15
    assert any(j.start and j.end for j in jobs)
    assert any(j.exclude for j in jobs)
    assert any(j.max_runs for j in jobs)
    assert sum(j.schedule.startswith("@at ") for j in jobs) >= 4
    for job in jobs:
        assert job.problems() == [], job.name


def test_the_checker_expects_exactly_what_an_independent_reading_expects() -> None:
    stream = perfect_stream()
    verdict = check(stream, list(JOBS.values()), WINDOW)
    assert verdict.ok, verdict.table()
    expected = sum(len(independent_dues(job, WINDOW)) for job in JOBS.values())
    assert verdict.ticks == expected
    # Not a vacuous mix: each shape has ticks inside the window, and rules some out.
    excluded = JOBS[f"{PLAN_PREFIX}excluded"]
    assert 0 < len(independent_dues(excluded, WINDOW)) < (WINDOW[1] - WINDOW[0]) / 1000 * 0.67
    assert len(independent_dues(JOBS[f"{PLAN_PREFIX}window"], WINDOW)) >= 20


def _planted(extra: Trigger) -> list[Trigger]:
    stream = perfect_stream()
    return [
        *stream,
        parse_trigger(
            len(stream) + 1, extra.subject, _body(extra), dict(extra.headers), extra.stored_ms
        ),
    ]


def _window_job() -> tuple[str, int, int]:
    job = JOBS[f"{PLAN_PREFIX}window"]
    assert job.start and job.end
    return job.name, parse_iso(job.start), parse_iso(job.end)


def test_a_tick_outside_the_window_is_caught() -> None:
    name, _, end = _window_job()
    verdict = check(_planted(trigger(0, name, end + 1000)), list(JOBS.values()), WINDOW)
    assert verdict.counts() == {"outside_window": 1}, verdict.table()
    name, start, _ = _window_job()
    before = [t for t in perfect_stream() if t.job != name]
    early = [trigger(0, name, start - 1000), *[t for t in perfect_stream() if t.job == name]]
    verdict = check([*before, *early], list(JOBS.values()), WINDOW)
    assert verdict.counts()["outside_window"] == 1, verdict.table()


def test_an_excluded_tick_fired_is_caught_naming_its_exclusion() -> None:
    name = f"{PLAN_PREFIX}excluded"
    third = next(t for t in croniter_seconds("*/3 * * * * *", WINDOW[0], WINDOW[1]))
    ok = [t for t in perfect_stream() if not (t.job == name and t.due_ms > third)]
    rest = [t for t in perfect_stream() if t.job == name and t.due_ms > third]
    stream = [*ok, trigger(0, name, third), *rest]
    verdict = check(stream, list(JOBS.values()), WINDOW)
    assert verdict.counts() == {"excluded": 1}, verdict.table()
    assert "*/3 * * * * *" in verdict.violations[0].detail
    gap_from = parse_iso(JOBS[name].exclude[1].split("..")[0] + "Z") + 1000  # 1 mod 3 or not
    in_gap = next(g for g in range(gap_from, gap_from + 4000, 1000) if g % 3000)
    verdict = check(_planted(trigger(0, name, in_gap)), list(JOBS.values()), WINDOW)
    assert verdict.counts().get("excluded") == 1, verdict.table()


def test_a_tick_after_max_runs_is_caught() -> None:
    name = f"{PLAN_PREFIX}runs"
    runs = JOBS[name].max_runs
    assert runs is not None
    after = T0 + 2000 * (runs + 1)
    verdict = check(_planted(trigger(0, name, after, run=runs + 1)), list(JOBS.values()), WINDOW)
    assert verdict.counts() == {"max_runs": 1}, verdict.table()
    assert f"run {runs + 1} of a job with max_runs {runs}" in verdict.violations[0].detail


def test_a_run_numbered_out_of_turn_is_caught() -> None:
    name = f"{PLAN_PREFIX}runs"
    stream = [
        trigger(t.seq, t.job, t.due_ms, run=int(t.headers["Hrwcron-Run"]) + 1)
        if t.job == name and t.headers.get("Hrwcron-Run") == "3"
        else t
        for t in perfect_stream()
    ]
    verdict = check(stream, list(JOBS.values()), WINDOW)
    assert verdict.counts() == {"max_runs": 1}, verdict.table()


def test_a_missed_tick_is_missing_and_the_runs_go_on_after_it() -> None:
    name = f"{PLAN_PREFIX}runs"
    runs = JOBS[name].max_runs
    assert runs is not None
    # The fifth tick was never fired; the runs go on, numbered on, one tick further.
    dues = [T0 + 2000 * (i + 1) for i in range(runs + 1) if i != 4]
    others = [t for t in perfect_stream() if t.job != name]
    mine = [trigger(0, name, d, run=i + 1) for i, d in enumerate(dues)]
    verdict = check([*others, *mine], list(JOBS.values()), WINDOW)
    assert verdict.counts() == {"missing": 1}, verdict.table()
    assert verdict.violations[0].due_ms == T0 + 10_000


@pytest.mark.parametrize("where", ["wrong instant", "not at all"])
def test_a_one_time_job_fires_at_its_instant_and_only_there(where: str) -> None:
    name = f"{PLAN_PREFIX}at01"
    at = parse_iso(JOBS[name].schedule.removeprefix("@at "))
    stream = [t for t in perfect_stream() if t.job != name]
    if where == "wrong instant":
        stream.append(trigger(len(stream) + 1, name, at + 1000))
        expect = {"stray": 1, "missing": 1}
    else:
        expect = {"missing": 1}
    verdict = check(stream, list(JOBS.values()), WINDOW)
    assert verdict.counts() == expect, verdict.table()
