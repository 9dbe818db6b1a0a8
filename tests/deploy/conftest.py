"""Fixtures of the deploy tests: one 3-node cluster from the shipped nats/ files for the whole
run (each test module uses it as it finds it), and a connection per role."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from .natsconf import Session, ShippedCluster, passwords_env, random_passwords


@pytest.fixture(scope="session")
def passwords() -> dict[str, str]:
    return random_passwords()


@pytest.fixture(scope="session")
def shipped_cluster(
    tmp_path_factory: pytest.TempPathFactory, passwords: dict[str, str]
) -> Iterator[ShippedCluster]:
    with pytest.MonkeyPatch.context() as mp:
        # The servers inherit the environment, which is where accounts.conf reads passwords.
        for name, value in passwords_env(passwords).items():
            mp.setenv(name, value)
        # The servers' logs stay in pytest's temporary directory for a failed run.
        cluster = ShippedCluster(tmp_path_factory.mktemp("shipped-cluster")).start()
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
async def sessions(
    shipped_cluster: ShippedCluster, passwords: dict[str, str]
) -> AsyncIterator[dict[str, Session]]:
    opened = {
        role: await Session().open(shipped_cluster.urls, role, password)
        for role, password in passwords.items()
    }
    try:
        yield opened
    finally:
        for session in opened.values():
            await session.close()
