"""Tick outcomes are named once (core/outcomes.py): each is a series of the tick counter from
the start, each is explained where operators read about the metrics, and the engine's sets of
them hold only outcomes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hrwcron.adapters.metrics import OUTCOMES, TickCounts
from hrwcron.core import outcomes
from hrwcron.core.outcomes import Outcome

OBSERVABILITY = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def ticks_row() -> str:
    rows = [
        line
        for line in OBSERVABILITY.read_text().splitlines()
        if line.startswith("| `hrwcron_ticks_total")
    ]
    assert rows, "docs/observability.md has no row for hrwcron_ticks_total"
    return rows[0]


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_is_explained_with_the_metric(outcome: Outcome) -> None:
    # Each meaning is written as `outcome`: followed by what it says.
    assert re.search(rf"`{outcome.value}`: \w", ticks_row()), outcome


def test_the_metric_explains_no_outcome_that_does_not_exist() -> None:
    named = set(re.findall(r"`([a-z_]+)`: ", ticks_row()))
    assert named == {o.value for o in Outcome}


@pytest.mark.parametrize("per_job", [False, True])
def test_every_outcome_is_a_series_once_counted_and_an_unknown_one_is_refused(
    per_job: bool,
) -> None:
    counts = TickCounts(per_job=per_job)
    for outcome in Outcome:
        counts.count("a.job", outcome)
    (family,) = counts.collect()
    labels = {sample.labels["outcome"]: sample.value for sample in family.samples}
    assert labels == {o.value: 1.0 for o in Outcome}
    assert tuple(OUTCOMES) == tuple(Outcome)
    with pytest.raises(KeyError):
        counts.count("a.job", "lock_bussy")  # type: ignore[arg-type]


def test_without_job_labels_every_outcome_is_a_zero_series_from_the_start() -> None:
    (family,) = TickCounts(per_job=False).collect()
    assert {s.labels["outcome"] for s in family.samples} == {o.value for o in Outcome}


def test_the_engine_sets_are_made_of_outcomes_and_retry_what_they_should() -> None:
    sets = [
        outcomes.RESOLVED,
        outcomes.CLAIM_RESOLVED,
        outcomes.CONTENTION,
        outcomes.PROBLEMS,
        outcomes.PUBLISHED,
    ]
    assert all(all(isinstance(o, Outcome) for o in chosen) for chosen in sets)
    # A write that failed and a claim still held are looked at again; nothing else is.
    assert set(Outcome) - outcomes.RESOLVED == {Outcome.ERROR, Outcome.LOCK_BUSY}
    assert outcomes.CLAIM_RESOLVED <= outcomes.RESOLVED
    assert outcomes.PUBLISHED <= outcomes.RESOLVED
