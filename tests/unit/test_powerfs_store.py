"""The power-loss filesystem's model without FUSE: which bytes a read sees before a cut, and
which survive it (synced pages, sizes and truncations only)."""

from __future__ import annotations

from pathlib import Path

from harness.powerfs import PAGE, VolatileStore


def store_with(tmp_path: Path, name: str, content: bytes) -> VolatileStore:
    (tmp_path / name).write_bytes(content)
    return VolatileStore(str(tmp_path))


def test_reads_see_unsynced_writes_and_a_cut_drops_them(tmp_path: Path) -> None:
    store = store_with(tmp_path, "f", b"durable")
    store.write("/f", b"-volatile", 7)
    assert store.read("/f", 100, 0) == b"durable-volatile"
    assert (tmp_path / "f").read_bytes() == b"durable"
    assert store.stats() == (1, PAGE)
    assert store.cut() == (1, PAGE)
    assert store.read("/f", 100, 0) == b"durable"


def test_sync_writes_pages_and_size_to_the_backing_file(tmp_path: Path) -> None:
    store = store_with(tmp_path, "f", b"a" * (PAGE + 10))
    store.write("/f", b"XY", PAGE - 1)  # across a page boundary
    store.write("/f", b"tail", 3 * PAGE)  # a hole of zeros before it
    store.sync("/f")
    data = (tmp_path / "f").read_bytes()
    assert data[PAGE - 2 : PAGE + 2] == b"aXYa"
    assert data[PAGE + 10 : 3 * PAGE] == bytes(2 * PAGE - 10)
    assert data.endswith(b"tail") and len(data) == 3 * PAGE + 4
    assert store.cut() == (0, 0)
    assert (tmp_path / "f").read_bytes() == data


def test_an_unsynced_truncate_is_undone_by_a_cut(tmp_path: Path) -> None:
    store = store_with(tmp_path, "f", b"0123456789")
    store.truncate("/f", 4)
    store.write("/f", b"ab", 6)  # extends again: the gap reads as zeros, not as old bytes
    assert store.read("/f", 100, 0) == b"0123\x00\x00ab"
    assert store.size("/f") == 8
    store.cut()
    assert store.read("/f", 100, 0) == b"0123456789"


def test_a_synced_truncate_persists(tmp_path: Path) -> None:
    store = store_with(tmp_path, "f", b"0123456789")
    store.truncate("/f", 3)
    store.sync("/f")
    store.cut()
    assert (tmp_path / "f").read_bytes() == b"012"


def test_a_rename_carries_the_unsynced_data_with_the_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    store = store_with(tmp_path, "d/tmp", b"")
    store.write("/d/tmp", b"new", 0)
    (tmp_path / "d" / "tmp").rename(tmp_path / "d" / "final")
    store.renamed("/d", "/e")  # a directory rename moves what is under it
    assert store.size("/e/tmp") == 3 and store.size("/d/tmp") is None
    store.renamed("/e/tmp", "/e/final")
    assert store.size("/e/final") == 3
    store.cut()
    assert store.size("/e/final") is None


def test_a_file_rewritten_from_nothing_is_flushed_when_closed(tmp_path: Path) -> None:
    store = store_with(tmp_path, "state", b"old")
    store.truncate("/state", 0)
    store.write("/state", b"new", 0)
    store.closed("/state")
    assert (tmp_path / "state").read_bytes() == b"new"
    # An append is not a rewrite: closing does not flush it.
    store.write("/state", b"+", 3)
    store.closed("/state")
    store.cut()
    assert (tmp_path / "state").read_bytes() == b"new"
