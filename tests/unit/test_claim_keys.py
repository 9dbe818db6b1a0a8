"""Claim keys: one per occurrence of a job, never shared by two, whatever the names and ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hrwcron.core.ticks import CLAIM_DUE, CLAIM_MANUAL, TickId, claim_key, manual_claim_key


def test_the_reported_claim_key_collision_is_gone() -> None:
    manual = manual_claim_key("sec", "-5000")
    backfill = TickId("sec.manual", -5000).claim_key
    assert manual != backfill
    assert (manual, backfill) == ("sec.manual.-5000", "sec.manual.due.-5000")


token = st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True)
names = st.lists(token, min_size=1, max_size=8).map(".".join)
occurrences = st.one_of(
    st.tuples(names, st.just(CLAIM_DUE), st.integers(-(2**62), 2**62).map(str)),
    st.tuples(names, st.just(CLAIM_MANUAL), token),
)


@settings(max_examples=300, deadline=None)
@given(occurrences, occurrences)
def test_two_occurrences_never_share_a_claim_key(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    if a != b:
        assert claim_key(*a) != claim_key(*b)
    # The last two tokens give kind and value back; the rest is the job.
    job_name, kind, value = claim_key(*a).rsplit(".", 2)
    assert (job_name, kind, value) == a
