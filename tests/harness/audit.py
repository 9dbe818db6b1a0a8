"""The audit of a trigger stream against the jobs' whole plans: which ticks must be there, which
must not, and how each that is there was published.

A job's plan is the service's own (``JobSpec.plan()``, :mod:`hrwcron.core.plan`): its schedule
(cron, ``@every``, ``@at``) inside its window (``start``/``end``), with its exclusions; plus
``max_runs``, which the engine enforces from the stream itself. Reading the plan with the
service's code keeps the audit about the protocol (once, in order, on time), not about a
second reading of the calendar; ``tests/chaos/test_checker.py`` holds the calendar of the chaos
job mix to croniter and to plain arithmetic, so a plan that misreads it does not pass unseen.

Times are epoch milliseconds throughout.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hrwcron.core.errors import ScheduleError
from hrwcron.core.model import JobSpec
from hrwcron.core.plan import SEARCH_BUDGET, Allowance, TickPlan
from hrwcron.core.schedule import jitter_ms

__all__ = [
    "DUPLICATED",
    "EARLY",
    "EXCLUDED",
    "LATE",
    "MISSING",
    "OUTSIDE",
    "OUT_OF_ORDER",
    "RUNS",
    "STRAY",
    "Violation",
    "due_instants",
    "expected_dues",
    "find_violations",
    "first_copies",
]

MISSING = "missing"
DUPLICATED = "duplicated"
EARLY = "early"
LATE = "late"
OUT_OF_ORDER = "out_of_order"
STRAY = "stray"
EXCLUDED = "excluded"  # an instant the job's exclusions remove was fired
OUTSIDE = "outside_window"  # an instant of the schedule before start or after end was fired
RUNS = "max_runs"  # a trigger past max_runs, or numbered out of turn
RUN_HEADER = "Hrwcron-Run"


class Published(Protocol):
    """What the audit reads of a stored trigger (``harness.chaos.Trigger``)."""

    @property
    def seq(self) -> int: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def job(self) -> str: ...
    @property
    def due_ms(self) -> int: ...
    @property
    def stored_ms(self) -> float: ...
    @property
    def node(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def scheduled(self) -> bool: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Violation:
    """One way the stream breaks an invariant, for one tick of one job."""

    kind: str  # one of the constants above
    job: str
    due_ms: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.job}:{self.due_ms}: {self.detail}"


def _plan(spec: JobSpec) -> TickPlan:
    return spec.plan()


def due_instants(spec: JobSpec, start_ms: float, end_ms: float) -> list[int]:
    """The ticks of the job's plan that fire in ``[start_ms, end_ms]``: inside its window, not
    excluded (``max_runs`` is the stream's to settle, see :func:`find_violations`)."""
    # Each tick is a search step; a long run's window holds far more than one request's.
    steps = Allowance(2 * int(max(0.0, end_ms - start_ms)) + SEARCH_BUDGET)
    return list(_plan(spec).iter_firing(int(start_ms) - 1, until=int(end_ms), allowance=steps))


def expected_dues(
    spec: JobSpec, runs: Sequence[Published], window: tuple[float, float]
) -> list[int]:
    """The ticks that must be in the stream for ``window``: the plan's firing ones, and for a
    job with ``max_runs`` only up to its last allowed run once that many are in ``runs`` (the
    job's scheduled triggers, first copies, in stream order)."""
    end = window[1]
    if spec.max_runs is not None and len(runs) >= spec.max_runs:
        end = min(end, runs[spec.max_runs - 1].due_ms)
    return due_instants(spec, window[0], end)


def first_copies(triggers: Iterable[Published], job: str) -> list[Published]:
    """``job``'s scheduled triggers in stream order, each Msg-Id once."""
    seen: set[str] = set()
    found = []
    for trigger in triggers:
        if trigger.scheduled and trigger.job == job and trigger.msg_id not in seen:
            seen.add(trigger.msg_id)
            found.append(trigger)
    return found


def find_violations(
    triggers: Sequence[Published],
    jobs: Iterable[JobSpec],
    window: tuple[float, float],
    *,
    early_tolerance_ms: float = 50.0,
) -> list[Violation]:
    """Every invariant ``triggers`` break for ``jobs``; empty means the run was clean.

    * MISSING: a tick of the plan that fires in ``window`` (inclusive) without a trigger; for
      a job with ``max_runs``, only up to the due instant of its last allowed run, once that
      many have fired. Only the window is checked for completeness: ticks before the replicas
      started or after the test stopped reading are legitimately absent.
    * DUPLICATED: a Msg-Id stored more than once, anywhere in the log.
    * EARLY: stored before the fire instant (due + the job's jitter) by more than
      ``early_tolerance_ms``, by the server's timestamp.
    * LATE: stored after due + jitter + ``max_lateness``: past that nobody may publish.
    * OUT_OF_ORDER: a job's scheduled triggers not in increasing due order in the stream.
    * STRAY: a Msg-Id that is not ``<job>:<due ms>`` for an instant of the job's schedule.
    * OUTSIDE: an instant of the schedule outside the job's window (before ``start``, after
      ``end``).
    * EXCLUDED: an instant one of the job's exclusions covers.
    * RUNS: a scheduled trigger after the job's ``max_runs``-th, or whose ``Hrwcron-Run`` is
      not its place among the job's triggers (the stream must hold all of them: a job created
      for the test).

    Only scheduled triggers count; manual and backfill triggers are other Msg-Ids by design.
    Triggers of jobs not in ``jobs`` are ignored.
    """
    specs = {spec.name: spec for spec in jobs}
    found: list[Violation] = []
    per_job: dict[str, list[Published]] = defaultdict(list)
    for trigger in triggers:
        if trigger.scheduled and trigger.job in specs:
            per_job[trigger.job].append(trigger)
    for name, spec in specs.items():
        found += _audit_job(spec, per_job.get(name, []), window, early_tolerance_ms)
    return found


def _audit_job(
    spec: JobSpec, mine: list[Published], window: tuple[float, float], early_tolerance_ms: float
) -> list[Violation]:
    name, plan = spec.name, _plan(spec)
    jitter = jitter_ms(name, spec.jitter)
    found: list[Violation] = []
    seen: dict[str, Published] = {}
    previous: Published | None = None
    runs: list[Published] = []  # first copies, in stream order
    for trigger in mine:
        due = trigger.due_ms
        found += _placement(plan, name, trigger)
        first = seen.get(trigger.msg_id)
        if first is not None:
            # Its timing and order were judged on the first copy; report the copy once.
            found.append(
                Violation(
                    DUPLICATED,
                    name,
                    due,
                    f"seq {first.seq} (node {first.node}, attempt {first.attempt}) and "
                    f"seq {trigger.seq} (node {trigger.node}, attempt {trigger.attempt})",
                )
            )
            continue
        seen[trigger.msg_id] = trigger
        runs.append(trigger)
        fire = due + jitter
        if trigger.stored_ms < fire - early_tolerance_ms:
            found.append(
                Violation(
                    EARLY,
                    name,
                    due,
                    f"seq {trigger.seq} stored {fire - trigger.stored_ms:.0f} ms before its "
                    f"fire instant (node {trigger.node})",
                )
            )
        if trigger.stored_ms > fire + spec.max_lateness_ms:
            found.append(
                Violation(
                    LATE,
                    name,
                    due,
                    f"seq {trigger.seq} stored {trigger.stored_ms - fire:.0f} ms after its "
                    f"fire instant; max_lateness is {spec.max_lateness:g} s "
                    f"(node {trigger.node})",
                )
            )
            continue
        if previous is not None and due <= previous.due_ms:
            found.append(
                Violation(
                    OUT_OF_ORDER,
                    name,
                    due,
                    f"seq {trigger.seq} comes after seq {previous.seq} (due {previous.due_ms})",
                )
            )
        previous = trigger
    if spec.max_runs is not None:
        found += _run_count(spec, runs)
    published = {t.due_ms for t in mine}
    for due in expected_dues(spec, runs, window):
        if due not in published:
            found.append(Violation(MISSING, name, due, "no trigger in the stream"))
    return found


def _placement(plan: TickPlan, name: str, trigger: Published) -> list[Violation]:
    """Whether the trigger names an instant of the plan that fires: the schedule's, inside the
    window, not excluded."""
    due = trigger.due_ms
    if trigger.msg_id != f"{name}:{due}" or _next(plan.schedule.next_after, due - 1) != due:
        return [Violation(STRAY, name, due, f"seq {trigger.seq} has Msg-Id {trigger.msg_id!r}")]
    if plan.next_after(due - 1) != due:
        return [
            Violation(
                OUTSIDE,
                name,
                due,
                f"seq {trigger.seq} fired an instant outside the window "
                f"(start {plan.start_ms}, end {plan.end_ms}; node {trigger.node})",
            )
        ]
    exclusion = plan.excluded_by(due)
    if exclusion is not None:
        return [
            Violation(
                EXCLUDED,
                name,
                due,
                f"seq {trigger.seq} fired an instant excluded by {exclusion.text!r} "
                f"(node {trigger.node})",
            )
        ]
    return []


def _next(step: Callable[[int], int], instant: int) -> int | None:
    """``schedule.next_after``, None past a one-time schedule's instant."""
    try:
        return step(instant)
    except ScheduleError:
        return None


def _run_count(spec: JobSpec, runs: list[Published]) -> list[Violation]:
    assert spec.max_runs is not None
    found = []
    for place, trigger in enumerate(runs, start=1):
        header = trigger.headers.get(RUN_HEADER)
        if place > spec.max_runs:
            found.append(
                Violation(
                    RUNS,
                    spec.name,
                    trigger.due_ms,
                    f"seq {trigger.seq} is run {place} of a job with max_runs {spec.max_runs} "
                    f"(node {trigger.node})",
                )
            )
        elif header is not None and header != str(place):
            found.append(
                Violation(
                    RUNS,
                    spec.name,
                    trigger.due_ms,
                    f"seq {trigger.seq} carries {RUN_HEADER} {header} as run {place}",
                )
            )
    return found
