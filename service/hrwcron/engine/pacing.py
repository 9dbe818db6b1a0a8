"""Sharing the event loop while draining a feed whose messages are already buffered."""

from __future__ import annotations

import time

# A feed whose messages are already buffered never suspends on its own, so loading 100,000
# jobs or trigger subjects would hold the event loop for seconds: yield once a slice of work
# took this long. The clock is read after every item (tens of nanoseconds), since one item
# can cost milliseconds (a job whose exclusions take the whole search bound to check).
SLICE_S = 0.005


class Slices:
    """Counts the items a loop handled and says when it has held the event loop long enough."""

    __slots__ = ("began", "count")

    def __init__(self) -> None:
        self.count = 0
        self.began = time.perf_counter()

    def spent(self) -> bool:
        """Count one item; True when the caller should yield (``await asyncio.sleep(0)``)."""
        self.count += 1
        if time.perf_counter() - self.began > SLICE_S:
            self.began = time.perf_counter()
            return True
        return False
