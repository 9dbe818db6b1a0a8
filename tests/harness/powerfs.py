"""A FUSE filesystem that can lose power: a passthrough over a backing directory that keeps
every write since a file's last fsync in memory, and drops it all on command.

Run as a script (the test harness does, one process per mount)::

    python powerfs.py BACKING MOUNTPOINT CONTROL_SOCKET

What it models, and what it does not (ext4's defaults, ``data=ordered,auto_da_alloc``, as a
rule of thumb):

* **File contents and sizes are volatile.** ``write`` and ``truncate`` (``O_TRUNC`` included)
  go to an in-memory overlay of 4 KiB pages per file; reads see the overlay first, as reads see
  the page cache. ``fsync``/``fdatasync`` of a file, and every write through a descriptor opened
  with ``O_SYNC`` or ``O_DSYNC``, write that file's overlay to the backing file. ``close`` does
  not, with ext4's two exceptions (``auto_da_alloc``): a file renamed over an existing one is
  flushed before the rename, and a file truncated to nothing and rewritten is flushed when its
  last descriptor closes.
* **Directory operations are durable at once**: create, mkdir, rename, unlink and rmdir are
  applied to the backing directory when they happen, like a filesystem that journals metadata
  in order. A file created and never fsynced survives a cut with the size it had at its last
  fsync (empty if none): the familiar zero-length file. A file renamed before its data was
  synced (and not over another file) keeps its unsynced data in the overlay under the new name.
* **A power cut** (the ``cut`` command on the control socket) discards every overlay at once.
  The harness SIGKILLs the server first, so nothing can write between the crash and the cut.
* The kernel caches nothing (``direct_io``, zero attribute and entry timeouts), so after a cut
  a reader sees exactly the backing files. The backing files themselves are never fsynced: the
  machine running the tests does not lose power, only the modelled one does.
* Not modelled: torn or reordered writes inside a flush, a disk that acknowledges a flush it
  has not done, and losing directory entries that were never fsynced (stricter than ext4).

Control protocol: one line per request on a Unix socket, one line back. ``ping`` -> ``pong``;
``stats`` -> ``dirty_files=N dirty_bytes=B``; ``cut`` -> ``dropped_files=N dropped_bytes=B``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

PAGE = 4096
_SYNC_FLAGS = os.O_SYNC | os.O_DSYNC


class Overlay:
    """The unsynced state of one file: its logical size and the pages written since its last
    fsync. ``valid`` is how much of the backing file is still the file's content (a truncate
    since the last fsync cuts it short; what lies beyond reads as zeros)."""

    __slots__ = ("pages", "replaced", "size", "valid")

    def __init__(self, size: int) -> None:
        self.size = size
        self.valid = size
        self.pages: dict[int, bytearray] = {}
        # Truncated to nothing since the last fsync: a rewrite ext4 flushes on close.
        self.replaced = False

    @property
    def dirty_bytes(self) -> int:
        return len(self.pages) * PAGE


class VolatileStore:
    """The overlays of every file under ``root``, keyed by path relative to the mount. All
    methods take the one lock: FUSE threads and the control thread share it."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.lock = threading.RLock()
        self.overlays: dict[str, Overlay] = {}

    def backing(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _backing_page(self, path: str, overlay: Overlay | None, index: int) -> bytearray:
        page = bytearray(PAGE)
        start = index * PAGE
        limit = overlay.valid if overlay is not None else None
        try:
            with open(self.backing(path), "rb") as f:
                f.seek(start)
                data = f.read(PAGE)
        except FileNotFoundError:
            data = b""
        if limit is not None:
            data = data[: max(0, limit - start)]
        page[: len(data)] = data
        return page

    def _overlay(self, path: str) -> Overlay:
        overlay = self.overlays.get(path)
        if overlay is None:
            overlay = Overlay(os.stat(self.backing(path)).st_size)
            self.overlays[path] = overlay
        return overlay

    def size(self, path: str) -> int | None:
        overlay = self.overlays.get(path)
        return None if overlay is None else overlay.size

    def read(self, path: str, size: int, offset: int) -> bytes:
        with self.lock:
            overlay = self.overlays.get(path)
            if overlay is None:
                with open(self.backing(path), "rb") as f:
                    f.seek(offset)
                    return f.read(size)
            end = min(offset + size, overlay.size)
            out = bytearray()
            position = offset
            while position < end:
                index, within = divmod(position, PAGE)
                page = overlay.pages.get(index)
                if page is None:
                    page = self._backing_page(path, overlay, index)
                take = min(PAGE - within, end - position)
                out += page[within : within + take]
                position += take
            return bytes(out)

    def write(self, path: str, data: bytes, offset: int) -> int:
        with self.lock:
            overlay = self._overlay(path)
            position, done = offset, 0
            while done < len(data):
                index, within = divmod(position, PAGE)
                page = overlay.pages.get(index)
                if page is None:
                    page = self._backing_page(path, overlay, index)
                    if index * PAGE >= overlay.size:
                        page = bytearray(PAGE)
                    overlay.pages[index] = page
                take = min(PAGE - within, len(data) - done)
                page[within : within + take] = data[done : done + take]
                position += take
                done += take
            overlay.size = max(overlay.size, offset + len(data))
            return len(data)

    def truncate(self, path: str, length: int) -> None:
        with self.lock:
            overlay = self._overlay(path)
            for index in [i for i in overlay.pages if i * PAGE >= length]:
                del overlay.pages[index]
            index, within = divmod(length, PAGE)
            page = overlay.pages.get(index)
            if page is not None:
                page[within:] = bytes(PAGE - within)
            if length == 0 and overlay.size > 0:
                overlay.replaced = True
            overlay.valid = min(overlay.valid, length)
            overlay.size = length

    def closed(self, path: str) -> None:
        """The last descriptor of ``path`` closed: a file rewritten from nothing is flushed
        now, as ext4's ``auto_da_alloc`` does for the truncate-and-rewrite pattern."""
        with self.lock:
            overlay = self.overlays.get(path)
            if overlay is not None and overlay.replaced:
                self.sync(path)

    def sync(self, path: str) -> None:
        """Write ``path``'s overlay to the backing file: what fsync promises."""
        with self.lock:
            overlay = self.overlays.pop(path, None)
            if overlay is None:
                return
            fd = os.open(self.backing(path), os.O_WRONLY)
            try:
                if overlay.valid < overlay.size:
                    os.ftruncate(fd, overlay.valid)
                for index, page in sorted(overlay.pages.items()):
                    start = index * PAGE
                    if start < overlay.size:
                        os.pwrite(fd, bytes(page[: overlay.size - start]), start)
                os.ftruncate(fd, overlay.size)
            finally:
                os.close(fd)

    def forget(self, path: str) -> None:
        with self.lock:
            self.overlays.pop(path, None)

    def renamed(self, old: str, new: str) -> None:
        """Move the overlays of ``old`` (a file, or everything under a directory) to ``new``."""
        with self.lock:
            self.overlays.pop(new, None)
            prefix = old.rstrip("/") + "/"
            for key in [k for k in self.overlays if k == old or k.startswith(prefix)]:
                self.overlays[new + key[len(old) :]] = self.overlays.pop(key)

    def stats(self) -> tuple[int, int]:
        with self.lock:
            return len(self.overlays), sum(o.dirty_bytes for o in self.overlays.values())

    def cut(self) -> tuple[int, int]:
        """Power lost: every unsynced write is gone."""
        with self.lock:
            found = self.stats()
            self.overlays.clear()
            return found


def _operations(store: VolatileStore) -> Any:
    # mfusepy is imported here, not at module level, so the harness can import this module
    # (for VolatileStore and the process wrapper) where libfuse is missing and skip cleanly.
    import mfusepy

    class PowerFS(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.handles: dict[int, int] = {}  # our handle -> open flags
            self.next_handle = 1

        def _open_handle(self, flags: int) -> int:
            with store.lock:
                handle = self.next_handle
                self.next_handle += 1
                self.handles[handle] = flags
                return handle

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            with store.lock:
                st = os.lstat(store.backing(path))
                attrs = {
                    key: getattr(st, key)
                    for key in (
                        "st_mode",
                        "st_nlink",
                        "st_uid",
                        "st_gid",
                        "st_size",
                        "st_atime_ns",
                        "st_mtime_ns",
                        "st_ctime_ns",
                        "st_ino",
                    )
                }
                attrs["st_atime"] = st.st_atime_ns
                attrs["st_mtime"] = st.st_mtime_ns
                attrs["st_ctime"] = st.st_ctime_ns
                size = store.size(path)
                if size is not None:
                    attrs["st_size"] = size
                return attrs

        def readdir(self, path: str, fh: int) -> Iterator[str]:
            yield "."
            yield ".."
            yield from os.listdir(store.backing(path))

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(store.backing(path))
            return {
                key: getattr(sv, key)
                for key in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

        def access(self, path: str, amode: int) -> int:
            if not os.access(store.backing(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(store.backing(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(store.backing(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            os.utime(store.backing(path), ns=times) if times else os.utime(store.backing(path))
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(store.backing(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(store.backing(path))
            return 0

        def unlink(self, path: str) -> int:
            with store.lock:
                os.unlink(store.backing(path))
                store.forget(path)
            return 0

        def rename(self, old: str, new: str) -> int:
            with store.lock:
                if os.path.isfile(store.backing(new)):
                    # Replacing a file by rename flushes the new one's data first, as ext4's
                    # auto_da_alloc does, so the name never points at data that was not written.
                    store.sync(old)
                os.rename(store.backing(old), store.backing(new))
                store.renamed(old, new)
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, store.backing(target))
            return 0

        def readlink(self, path: str) -> str:
            return os.readlink(store.backing(path))

        def create(self, path: str, mode: int, flags: int = 0) -> int:
            with store.lock:
                fd = os.open(store.backing(path), os.O_WRONLY | os.O_CREAT, mode)
                os.close(fd)
                return self._open_handle(flags)

        def open(self, path: str, flags: int) -> int:
            if not os.path.exists(store.backing(path)):
                raise mfusepy.FuseOSError(errno.ENOENT)
            if flags & os.O_TRUNC:
                # libfuse 3 asks the kernel for atomic O_TRUNC: no separate truncate arrives.
                store.truncate(path, 0)
            return self._open_handle(flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return store.read(path, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with store.lock:
                written = store.write(path, data, offset)
                if self.handles.get(fh, 0) & _SYNC_FLAGS:
                    store.sync(path)
                return written

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            store.truncate(path, length)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            store.sync(path)
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0  # directory operations are durable as they happen

        def flush(self, path: str, fh: int) -> int:
            # close(2) waits for flush but not for release, which the kernel sends later: a
            # power cut right after close() must find a rewritten file already flushed.
            store.closed(path)
            return 0

        def release(self, path: str, fh: int) -> int:
            with store.lock:
                self.handles.pop(fh, None)
            return 0

    return PowerFS()


def _serve_control(store: VolatileStore, path: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server.bind(path)
    server.listen(4)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn, conn.makefile("rw") as stream:
                for line in stream:
                    command = line.strip()
                    if command == "ping":
                        answer = "pong"
                    elif command == "stats":
                        files, size = store.stats()
                        answer = f"dirty_files={files} dirty_bytes={size}"
                    elif command == "cut":
                        files, size = store.cut()
                        answer = f"dropped_files={files} dropped_bytes={size}"
                    else:
                        answer = f"error unknown command {command!r}"
                    stream.write(answer + "\n")
                    stream.flush()

    threading.Thread(target=loop, name="powerfs-control", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: powerfs.py BACKING MOUNTPOINT CONTROL_SOCKET", file=sys.stderr)
        return 2
    backing, mountpoint, control = argv
    import mfusepy

    store = VolatileStore(backing)
    operations = _operations(store)
    _serve_control(store, control)
    with contextlib.suppress(RuntimeError):  # libfuse's exit status after SIGTERM
        mfusepy.FUSE(
            operations,
            mountpoint,
            foreground=True,
            nothreads=True,
            direct_io=True,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            fsname="powerfs",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
