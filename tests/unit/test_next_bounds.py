"""``hrwcron next`` with exclusions (issue 25): the local search is bounded too, and says what it
found within its bound, not more."""

from __future__ import annotations

import pytest

from hrwcron.cli import main

# Every second but 59 excluded, and 59 too from Sunday to Friday: fires on Saturdays only,
# 00:00:59 first. From a Tuesday that is thousands of covered stretches away, past the search bound.
SATURDAYS = ["* * * * * *", "--exclude", "0-58 * * * * *", "--exclude", "59 * * * * 0-5"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_a_tick_within_the_bound_is_found(capsys: pytest.CaptureFixture[str]) -> None:
    # The same expression from an hour before: found (the case below differs only in --after).
    code, out, _ = run(capsys, "next", *SATURDAYS, "--after", "2026-12-04T23:00:00Z")
    assert (code, out) == (0, ["2026-12-05T00:00:59Z"])


def test_a_search_that_ran_out_of_steps_does_not_claim_there_is_no_tick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, err = run(capsys, "next", *SATURDAYS, "--after", "2026-12-01T21:00:00Z")
    assert out == ["2026-12-05T00:00:59Z"] or "within the next 100 years" not in err, err
    if not out:
        assert "without deciding whether a further tick fires" in err, err
