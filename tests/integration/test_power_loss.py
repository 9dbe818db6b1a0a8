"""The power-loss filesystem under real processes: through a FUSE mount, and under a real
nats-server whose acknowledged messages survive a cut only with ``sync_interval: always``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from harness import wait_for_async
from harness.ackjournal import Ack, find_lost_acks
from harness.power import DEFAULT_SYNC, SYNC_ALWAYS, PowerCluster, PowerMount, fuse_unavailable

pytestmark = pytest.mark.skipif(
    fuse_unavailable() is not None, reason=f"FUSE unavailable: {fuse_unavailable()}"
)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerMount]:
    fs = PowerMount(tmp_path / "disk", tmp_path / "mnt", tmp_path / "powerfs.log").start()
    try:
        yield fs
    finally:
        fs.close()
    assert not os.path.ismount(tmp_path / "mnt")


def test_a_cut_keeps_fsynced_data_and_drops_the_rest(mount: PowerMount) -> None:
    path = mount.mountpoint / "wal"
    with open(path, "wb") as f:
        f.write(b"synced.")
        f.flush()
        os.fsync(f.fileno())
        f.write(b"unsynced.")
    assert path.read_bytes() == b"synced.unsynced."  # reads see the page cache
    assert (mount.backing / "wal").read_bytes() == b"synced."
    assert mount.stats()[0] == 1
    files, size = mount.cut()
    assert files == 1 and size > 0
    assert path.read_bytes() == b"synced."
    assert mount.stats() == (0, 0)


def test_a_file_never_fsynced_survives_a_cut_empty(mount: PowerMount) -> None:
    path = mount.mountpoint / "sub" / "new"
    path.parent.mkdir()
    path.write_bytes(b"never synced")
    mount.cut()
    assert path.exists() and path.read_bytes() == b""


def test_writes_through_o_sync_and_fdatasync_are_durable(mount: PowerMount) -> None:
    fd = os.open(mount.mountpoint / "sync", os.O_CREAT | os.O_WRONLY | os.O_SYNC, 0o644)
    try:
        os.write(fd, b"x" * 10_000)
    finally:
        os.close(fd)
    with open(mount.mountpoint / "data", "wb") as f:
        f.write(b"y" * 5)
        f.flush()
        os.fdatasync(f.fileno())
    mount.cut()
    assert (mount.mountpoint / "sync").stat().st_size == 10_000
    assert (mount.mountpoint / "data").read_bytes() == b"yyyyy"


def test_an_unsynced_truncate_is_undone_but_a_closed_rewrite_is_kept(mount: PowerMount) -> None:
    path = mount.mountpoint / "index"
    with open(path, "wb") as f:
        f.write(b"old state")
        f.flush()
        os.fsync(f.fileno())
    with open(path, "r+b") as f:
        f.truncate(3)
        assert path.read_bytes() == b"old"
        mount.cut()  # power lost while the file is still open
    assert path.read_bytes() == b"old state"
    path.write_bytes(b"new")  # O_TRUNC, a write, close: ext4 flushes this on close
    mount.cut()
    assert path.read_bytes() == b"new"


def test_a_rename_over_a_file_flushes_the_new_data_first(mount: PowerMount) -> None:
    final, tmp = mount.mountpoint / "meta", mount.mountpoint / "meta.tmp"
    final.write_bytes(b"")  # exists (empty, never written)
    with open(tmp, "wb") as f:
        f.write(b"replacement")
    os.rename(tmp, final)
    other = mount.mountpoint / "fresh"
    with open(mount.mountpoint / "fresh.tmp", "wb") as f:
        f.write(b"unsynced")
    os.rename(mount.mountpoint / "fresh.tmp", other)  # not over a file: stays volatile
    mount.cut()
    assert final.read_bytes() == b"replacement"
    assert other.read_bytes() == b""


async def _publish_and_cut(tmp_path: Path, sync: str) -> tuple[list[Ack], list[tuple[int, str]]]:
    """300 acknowledged publishes to an R3 stream, every node's power cut, every node booted;
    returns the acks and (seq, Msg-Id) of what the stream holds afterwards."""
    cluster = PowerCluster(3, sync=sync, base_dir=tmp_path / sync)
    await asyncio.to_thread(cluster.start)
    try:
        client = await nats.connect(cluster.urls)
        js = client.jetstream()
        await js.add_stream(name="T", subjects=["t.>"], num_replicas=3)
        acks = []
        for i in range(300):
            # A stream just created may not have elected its leader yet, and a connection may
            # move to another node meanwhile: the same Msg-Id again is safe, and what counts
            # is the ack finally given.
            ack = await wait_for_async(
                lambda i=i: js.publish("t.x", b"m", headers={"Nats-Msg-Id": f"t:{i}"}),
                timeout=30,
                interval=0.2,
                message=f"publish t:{i} acknowledged",
                ignore=(NatsError, TimeoutError),
            )
            acks.append(Ack(f"t:{i}", ack.stream, ack.seq, ack.duplicate, "test", 0.0))
        await client.close()
        cuts = await asyncio.to_thread(cluster.power_cut, [0, 1, 2])
        assert [c.node for c in cuts] == cluster.names
        await asyncio.to_thread(cluster.power_on, [0, 1, 2], 120.0)
        return acks, await _stored(cluster)
    finally:
        await asyncio.to_thread(cluster.cleanup)


async def _stored(cluster: PowerCluster) -> list[tuple[int, str]]:
    client = await nats.connect(cluster.urls)
    try:
        js = client.jetstream()

        async def state() -> tuple[list[tuple[int, str]]]:
            # Wrapped in a tuple so an empty stream (or a lost one) is a truthy answer.
            try:
                info = await js.stream_info("T")
            except NotFoundError:
                return ([],)  # the stream itself was lost
            found = []
            for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
                msg = await js.get_msg("T", seq)
                found.append((seq, (msg.headers or {}).get("Nats-Msg-Id", "")))
            return (found,)

        # Until the meta layer and a stream leader answer, every request times out.
        answer = await wait_for_async(
            state,
            timeout=60,
            interval=0.5,
            message="stream T readable",
            ignore=(nats.errors.Error, TimeoutError),
        )
        return answer[0]
    finally:
        await client.close()


@pytest.mark.cluster
async def test_with_sync_always_every_acknowledged_message_survives_a_full_power_cut(
    tmp_path: Path,
) -> None:
    acks, stored = await _publish_and_cut(tmp_path, SYNC_ALWAYS)
    assert find_lost_acks(acks, stored) == []


@pytest.mark.cluster
async def test_with_the_default_sync_interval_a_full_power_cut_loses_acknowledged_messages(
    tmp_path: Path,
) -> None:
    acks, stored = await _publish_and_cut(tmp_path, DEFAULT_SYNC)
    lost = find_lost_acks(acks, stored)
    # nats-server flushes every two minutes by default: everything acknowledged since is gone.
    assert len(lost) == len(acks)
