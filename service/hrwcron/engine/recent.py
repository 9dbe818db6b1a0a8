"""Counting events over a sliding window in fixed-size buckets, in constant memory."""

from __future__ import annotations

import collections

HOUR_MS = 3_600_000
MINUTE_MS = 60_000


class RecentCounts:
    """How many events happened in the last ``window_ms``, to the precision of one bucket:
    an event is forgotten between ``window_ms`` and ``window_ms + bucket_ms`` after it."""

    def __init__(self, window_ms: int = HOUR_MS, bucket_ms: int = MINUTE_MS) -> None:
        if window_ms <= 0 or bucket_ms <= 0 or window_ms % bucket_ms:
            raise ValueError("window_ms must be a positive multiple of bucket_ms")
        self.window_ms = window_ms
        self.bucket_ms = bucket_ms
        self._buckets: collections.deque[list[int]] = collections.deque()  # [bucket, count]

    def add(self, now_ms: float, count: int = 1) -> None:
        if count <= 0:
            return
        bucket = int(now_ms) // self.bucket_ms
        if self._buckets and self._buckets[-1][0] >= bucket:
            self._buckets[-1][1] += count  # a clock that stepped back counts into the newest
        else:
            self._buckets.append([bucket, count])
        self._forget(bucket)

    def total(self, now_ms: float) -> int:
        self._forget(int(now_ms) // self.bucket_ms)
        return sum(count for _, count in self._buckets)

    def _forget(self, bucket: int) -> None:
        oldest = bucket - self.window_ms // self.bucket_ms
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()
