"""Run limits (``max_runs``): how many scheduled triggers a job has fired, agreed by every
replica, unchanged by restarts, and kept after the trigger stream has forgotten the triggers.

Why this design. The count has to be exact where it matters: at the moment a replica decides
whether to publish run N+1. Two sources are combined:

1. **The trigger itself.** While a job has ``max_runs``, each scheduled trigger carries its run
   number in the ``Hrwcron-Run`` header: one more than the newest trigger already on the job's
   subject. That newest trigger is exactly the message whose stream sequence the publish
   names in ``Nats-Expected-Last-Subject-Sequence`` (the fencing every tick already uses), so
   two replicas can never both publish run N+1: the stream accepts one publish per
   predecessor, and the other is fenced, re-reads the subject and sees run N+1 there. Manual
   and backfill triggers carry the number forward unchanged (like ``Hrwcron-Watermark``), so
   they are not counted. No extra write sits between claim and publish; the tick protocol is
   unchanged.
2. **A durable copy** in a KV bucket (``hrwcron_counts``, one key per job, no TTL), because the
   stream drops triggers after ``stream_max_age``. The replica that published a run, and the
   job's owner whenever it sees a trigger whose number is above the copy, raise it with
   compare-and-set; it only ever grows, so concurrent writers converge on the largest value.
   When the stream still holds the job's newest trigger, that trigger's number is used (it is
   never below the copy); when it has expired, the copy stands in for it.

The copy lags a publish by one round trip, while the stream keeps a trigger for at least its
duplicate window (minutes; a day by default). Only if every replica stayed away from NATS from
the moment a run was published until the stream expired that trigger would the copy miss it,
and then the job would fire one run too many; nothing else loses a count.

A job deleted through hrwcron (``jobs rm``, ``apply --prune``, the admin API) starts again from
zero when it is created anew: deletion records the count reached so far as the new ``base``.
Raising ``max_runs`` lets a finished job fire again; a job deleted because ``delete_after``
passed keeps its count, so re-applying a config file does not run it again.
"""

from __future__ import annotations

import msgspec

SCHEMA_VERSION = 1


class RunCount(msgspec.Struct, kw_only=True, frozen=True):
    """The durable copy for one job."""

    total: int = 0  # the highest run number published on the job's subject
    base: int = 0  # ``total`` when the job was last deleted through hrwcron
    v: int = SCHEMA_VERSION

    def merged(self, other: RunCount) -> RunCount:
        """Both only ever grow: the newer knowledge of each."""
        return RunCount(total=max(self.total, other.total), base=max(self.base, other.base))


def runs_done(record: RunCount, last_run: int) -> int:
    """Scheduled triggers fired since the job was (re)created, given the run number of the
    newest trigger on its subject (0 when there is none or it carries no number)."""
    return max(0, max(last_run, record.total) - record.base)


def next_run(record: RunCount, last_run: int, max_runs: int, scheduled: bool) -> int | None:
    """The ``Hrwcron-Run`` header of the next trigger: one more for a scheduled tick (None
    when the job has used up its runs), the same number for a manual or backfill trigger."""
    total = max(last_run, record.total)
    if not scheduled:
        return total
    if total - record.base >= max_runs:
        return None
    return total + 1


def decode_count(data: bytes) -> RunCount:
    try:
        return msgspec.json.decode(data, type=RunCount)
    except msgspec.MsgspecError:
        # An unreadable copy must not stop a job or reset its count to zero for good: the
        # stream's own numbers (and the next write) take over.
        return RunCount()
