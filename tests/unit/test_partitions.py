"""Lanes of the job set: keys, holders, balance, and how little a membership change moves."""

from __future__ import annotations

import collections

import pytest

from hrwcron.core import hrw
from hrwcron.core import partitions as pt
from hrwcron.core.turns import Candidate


def members(n: int, weight: float = 1.0) -> list[Candidate]:
    return [Candidate(f"replica-{i}", weight, frozenset()) for i in range(n)]


@pytest.mark.parametrize(
    ("name", "tags"),
    [("billing.report", []), ("a", []), ("gpu.train", ["gpu"]), ("x-y_z.1.2", ["a", "b"])],
)
def test_a_key_names_its_lane_and_its_job(name: str, tags: list[str]) -> None:
    key = pt.job_key(name, tags)
    lane, back = pt.split_key(key)
    assert back == name
    assert lane == pt.lane_of(name, tags)
    assert (lane == pt.TAGGED) == bool(tags)


def test_a_key_from_before_lanes_is_its_name() -> None:
    assert pt.split_key("billing.report") == (None, "billing.report")


def test_the_layout_marker_is_no_job_key() -> None:
    assert pt.split_key(pt.LAYOUT_KEY)[0] is None
    assert "=" in pt.LAYOUT_KEY  # job names never hold '=' (core/model.py)


def test_holders_in_one_pass_match_holders_lane_by_lane() -> None:
    for candidates in (members(5), [*members(4), Candidate("heavy", 3.0, frozenset())]):
        by_lane = pt.holders_by_lane(candidates, 2)
        for lane in pt.lanes()[:300]:
            assert by_lane[lane] == pt.lane_holders(lane, candidates, 2)
            assert len(by_lane[lane]) == 2


def test_with_as_many_holders_as_members_everyone_holds_every_lane() -> None:
    by_lane = pt.holders_by_lane(members(2), 2)
    assert all(nodes == ["replica-0", "replica-1"] for nodes in by_lane.values())
    assert pt.held_lanes("replica-1", [by_lane]) == frozenset([*pt.lanes(), pt.TAGGED])


@pytest.mark.parametrize(("n", "bound"), [(3, 1.03), (6, 1.04), (10, 1.06)])
def test_owned_and_held_jobs_stay_within_six_percent_of_the_mean(n: int, bound: float) -> None:
    jobs = [f"job-{i}" for i in range(100_000)]
    by_lane = pt.holders_by_lane(members(n), 2)
    owned: collections.Counter[str] = collections.Counter()
    held: collections.Counter[str] = collections.Counter()
    for name in jobs:
        holders = by_lane[pt.lane_of(name, [])]
        owned[hrw.rank(name, holders)[0]] += 1
        held.update(holders)
    assert max(owned.values()) / (len(jobs) / n) <= bound
    assert max(held.values()) / (len(jobs) * 2 / n) <= bound
    assert len(owned) == n


def test_a_joining_member_takes_lanes_and_nobody_else_trades() -> None:
    before = pt.holders_by_lane(members(5), 2)
    after = pt.holders_by_lane(members(6), 2)
    moved = 0
    for lane in pt.lanes():
        gained = set(after[lane]) - set(before[lane])
        assert gained <= {"replica-5"}  # only the newcomer gains a lane
        moved += len(gained)
    # The newcomer takes about its share, 2/6 of the lanes, and nothing else moves.
    assert 0.28 < moved / pt.PARTITIONS < 0.39
    assert pt.held_lanes("replica-5", [after]) - pt.held_lanes("replica-5", [before]) != set()


def test_weights_give_lanes_in_proportion() -> None:
    candidates = [*members(3), Candidate("heavy", 3.0, frozenset())]
    by_lane = pt.holders_by_lane(candidates, 1)
    first = collections.Counter(nodes[0] for nodes in by_lane.values())
    assert first["heavy"] / pt.PARTITIONS == pytest.approx(0.5, abs=0.03)
