"""The operator-commands benchmark's report: ratios to the floor, targets, failed commands."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.operator import Command, OperatorResult, goal_rows, section  # noqa: E402


def result() -> OperatorResult:
    r = OperatorResult(jobs=100_000, deployment="single")
    r.floors = {"one inbox": 2.0, "js.publish": 5.0}
    for key, seconds in (("apply_new", 7.0), ("no_change", 1.5), ("ls", 0.9), ("status", 1.2)):
        argv = ["apply", "/tmp/x/jobs.json"] if key.startswith(("apply", "no")) else [key]
        r.commands[key] = Command(key, argv, seconds, 0)
    return r


def test_goals_compare_with_the_faster_floor_and_the_stated_targets() -> None:
    rows = {goal: (measured, met) for goal, measured, met in goal_rows(result())}
    prefix = "operator (100,000 jobs): "
    assert rows[prefix + "apply of new jobs < 30 s"] == ("7.0 s", "yes")
    assert rows[prefix + "apply of new jobs ≤ 3× the job-write floor"] == ("3.5×", "**no**")
    assert rows[prefix + "`status`, first screen < 1 s"] == ("1.20 s", "**no**")
    assert rows[prefix + "no-change apply < 10 s"] == ("1.50 s", "yes")


def test_a_failed_command_has_no_time_and_meets_no_goal() -> None:
    r = result()
    r.commands["ls"].exit_code = 1
    assert math.isnan(r.seconds("ls"))
    rows = {goal: met for goal, _, met in goal_rows(r)}
    assert rows["operator (100,000 jobs): `jobs ls` < 10 s"] == "**no**"


def test_the_section_names_commands_without_temporary_paths() -> None:
    text = "\n".join(section(result(), 6))
    assert text.startswith("## 6. Operator commands at 100,000 jobs")
    assert "`hrwcron apply jobs.json`" in text and "/tmp/x" not in text
    assert "| 7.00 | 14,286 | 3.50 |" in text
    assert section(None, 6) == []
