"""What goes wrong in the worker SDK, and the failpoints that make it go wrong on purpose."""

from __future__ import annotations

from hrwcron.core.errors import HrwcronError, NatsSetupError
from hrwcron.engine.failpoints import Failpoints


class WorkerSettingsError(HrwcronError, ValueError):
    """Worker arguments that cannot keep the SDK's promise; says which one and why."""


class WorkerSetupError(NatsSetupError):
    """The trigger stream or the durable consumer cannot serve this worker as configured."""


class FailpointError(HrwcronError):
    """Raised by a worker failpoint armed with ``error``: a stand-in for a failed NATS call."""


class WorkerFailpoints(Failpoints):
    """The replicas' failpoints (``HRWCRON_FAILPOINTS``, :mod:`hrwcron.engine.failpoints`) at the
    worker's steps, plus the action ``error``, which raises :class:`FailpointError` once.

    Points: ``worker_begin``, ``worker_handler_returned`` (between the handler's return and its
    done record: ``crash`` there is the one window where a tick runs twice), ``worker_finish``,
    ``worker_ack``, ``worker_beat_written`` and ``worker_marker_written`` (after a heartbeat's
    write landed, before the heartbeat goes on). Unarmed, each point costs a truth test."""

    async def hit(self, name: str, job: str) -> None:
        armed = self._armed.get(name)
        if (
            armed is not None
            and armed.action == "error"
            and not armed.fired
            and armed.job in (None, job)
        ):
            armed.fired = True
            raise FailpointError(f"failpoint {name} job={job}")
        await super().hit(name, job)
