"""Requests about one job, sent on to a replica that holds it when this one holds a share.

With ``scheduler.holders`` set, a replica holds only its lanes' jobs (core/partitions.py), but
any replica of the queue group may receive a request about any job. Such a request goes, as
it came, to the job's first ready holder on that replica's own subjects
(``<prefix>.node.<node>.<verb>``), and its reply, error or not, goes back unchanged. A request
on a node subject is always served where it lands, so nothing is sent on twice.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from hrwcron.core import partitions
from hrwcron.engine.queries import EngineQueries

# The verbs about one named job, and where their request names it.
ONE_JOB = frozenset(
    {
        "jobs.get",
        "jobs.put",
        "jobs.delete",
        "jobs.pause",
        "jobs.resume",
        "trigger",
        "backfill",
        "history",
        "status",
    }
)
FORWARD_TIMEOUT = 10.0
ERROR_CODE = "Nats-Service-Error-Code"
ERROR_TEXT = "Nats-Service-Error"


def node_subject(prefix: str, node: str, verb: str) -> str:
    return f"{prefix}.node.{node}.{verb}"


def job_named(verb: str, request: Any) -> tuple[str, list[str]] | None:
    """The job a request is about and the tags it is known to have (a put names them)."""
    if verb not in ONE_JOB:
        return None
    if verb == "jobs.put":
        return request.spec.name, list(request.spec.tags)
    name = getattr(request, "name", "")
    return (name, []) if name else None


def holder_for(scheduler: EngineQueries, verb: str, request: Any) -> str | None:
    """The replica to send this request on to, or None to serve it here."""
    if scheduler.settings.holders <= 0:
        return None
    named = job_named(verb, request)
    if named is None:
        return None
    name, tags = named
    held = scheduler.held_lanes
    if name in scheduler.jobs or held is None:
        return None
    lane = partitions.lane_of(name, tags)
    if lane in held:
        return None  # held here: a job this replica does not have does not exist
    order = scheduler.ranking_of_lane(name, lane)
    return order[0] if order and order[0] != scheduler.node else None


async def send_to(client: Client, prefix: str, node: str, verb: str, data: bytes) -> Msg:
    return await client.request(node_subject(prefix, node, verb), data, timeout=FORWARD_TIMEOUT)


def relayed_error(msg: Msg) -> tuple[str, str] | None:
    """The micro-service error code and text of a reply, None when it is no error."""
    headers = msg.headers or {}
    code = headers.get(ERROR_CODE)
    return None if code is None else (code, headers.get(ERROR_TEXT, ""))
