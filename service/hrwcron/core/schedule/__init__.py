"""Cron schedules evaluated on local wall-clock time in an IANA zone, with a stated DST policy.

Every replica must compute the same due instants from the same (expression, zone, job name), so
the rules here are explicit rather than inherited from a library:

- 5 fields ``minute hour day-of-month month day-of-week`` or 6 with the **second first**;
  macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``; ``@every <duration>``
  ticks on the multiples of the interval since the Unix epoch (the zone plays no part).
- ``@at <date and time>`` is due once: at an instant written with ``Z`` or an offset, or at a
  local time in the zone read like a fixed-time schedule (first pass of a repeated hour, the
  end of the gap for a skipped time).
- A step wider than its range keeps the range's first value only (``*/30`` in hours is hour 0),
  as Vixie cron, cronie and croniter read it; step 0 is refused.
- Forms from Quartz and EventBridge: day-of-month ``L`` (last day), ``L-n`` (n days before it,
  n 1-30), ``nW`` (the weekday nearest day n, never leaving the month; a month without day n
  has none, like a plain ``31``), ``LW`` (last weekday); day-of-week ``nL`` (last weekday n of
  the month) and ``n#k`` (k-th weekday n, k 1-5; a month without one has no match), with
  Vixie's numbering (0 and 7 Sunday); ``?`` for ``*`` in either day field. They mix with plain
  values in lists (``1,15,L``).
- Jenkins' ``H``: ``H``, ``H(a-b)``, ``H/n``, ``H(a-b)/n`` stand for values picked by
  :func:`field_hash` of the job's name, so they need the name (``Schedule.parse(..., job=)``).
  A bare ``H`` covers the field (day-of-month only 1-28, so it fires every month).
- Vixie day rule: when both day fields are restricted (neither starts with ``*`` nor is ``?``)
  a day matches if either matches; otherwise both must.
- A day-of-month that no month of the month field can ever hold is refused, with the reason.
- DST (Vixie/ISC): a schedule is *fixed-time* when neither its minute nor its hour field starts
  with ``*``. A fixed-time schedule fires once at the first instant after a gap for local times
  the gap swallowed, and only on the first pass through a repeated hour. Interval-like schedules
  skip nonexistent times and fire on both passes. Firings that land on the same instant are one.

croniter is not used at run time: croniter 7 fires fixed-time schedules on both passes of a
repeated hour, reads a 6th field as seconds *last*, treats ``*/2`` in a day field as a
restriction (day OR instead of AND), accepts a 7th (year) field, silently wraps ``5-2`` and
hashes ``H`` its own way. A small matcher over wall time is both simpler to get right and faster.

The parts: :mod:`.fields` reads each cron field and its dialect forms, :mod:`.cron` compiles
the fields and finds matching wall times, :mod:`.durations` reads ``@every`` and other
durations, :mod:`.civil` holds calendar and time-zone arithmetic, and :mod:`.nextrun` is the
:class:`Schedule` that puts them together.
"""

from hrwcron.core.schedule.civil import instant_of_wall, wall_ms
from hrwcron.core.schedule.durations import (
    MAX_EVERY_MS,
    MIN_EVERY_MS,
    jitter_ms,
    parse_duration,
)
from hrwcron.core.schedule.fields import MACROS, MAX_EXPRESSION_LENGTH, field_hash
from hrwcron.core.schedule.nextrun import Schedule

__all__ = [
    "MACROS",
    "MAX_EVERY_MS",
    "MAX_EXPRESSION_LENGTH",
    "MIN_EVERY_MS",
    "Schedule",
    "field_hash",
    "instant_of_wall",
    "jitter_ms",
    "parse_duration",
    "wall_ms",
]
