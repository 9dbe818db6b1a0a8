"""Failover: ``kill -9`` the replica that owns a third of M every-second jobs, R times, then one
graceful stop; the worst lateness after each stop, and every tick of the run checked for loss and
duplication against the trigger stream.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from hrwcron.core import hrw
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import HEADER_JOB, HEADER_WATERMARK

from .common import (
    Deployment,
    Stored,
    last_seq,
    now_ms,
    put_jobs,
    read_stream,
    sleep_until,
    stores_for,
)

EVERY_SECOND = "* * * * * *"
# After a stop: the dead member's heartbeat expires after member_ttl (3 s by default) and its
# ticks move at once; until then its successors act one failover_step (1 s) late. Watching 7 s
# covers both with room for a claim takeover (claim_lease, 2 s).
OBSERVE_S = 7


@dataclass
class Stop:
    node: str
    graceful: bool
    at_ms: float
    owned: int = 0
    worst_ms: float = math.nan  # worst lateness of the stopped replica's ticks
    others_worst_ms: float = math.nan  # worst lateness of everybody else's ticks meanwhile
    stop_took_s: float = math.nan


@dataclass
class FailoverResult:
    jobs: int
    deployment: str
    stops: list[Stop] = field(default_factory=list)
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    checked_from_ms: float = 0
    checked_to_ms: float = 0

    @property
    def kills(self) -> list[Stop]:
        return [s for s in self.stops if not s.graceful]


def check_ticks(
    stored: list[Stored], names: list[str], begin_ms: int, end_ms: int
) -> tuple[int, int, int]:
    """(expected, lost, duplicated) for every-second ticks due in [begin_ms, end_ms)."""
    seen: Counter[tuple[str, int]] = Counter()
    for msg in stored:
        due = int(msg.headers.get(HEADER_WATERMARK, "0"))
        if begin_ms <= due < end_ms:
            seen[(msg.headers.get(HEADER_JOB, ""), due)] += 1
    expected = lost = 0
    for name in names:
        for due in range(begin_ms, end_ms, 1000):
            expected += 1
            lost += seen[(name, due)] == 0
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    return expected, lost, duplicated


async def run(dep: Deployment, jobs: int, kills: int, seed: int, log: object) -> FailoverResult:
    rng = random.Random(seed)
    result = FailoverResult(jobs=jobs, deployment=dep.kind)
    config = dep.config()
    stores = await stores_for(config)
    js = stores.client.jetstream()
    fleet = dep.fleet("failover")
    names = [f"f-{i}" for i in range(jobs)]
    try:
        fleet.start(3)
        await fleet.wait_ready(timeout=90)
        nodes = [r.node for r in fleet.members]
        await fleet.wait_members(nodes)
        first_seq = await last_seq(js, config.scheduler.stream) + 1
        await put_jobs(stores, [JobSpec(name=n, schedule=EVERY_SECOND) for n in names])
        begin_ms = (math.ceil(now_ms() / 1000) + 3) * 1000
        await sleep_until(begin_ms + 2000)
        plan = [(i % 3, False) for i in range(kills)] + [(kills % 3, True)]
        for index, graceful in plan:
            victim = fleet.members[index]
            owned = sum(1 for n in names if hrw.owner(n, nodes) == victim.node)
            # Somewhere inside a second, so some stops land between a claim and its publish.
            at = (math.ceil(now_ms() / 1000) + 1) * 1000 + rng.randrange(1000)
            await sleep_until(at)
            stop = Stop(victim.node, graceful, now_ms(), owned)
            if graceful:
                stop.stop_took_s = victim.terminate()
            else:
                victim.kill()
            result.stops.append(stop)
            await sleep_until(stop.at_ms + OBSERVE_S * 1000)
            victim.start()
            await fleet.wait_ready([victim], timeout=60)
            await fleet.wait_members(nodes)
            log(  # type: ignore[operator]
                f"  {'stop' if graceful else 'kill -9'} {victim.node} ({owned} jobs) done"
            )
        end_ms = (math.floor(now_ms() / 1000) - 2) * 1000
        await sleep_until(end_ms + 4000)
        stored = await read_stream(
            js,
            config.scheduler.stream,
            f"{config.scheduler.subject_prefix}.>",
            start_seq=first_seq,
        )
        result.checked_from_ms, result.checked_to_ms = begin_ms, end_ms
        result.expected, result.lost, result.duplicated = check_ticks(
            stored, names, begin_ms, end_ms
        )
        _worst_per_stop(result, stored, nodes)
        for s in result.stops:
            log(  # type: ignore[operator]
                f"  {'stop' if s.graceful else 'kill'} {s.node}: worst {s.worst_ms:.0f} ms "
                f"(others {s.others_worst_ms:.0f} ms)"
            )
        log(  # type: ignore[operator]
            f"  {result.expected} ticks checked: {result.lost} lost, {result.duplicated} duplicated"
        )
    finally:
        fleet.stop()
        await stores.client.close()
    return result


def _worst_per_stop(result: FailoverResult, stored: list[Stored], nodes: list[str]) -> None:
    by_due: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for msg in stored:
        due = int(msg.headers.get(HEADER_WATERMARK, "0"))
        by_due[due].append((msg.headers.get(HEADER_JOB, ""), msg.stored_ms - due))
    for stop in result.stops:
        mine: list[float] = []
        others: list[float] = []
        # Ticks due from the last whole second before the stop to the end of the watch.
        first = int(stop.at_ms // 1000) * 1000
        for due in range(first, first + OBSERVE_S * 1000, 1000):
            for job, lateness in by_due.get(due, []):
                (mine if hrw.owner(job, nodes) == stop.node else others).append(lateness)
        stop.worst_ms = max(mine) if mine else math.nan
        stop.others_worst_ms = max(others) if others else math.nan
