"""How much a replica's telemetry grows once every job has ticked: the scale section measures
memory minutes after start, before most hourly jobs have fired; per-job metric series and the
last-trigger table only fill up over the hour.

Run as ``python -m bench.telemetry_growth JOBS PER_JOB`` in a fresh process: it feeds hrwcron's
own Telemetry observer one tick of every job (a third fired by this replica, the rest owned by
others, as on one of three replicas), keeps each trigger in a last-trigger table as the engine
does, and prints the resident memory before and after as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(jobs: int, per_job: bool) -> dict[str, float]:
    """Run in a fresh interpreter so the figures are this process's own."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.telemetry_growth", str(jobs), "1" if per_job else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    from hrwcron.adapters.telemetry import Telemetry
    from hrwcron.engine.ports import LastTrigger

    jobs, per_job = int(sys.argv[1]), sys.argv[2] == "1"
    telemetry = Telemetry(node="scheduler-0", per_job=per_job, process_metrics=False)
    # Job names and subjects exist before any tick: made first, outside the measurement.
    names = [f"s-{i}" for i in range(jobs)]
    subjects = [f"hrwcron.trigger.{name}" for name in names]
    last: dict[str, LastTrigger] = {}  # the engine's table of each subject's newest trigger
    telemetry.history_loaded()
    before = _rss_mb()
    due = 1_790_000_000_000
    for i, (name, subject) in enumerate(zip(names, subjects, strict=True)):
        if i % 3 == 0:
            telemetry.outcome(name, "started", due_ms=due, rank=0, attempt=1, lateness_ms=4.0)
        else:
            telemetry.outcome(name, "not_owner", due_ms=due, rank=1, attempt=0, lateness_ms=None)
        seen = LastTrigger(i + 1, f"{name}:{due}", due)
        last[subject] = seen
        telemetry.trigger_seen(subject, seen)
    print(json.dumps({"before_mb": before, "after_mb": _rss_mb(), "subjects": len(last)}))


if __name__ == "__main__":
    main()
