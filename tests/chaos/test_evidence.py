"""The evidence of a failed chaos run: tracebacks in replica logs read with their causes, and
the logs of a run directory kept without its stores."""

from __future__ import annotations

from pathlib import Path

from harness.evidence import keep, tracebacks

LOG = """\
2026-12-01 10:00:00,001 INFO    [r1] hrwcron.app: replica r1 started (instance ab)
2026-12-01 10:00:05,002 ERROR   [r1] hrwcron.admin: admin jobs.put failed
Traceback (most recent call last):
  File "/x/kv.py", line 10, in put
    await js.publish(subject, data)
nats.errors.TimeoutError: nats: timeout

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/service.py", line 5, in handle
    raise StoreUnavailable("jobs bucket") from exc
hrwcron.engine.ports.StoreUnavailable: jobs bucket
2026-12-01 10:00:06,003 WARNING [r1] hrwcron.nats: nats: disconnected
2026-12-01 10:00:07,004 ERROR   [r1] asyncio: Task exception was never retrieved
future: <Task finished name='heartbeat' coro=<beat()> exception=KeyError('x')>
Traceback (most recent call last):
  File "/x/membership.py", line 3, in beat
KeyError: 'x'
"""


def test_each_traceback_is_read_with_the_record_that_logged_it_and_its_cause() -> None:
    first, second = tracebacks(LOG)
    assert first.logged.endswith("admin jobs.put failed")
    assert first.raised == "hrwcron.engine.ports.StoreUnavailable: jobs bucket"
    assert first.causes == ("nats.errors.TimeoutError: nats: timeout",)
    assert first.summary().endswith(
        "StoreUnavailable: jobs bucket <- nats.errors.TimeoutError: nats: timeout"
    )
    assert "disconnected" not in first.text
    assert second.logged.endswith("Task exception was never retrieved")
    assert second.raised == "KeyError: 'x'" and second.causes == ()


def test_a_log_without_tracebacks_has_none() -> None:
    assert tracebacks(LOG.split("Traceback")[0]) == []


def test_keep_copies_logs_journals_and_reports_but_not_stores(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "world" / "replicas").mkdir(parents=True)
    (run / "world" / "replicas" / "r0.log").write_text(LOG)
    (run / "world" / "replicas" / "r0.acks.jsonl").write_text("{}\n")
    (run / "cluster" / "n0" / "store" / "jetstream").mkdir(parents=True)
    (run / "cluster" / "n0" / "server.log").write_text("[1] ready\n")
    (run / "cluster" / "n0" / "store" / "jetstream" / "meta.log").write_text("data")
    (run / "cluster" / "n0" / "store" / "blk.dat").write_text("data")
    kept = keep(run, tmp_path / "reports", "test_long_chaos[x]-seed11")
    assert kept.parent == tmp_path / "reports" / "failed"
    assert kept.name.startswith("test_long_chaos-x-seed11-")
    copied = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert copied == [
        "cluster/n0/server.log",
        "world/replicas/r0.acks.jsonl",
        "world/replicas/r0.log",
    ]
    assert (kept / "world" / "replicas" / "r0.log").read_text() == LOG
