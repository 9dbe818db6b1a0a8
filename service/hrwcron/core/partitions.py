"""Partitions of the job set: which replicas hold a job, so that each holds only what it may fire.

A job without tags lives in one of ``PARTITIONS`` lanes, picked by hashing its name; a job with
tags lives in the one ``TAGGED`` lane, which every replica holds (a lane's holders cannot know
which tags its jobs need before they read them). The holders of a lane are its first
``holders`` members by HRW over the lane's token, and the owner of a job is the first of its
lane's holders by HRW over the job's name: any replica computes both from the member list
alone, and a member joining or leaving moves only the lanes it takes or gives up.

The lane is the first token of the job's key in the jobs bucket (``p=<lane>.<name>``), so a
replica watches only the subjects of the lanes it holds. A key without that token is a job
written before lanes existed (its key is its name); ``hrwcron provision --migrate`` moves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import xxhash

from hrwcron.core import hrw
from hrwcron.core.turns import Candidate

# 8,192 lanes keep the most loaded of 10 replicas within 6% of the mean with two holders per
# lane (4,096: 8%; tests/unit/test_partitions.py measures it), and a replica's watch within a
# few consumers of a thousand subjects each.
PARTITIONS = 8192
TAGGED = "t"
KEY_PREFIX = "p="
# The jobs bucket's layout marker: written when the bucket is created or migrated; its absence
# means keys may still be bare names. '=' is in no job name, so it is never a job's key.
LAYOUT_KEY = "=layout"
LAYOUT = b"lanes-1"

_SALT = b"partition\x00"
_ALL_LANES: tuple[str, ...] = tuple(f"{p:04x}" for p in range(PARTITIONS))


def lanes() -> tuple[str, ...]:
    """Every lane of jobs without tags."""
    return _ALL_LANES


def partition_of(name: str) -> int:
    return int(xxhash.xxh3_64_intdigest(_SALT + name.encode()) % PARTITIONS)


def lane_of(name: str, tags: Sequence[str]) -> str:
    return TAGGED if tags else _ALL_LANES[partition_of(name)]


def job_key(name: str, tags: Sequence[str]) -> str:
    """The job's key in a bucket with lanes."""
    return f"{KEY_PREFIX}{lane_of(name, tags)}.{name}"


def split_key(key: str) -> tuple[str | None, str]:
    """``(lane, job name)`` of a key; the lane is None for a key written before lanes."""
    if key.startswith(KEY_PREFIX):
        lane, _, name = key[len(KEY_PREFIX) :].partition(".")
        return lane, name
    return None, key


def lane_holders(lane: str, candidates: Sequence[Candidate], holders: int) -> list[str]:
    """The lane's holders, first holder first: every candidate for the tagged lane or when
    ``holders`` is 0, otherwise the first ``holders`` by (weighted) HRW over the lane token."""
    if lane == TAGGED or holders <= 0 or holders >= len(candidates):
        return sorted(c.node for c in candidates)
    token = KEY_PREFIX + lane
    if any(c.weight != 1.0 for c in candidates):
        return hrw.weighted_rank(token, {c.node: c.weight for c in candidates})[:holders]
    return hrw.rank(token, [c.node for c in candidates])[:holders]


def holders_by_lane(candidates: Sequence[Candidate], holders: int) -> dict[str, list[str]]:
    """:func:`lane_holders` of every lane without tags, computed in one pass."""
    if holders <= 0 or holders >= len(candidates):
        everyone = sorted(c.node for c in candidates)
        return dict.fromkeys(_ALL_LANES, everyone)
    if any(c.weight != 1.0 for c in candidates):
        return {lane: lane_holders(lane, candidates, holders) for lane in _ALL_LANES}
    prepared = hrw.prepare(c.node for c in candidates)
    return {lane: hrw.rank_prepared(KEY_PREFIX + lane, prepared)[:holders] for lane in _ALL_LANES}


def held_lanes(node: str, views: Iterable[dict[str, list[str]]]) -> frozenset[str]:
    """The lanes ``node`` holds under any of ``views`` (holders by lane), the tagged lane
    always."""
    held = {TAGGED}
    for view in views:
        held.update(lane for lane, nodes in view.items() if node in nodes)
    return frozenset(held)
