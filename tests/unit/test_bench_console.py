"""The console section of the benchmark: its figures become rows and goals. No servers."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.console import ConsoleResult, goal_rows, section, specs  # noqa: E402


def test_the_section_reports_pages_keystrokes_and_the_cost_of_open_pages() -> None:
    result = ConsoleResult(
        jobs=100_000,
        ready_s=31.0,
        pages_ms={"fleet": 40.0, "jobs": 60.0, "job": 12.0},
        first_fleet_ms=30.0,
        timeline_s=2.5,
        search_ms={"q": 20.0, "4217": 130.0},
        filter_ms={"state=paused": 8.0},
        first_filter_ms=700.0,
        after_change_ms={"a job paused: the next filter": 90.0},
        held_ms={"the first filtered query": 12.0, "a job paused: the next filter": 26.0},
        alone_held_ms=9.0,
        builds={"the first filtered query (facets)": ("facets", 26.0, 400.0)},
        idle_cpu=2.0,
        open_cpu=2.4,
    )
    lines = section(result, 11)
    assert lines[0] == "## 11. The console at 100,000 jobs"
    assert "| search `q=4217` (results part) | 130.0 |" in lines
    goals = {name: (measured, ok) for name, measured, ok in goal_rows(result)}
    assert goals["console (100,000 jobs): first page < 1 s"] == (
        "60 ms (the very first fleet view 30 ms; its hour counted 2.5 s later)",
        "yes",
    )
    assert goals["console (100,000 jobs): search < 100 ms per keystroke"] == (
        "130 ms (slowest)",
        "**no**",
    )
    assert goals["console (100,000 jobs): open pages cost < 1% of a core"][1] == "yes"
    held = "console (100,000 jobs): rebuilding the index and filters holds the event loop < 20 ms"
    assert goals[held] == ("26.0 ms (the longest turn of a build)", "**no**")
    assert "| the first filtered query (facets) | 26.0 | 400 |" in lines
    assert "| a job paused: the next filter | 90 |" in lines
    assert any("nothing asked of the console, 9.0 ms" in line for line in lines)
    assert section(None, 11) == [] and goal_rows(None) == []


def test_the_jobs_are_tagged_and_paused_as_the_section_says() -> None:
    jobs = specs(400)
    assert sum(bool(s.tags) for s in jobs) == 100 and sum(s.paused for s in jobs) == 4
