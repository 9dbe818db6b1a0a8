"""Regenerate cron_hash_vectors.json (Jenkins' H in schedules) from the reference implementation.

Run ``python tests/vectors/make_cron_hash_vectors.py`` after an intentional change to how H is
derived (every replica of a cluster must derive it the same way), or with ``--check`` to fail
when the file and the code disagree.
"""

from __future__ import annotations

import json
import sys
from itertools import islice
from pathlib import Path
from typing import Any

from hrwcron.core.schedule import Schedule, field_hash
from hrwcron.core.ticks import format_ms

VECTORS = Path(__file__).with_name("cron_hash_vectors.json")

FIELDS = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"]

JOBS = ["reports.daily", "job-0", "billing.nightly", "café", "ジョブ.毎日"]

# One H form per row, the other fields fixed, so each row shows one field's values.
EXPRESSIONS = [
    "H * * * *",
    "H(10-20) * * * *",
    "H/15 * * * *",
    "H(0-29)/10 * * * *",
    "H(0-9)/30 * * * *",
    "0 H * * *",
    "0 H/6 * * *",
    "0 0 H * *",
    "0 0 1 H *",
    "0 0 * * H",
    "0 0 * * H(MON-FRI)",
    "H 0 0 * * *",
    "H H H * *",
]

AFTER_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
COUNT = 4


def _hex(h: int) -> str:
    return f"{h:016x}"


def build() -> dict[str, Any]:
    hashes = [
        {
            "job": job,
            "field": name,
            "input_hex": (job.encode() + b"\x00" + name.encode()).hex(),
            "hash": _hex(field_hash(job, name)),
        }
        for job in JOBS
        for name in FIELDS
    ]
    cases = [
        {
            "job": job,
            "expression": expr,
            "tz": "UTC",
            "after": format_ms(AFTER_MS),
            "next": [
                format_ms(t)
                for t in islice(Schedule.parse(expr, "UTC", job=job).iter_after(AFTER_MS), COUNT)
            ],
        }
        for job in JOBS
        for expr in EXPRESSIONS
    ]
    return {
        "about": (
            "H in a field of a job's schedule: h = xxh3_64(utf8(job) || 0x00 || utf8(field)),"
            " seed 0, as 16 lowercase hex digits, field one of second minute hour day-of-month"
            " month day-of-week. H(a-b) is a + h mod (b - a + 1); a bare H covers the field"
            " (day-of-month 1-28, day-of-week 0-6); with a step n the values are"
            " a + h mod min(n, b - a + 1), then every n-th up to b. 'next' are the first due"
            " instants strictly after 'after'. See README.md next to this file."
        ),
        "hashes": hashes,
        "cases": cases,
    }


def render() -> str:
    return json.dumps(build(), ensure_ascii=False, indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if VECTORS.read_text(encoding="utf-8") != text:
            print(f"{VECTORS.name} is out of date: regenerate it", file=sys.stderr)
            return 1
        return 0
    VECTORS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
