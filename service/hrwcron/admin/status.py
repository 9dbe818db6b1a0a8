"""The status document of one replica: members, a summary of every job, a page of jobs (soonest
due first) with owner and failover order, next and last triggers, and the next hour's ticks per
member.

Like app.py this module knows the concrete scheduler and telemetry; the HTTP server only sees
plain dicts. Big job sets are handled in slices with a budget, so a status request never
stalls the event loop that fires ticks, and whatever the number of jobs the document holds
the summary and one page of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from hrwcron import __version__
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.job_pages import by_due, format_due_cursor, parse_due_cursor, summary
from hrwcron.admin.ticks_ahead import count_ticks_ahead
from hrwcron.core.plan import Allowance
from hrwcron.core.ticks import format_ms
from hrwcron.engine.pacing import Slices
from hrwcron.engine.queries import EngineQueries

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
TIMELINE_MS = 3_600_000
TIMELINE_BUCKET_MS = 60_000
# Enough for a few hundred minutely jobs or a handful of every-second ones; beyond it the
# timeline says it is partial rather than spending the event loop on a picture.
TIMELINE_TICK_BUDGET = 20_000
TIMELINE_SEARCH_BUDGET = 50_000
PAYLOAD_PREVIEW = 200
_SLICE = 500


def _payload_preview(payload: Any) -> str:
    if payload is None:
        return ""
    try:
        text = msgspec.json.encode(payload).decode()
    except (TypeError, msgspec.EncodeError):
        return "(not JSON)"
    if len(text) > PAYLOAD_PREVIEW:
        return text[: PAYLOAD_PREVIEW - 1] + "…"
    return text


class ReplicaStatus:
    """Readiness and status of a running replica, read-only."""

    def __init__(
        self,
        scheduler: EngineQueries,
        telemetry: Telemetry,
        connected: Callable[[], bool] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.telemetry = telemetry
        self._connected = connected

    def not_ready_reason(self) -> str:
        """Empty when ready. A lost connection shows at once, before heartbeats go stale."""
        reason = self.scheduler.not_ready_reason
        if not reason and self._connected is not None and not self._connected():
            return "not connected to NATS"
        return reason

    async def status(
        self,
        limit: int = DEFAULT_LIMIT,
        timeline: bool = False,
        *,
        prefix: str = "",
        after: str = "",
    ) -> dict[str, Any]:
        """``after`` is the ``next`` of the previous page; ValueError when it is not one."""
        limit = max(1, min(limit, MAX_LIMIT))
        position = parse_due_cursor(after)
        s = self.scheduler
        now = s.clock.now_ms()
        reason = self.not_ready_reason()
        doc: dict[str, Any] = {
            "node": s.node,
            "instance": s.instance,
            "version": __version__,
            "ready": not reason,
            "reason": reason,
            "now_ms": int(now),
            "now": format_ms(int(now)),
            "clock_offset_ms": round(s.clock.offset_ms, 1),
            "digest": s.digest,
            "failover_step_s": s.settings.failover_step,
            "members": self._members(),
            "live": list(self.telemetry.live),
            "summary": msgspec.to_builtins(await summary(s)),
            "owned_total": self.telemetry.owned_count,
            "limit": limit,
            "prefix": prefix,
            "order": "due",
        }
        names = [n for n in s.jobs if n.startswith(prefix)] if prefix else list(s.jobs)
        doc["jobs_total"] = len(names)
        keys = await by_due(s, names, position, limit + 1)
        shown = [name for _, name in keys[:limit]]
        await s.refresh_last(shown)
        doc["jobs"] = await self._jobs(shown)
        doc["next"] = format_due_cursor(keys[limit - 1]) if len(keys) > limit else ""
        doc["owned"] = await self._owned(limit, now)
        # Specs this replica could not load, then loaded jobs whose triggers the server refused.
        doc["bad_jobs"] = [
            {"name": name, "error": error}
            for name, error in self.telemetry.bad_jobs.items()
            if name not in s.jobs
        ][:limit]
        failing = sorted((name, job.problem) for name, job in s.jobs.items() if job.problem)
        doc["bad_jobs"] += [{"name": name, "error": problem} for name, problem in failing][
            : max(0, limit - len(doc["bad_jobs"]))
        ]
        if timeline:
            doc["timeline"] = await self._timeline(now)
        return doc

    async def job_rows(self, names: list[str]) -> list[dict[str, Any]]:
        """The status document's entries for ``names``, their newest triggers read first;
        names no longer loaded are left out."""
        await self.scheduler.refresh_last(names)
        return await self._jobs(names)

    def members(self) -> list[dict[str, Any]]:
        return self._members()

    def _members(self) -> list[dict[str, Any]]:
        s = self.scheduler
        live = set(self.telemetry.live)
        out = []
        for node, (hb, age) in sorted(s.view.heartbeats().items()):
            out.append(
                {
                    "node": node,
                    "self": node == s.node,
                    "heartbeat_age_s": round(age, 3),
                    "live": node in live,
                    "ready": hb.ready,
                    "reason": hb.reason,
                    "weight": hb.weight,
                    "tags": list(hb.tags),
                    "digest": hb.digest,
                    "digest_matches": hb.digest == s.digest,
                    "jobs": hb.jobs,
                    "version": hb.version,
                    "started": format_ms(hb.started_ms) if hb.started_ms else "",
                    "offset_ms": hb.offset_ms,
                }
            )
        return out

    def _last(self, name: str, subject: str) -> dict[str, Any] | None:
        last = self.scheduler.last.get(subject)
        if last is None:
            return None
        out: dict[str, Any] = {
            "tick": last.msg_id,
            "seq": last.seq,
            "due_ms": last.watermark,
            "due": format_ms(last.watermark) if last.watermark else "",
            "by": None,
            "lateness_ms": None,
            "seen_after_ms": None,
        }
        fired = self.telemetry.fired.get(name)
        seen = self.telemetry.seen.get(subject)
        if fired is not None and fired.due_ms == last.watermark:
            out["by"] = self.scheduler.node
            out["lateness_ms"] = round(fired.lateness_ms, 1)
        elif seen is not None and seen.live and seen.seq == last.seq and last.watermark:
            # Fired by another replica: when it went by here bounds its lateness from above.
            out["seen_after_ms"] = round(seen.seen_ms - last.watermark, 1)
        return out

    async def _jobs(self, names: list[str]) -> list[dict[str, Any]]:
        s = self.scheduler
        out = []
        allowance = Allowance()
        slices = Slices()
        for name in names:
            if slices.spent():
                await asyncio.sleep(0)
            job = s.jobs.get(name)
            if job is None:  # deleted while this request yielded
                continue
            spec = job.spec
            order = s.ranking_of(name)
            progress = s.progress(name, allowance)
            due = progress.next_due
            fire = due + job.jitter_ms if due is not None else None
            out.append(
                {
                    "name": name,
                    "schedule": spec.schedule,
                    "tz": spec.tz,
                    "paused": spec.paused,
                    "state": progress.state,
                    "start": spec.start,
                    "end": spec.end,
                    "exclude": list(spec.exclude),
                    "max_runs": spec.max_runs,
                    "runs_done": progress.runs_done,
                    "runs_left": progress.runs_left,
                    "tags": list(spec.tags),
                    "description": spec.description,
                    "payload": _payload_preview(spec.payload),
                    "subject": job.subject,
                    "owner": order[0] if order else None,
                    "failover": order,
                    "rank": order.index(s.node) if s.node in order else None,
                    "next_due_ms": due,
                    "next_due": format_ms(due) if due is not None else "",
                    "next_fire_ms": fire,
                    "last": self._last(name, job.subject),
                    "problem": job.problem,
                }
            )
        return out

    async def _owned(self, limit: int, now: float) -> list[dict[str, Any]]:
        """Owned jobs, soonest first; rankings are computed only until ``limit`` are found."""
        s = self.scheduler
        upcoming = sorted(
            (job.due + job.jitter_ms, name) for name, job in s.jobs.items() if job.due is not None
        )
        out: list[dict[str, Any]] = []
        for index, (fire, name) in enumerate(upcoming):
            job = s.jobs.get(name)
            order = s.ranking_of(name) if job is not None else []
            if job is not None and order and order[0] == s.node:
                due = job.due or 0
                out.append(
                    {
                        "name": name,
                        "next_due_ms": due,
                        "next_due": format_ms(due),
                        "in_s": round((fire - now) / 1000, 3),
                    }
                )
                if len(out) >= limit:
                    break
            if index % _SLICE == _SLICE - 1:
                await asyncio.sleep(0)
        return out

    async def _timeline(self, now: float) -> dict[str, Any]:
        """Ticks of the next hour per owner in one-minute buckets, as ranked right now, within
        the bounds of ``admin/ticks_ahead.py`` (past them the timeline says it is partial)."""
        ahead = await count_ticks_ahead(
            self.scheduler,
            self.telemetry.live,
            int(now),
            span_ms=TIMELINE_MS,
            bucket_ms=TIMELINE_BUCKET_MS,
            tick_budget=TIMELINE_TICK_BUDGET,
            search_budget=TIMELINE_SEARCH_BUDGET,
        )
        start, rows, partial = ahead.start_ms, ahead.per_member, ahead.partial
        return {
            "start_ms": start,
            "start": format_ms(start),
            "bucket_ms": TIMELINE_BUCKET_MS,
            "members": rows,
            "partial": partial,
        }
