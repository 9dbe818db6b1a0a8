"""The benchmark's arithmetic: percentiles, ratios to floors, tick accounting, peak rates, the
native scheduler's timestamps and the performance page's block. No servers, no timing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.__main__ import README_BEGIN, README_END, update_readme  # noqa: E402
from bench.burst import BurstResult, Floor  # noqa: E402
from bench.common import Stored, Summary, percentile, ratio  # noqa: E402
from bench.failover import check_ticks  # noqa: E402
from bench.precision import _parse_rfc3339_ms, _rfc3339  # noqa: E402


def test_percentile_interpolates_between_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0], 101)


def test_summary_and_ratio() -> None:
    s = Summary.of([float(v) for v in range(1, 101)])
    assert (s.count, s.min, s.max) == (100, 1.0, 100.0)
    assert s.p50 == pytest.approx(50.5)
    assert ratio(3.0, 1.5) == 2.0
    assert math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(math.nan, 1.0))


def _trigger(job: str, due: int, stored: float) -> Stored:
    headers = {"Hrwcron-Job": job, "Hrwcron-Watermark": str(due)}
    return Stored(f"hrwcron.trigger.{job}", 0, stored, headers, b"")


def test_check_ticks_counts_lost_and_duplicated() -> None:
    stored = [
        _trigger("a", 1000, 1001),
        _trigger("a", 2000, 2001),
        _trigger("a", 2000, 2002),  # the same tick twice
        _trigger("b", 1000, 1003),  # b's tick at 2000 is missing
        _trigger("b", 9000, 9001),  # outside the checked range
    ]
    expected, lost, duplicated = check_ticks(stored, ["a", "b"], 1000, 3000)
    assert (expected, lost, duplicated) == (4, 1, 1)


def test_peak_rate_uses_one_second_windows() -> None:
    result = BurstResult(jobs=6, deployment="single", jitter_s=3.0)
    result.spread_stored_ms = [0.0, 100.0, 999.0, 1000.0, 2500.0, 2600.0]
    peak, mean = result.peak_rate
    assert peak == 3
    assert mean == 2.0


def test_native_timestamps_round_trip() -> None:
    ms = 1_790_000_123_456
    text = _rfc3339(ms)
    assert text.endswith(".456Z")
    assert _parse_rfc3339_ms(text) == ms
    # Go prints nanoseconds, or no fraction at all on a whole second.
    assert _parse_rfc3339_ms("2026-11-29T19:03:57.123456789Z") % 1000 == 123
    assert _parse_rfc3339_ms("2026-11-29T19:03:57Z") % 1000 == 0


def test_readme_block_replaced_only_between_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{README_BEGIN}\nold\n{README_END}\nafter\n")
    assert update_readme(readme, "new figures\n")
    assert (
        readme.read_text() == f"# x\n\nbefore\n{README_BEGIN}\nnew figures\n{README_END}\nafter\n"
    )
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert not update_readme(plain, "new\n")
    assert plain.read_text() == "no markers\n"


def test_durability_section_sets_the_two_sync_settings_side_by_side() -> None:
    from bench.durability import DurabilityResult, SyncRun
    from bench.precision import Run
    from bench.report import durability_section

    default = SyncRun("default", {"single": 60_000.0, "R3": 20_000.0})
    always = SyncRun("always", {"single": 6_000.0, "R3": 3_000.0})
    default.claims_per_s[("R3", "memory")] = 9_000.0
    always.claims_per_s[("R3", "file")] = 2_500.0
    run = Run("hrwcron", "R3", True, 10, 5, expected=50)
    run.lateness_ms = [1.0, 2.0, 3.0]
    always.precision = [run]
    always.burst = BurstResult(jobs=100, deployment="single", herd_ms=[0.0, 2_000.0])
    always.burst.floors = [Floor(64, 0.5)]
    lines = durability_section(DurabilityResult(5_000, 5_000, [default, always]))
    text = "\n".join(lines)
    assert "| what | sync_interval default | sync_interval always |" in text
    assert "| publishes, single | 60,000/s | 6,000/s |" in text
    assert "| claim writes, file bucket, R3 | — | 2,500/s |" in text
    assert "| precision R3, spread | — | p50 2.0 / p99 " in text
    assert "| herd of 100: last trigger stored | — | 2.00 s (4.0× floor) |" in text
    assert durability_section(None) == []


def test_the_search_benchmark_measures_refusals_within_the_bound() -> None:
    from bench.searches import ADVERSARIAL, spec_costs

    from hrwcron.core.plan import SEARCH_BUDGET

    costs = {c.name: c for c in spec_costs(1_796_000_000_000)}
    for name in ADVERSARIAL:
        assert costs[name].steps <= 2 * SEARCH_BUDGET, name
    assert costs["one second in two minutes"].verdict == "refused"
    assert costs["one second an hour (dense, fires)"].verdict == "accepted"
    assert costs["plain (floor)"].steps <= 2


def test_capacity_rows_say_what_the_busiest_replica_spends_per_trigger() -> None:
    from bench.curve import CurveResult, capacity_section
    from bench.precision import Run

    three = Run("hrwcron", "single", True, 100, 2, expected=200, replicas=3)
    three.lateness_ms = [1.0] * 200
    three.replica_cpu_s, three.cpu_s = [0.02, 0.01, 0.01], 0.04
    six = Run("hrwcron", "single", True, 100, 2, expected=200, replicas=6)
    six.lateness_ms = [1.0] * 199
    six.replica_cpu_s, six.cpu_s = [0.00995] + [0.00597] * 5, 0.0398
    result = CurveResult([100], 2, capacity_rate=100, capacity=[three, six])
    rows = [
        line
        for line in capacity_section(result)
        if line.startswith("| 3 ") or line.startswith("| 6 ")
    ]
    assert rows[0] == "| 3 | 200 (200) | 1.0 | 200 µs | 100 µs | 10,000 ticks/s |"
    assert rows[1] == "| 6 | 199 (200) | 1.0 | 200 µs | 50 µs | 20,000 ticks/s |"
    assert capacity_section(CurveResult([100], 2)) == []


def test_a_shares_fleet_that_did_not_settle_is_reported_and_fails_its_goal() -> None:
    from bench.shares import FleetFigures, SharesResult, goal_rows, section

    six = FleetFigures("6 holding shares", 6, 2, jobs_total=1_000)
    six.problem = "timed out after 120 s waiting for replicas to be ready"
    three = FleetFigures("3 holding shares", 3, 2, ready_s=1.5, jobs_total=1_000)
    three.held, three.rss_mb = [660, 670, 670], [80.0, 81.0, 82.0]
    result = SharesResult(jobs=1_000, apply_s=2.0, loaded_s=0.1, move_s=4.0, fleets=[six, three])
    text = "\n".join(section(result, 12))
    assert "| 6 replicas, holding shares | – | — | 0.00 | — |" in text
    assert "| 3 replicas, holding shares | 1.5 | 660–670 | 0.67 | 80–82 (median 81) |" in text
    assert f"- 6 replicas, holding shares: {six.problem}." in text
    ready = [row for row in goal_rows(result) if "all ready" in row[0]]
    assert ready == [
        ("holding shares (1,000 jobs, 6 replicas): all ready < 60 s", six.problem, "no")
    ]


def test_the_shares_size_is_chosen_on_the_command_line_and_checked() -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit) as refused:
        main(["--only", "shares", "--shares-jobs", "0"])
    assert refused.value.code == 2
