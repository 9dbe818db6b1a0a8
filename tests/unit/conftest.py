"""What the unit tests share: ``cluster``, replicas of the engine over the in-memory stores
(tests/harness/memory_cluster.py). A module whose tests need another cluster defines its own
``cluster`` fixture, which takes precedence in that module."""

from harness.memory_cluster import cluster  # noqa: F401
