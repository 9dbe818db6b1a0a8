"""The job list: a query (text, state, tag, owner, missed in the last hour, page), the jobs it
finds through the index, and the page of rows to show.

A query costs the index's search (in C) plus set lookups per matching name when filtered, and
the status of the rows on its page only: at 100,000 jobs it answers in tens of milliseconds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hrwcron.adapters.http import BadRequest
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.status import ReplicaStatus
from hrwcron.console.index import Facets, JobIndex, Names, every_bit, set_bits, to_mask
from hrwcron.core.plan import Allowance
from hrwcron.engine.queries import EngineQueries

STATES = ("waiting", "active", "paused", "done", "ended", "bad")
PAGE = 50
MAX_PAGE = 200
MAX_START = 1_000_000
HOUR_MS = 3_600_000
_TEXT = 200


@dataclass(frozen=True)
class ListQuery:
    q: str = ""
    state: str = ""
    tag: str = ""
    owner: str = ""
    missed: bool = False
    start: int = 0
    limit: int = PAGE

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ListQuery:
        """The query of a /jobs URL; BadRequest names the parameter that is wrong."""
        texts = {}
        for key in ("q", "state", "tag", "owner"):
            value = query.get(key, "").strip()
            if len(value) > _TEXT:
                raise BadRequest(f"{key} is longer than {_TEXT} characters")
            texts[key] = value
        if texts["state"] and texts["state"] not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}")
        numbers = {}
        for key, default, most in (("start", 0, MAX_START), ("limit", PAGE, MAX_PAGE)):
            raw = query.get(key, "")
            if not raw:
                numbers[key] = default
                continue
            if not raw.isdigit() or int(raw) > most or (key == "limit" and int(raw) < 1):
                raise BadRequest(f"{key} must be an integer up to {most}")
            numbers[key] = int(raw)
        return cls(
            q=texts["q"],
            state=texts["state"],
            tag=texts["tag"],
            owner=texts["owner"],
            missed=query.get("missed", "") in ("1", "on", "true"),
            start=numbers["start"],
            limit=numbers["limit"],
        )

    def criteria(self) -> dict[str, str]:
        """What this query asks for, whatever its page: its text and filters, as non-empty
        form fields (what ``parse`` reads back)."""
        fields = {"q": self.q, "state": self.state, "tag": self.tag, "owner": self.owner}
        fields["missed"] = "1" if self.missed else ""
        return {k: v for k, v in fields.items() if v}

    def described(self) -> str:
        """The criteria in words, for a confirmation and the audit log."""
        said = ", ".join(f"{k}={v!r}" for k, v in self.criteria().items())
        return said or "every job"

    @property
    def filtered(self) -> bool:
        return bool(self.state or self.tag or self.owner or self.missed)

    def url(self, **changes: Any) -> str:
        chosen = replace(self, **changes)
        args: dict[str, object] = {
            "q": chosen.q,
            "state": chosen.state,
            "tag": chosen.tag,
            "owner": chosen.owner,
            "missed": "1" if chosen.missed else "",
            "start": chosen.start or "",
            "limit": chosen.limit if chosen.limit != PAGE else "",
        }
        kept = {k: v for k, v in args.items() if v != ""}
        return "/jobs?" + urlencode(kept) if kept else "/jobs"


@dataclass
class ListResult:
    query: ListQuery
    total: int
    rows: list[dict[str, Any]]
    revision: int
    took_ms: float
    # Holding a share: what the list covers, and a job named by the search held elsewhere.
    share: str = ""
    elsewhere: str = ""


class IndexMetrics(Collector):
    """The latest build of each kind (names, names checked, facets, facets updated): the
    longest turn of the event loop it held, and how long it took in all."""

    def __init__(self, index: JobIndex) -> None:
        self._index = index

    def collect(self) -> Iterator[GaugeMetricFamily]:
        turn = GaugeMetricFamily(
            "hrwcron_console_index_longest_turn_seconds",
            "The longest the console's latest build of its job index or filters, of each kind, "
            "held the event loop at once",
            labels=["build"],
        )
        took = GaugeMetricFamily(
            "hrwcron_console_index_build_seconds",
            "How long the console's latest build of its job index or filters, of each kind, "
            "took from start to end (in slices)",
            labels=["build"],
        )
        for build, (longest, whole) in sorted(self._index.timings.items()):
            turn.add_metric([build], longest)
            took.add_metric([build], whole)
        yield turn
        yield took


class Lister:
    def __init__(
        self, scheduler: EngineQueries, status: ReplicaStatus, telemetry: Telemetry
    ) -> None:
        self._s = scheduler
        self._status = status
        self._telemetry = telemetry
        self.index = JobIndex(scheduler.clock.monotonic)
        self._metrics = IndexMetrics(self.index)
        telemetry.registry.register(self._metrics)
        # The searches for states of jobs with windows and exclusions, shared by one build.
        self._allowance = Allowance()

    def close(self) -> None:
        """Take this index's metrics off the registry: a start that failed after building
        the console leaves the registry as it found it for the next attempt."""
        self._telemetry.registry.unregister(self._metrics)

    async def find(self, query: ListQuery) -> ListResult:
        began = time.perf_counter()
        s = self._s
        revision = s.jobs_revision
        names = await self.index.names(revision, lambda: [*s.jobs, *s.skipped])
        if query.filtered:
            chosen, total = await self._filtered(names, query)
        else:
            found = (names.names[i] for i in names.matches(query.q))
            chosen = list(itertools.islice(found, query.start, query.start + query.limit))
            short = len(chosen) < query.limit and (chosen or not query.start)
            # A short page was the last: its end is the count, without a second search.
            total = query.start + len(chosen) if short else names.count(query.q)
        rows = await self.rows(chosen)
        took = (time.perf_counter() - began) * 1000
        return ListResult(query, total, rows, revision, took)

    async def _filtered(self, names: Names, query: ListQuery) -> tuple[list[str], int]:
        """The search's matches (prefix ones, then the others) and every filter as bitmasks
        over the names: their intersection is counted and paged in C."""
        first, then = await self._masks(names, query)
        ahead = first.bit_count()
        total = ahead + then.bit_count()
        start, end = query.start, query.start + query.limit
        positions = set_bits(first, start, query.limit) if start < ahead else []
        if len(positions) < query.limit and end > ahead:
            positions += set_bits(then, max(0, start - ahead), query.limit - len(positions))
        return [names.names[p] for p in positions], total

    async def _masks(self, names: Names, query: ListQuery) -> tuple[int, int]:
        """The jobs ``query`` finds as two bitmasks over ``names``: the prefix matches of its
        text, then the other names holding it, each within every filter."""
        everyone = (1 << len(names.names)) - 1
        wanted = everyone
        if query.state or query.tag or query.owner:
            facets = await self.facets(names)
            if query.state:
                wanted &= facets.by_state.get(query.state, 0)
            if query.tag:
                wanted &= facets.by_tag.get(query.tag, 0)
            if query.owner:
                wanted &= facets.by_owner.get(query.owner, 0)
        if query.missed:
            since = self._s.clock.now_ms() - HOUR_MS
            missed = self._telemetry.tick_log.missed_since(since)
            found = (names.position(n) for n in missed)
            wanted &= to_mask((p for p in found if p is not None), len(names.names))
        first, then = names.masks(query.q)
        return first & wanted, then & wanted

    async def matching(self, query: ListQuery, most: int) -> tuple[list[str], int]:
        """Every job ``query`` finds, whatever its page (``start`` and ``limit`` do not
        count), in the list's order, and how many they are; no names when over ``most``."""
        s = self._s
        names = await self.index.names(s.jobs_revision, lambda: [*s.jobs, *s.skipped])
        first, then = await self._masks(names, query)
        total = first.bit_count() + then.bit_count()
        if total > most:
            return [], total
        return [names.names[p] for p in (*every_bit(first), *every_bit(then))], total

    async def facets(self, names: Names | None = None) -> Facets:
        s = self._s
        if names is None:
            names = await self.index.names(s.jobs_revision, lambda: [*s.jobs, *s.skipped])
        self._allowance = Allowance()  # for this build, should it happen
        live = tuple(self._telemetry.live)
        return await self.index.facets(names, live, self._facet_row, self._version)

    def _version(self, name: str) -> int:
        job = self._s.jobs.get(name)
        if job is not None:
            return job.revision
        skipped = self._s.skipped.get(name)
        return skipped[0] if skipped is not None else -1

    def _facet_row(self, name: str) -> tuple[list[str], str, list[str]]:
        s = self._s
        job = s.jobs.get(name)
        if job is None:
            return [], "", ["bad"]  # a stored spec not loaded, or deleted since
        spec = job.spec
        if spec.paused:
            state = "paused"
        elif job.plan.plain and spec.max_runs is None and job.due is not None:
            state = "active"  # most jobs: no window, no run limit, a next tick
        else:
            state = s.progress(name, self._allowance).state
        order = s.ranking_of(name)
        return (
            list(spec.tags),
            order[0] if order else "",
            [state, "bad"] if job.problem else [state],
        )

    async def rows(self, names: list[str]) -> list[dict[str, Any]]:
        """Status rows for ``names`` in their order; a stored spec the replica could not load
        is a row of its own, in state bad."""
        s = self._s
        loaded = await self._status.job_rows([n for n in names if n in s.jobs])
        by_name = {row["name"]: row for row in loaded}
        rows = []
        for name in names:
            row = by_name.get(name)
            if row is None and name in s.skipped:
                row = {"name": name, "state": "bad", "problem": s.skipped[name][1], "bad": True}
            if row is not None:
                row.setdefault("bad", bool(row.get("problem")))
                rows.append(row)
        return rows
