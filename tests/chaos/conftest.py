"""A failed chaos test keeps its evidence: the logs, ack journals and reports of its directory
are copied under ``tests/chaos/reports/failed/`` before the run directory goes away, and the
failure says where."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from harness.clock_files import clockshift_unavailable
from harness.evidence import keep

REPORTS = Path(__file__).resolve().parent / "reports"
# Where this process kept evidence, for the summary at the end (without xdist; with it, each
# failure's own report says where).
KEPT = pytest.StashKey[list[str]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    source = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and isinstance(source, Path) and source.exists():
        seed = item.config.getoption("--chaos-seed")
        kept = keep(source, REPORTS, f"{item.name}-seed{seed}")
        (kept / "failure.txt").write_text(str(report.longrepr))
        report.sections.append(("chaos evidence", f"logs and reports of this run kept in {kept}"))
        item.config.stash.setdefault(KEPT, []).append(str(kept))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for path in terminalreporter.config.stash.get(KEPT, []):
        terminalreporter.write_line(f"chaos evidence kept in {path}")


@pytest.fixture
def clockshift() -> None:
    """Skip, with the reason, where a NATS server's clock cannot be moved (``needs_clockshift``)."""
    reason = clockshift_unavailable()
    if reason is not None:
        pytest.skip(f"cannot move a NATS server's clock: {reason}")
