"""What a failed chaos run leaves behind for whoever reads it later, and the Python tracebacks
in replica logs told apart with their causes.

A run's directory goes away with the test process (see ``rundir.py``), which is right for a
passing run and lost the one clue of a failing one (the seed-11 run's two tracebacks were never
read). :func:`keep` copies the logs, ack journals, configs and reports of a test's directory to
a directory of its own under ``tests/chaos/reports/failed/``; the stores stay behind (large,
and on a FUSE mount in the power-loss runs).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Traceback", "keep", "tracebacks"]

SUFFIXES = (".log", ".jsonl", ".md", ".conf", ".json", ".txt")
# A store directory holds the servers' data, not their account of what happened.
SKIPPED_DIRS = frozenset({"store", "jetstream", "mnt"})
MOST_BYTES = 64 * 1024 * 1024  # per file: a runaway log is cut, not copied whole

# A record of the replicas' text log format starts with its asctime.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d{3} ")
_CHAIN = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def keep(source: Path, reports: Path, name: str) -> Path:
    """Copy what explains a run from ``source`` into a new directory under ``reports`` named
    after ``name`` and the time; returns it."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-")[:120]
    target = reports / "failed" / f"{safe}-{stamp}"
    for root, dirs, files in os.walk(source):
        here = Path(root)
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not os.path.ismount(here / d)]
        for file in files:
            path = here / file
            if not file.endswith(SUFFIXES) or not path.is_file():
                continue
            out = target / path.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb") as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
                if dst.tell() > MOST_BYTES:
                    dst.truncate(MOST_BYTES)
    target.mkdir(parents=True, exist_ok=True)
    return target


@dataclass(frozen=True)
class Traceback:
    """One logged traceback: the record that logged it, its exceptions outermost last (the
    one raised, after the ones it was raised from or while handling), and the whole text."""

    logged: str
    exceptions: tuple[str, ...]
    text: str

    @property
    def raised(self) -> str:
        return self.exceptions[-1] if self.exceptions else "(no exception line)"

    @property
    def causes(self) -> tuple[str, ...]:
        return self.exceptions[:-1]

    def summary(self) -> str:
        chain = "".join(f" <- {cause}" for cause in reversed(self.causes))
        return f"{self.logged} | {self.raised}{chain}"


def tracebacks(text: str) -> list[Traceback]:
    """Every traceback in a replica's log, with the record line that introduced it."""
    lines = text.splitlines()
    found: list[Traceback] = []
    at = 0
    while at < len(lines):
        if not lines[at].startswith("Traceback (most recent call last):"):
            at += 1
            continue
        # The record that logged it, a line or two up (asyncio names the task in between).
        above = range(at - 1, max(-1, at - 4), -1)
        logged = next(
            (lines[i] for i in above if _RECORD.match(lines[i])), lines[at - 1] if at else ""
        )
        end = at + 1
        while end < len(lines) and not _RECORD.match(lines[end]):
            end += 1
        block = lines[at:end]
        exceptions = tuple(
            line
            for line in block
            if line.strip()
            and not line[0].isspace()
            and not line.startswith("Traceback (")
            and line not in _CHAIN
        )
        found.append(Traceback(logged, exceptions, "\n".join(block)))
        at = end
    return found
