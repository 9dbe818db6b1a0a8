"""Worker SDK processes for fault tests, and the run log their handlers write.

:func:`worker_process` starts ``worker_child.py`` (a real :class:`hrwcron.worker.Worker` in its
own process, so it can be killed with SIGKILL or stopped with SIGSTOP) as a
:class:`ReplicaProcess`; :func:`read_runs` reads back what the handlers appended, and
:func:`audit_runs` says, per tick, whether it ran and whether every extra run is one the SDK
documents and counts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .procs import ReplicaProcess

CHILD = Path(__file__).resolve().parent / "worker_child.py"

__all__ = ["CHILD", "RunAudit", "RunEvent", "audit_runs", "read_runs", "worker_process"]


def worker_process(
    url: str,
    runs: Path,
    name: str,
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
    start: bool = True,
) -> ReplicaProcess:
    """A worker child connected to ``url`` whose handler appends to ``runs``."""
    # -P: the script's own directory is not put on sys.path, where harness/nats.py would
    # shadow the nats package.
    args = ["-P", str(CHILD), "--url", url, "--runs", str(runs), "--name", name, *options]
    return ReplicaProcess(args, env, log_path, module=None, start=start)


@dataclass(frozen=True)
class RunEvent:
    event: str  # start | end | cancelled
    tick: str
    worker: str
    pid: int
    takeover: bool = False
    delivered: int = 0


def read_runs(path: Path) -> list[RunEvent]:
    """Every event the handlers appended to ``path``, in file order."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        item = json.loads(line)
        events.append(
            RunEvent(
                event=item["event"],
                tick=item["tick"],
                worker=item["worker"],
                pid=int(item["pid"]),
                takeover=bool(item.get("takeover", False)),
                delivered=int(item.get("delivered", 0)),
            )
        )
    return events


@dataclass
class RunAudit:
    """Per-tick accounting of a run log against the ticks that were published.

    A second start of a tick's handler is *explained* when the SDK flagged it as a takeover
    (the previous run stopped renewing its lease: killed, paused or cut off) or when an earlier
    run of the tick was cancelled by a graceful stop (its record was released). Any other
    second start is a duplicate the SDK failed to prevent."""

    published: int = 0
    starts: int = 0
    ends: int = 0
    cancelled: int = 0
    takeovers: int = 0
    second_runs: int = 0  # starts beyond each tick's first
    unhandled: list[str] = field(default_factory=list)  # published, never ran to its end
    unexplained: list[str] = field(default_factory=list)  # a second start nothing accounts for
    stray: list[str] = field(default_factory=list)  # ran, but never published

    @property
    def ok(self) -> bool:
        return not (self.unhandled or self.unexplained or self.stray)

    def table(self) -> str:
        return "\n".join(
            [
                "| ticks published | handler starts | ends | second runs | takeovers "
                "| cancelled by stop | unhandled | unexplained |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
                f"| {self.published} | {self.starts} | {self.ends} | {self.second_runs} "
                f"| {self.takeovers} | {self.cancelled} | {len(self.unhandled)} "
                f"| {len(self.unexplained)} |",
            ]
        )


def audit_runs(published: Iterable[str], events: Iterable[RunEvent]) -> RunAudit:
    by_tick: dict[str, list[RunEvent]] = defaultdict(list)
    for event in events:
        by_tick[event.tick].append(event)
    ticks = list(published)
    audit = RunAudit(published=len(ticks))
    known = set(ticks)
    audit.stray = sorted(set(by_tick) - known)
    for tick in ticks:
        seen = by_tick.get(tick, [])
        starts = [e for e in seen if e.event == "start"]
        audit.starts += len(starts)
        audit.ends += sum(1 for e in seen if e.event == "end")
        audit.cancelled += sum(1 for e in seen if e.event == "cancelled")
        audit.takeovers += sum(1 for e in starts if e.takeover)
        audit.second_runs += max(0, len(starts) - 1)
        if not any(e.event == "end" for e in seen):
            audit.unhandled.append(tick)
        released = 0  # runs cancelled so far, each of which gave the tick back
        began = 0
        plain = 0  # starts after the first that were not takeovers
        for event in seen:
            if event.event == "cancelled":
                released += 1
            elif event.event == "start":
                if began and not event.takeover:
                    plain += 1
                    if plain > released:
                        audit.unexplained.append(f"{tick} (start {began + 1} by {event.worker})")
                began += 1
    return audit
