"""A one-line progress bar for long operator commands, on stderr.

It shows itself only on a terminal, and only once a command has run for about a second, so a
quick command prints exactly what it printed before and output piped into a file or another
program never holds control characters. Pure standard library: the clock and the stream are
passed in, which is also how the tests drive it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TextIO

# A command shorter than this shows no bar at all.
SHOW_AFTER_S = 1.0
# Redraws per second at most: a terminal is slower than a loop counting jobs.
REDRAW_EVERY_S = 0.1
BAR_WIDTH = 24
# The rate is the average over the last few seconds, so a stall shows in the time left.
RATE_WINDOW_S = 5.0


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Counts work done out of ``total`` (None while unknown) and draws a bar on ``stream``.

    ``enabled`` None means "when ``stream`` is a terminal". ``close`` erases the bar, so the
    summary line a command prints afterwards is the same with and without it."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: TextIO,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        width: int = 80,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream
        self._enabled = _is_terminal(stream) if enabled is None else enabled
        self._clock = clock
        self._width = max(40, width)
        self._started = clock()
        self._drawn_at: float | None = None
        self._shown = False
        self._samples: list[tuple[float, int]] = [(self._started, 0)]

    @property
    def shown(self) -> bool:
        """Whether the bar is on the screen now."""
        return self._shown

    def stage(self, label: str, total: int | None = None) -> None:
        """Start counting something else (the next phase of a command) on the same line."""
        self.label = label
        self.total = total
        self.done = 0
        now = self._clock()
        self._samples = [(now, 0)]
        self._draw(now, force=self._shown)

    def set_total(self, total: int | None) -> None:
        self.total = total

    def advance(self, count: int = 1) -> None:
        self.update(self.done + count)

    def update(self, done: int) -> None:
        self.done = done
        self._draw(self._clock())

    def close(self) -> None:
        """Erase the bar (if it was shown); nothing is left on the terminal."""
        if self._shown:
            self._stream.write("\r" + " " * (self._width - 1) + "\r")
            self._stream.flush()
            self._shown = False
        self._enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- drawing

    def rate(self, now: float) -> float:
        """Units per second over the last RATE_WINDOW_S (since the start before that)."""
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.pop(0)
        since, count = self._samples[0]
        elapsed = now - since
        return (self.done - count) / elapsed if elapsed > 0 else 0.0

    def line(self, now: float) -> str:
        """The text of the bar at ``now``, at most ``width - 1`` characters."""
        rate = self.rate(now)
        parts = [self.label]
        if self.total:
            share = min(1.0, self.done / self.total)
            filled = int(share * BAR_WIDTH)
            parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
            parts.append(f"{_count(self.done)}/{_count(self.total)} {share * 100:3.0f}%")
        else:
            parts.append(_count(self.done))
        parts.append(f"{_count(rate)}/s")
        if self.total:
            left = (self.total - self.done) / rate if rate > 0 else math.inf
            parts.append(f"{_duration(left)} left")
        text = " ".join(parts)
        elapsed = f" {_duration(now - self._started)} elapsed"
        if len(text) + len(elapsed) < self._width:  # the first thing to go on a narrow screen
            text += elapsed
        return text[: self._width - 1]

    def _draw(self, now: float, force: bool = False) -> None:
        if not self._enabled or now - self._started < SHOW_AFTER_S:
            return
        if not force and self._drawn_at is not None and now - self._drawn_at < REDRAW_EVERY_S:
            return
        text = self.line(now)
        self._stream.write("\r" + text.ljust(self._width - 1))
        self._stream.flush()
        self._drawn_at = now
        self._shown = True


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False
