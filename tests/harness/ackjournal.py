"""The record of every trigger the trigger stream acknowledged, kept by the replicas themselves,
and the check that each one is still in the stream where it was acknowledged.

A replica started through this file as a script (``python ackjournal.py run ...``) is an
ordinary ``hrwcron`` process, except that every PubAck it receives for a publish to the trigger
subjects is appended to the file named by ``ACK_JOURNAL_ENV`` as one JSON line: Msg-Id, stream,
sequence, whether the server called it a duplicate, and when. The hook wraps the trigger
adapter's ``JetStreamTriggers.publish_many`` (every trigger the engine publishes goes through
it, batched or one at a time) in this process only, so the service's code is unchanged: each
answer it records is a PubAck the server sent, decoded by the adapter.

A line is written after the PubAck arrived and before the replica acts on it, flushed to the
operating system at once: a replica killed right after an ack may miss a line (a record too
short, never a wrong one), and the page cache of the machine running the tests is not what the
power faults cut.

:func:`find_lost_acks` then compares the journal with the stream: an acknowledged
``(Msg-Id, sequence)`` whose sequence now holds another message, or nothing, was acknowledged
and lost. If the same Msg-Id is in the stream at a later sequence, the tick was published again
after the loss, which a worker that had consumed the first copy runs twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACK_JOURNAL_ENV = "HRWCRON_TEST_ACK_JOURNAL"
ACK_LOST = "ack_lost"
TRIGGER_PREFIX = "hrwcron.trigger."

__all__ = [
    "ACK_JOURNAL_ENV",
    "ACK_LOST",
    "Ack",
    "LostAck",
    "find_lost_acks",
    "read_journals",
    "script_path",
]


def script_path() -> str:
    return __file__


@dataclass(frozen=True)
class Ack:
    """One PubAck a replica received for a trigger."""

    msg_id: str
    stream: str
    seq: int
    duplicate: bool
    node: str
    at_ms: float


def read_journals(paths: Iterable[Path]) -> list[Ack]:
    """Every ack of every journal; a line cut short by a kill is skipped."""
    found: list[Ack] = []
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                item = json.loads(line)
                found.append(
                    Ack(
                        str(item["msg_id"]),
                        str(item["stream"]),
                        int(item["seq"]),
                        bool(item["duplicate"]),
                        str(item["node"]),
                        float(item["at_ms"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
    return found


@dataclass(frozen=True)
class LostAck:
    ack: Ack
    now_at: int | None  # the sequence the Msg-Id is stored at now, if anywhere
    seq_holds: str | None  # the Msg-Id the acknowledged sequence holds now, if any

    @property
    def detail(self) -> str:
        a = self.ack
        if self.now_at is not None:
            where = f"published again at seq {self.now_at}"
        else:
            where = "no longer in the stream"
        holds = f"now holds {self.seq_holds!r}" if self.seq_holds else "is empty"
        duplicate = " (as a duplicate)" if a.duplicate else ""
        return f"acknowledged to {a.node} at seq {a.seq}{duplicate}; seq {a.seq} {holds}; {where}"

    def __str__(self) -> str:
        return f"{ACK_LOST}: {self.ack.msg_id}: {self.detail}"


def find_lost_acks(
    acks: Iterable[Ack], stored: Sequence[tuple[int, str]], *, first_seq: int = 1
) -> list[LostAck]:
    """The acks whose message is not at its acknowledged sequence in ``stored`` ((seq, Msg-Id)
    of every message in the stream now). Sequences below ``first_seq`` were removed by the
    stream's own limits (max_age) and are not judged."""
    at_seq = dict(stored)
    where: dict[str, int] = {}
    for seq, msg_id in stored:
        where.setdefault(msg_id, seq)
    lost: list[LostAck] = []
    seen: set[tuple[str, int]] = set()
    for ack in sorted(acks, key=lambda a: (a.seq, a.at_ms)):
        key = (ack.msg_id, ack.seq)
        if key in seen or ack.seq < first_seq:
            continue
        seen.add(key)
        if at_seq.get(ack.seq) == ack.msg_id:
            continue
        now_at = where.get(ack.msg_id)
        lost.append(LostAck(ack, now_at, at_seq.get(ack.seq)))
    return lost


# --- the replica side: run hrwcron with the journal hook --------------------------------------


def _install(journal: Path, node: str) -> None:
    from hrwcron.adapters.jetstream.triggers import JetStreamTriggers

    original = JetStreamTriggers.publish_many
    handle = open(journal, "a", buffering=1)  # noqa: SIM115  (kept open for the process)

    def recorder(msg_id: str, stream: str) -> Any:
        def record(answer: asyncio.Future[Any]) -> None:
            if answer.cancelled() or answer.exception() is not None:
                return
            ack = answer.result()
            line = {
                "msg_id": msg_id,
                "stream": stream,
                "seq": ack.seq,
                "duplicate": bool(ack.duplicate),
                "node": node,
                "at_ms": time.time() * 1000,
            }
            handle.write(json.dumps(line) + "\n")

        return record

    async def publish_many(self: Any, writes: Sequence[Any]) -> list[asyncio.Future[Any]]:
        # Read before the call: the adapter adds its own headers to each write's dict.
        ids = [(subject, headers.get("Nats-Msg-Id", "")) for subject, _, headers, _ in writes]
        answers = await original(self, writes)
        for (subject, msg_id), answer in zip(ids, answers, strict=True):
            if subject.startswith(TRIGGER_PREFIX):
                # Registered before the engine's own callback, so it runs first: the line is
                # written before the replica acts on the answer.
                answer.add_done_callback(recorder(msg_id, self._stream))
        return answers

    JetStreamTriggers.publish_many = publish_many  # type: ignore[method-assign]


def _main(argv: list[str]) -> int:
    journal = os.environ.pop(ACK_JOURNAL_ENV, "")
    if journal:
        _install(Path(journal), os.environ.get("HRWCRON_NODE_ID", ""))
    from hrwcron.cli import main

    return main(argv)


def journals(directory: Path) -> Iterator[Path]:
    return iter(sorted(directory.glob("*.acks.jsonl")))


if __name__ == "__main__":
    # Run as a script, this file's directory is first on sys.path; the service must not
    # import a sibling of it by accident, so drop it.
    sys.path.pop(0)
    sys.exit(_main(sys.argv[1:]))
