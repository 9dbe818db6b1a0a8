"""Everything the page of one job shows, gathered from this replica: its spec, where it stands,
its next ticks with the plan's explanation, who fires it and who takes over, a page of its
run history from the trigger stream, and what went wrong lately."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgspec

from hrwcron.adapters.telemetry import Telemetry
from hrwcron.adapters.tick_log import Trouble
from hrwcron.admin.api import HistoryReply, JobEntry, StatusReply
from hrwcron.admin.replies import ApiError
from hrwcron.admin.service import AdminService
from hrwcron.admin.status import ReplicaStatus
from hrwcron.core.errors import ScheduleError
from hrwcron.core.explain import Explanation, explain_next, utc_offset, why_fewer
from hrwcron.core.model import JobSpec
from hrwcron.core.plan import TickPlan, parse_rfc3339
from hrwcron.core.schedule import Schedule, jitter_ms
from hrwcron.engine.queries import EngineQueries

NEXT_COUNT = 10
HISTORY_PAGE = 20
SPEC_SHOWN = 20_000


@dataclass
class NextTick:
    due: int
    fire: int
    rule: str | None
    until: int | None
    offset_change: tuple[timedelta, timedelta] | None  # DST: the zone's offset moved


@dataclass
class JobView:
    name: str
    entry: JobEntry | None  # as stored (None: the bucket has no such job any more)
    row: dict[str, Any] | None  # the status row, when this replica runs the job
    spec_json: str = ""
    problem: str = ""  # why the stored spec is not loaded, or the server refused a trigger
    ticks: list[NextTick] = field(default_factory=list)
    ending: str = ""  # why fewer ticks than asked for are listed
    notes: list[str] = field(default_factory=list)  # jitter, H, zone, window
    live: list[str] = field(default_factory=list)
    history: HistoryReply | None = None
    history_error: str = ""
    troubles: list[Trouble] = field(default_factory=list)
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class _Planned:
    """What the explanation of the next ticks reads of a job, for a job held elsewhere."""

    spec: JobSpec
    plan: TickPlan
    schedule: Schedule
    jitter_ms: int


def _instant(text: str | None) -> int | None:
    return parse_rfc3339(text, "instant") if text else None


def lateness_ms(entry: Any) -> float | None:
    """How long after its due instant the stream stored a scheduled trigger."""
    if entry.kind != "scheduled" or not entry.due or not entry.stored:
        return None
    try:
        return float(parse_rfc3339(entry.stored, "stored") - parse_rfc3339(entry.due, "due"))
    except ScheduleError:
        return None


class JobViews:
    def __init__(
        self,
        scheduler: EngineQueries,
        status: ReplicaStatus,
        telemetry: Telemetry,
        admin: AdminService,
    ) -> None:
        self._s = scheduler
        self._status = status
        self._telemetry = telemetry
        self._admin = admin

    async def view(self, name: str, before: int = 0) -> JobView:
        """Raises ApiError (not_found for a job the bucket does not hold, bad_request for a
        bad name) exactly as the admin API would."""
        s = self._s
        found = await self._admin.call("jobs.get", msgspec.json.encode({"name": name}))
        assert isinstance(found, JobEntry)
        view = JobView(name, found, None, now_ms=int(s.clock.now_ms()))
        view.live = list(self._telemetry.live)
        if found.spec is not None:
            text = msgspec.json.format(msgspec.json.encode(found.spec), indent=2).decode()
            view.spec_json = text if len(text) <= SPEC_SHOWN else text[:SPEC_SHOWN] + "\n…"
        view.problem = found.error or (s.skipped[name][1] if name in s.skipped else "")
        job = s.jobs.get(name)
        if job is not None:
            rows = await self._status.job_rows([name])
            view.row = rows[0] if rows else None
            view.problem = view.problem or job.problem
            left = view.row.get("runs_left") if view.row else None
            self._explain(view, job, left)
        elif found.spec is not None and s.held_lanes is not None and not view.problem:
            await self._held_elsewhere(view, found.spec)
        try:
            request = {"name": name, "limit": HISTORY_PAGE, "before": before}
            history = await self._admin.call("history", msgspec.json.encode(request))
            assert isinstance(history, HistoryReply)
            view.history = history
        except ApiError as exc:
            view.history_error = exc.message
        view.troubles = self._telemetry.tick_log.troubles(name)
        return view

    async def _held_elsewhere(self, view: JobView, spec: JobSpec) -> None:
        """Holding a share without this job: where it stands as a replica that holds it says
        (the admin call goes there), its next ticks worked out here from its spec."""
        request = {"name": view.name, "limit": 1}
        try:
            reply = await self._admin.call("status", msgspec.json.encode(request))
        except ApiError as exc:
            view.problem = f"no replica that holds it answered ({exc.message})"
            return
        assert isinstance(reply, StatusReply)
        if not reply.jobs:
            return
        found = reply.jobs[0]
        view.row = {
            "state": found.state,
            "next_due_ms": _instant(found.next_due),
            "next_due": found.next_due or "",
            "next_fire_ms": _instant(found.next_fire),
            "runs_left": found.runs_left,
            "max_runs": spec.max_runs,
            "last": {"tick": found.last.tick, "seq": found.last.seq} if found.last else None,
            "failover": found.order,
            "owner": found.owner,
        }
        view.problem = found.problem
        plan = spec.plan()
        planned = _Planned(spec, plan, plan.schedule, jitter_ms(spec.name, spec.jitter))
        self._explain(view, planned, found.runs_left)

    def _explain(self, view: JobView, job: Any, runs_left: int | None) -> None:
        spec = job.spec
        if spec.paused:
            view.notes.append("paused: no tick fires until it is resumed")
        found: Explanation = explain_next(job.plan, view.now_ms, NEXT_COUNT, runs_left)
        previous = utc_offset(view.now_ms, spec.tz)
        for instant in found.instants:
            offset = utc_offset(instant.due, spec.tz)
            change = (previous, offset) if offset != previous else None
            previous = offset
            view.ticks.append(
                NextTick(
                    instant.due, instant.due + job.jitter_ms, instant.rule, instant.until, change
                )
            )
        if found.exhausted:
            view.ending = (
                "the search stopped: the exclusions are too dense to tell whether a further "
                "tick fires"
            )
        elif found.found < NEXT_COUNT:
            view.ending = why_fewer(job.plan, found, runs_left)
        if job.jitter_ms:
            view.notes.append(
                f"jitter: each trigger is published {job.jitter_ms / 1000:.3f} s after its due "
                "instant (hashed from the job's name, the same on every replica)"
            )
        if job.schedule.job is not None:  # only a schedule with H knows its job's name
            view.notes.append(
                "H in the schedule stands for values hashed from the job's name, so jobs "
                "with the same expression spread out; the instants below are this job's"
            )
        if spec.tz != "UTC":
            view.notes.append(
                f"evaluated on wall-clock time in {spec.tz}: a fixed time that a daylight-saving "
                "gap swallows fires at the end of the gap, a repeated hour fires once; ticks "
                "across a change of the zone's offset are marked"
            )
        if spec.start or spec.end:
            window = " ".join(
                part
                for part in (
                    f"from {spec.start}" if spec.start else "",
                    f"until {spec.end}" if spec.end else "",
                )
                if part
            )
            view.notes.append(f"window: ticks only {window}")
