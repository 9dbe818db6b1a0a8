"""Wall-clock arithmetic every schedule shares: the supported years, calendar dates as days
since 1970, time zones as segments of constant UTC offset, and the error every parse raises."""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hrwcron.core.errors import Problem, ScheduleError

# The instants a schedule is evaluated for; outside them datetime (and the zone data) run out.
MIN_MS = -5_364_662_400_000  # 1800-01-01T00:00Z
MAX_MS = 221_845_392_000_000  # 9000-01-01T00:00Z
MAX_YEAR = 9100

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
MEMO_SIZE = 4096


DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def schedule_error(where: str, message: str) -> ScheduleError:
    """The error a schedule, an exclusion or a window raises: one problem at ``where``."""
    return ScheduleError(Problem(where, message))


# --- calendar arithmetic (proleptic Gregorian, days since 1970-01-01) -------------------------


def days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def days_in_month(y: int, m: int) -> int:
    if m == 2 and not (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)):
        return 28
    return DAYS_IN_MONTH[m]


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise schedule_error(
            "tz", "empty time zone: give an IANA zone such as 'UTC' or 'Europe/Berlin'"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise schedule_error(
            "tz", f"{tz!r} is not an IANA time zone (e.g. 'UTC', 'Europe/Berlin')"
        ) from None


# --- time zones as segments of constant UTC offset -----------------------------------------

# Offsets are probed once a day: every transition in tzdata since 1970 is at least weeks from
# the next, so a day's step finds each one, and bisection pins it to the second.
_CHUNK_S = 1 << 24  # about 194 days
_PROBE_S = 86_400


class ZoneTable:
    """Where a zone's UTC offset changes, found lazily by probing, cached per ~half year."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self.chunks: dict[int, list[tuple[int, int]]] = {}
        self.windows: dict[int, tuple[list[int], list[int]]] = {}

    def offset_s(self, s: int) -> int:
        delta = (EPOCH + timedelta(seconds=s)).astimezone(self.zone).utcoffset()
        return 0 if delta is None else delta // _SECOND

    def chunk(self, c: int) -> list[tuple[int, int]]:
        """(transition second, offset from it on) for transitions in (c*C, (c+1)*C]."""
        found = self.chunks.get(c)
        if found is None:
            found = []
            lo = c * _CHUNK_S
            end = lo + _CHUNK_S
            lo_off = self.offset_s(lo)
            while lo < end:
                hi = min(lo + _PROBE_S, end)
                hi_off = self.offset_s(hi)
                if hi_off != lo_off:
                    a, b = lo, hi  # offset(a) == lo_off, offset(b) != lo_off
                    while b - a > 1:
                        mid = (a + b) // 2
                        if self.offset_s(mid) == lo_off:
                            a = mid
                        else:
                            b = mid
                    found.append((b, self.offset_s(b)))
                lo, lo_off = hi, hi_off
            self.chunks[c] = found
        return found

    def window(self, k: int) -> tuple[list[int], list[int]]:
        """Transition instants (ms) in ((k-1)C, (k+2)C] and the offset (ms) before/after each:
        ``offs[i]`` holds between ``times[i-1]`` and ``times[i]``."""
        win = self.windows.get(k)
        if win is None:
            times: list[int] = []
            offs = [self.offset_s((k - 1) * _CHUNK_S) * 1000]
            for c in (k - 1, k, k + 1):
                for t, off in self.chunk(c):
                    times.append(t * 1000)
                    offs.append(off * 1000)
            win = (times, offs)
            if len(self.windows) >= 256:
                self.windows.clear()
            self.windows[k] = win
        return win

    def segment(self, x: int) -> tuple[int, int, int, int]:
        """(start, end, offset, offset before start) of the constant-offset run holding ``x``.
        Both ends may be artificial cut points where the offset does not change."""
        k = (x // 1000) // _CHUNK_S
        times, offs = self.window(k)
        i = bisect_right(times, x)
        start = times[i - 1] if i else (k - 1) * _CHUNK_S * 1000
        end = times[i] if i < len(times) else (k + 2) * _CHUNK_S * 1000
        return start, end, offs[i], offs[i - 1] if i else offs[0]


@lru_cache(maxsize=512)
def zone_table(tz: str) -> ZoneTable:
    return ZoneTable(_zone(tz))


def wall_ms(instant_ms: int, tz: str) -> int:
    """The local wall-clock time of ``instant_ms`` in ``tz``, as milliseconds since
    1970-01-01T00:00 local (both passes of a repeated hour give the same wall times)."""
    return instant_ms + zone_table(tz).segment(instant_ms)[2]


def instant_of_wall(wall: int, tz: str, *, after: int | None = None) -> int:
    """The first instant (strictly after ``after`` when given) at which the local clock in
    ``tz`` shows ``wall`` or later: the first pass of a repeated time, and the end of the gap
    for a time a spring-forward skipped, as the DST policy of fixed-time schedules reads them.
    """
    zones = zone_table(tz)
    # No zone is more than 26 hours off UTC, so the clock shows less than ``wall`` here.
    t = wall - 26 * 3_600_000 if after is None else after + 1
    while True:
        _, end, off, _ = zones.segment(t)
        if t + off >= wall:
            return t  # at ``after`` already, or the clock jumped over ``wall`` at a transition
        if wall - off < end:
            return wall - off
        t = end


def as_instant_ms(instant: datetime | int) -> int:
    if isinstance(instant, datetime):
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise schedule_error(
                "instant",
                f"naive datetime: {instant.isoformat()} has no time zone; "
                "give an aware datetime or epoch milliseconds",
            )
        ms = (instant - EPOCH) // timedelta(milliseconds=1)
    elif isinstance(instant, int) and not isinstance(instant, bool):
        ms = instant
    else:
        raise TypeError(f"instant must be an aware datetime or epoch ms, not {type(instant)!r}")
    if not MIN_MS <= ms < MAX_MS:
        raise schedule_error("instant", f"{ms} ms is outside the supported years 1800-8999")
    return ms
