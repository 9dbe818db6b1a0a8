"""Failpoints armed through the environment, so tests can stop a replica at an exact step.

``HRWCRON_FAILPOINTS="after_claim=stop"`` makes the process SIGSTOP itself the first time it
passes ``after_claim``; ``crash`` exits at once with status 137 (as kill -9 would), ``sleep:S``
waits S seconds. ``name=action@job`` only fires for that job. Each failpoint fires once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from hrwcron.core.config import FAILPOINTS_ENV as ENV


@dataclass
class _Armed:
    action: str
    job: str | None
    fired: bool = False


class Failpoints:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._armed: dict[str, _Armed] = {}
        for item in filter(None, (p.strip() for p in env.get(ENV, "").split(","))):
            name, _, rest = item.partition("=")
            action, _, job = rest.partition("@")
            self._armed[name] = _Armed(action or "stop", job or None)

    def __bool__(self) -> bool:
        return bool(self._armed)

    async def hit(self, name: str, job: str) -> None:
        armed = self._armed.get(name)
        if armed is None or armed.fired or (armed.job is not None and armed.job != job):
            return
        armed.fired = True
        print(f"failpoint {name} {armed.action} job={job}", file=sys.stderr, flush=True)
        if armed.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif armed.action == "crash":
            os._exit(137)
        elif armed.action.startswith("sleep:"):
            await asyncio.sleep(float(armed.action.split(":", 1)[1]))
