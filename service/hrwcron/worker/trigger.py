"""The trigger a handler receives, and the handler's type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from hrwcron.core.model import TriggerMessage


@dataclass(frozen=True)
class Trigger:
    """One delivery of a trigger to the handler."""

    message: TriggerMessage
    tick: str  # the tick key (Nats-Msg-Id): the same on every redelivery
    subject: str
    headers: Mapping[str, str]
    delivered: int  # 1 on the first delivery
    msg: Msg = field(repr=False)
    # True when this run took the tick over from a run that stopped renewing its lease (its
    # worker was killed, paused or cut off): that run may have done part or all of the work.
    takeover: bool = False

    @property
    def job(self) -> str:
        return self.message.job


Handler = Callable[[Trigger], Awaitable[None]]
