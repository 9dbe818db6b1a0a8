"""The chaos checker: each kind of violation found on a made-up stream, the table, the exit
status, failover figures, and the command line against a real server's stream."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from harness import NatsServer
from harness.chaos import Trigger, parse_trigger
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import JobSpec
from hrwcron.process.app import open_stores

from .checker import check, failover_times, main, parse_instant

T0 = 1_800_000_000_000  # a whole second
JOB = JobSpec(name="tick", schedule="@every 1s", max_lateness=5)


def trigger(
    seq: int, due: int, stored: float, node: str = "r0", job: str = "tick", msg_id: str = ""
) -> Trigger:
    headers = {"Nats-Msg-Id": msg_id or f"{job}:{due}", "Hrwcron-Job": job}
    body = msgspec.json.encode({"job": job, "due_ms": due, "node": node, "attempt": 1})
    return parse_trigger(seq, f"hrwcron.trigger.{job}", body, headers, stored)


def clean(count: int = 5) -> list[Trigger]:
    return [trigger(i + 1, T0 + i * 1000, T0 + i * 1000 + 20) for i in range(count)]


WINDOW = (T0, T0 + 4000)


def test_a_clean_stream_passes_with_its_ticks_counted() -> None:
    verdict = check(clean(), [JOB], WINDOW)
    assert verdict.ok and verdict.exit_code == 0
    assert verdict.ticks == 5
    assert verdict.worst_lateness_ms == 20
    assert "5 ticks of 1 jobs" in verdict.table() and "no violations" in verdict.table()


@pytest.mark.parametrize(
    ("kind", "stream"),
    [
        ("missing", [t for t in clean() if t.seq != 3]),
        ("duplicated", [*clean(), trigger(6, T0 + 2000, T0 + 2500, node="r1")]),
        ("early", [*clean(4), trigger(5, T0 + 4000, T0 + 4000 - 51)]),
        ("late", [*clean(4), trigger(5, T0 + 4000, T0 + 4000 + 5051)]),
        (
            "out_of_order",
            [*clean(3), trigger(4, T0 + 4000, T0 + 4020), trigger(5, T0 + 3000, T0 + 4030)],
        ),
        ("stray", [*clean(), trigger(6, T0 + 1500, T0 + 1600)]),
    ],
)
def test_each_violation_is_reported_by_kind_and_fails_the_run(
    kind: str, stream: list[Trigger]
) -> None:
    verdict = check(stream, [JOB], WINDOW)
    assert verdict.exit_code == 1
    assert verdict.counts()[kind] >= 1, verdict.table()
    assert f"| {kind} | {verdict.counts()[kind]} |" in verdict.table()
    assert f"| {JOB.name} |" in verdict.table()  # the per-job row


def test_early_and_late_are_judged_with_fifty_milliseconds_of_tolerance() -> None:
    early = [*clean(4), trigger(5, T0 + 4000, T0 + 4000 - 50)]
    assert check(early, [JOB], WINDOW).ok
    late = [*clean(4), trigger(5, T0 + 4000, T0 + 4000 + 5050)]
    assert check(late, [JOB], WINDOW).ok
    assert check(late, [JOB], WINDOW, late_tolerance_ms=0).counts()["late"] == 1


def test_failover_is_the_lateness_of_the_first_tick_after_its_owner_left() -> None:
    stream = [
        trigger(1, T0, T0 + 10, node="r0"),
        trigger(2, T0 + 1000, T0 + 1010, node="r0"),
        trigger(3, T0 + 2000, T0 + 3200, node="r1"),  # r0 left at T0 + 1500
        trigger(4, T0 + 3000, T0 + 3210, node="r1"),
    ]
    assert failover_times(stream, [JOB], [("r0", T0 + 1500, "kill")]) == [("kill", 1200)]
    # Nothing to measure for a replica that was not firing this job.
    assert failover_times(stream, [JOB], [("r2", T0 + 1500, "kill")]) == []


def test_instants_on_the_command_line() -> None:
    assert parse_instant("1800000000000") == T0
    assert parse_instant("2027-01-15T08:00:00Z") == T0
    assert parse_instant("-10m", now_ms=T0) == T0 - 600_000
    with pytest.raises(Exception, match="no time zone"):
        parse_instant("2027-01-15T08:00:00")


async def test_the_command_line_checks_a_real_stream_and_exits_by_verdict(
    nats_server: NatsServer,
) -> None:
    config = Config(
        nats=NatsConfig(servers=[nats_server.url]),
        scheduler=SchedulerConfig(node_id="checker"),
        http=HttpConfig(listen=""),
    )
    stores = await open_stores(config)
    # Due instants just past, so that the server's timestamps are neither early nor late.
    base = (int(time.time()) - 3) * 1000
    try:
        await stores.jobs.put(JOB, None)
        js = stores.client.jetstream()
        for i in range(3):
            due = base + i * 1000
            await js.publish(
                "hrwcron.trigger.tick",
                msgspec.json.encode({"job": "tick", "due_ms": due}),
                headers={"Nats-Msg-Id": f"tick:{due}", "Hrwcron-Job": "tick"},
            )
    finally:
        await stores.client.close()
    args = ["--nats", nats_server.url, "--since", str(base), "--settle", "1"]
    assert await asyncio.to_thread(main, [*args, "--until", str(base + 2000)]) == 0
    # One second further the window holds a tick nobody published.
    assert await asyncio.to_thread(main, [*args, "--until", str(base + 3000)]) == 1


def test_an_acknowledged_trigger_no_longer_at_its_sequence_is_reported() -> None:
    from harness.ackjournal import Ack

    stream = clean()
    # seq 3 acknowledged T0+2000, but after a power cut the stream lost it and seq 3 now
    # holds the next tick; T0+2000 came back at seq 6 (published again).
    moved = [*stream[:2], trigger(3, T0 + 3000, T0 + 3020), trigger(4, T0 + 4000, T0 + 4020)]
    moved.append(trigger(5, T0 + 2000, T0 + 2500))
    acks = [Ack(f"tick:{T0 + 1000}", "S", 2, False, "r0", 0.0)]
    acks.append(Ack(f"tick:{T0 + 2000}", "S", 3, False, "r1", 0.0))
    assert check(stream, [JOB], WINDOW, acks=acks).ok
    verdict = check(moved, [JOB], WINDOW, acks=acks)
    assert verdict.counts() == {"ack_lost": 1, "out_of_order": 1}
    lost = next(v for v in verdict.violations if v.kind == "ack_lost")
    assert lost.job == "tick" and lost.due_ms == T0 + 2000
    assert "seq 3 now holds 'tick:" in lost.detail and "published again at seq 5" in lost.detail
    gone = check(stream[:2], [JOB], (T0, T0 + 1000), acks=acks)
    assert [v.detail for v in gone.violations if v.kind == "ack_lost"] == [
        "acknowledged to r1 at seq 3; seq 3 is empty; no longer in the stream"
    ]
