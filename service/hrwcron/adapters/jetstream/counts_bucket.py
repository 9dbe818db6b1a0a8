"""The durable copy of each max_runs job's run count, in a KV bucket (see core/run_limits.py)."""

from __future__ import annotations

from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import conditional_put, create_only, deleted, entry_or_none
from hrwcron.core.errors import ConflictError
from hrwcron.core.model import encode
from hrwcron.core.run_limits import RunCount, decode_count

# Writers only ever raise a record, so a lost race is retried against the new value; a handful
# of writers (the publisher and the job's owner) settle within a few rounds.
ATTEMPTS = 10


class JetStreamCounts:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket

    async def get(self, job: str) -> RunCount | None:
        entry = await entry_or_none(self._kv, job)
        if entry is None or deleted(entry) or not entry.value:
            return None
        return decode_count(entry.value)

    async def raise_total(self, job: str, total: int) -> RunCount:
        return await self._change(
            job, lambda held: RunCount(total=max(total, held.total), base=held.base)
        )

    async def reset(self, job: str, total: int) -> RunCount:
        def reset(held: RunCount) -> RunCount:
            top = max(total, held.total)
            return RunCount(total=top, base=top)

        return await self._change(job, reset)

    async def _change(self, job: str, change: Callable[[RunCount], RunCount]) -> RunCount:
        for _ in range(ATTEMPTS):
            entry = await entry_or_none(self._kv, job)
            absent = entry is None or deleted(entry) or not entry.value
            held = RunCount() if absent or entry is None else decode_count(entry.value or b"")
            wanted = change(held)
            if wanted == held and not absent:
                return held
            if absent:
                revision = await create_only(self._js, self._bucket, job, encode(wanted))
            else:
                assert entry is not None
                revision = await conditional_put(
                    self._js, self._bucket, job, encode(wanted), int(entry.revision or 0), None
                )
            if revision is not None:
                return wanted
        raise ConflictError(f"run count of {job!r} kept changing under {ATTEMPTS} writes")
