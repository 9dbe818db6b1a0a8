"""The progress bar of long operator commands: on a terminal only, only after a second, erased
before the summary line; and the windowed counter behind "missed in the last hour"."""

from __future__ import annotations

import io

import pytest

from hrwcron.cli.progress import SHOW_AFTER_S, Progress
from hrwcron.engine.recent import RecentCounts


class Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_count_rate_and_time_left_after_a_second() -> None:
    out, clock = Terminal(tty=True), Clock()
    bar = Progress("writing jobs", 1000, stream=out, clock=clock, width=120)
    bar.update(100)
    assert out.getvalue() == "", "nothing in the first second"
    clock.now += 2.0
    bar.update(400)
    line = out.getvalue().split("\r")[-1].rstrip()
    assert line.startswith("writing jobs [")
    assert "400/1,000" in line and "40%" in line
    assert "200/s" in line  # 400 jobs in 2 s
    assert "0:03 left" in line  # 600 more at 200/s
    assert "0:02 elapsed" in line
    bar.close()
    assert not bar.shown
    # The bar is erased: the last thing on the line is blanks followed by a carriage return.
    assert out.getvalue().endswith("\r") and out.getvalue().split("\r")[-2].strip() == ""


def test_no_bar_when_stderr_is_not_a_terminal_or_when_quiet() -> None:
    for out, enabled in ((Terminal(tty=False), None), (Terminal(tty=True), False)):
        clock = Clock()
        bar = Progress("reading jobs", 10, stream=out, clock=clock, enabled=enabled)
        clock.now += 5.0
        bar.update(5)
        bar.close()
        assert out.getvalue() == ""


def test_a_quick_command_leaves_nothing_behind() -> None:
    out, clock = Terminal(tty=True), Clock()
    with Progress("reading jobs", stream=out, clock=clock) as bar:
        clock.now += SHOW_AFTER_S / 2
        bar.update(20_000)
    assert out.getvalue() == ""


def test_unknown_total_counts_without_a_bar_and_stages_restart_the_count() -> None:
    out, clock = Terminal(tty=True), Clock()
    bar = Progress("reading jobs", stream=out, clock=clock, width=100)
    clock.now += 1.5
    bar.update(3000)
    line = out.getvalue().split("\r")[-1]
    assert "[" not in line and "3,000" in line and "left" not in line
    bar.stage("writing jobs", 10)
    clock.now += 1.0
    bar.update(5)
    line = out.getvalue().split("\r")[-1]
    assert line.startswith("writing jobs [") and "5/10" in line and "5/s" in line


def test_redraws_are_throttled_and_the_line_fits_the_width() -> None:
    out, clock = Terminal(tty=True), Clock()
    bar = Progress("x" * 200, 100, stream=out, clock=clock, width=50)
    clock.now += 2.0
    for done in range(100):
        bar.update(done)  # the clock stands still: one redraw
    draws = out.getvalue().split("\r")[1:]
    assert len(draws) == 1
    assert len(draws[0]) == 49


def test_a_stall_shows_in_the_rate() -> None:
    out, clock = Terminal(tty=True), Clock()
    bar = Progress("writing jobs", 1000, stream=out, clock=clock, width=120)
    for _ in range(10):
        clock.now += 0.5
        bar.update(bar.done + 50)  # 100 a second
    for _ in range(20):
        clock.now += 0.5
        bar.update(bar.done)  # then nothing for 10 s
    line = out.getvalue().split("\r")[-1]
    assert " 0/s" in line and "? left" in line


def test_recent_counts_forget_after_the_window() -> None:
    counts = RecentCounts(window_ms=3_600_000, bucket_ms=60_000)
    counts.add(0)
    counts.add(59_999, 2)
    counts.add(1_800_000)
    assert counts.total(1_800_000) == 4
    assert counts.total(3_600_000 + 59_999) == 1  # the first minute's three are gone
    assert counts.total(5_400_000 + 60_000) == 0
    counts.add(10, 0)
    assert counts.total(10) == 0


def test_recent_counts_need_whole_buckets() -> None:
    with pytest.raises(ValueError, match="multiple"):
        RecentCounts(window_ms=1000, bucket_ms=300)


def test_a_narrow_terminal_drops_the_elapsed_time_rather_than_cut_a_figure() -> None:
    out, clock = Terminal(tty=True), Clock()
    bar = Progress("writing jobs", 100_000, stream=out, clock=clock, width=80)
    clock.now += 2.0
    bar.update(40_000)
    line = out.getvalue().split("\r")[-1].rstrip()
    assert line.endswith("0:03 left") and "elapsed" not in line
