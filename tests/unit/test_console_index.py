"""The console's name index: matches, counts and bitmask pages agree with a plain scan, and
builds over many jobs let the event loop run every slice of work."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from hrwcron.console.index import Facets, JobIndex, Names, every_bit, set_bits, to_mask
from hrwcron.console.slices import SLICE, Work

T = TypeVar("T")

NAMES = [f"ops-{i:05d}" for i in range(3000)] + [
    "billing.sweep",
    "Billing.Invoice",
    "reports.billing-summary",
    "aaa",
    "aa",
    "baaa",
]


@pytest.mark.parametrize("query", ["", "ops-", "0001", "bill", "BILL", "aa", "a", "-", ".", "zz"])
def test_matches_and_counts_agree_with_a_scan(query: str) -> None:
    index = Names.build(1, NAMES)
    wanted = [n for n in NAMES if query.lower() in n.lower()]
    found = [index.names[i] for i in index.matches(query)]
    assert sorted(found) == sorted(wanted) and len(found) == len(set(found))
    assert index.count(query) == len(wanted)
    starting = [n for n in found if n.lower().startswith(query.lower())]
    assert found[: len(starting)] == starting  # prefix matches first
    first, then = index.masks(query)
    assert first & then == 0
    assert first.bit_count() + then.bit_count() == len(wanted)
    assert [index.names[p] for p in set_bits(first, 0, 10**6)] == starting


def test_pages_of_a_bitmask_are_the_positions_in_order() -> None:
    rng = random.Random(7)
    for _ in range(300):
        size = rng.randint(1, 5000)
        picks = sorted(rng.sample(range(size), rng.randint(0, min(size, 400))))
        skip, take = rng.randint(0, 420), rng.randint(1, 60)
        assert set_bits(to_mask(picks, size), skip, take) == picks[skip : skip + take]


def test_a_name_has_its_position_and_a_stranger_none() -> None:
    index = Names.build(1, NAMES)
    for name in itertools.islice(NAMES, 0, None, 97):
        position = index.position(name)
        assert position is not None and index.names[position] == name
    assert index.position("no.such.job") is None


async def turns_of(counted: Work, work: Awaitable[T]) -> tuple[T, int, int]:
    """Runs ``work`` while this task takes a turn whenever the event loop gives one; what
    ``work`` returned, the most items it handled in Python in one turn, and how many turns it
    took. A turn that merges sorted names in C (one merge at most) handles no other item."""
    seen = [(counted.done, counted.merges)]
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.sleep(0)
        seen.append((counted.done, counted.merges))
    most = 0
    for (done, merges), (done_after, merges_after) in itertools.pairwise(seen):
        assert merges_after - merges <= 1, "two merges in one turn"
        assert merges_after == merges or done_after == done, "a merge and items in one turn"
        most = max(most, done_after - done)
    return await task, most, len(seen) - 1


def row(name: str) -> tuple[list[str], str, list[str]]:
    number = int(name.rsplit("-", 1)[1])
    tags = ["batch"] if number % 4 == 0 else []
    return tags, f"node-{number % 3}", ["paused" if number % 100 == 7 else "active"]


async def test_builds_over_many_jobs_let_the_event_loop_run_every_slice() -> None:
    rng = random.Random(11)
    many = [f"Job-{i}" if i % 10 == 0 else f"job-{i}" for i in range(30_000)]
    rng.shuffle(many)
    index = JobIndex(time.monotonic)
    names, most, turns = await turns_of(index.work, index.names(1, lambda: many))
    at_once = Names.build(1, many)  # the same index, built in one go
    assert (names.names, names.lower, names.starts) == (
        at_once.names,
        at_once.lower,
        at_once.starts,
    )
    assert names.text == at_once.text and index.builds == 1
    # A whole build in one turn would be every name, several times over: at most a slice.
    assert most <= SLICE and turns >= 3 * len(many) // SLICE

    building = index.facets(names, ("node-0",), row, lambda name: 1)
    facets, most, turns = await turns_of(index.work, building)
    assert most <= SLICE and turns >= len(many) // SLICE
    rows = {n: row(n) for n in many}
    for value, mask in [("batch", facets.by_tag["batch"])]:
        found = [names.names[p] for p in every_bit(mask)]
        assert sorted(found) == sorted(n for n in many if value in rows[n][0])
    paused = [names.names[p] for p in every_bit(facets.by_state["paused"])]
    assert sorted(paused) == sorted(n for n in many if "paused" in rows[n][2])
    assert every_bit(facets.by_owner["node-1"]) == [
        p for p, n in enumerate(names.names) if rows[n][1] == "node-1"
    ]

    # A new revision with the same names (a job paused): checked, in slices, not rebuilt.
    again, most, _ = await turns_of(index.work, index.names(2, lambda: list(reversed(many))))
    assert again.revision == 2 and again.names is names.names and index.builds == 1
    assert most <= SLICE
    # One name more: rebuilt, in slices.
    grown, most, _ = await turns_of(index.work, index.names(3, lambda: [*many, "job-x"]))
    assert index.builds == 2 and grown.position("job-x") is not None and most <= SLICE
    assert len(grown.names) == len(many) + 1
    # One name instead of another (as many as before): rebuilt too.
    swapped = await index.names(4, lambda: [*many[1:], "job-y"])
    assert index.builds == 3 and swapped.position(many[0]) is None


async def test_requests_during_a_build_wait_for_it_and_share_it() -> None:
    many = [f"job-{i}" for i in range(10_000)]
    index = JobIndex(time.monotonic)
    first, second = await asyncio.gather(index.names(1, lambda: many), index.names(1, lambda: many))
    assert first is second and index.builds == 1


async def test_after_a_job_changes_only_the_jobs_whose_version_moved_are_walked_again() -> None:
    many = [f"job-{i}" for i in range(20_000)]
    versions = dict.fromkeys(many, 1)
    paused = {"job-7"}
    asked: list[str] = []

    def row_of(name: str) -> tuple[list[str], str, list[str]]:
        asked.append(name)
        return [], "node-0", ["paused" if name in paused else "active"]

    index = JobIndex(time.monotonic)
    names = await index.names(1, lambda: many)
    facets = await index.facets(names, ("node-0",), row_of, versions.__getitem__)
    assert len(asked) == len(many) and index.facet_builds == 1

    def shown(facets: Facets, state: str) -> list[str]:
        return sorted(names.names[p] for p in every_bit(facets.by_state.get(state, 0)))

    assert shown(facets, "paused") == ["job-7"]
    # job-7 resumed and job-12 paused (new versions): the next revision walks those two.
    paused = {"job-12"}
    versions["job-7"] = versions["job-12"] = 2
    asked.clear()
    names = await index.names(2, lambda: many)
    updated, most, _ = await turns_of(
        index.work, index.facets(names, ("node-0",), row_of, versions.__getitem__)
    )
    assert sorted(asked) == ["job-12", "job-7"] and index.facet_updates == 1
    assert index.facet_builds == 1 and most <= SLICE  # the versions are compared in slices
    assert shown(updated, "paused") == ["job-12"]
    assert len(shown(updated, "active")) == len(many) - 1 and "job-7" in shown(updated, "active")
    assert shown(facets, "paused") == ["job-7"]  # the facets before are left as they were
    # Other members (the owners move): every job again.
    asked.clear()
    await index.facets(names, ("node-0", "node-1"), row_of, versions.__getitem__)
    assert len(asked) == len(many) and index.facet_builds == 2
    # Many jobs changed: built again rather than patched.
    for name in many[: len(many) // 4]:
        versions[name] = 3
    asked.clear()
    names = await index.names(3, lambda: many)
    await index.facets(names, ("node-0", "node-1"), row_of, versions.__getitem__)
    assert len(asked) == len(many) and index.facet_builds == 3 and index.facet_updates == 1
