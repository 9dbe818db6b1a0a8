"""The layout marker of a jobs bucket just created: a replicated bucket may not answer until
it has elected a leader, and the marker is tried again meanwhile instead of failing the
provisioning (seen on a 3-node cluster as 'no response from stream')."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.errors import NoStreamResponseError

from hrwcron.adapters.jetstream import jobs
from hrwcron.core import partitions


class ElectingStream:
    """Publishes get no answer the first ``silent`` times, as while a leader is elected."""

    def __init__(self, silent: int) -> None:
        self.silent = silent
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes, **_: Any) -> SimpleNamespace:
        if self.silent > 0:
            self.silent -= 1
            raise NoStreamResponseError
        self.published.append((subject, payload))
        return SimpleNamespace(seq=1)


async def test_the_marker_is_written_once_the_new_bucket_answers() -> None:
    stream = ElectingStream(silent=3)
    await jobs.mark_lanes(stream, "b_jobs")  # type: ignore[arg-type]
    assert stream.published == [(f"$KV.b_jobs.{partitions.LAYOUT_KEY}", partitions.LAYOUT)]


async def test_a_bucket_that_never_answers_still_fails_the_provisioning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jobs, "MARK_WAIT_S", 0.3)
    stream = ElectingStream(silent=10_000)
    with pytest.raises(NoStreamResponseError):
        await jobs.mark_lanes(stream, "b_jobs")  # type: ignore[arg-type]
    assert stream.published == []
