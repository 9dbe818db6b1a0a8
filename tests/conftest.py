"""Shared fixtures: real nats-server processes, chaos options, and failure diagnostics."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from harness import (
    KEEP_DIRS_ENV,
    FaketimeUnavailable,
    NatsCluster,
    NatsServer,
    faketime_env,
    find_libfaketime,
    keep_dirs,
    run_dir,
)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # pytest's temporary directories (tmp_path, where most fixtures keep their servers' stores)
    # go inside the run directory, so a killed run leaves none of them behind either; without
    # this, pytest keeps the last three runs' directories and a killed run's stores with them.
    if config.option.basetemp is None:
        config.option.basetemp = str(run_dir() / "pytest")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if keep_dirs():
        terminalreporter.write_line(f"run directory kept ({KEEP_DIRS_ENV}): {run_dir()}")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hrwcron chaos")
    group.addoption(
        "--chaos-seed",
        type=int,
        default=1,
        help="seed for the chaos schedule; a failing run is replayed with the same seed",
    )
    group.addoption(
        "--chaos-duration",
        type=float,
        default=1200.0,
        help="seconds each long chaos test keeps injecting faults",
    )
    group.addoption(
        "--chaos-sync",
        default="always",
        help="nats-server sync_interval for the long chaos runs' power-loss faults: always (as "
        "shipped), default (the server's own, every 2 minutes) or a duration such as 10s",
    )
    group.addoption(
        "--chaos-holders",
        type=int,
        default=0,
        help="scheduler.holders of the long chaos runs' replicas (0: each holds every job; 2: "
        "each holds a share, and churn and kills move lanes between them)",
    )
    group.addoption(
        "--chaos-warmup",
        type=float,
        default=0.0,
        help="seconds the long chaos runs let the replicas work before the first fault (130 "
        "lets nats-server's default two-minute flush pass before the first power cut)",
    )


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--chaos-seed"))


@pytest.fixture
def chaos_duration(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--chaos-duration"))


@pytest.fixture
def chaos_holders(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--chaos-holders"))


@pytest.fixture
def chaos_warmup(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--chaos-warmup"))


@pytest.fixture
def chaos_sync(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--chaos-sync"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # Fixture teardown reads this to decide whether the server logs are worth printing.
    setattr(item, f"_hrwcron_rep_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(
        getattr(getattr(request.node, f"_hrwcron_rep_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


def _print_log_tail(label: str, text: str, lines: int = 60) -> None:
    # Printed during teardown, so pytest shows it under "Captured stdout teardown".
    print(f"----- {label} (last {lines} lines) -----")
    print("\n".join(text.splitlines()[-lines:]))


@pytest.fixture
def tmp_store(tmp_path: Path) -> Path:
    """A fresh, empty directory for a store (server JetStream dir, replica state...)."""
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def nats_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NatsServer]:
    """A single JetStream nats-server on loopback, stopped and removed after the test."""
    server = NatsServer(name="single", base_dir=tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.cleanup()
        if _failed(request):
            _print_log_tail(f"nats-server {server.name} log", server.log_text())


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
def nats_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NatsCluster]:
    """A formed 3-node JetStream cluster (``n0``..``n2``), stopped and removed after the test."""
    cluster = NatsCluster(3, base_dir=tmp_path / "cluster").start()
    try:
        yield cluster
    finally:
        cluster.cleanup()
        if _failed(request):
            for name, text in cluster.log_texts().items():
                _print_log_tail(f"nats-server {name} log", text)


@pytest.fixture
def faketime() -> Callable[[float], dict[str, str]]:
    """``faketime_env``, or a skip when libfaketime is not installed."""
    try:
        find_libfaketime()
    except FaketimeUnavailable as exc:
        pytest.skip(str(exc))
    return faketime_env
