"""Live pages without reloading: each open page holds one server-sent event stream, and gets a
small pulse whenever what it shows may have changed; the script then fetches the part of the
page that changed.

A pulse is a few numbers (the jobs revision, a fingerprint of the members, of one job), so an
open page costs one comparison a second and a fetch when something changed, at most every
``REFRESH_S``; the number of open streams is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import msgspec
from aiohttp import web

from hrwcron.adapters.telemetry import Telemetry
from hrwcron.engine.queries import EngineQueries

PULSE_S = 1.0
# However busy the replica, a part is fetched again at most this often.
REFRESH_S = 5.0
# Nothing changed: say so anyway now and then, so proxies keep the stream open.
KEEPALIVE_S = 15.0
MAX_STREAMS = 100


class Pulses:
    def __init__(
        self,
        scheduler: EngineQueries,
        telemetry: Telemetry,
        *,
        may_read: Callable[[web.BaseRequest], bool],
        walks: Callable[[], int] = lambda: 0,
        pulse_s: float = PULSE_S,
    ) -> None:
        self._s = scheduler
        self._telemetry = telemetry
        self._may_read = may_read
        self._walks = walks
        self._pulse_s = pulse_s
        self._closing = asyncio.Event()
        self.open = 0

    async def close(self, app: object = None) -> None:
        """Ends every open stream at once (the server is stopping)."""
        self._closing.set()

    def pulse(self, job: str) -> dict[str, object]:
        s = self._s
        now = s.clock.now_ms()
        slot = int(now // (REFRESH_S * 1000))
        members = tuple(
            (node, hb.ready, hb.reason, hb.digest, hb.jobs, hb.version)
            for node, (hb, _) in sorted(s.view.heartbeats().items())
        )
        live = tuple(self._telemetry.live)
        fleet = hash((members, live, s.digest, s.ready, slot, self._walks()))
        out: dict[str, object] = {"jobs": s.jobs_revision, "fleet": fleet, "slot": slot}
        if job:
            loaded = s.jobs.get(job)
            if loaded is None:
                out["job"] = "gone" if job not in s.skipped else "bad"
            else:
                last = s.last.get(loaded.subject)
                out["job"] = hash(
                    (
                        loaded.revision,
                        loaded.spec.paused,
                        last.seq if last else 0,
                        loaded.problem,
                        s.due_of(job),
                        len(self._telemetry.tick_log.troubles(job)),
                    )
                )
        return out

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if not self._may_read(request):
            return web.Response(status=401, text="sign in or present the status token\n")
        if self.open >= MAX_STREAMS:
            return web.Response(status=503, text="too many open pages; try again later\n")
        job = request.query.get("job", "")[:300]
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
            }
        )
        self.open += 1
        try:
            await response.prepare(request)
            last: dict[str, object] | None = None
            quiet = 0.0
            while True:
                data = self.pulse(job)
                if data != last or quiet >= KEEPALIVE_S:
                    await response.write(b"data: " + msgspec.json.encode(data) + b"\n\n")
                    last, quiet = data, 0.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._pulse_s)
                if self._closing.is_set():
                    break
                quiet += self._pulse_s
        except (ConnectionError, RuntimeError):
            pass  # the page was closed
        finally:
            self.open -= 1
        with contextlib.suppress(Exception):
            await response.write_eof()
        return response
