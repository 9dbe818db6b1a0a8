"""The worker's processed-record keys (issue 25): no two ticks share one, whatever the job names
and manual trigger ids, for both kinds of tick.

Earlier versions keyed a tick by its key with colons made dots, so ``sec:manual:<T>`` (a manual
trigger of job ``sec``) and ``sec.manual:<T>`` (a scheduled tick of job ``sec.manual``) shared
``sec.manual.<T>``, and the second to arrive was taken for a duplicate. The property tests give
each key back its tick (so the mapping is injective over every name and value the replicas can
publish) and check the pairs that used to collide, which random names would almost never hit.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrwcron.core.model import job_name_problem
from hrwcron.core.ticks import TickId
from hrwcron.worker.records import _legacy_kv_key, tick_record_key

# A name token and a manual trigger id: what the admin API lets through.
TOKEN = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
NAMES = st.lists(
    st.one_of(TOKEN, st.sampled_from(["manual", "due", "other", "0", "123"])),
    min_size=1,
    max_size=8,
).map(".".join)
IDS = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    st.integers(min_value=0, max_value=2**53).map(str),  # ids that look like due instants
    st.sampled_from(["manual", "due", "other"]),
)
DUES = st.integers(min_value=0, max_value=2**53)

SCHEDULED = st.builds(lambda job, due: TickId(job, due).key, NAMES, DUES)
MANUAL = st.builds(lambda job, trigger_id: f"{job}:manual:{trigger_id}", NAMES, IDS)
TICKS = st.one_of(SCHEDULED, MANUAL)

# What nats-py accepts as a KV key (nats.js.kv.VALID_KEY_RE), without empty tokens.
KV_KEY = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")


def tick_of(key: str) -> str:
    """The tick a processed key stands for, read from the right: value, kind, then the job."""
    job, kind, value = key.rsplit(".", 2)
    assert kind in ("due", "manual"), key
    return f"{job}:{value}" if kind == "due" else f"{job}:manual:{value}"


@settings(max_examples=500)
@given(TICKS)
def test_every_key_gives_its_tick_back(tick: str) -> None:
    key = tick_record_key(tick)
    assert KV_KEY.fullmatch(key), key
    assert tick_of(key) == tick  # so no two ticks share a key


@settings(max_examples=300)
@given(st.lists(TICKS, min_size=2, max_size=40, unique=True))
def test_distinct_ticks_get_distinct_keys(ticks: list[str]) -> None:
    keys = [tick_record_key(t) for t in ticks]
    assert len(set(keys)) == len(ticks)


@settings(max_examples=300)
@given(NAMES.filter(lambda name: name.count(".") < 7), DUES.map(str))
def test_the_pairs_the_old_keys_confused_are_told_apart(job: str, value: str) -> None:
    manual = f"{job}:manual:{value}"  # job `job` triggered by hand with id `value`
    scheduled = f"{job}.manual:{value}"  # job `job.manual` due at `value` ms
    assert job_name_problem(job) is None and job_name_problem(f"{job}.manual") is None
    assert _legacy_kv_key(manual) == _legacy_kv_key(scheduled)  # the collision of issue 25
    assert tick_record_key(manual) != tick_record_key(scheduled)


def test_the_issues_example() -> None:
    due = 1_796_160_000_000
    assert tick_record_key(f"sec:manual:{due}") == f"sec.manual.{due}"
    assert tick_record_key(f"sec.manual:{due}") == f"sec.manual.due.{due}"


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_a_tick_key_of_neither_shape_never_gets_a_real_ticks_key(tick: str) -> None:
    # Not one a replica publishes (a hand-made trigger's Nats-Msg-Id).
    key = tick_record_key(tick)
    if key.startswith("other."):
        assert KV_KEY.fullmatch(key) and key.count(".") == 1  # real keys have 3+ tokens


# Tick keys no replica publishes, but any client allowed to publish on the trigger stream can
# (the worker takes the Nats-Msg-Id as it comes): a job part with a wildcard, a space or an
# empty token, or a due part in non-ASCII digits, must get a key of its own under ``other``, or
# `x.*:5` would be read as the wildcard subject `<ns>.x.*.due.5` and taken for `x.y:5`'s
# record (test_a_hostile_tick_key_is_not_taken_for_another_ticks_record in tests/integration).
HOSTILE_TICKS = ["x.*:5", "x.>:5", "a b:5", "a..b:5", "x:\u00b2", "x:\u0661\u0662"]


@pytest.mark.parametrize("tick", HOSTILE_TICKS)
def test_a_hostile_tick_key_gets_a_literal_kv_key(tick: str) -> None:
    key = tick_record_key(tick)
    assert KV_KEY.fullmatch(key), (tick, key)
    assert "*" not in key.split(".") and ">" not in key.split(".")
