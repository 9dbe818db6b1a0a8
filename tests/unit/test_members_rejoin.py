"""A heartbeat that rejoins after its key expired, in the race a route fault produced in a long
chaos run: a beat of this replica timed out, its key expired, and the write landed after all;
the next beat reads the key as gone (from a server that had not seen the write), cannot
create it, and must find its own heartbeat there, not another replica's, or it stops for
good over a node id it holds itself.

The KV calls are stood in for: the race needs a stale read, which no single test server gives.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hrwcron.adapters.jetstream import members as members_module
from hrwcron.adapters.jetstream.members import JetStreamMembers
from hrwcron.core.errors import ConflictError
from hrwcron.core.model import Heartbeat
from hrwcron.engine.ports import StoreUnavailable


def beat(instance: str) -> Heartbeat:
    return Heartbeat(node="r1", instance=instance, started_ms=1, version="test")


def stage(monkeypatch: pytest.MonkeyPatch, *, held_by: str | None) -> list[str]:
    """The store as the rejoining beat finds it: its conditional write refused, the key read
    as gone, the create refused, and the leader holding ``held_by``'s heartbeat (None: gone
    again)."""
    calls: list[str] = []

    async def conditional_put(*args: Any) -> int | None:
        calls.append("conditional_put")
        return None

    async def entry_or_none(*args: Any) -> None:
        calls.append("entry_or_none")
        return None

    async def create_only(*args: Any) -> int | None:
        calls.append("create_only")
        return None

    async def last_message(*args: Any) -> tuple[int, bytes | None]:
        calls.append("last_message")
        if held_by is None:
            return 12, None
        return 11, msgspec.json.encode(beat(held_by))

    for name, fake in {
        "conditional_put": conditional_put,
        "entry_or_none": entry_or_none,
        "create_only": create_only,
        "last_message": last_message,
    }.items():
        monkeypatch.setattr(members_module, name, fake)
    return calls


def members() -> JetStreamMembers:
    return JetStreamMembers(None, None, "hrwcron_members")  # type: ignore[arg-type]


async def test_its_own_late_heartbeat_is_no_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stage(monkeypatch, held_by="mine")
    assert await members().beat("r1", beat("mine"), 7) == 11
    assert calls == ["conditional_put", "entry_or_none", "create_only", "last_message"]


async def test_another_instance_there_is_still_a_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    stage(monkeypatch, held_by="intruder")
    with pytest.raises(ConflictError, match="held by instance intruder"):
        await members().beat("r1", beat("mine"), 7)


async def test_a_key_gone_again_is_tried_at_the_next_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    stage(monkeypatch, held_by=None)
    with pytest.raises(StoreUnavailable):
        await members().beat("r1", beat("mine"), 7)
