"""The console's name index: matches, counts and bitmask pages agree with a plain scan."""

from __future__ import annotations

import itertools
import random

import pytest

from hrwcron.console.index import Names, set_bits, to_mask

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
