"""What a replica decided about one tick, named once.

Every outcome is a value of the ``outcome`` label of ``hrwcron_ticks_total`` (the metrics count
each from the start, so alerts see a 0 rather than no series) and is explained in
docs/observability.md; tests/unit/test_outcomes.py holds the two to this list. The sets below
say how the engine treats each.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    STARTED = "started"  # this replica published the trigger
    ALREADY_CLAIMED = "already_claimed"  # another replica resolved a tick this one started on
    NOT_OWNER = "not_owner"  # another replica's tick, resolved without acting
    LOCK_BUSY = "lock_busy"  # the claim is held by a live replica whose trigger is not in yet
    DUPLICATE = "duplicate"  # the stream already held this tick
    MISSED = "missed"  # past max_lateness with no trigger
    FENCED = "fenced"  # the stream refused a stale publish
    SKIPPED = "skipped"  # the previous run still runs (overlap = "skip")
    EXCLUDED = "excluded"  # the tick falls on an excluded time
    MAX_RUNS = "max_runs"  # another replica's publish used up the job's last run first
    REJECTED = "rejected"  # the server refused the trigger for what it is (too large, say)
    ERROR = "error"  # a claim or publish write failed, or the clock was in doubt: tried again


# The tick is resolved for good: the job moves on to its next tick.
RESOLVED = frozenset(
    {
        Outcome.STARTED,
        Outcome.DUPLICATE,
        Outcome.ALREADY_CLAIMED,
        Outcome.NOT_OWNER,
        Outcome.MISSED,
        Outcome.FENCED,
        Outcome.SKIPPED,
        Outcome.EXCLUDED,
        Outcome.MAX_RUNS,
        Outcome.REJECTED,
    }
)
# Written into the claim, so replicas that find it resolve the tick without a trigger: the
# holder skipped it (overlap), or the server refused its trigger (it would refuse any).
CLAIM_RESOLVED = frozenset({Outcome.SKIPPED, Outcome.REJECTED})
# A claim found held by another replica (hrwcron_claim_contention_total{reason}).
CONTENTION = frozenset({Outcome.LOCK_BUSY, Outcome.ALREADY_CLAIMED})
# Logged as the job's problems (the console's recent problems, "missed in the last hour").
PROBLEMS = frozenset({Outcome.MISSED, Outcome.FENCED, Outcome.REJECTED, Outcome.ERROR})
# A trigger is in the stream for the tick: what a manual trigger reports as done.
PUBLISHED = frozenset({Outcome.STARTED, Outcome.DUPLICATE})
