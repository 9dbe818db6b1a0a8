"""Progress marks over core NATS: one small message per replica every quarter failover step,
never stored. Only the scheduler role may publish or subscribe there (nats/accounts.conf)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hrwcron.engine.marks import Mark

log = logging.getLogger("hrwcron.marks")

_decode = msgspec.json.Decoder(Mark).decode
_encode = msgspec.json.Encoder().encode


class NatsMarks:
    def __init__(self, nc: Client, subject: str) -> None:
        self._nc = nc
        self._subject = subject
        self._garbled = 0

    async def announce(self, mark: Mark) -> None:
        await self._nc.publish(self._subject, _encode(mark))

    async def follow(self) -> AsyncIterator[Mark]:
        queue: asyncio.Queue[Mark] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            try:
                queue.put_nowait(_decode(msg.data))
            except msgspec.DecodeError:
                # Not a replica's mark: ignored (it could only cost work, see marks.py).
                self._garbled += 1
                if self._garbled % 100 == 1:
                    log.warning(
                        "ignored %d messages on %s that are not marks", self._garbled, msg.subject
                    )

        subscription = await self._nc.subscribe(self._subject, cb=deliver)
        try:
            while True:
                yield await queue.get()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
