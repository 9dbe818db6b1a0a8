"""HRW hash quality: xxh3-64 (used) against the seed article's FNV-1a-64 (rejected).

Balance and remapping are deterministic counts over fixed job and node names; only the
``owners()`` timing depends on the machine, and it is reported as a ratio to a floor measured in
the same run so that numbers from different machines stay comparable.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from hrwcron.core import hrw

JOBS = [f"job-{n}" for n in range(20_000)]
TIMING_JOBS = 100_000
TIMING_NODES = [f"scheduler-{i}" for i in range(10)]
# One hash per (job, node) pair, so the floor covers exactly the hashing owners() must do.
FLOOR_HASHES = TIMING_JOBS * len(TIMING_NODES)
REPEATS = 5

# The alphabet Kubernetes uses for pod-template hashes and pod name suffixes (no vowels, no
# look-alike characters).
_K8S_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1

Scorer = Callable[[Sequence[str], str], list[int]]


def _k8s_pods(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    template = "".join(rng.choice(_K8S_ALPHABET) for _ in range(9))
    pods: list[str] = []
    while len(pods) < n:
        pod = f"hrwcron-{template}-{''.join(rng.choice(_K8S_ALPHABET) for _ in range(5))}"
        if pod not in pods:
            pods.append(pod)
    return pods


def _ec2_hosts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    hosts: list[str] = []
    while len(hosts) < n:
        host = f"ip-10-0-{rng.randrange(1, 4)}-{rng.randrange(2, 255)}.ec2.internal"
        if host not in hosts:
            hosts.append(host)
    return hosts


def patterns() -> list[tuple[str, list[str]]]:
    """(label, n + 1 node ids): the first n are the cluster, the last one joins it."""
    out: list[tuple[str, list[str]]] = []
    for n in (3, 5, 10):
        out.append((f"`scheduler-0..{n - 1}`", [f"scheduler-{i}" for i in range(n + 1)]))
    for n in (5, 10):
        out.append((f"k8s pods ×{n} (`{_k8s_pods(1, n)[0]}`)", _k8s_pods(n + 1, n)))
    for n in (5, 10):
        out.append((f"EC2 hosts ×{n} (`{_ec2_hosts(1, n)[0]}`)", _ec2_hosts(n + 1, n)))
    return out


def _xxh3_column(jobs: Sequence[str], node: str) -> list[int]:
    return [hrw.score(job, node) for job in jobs]


def _fnv_states(jobs: Sequence[str]) -> list[int]:
    # FNV-1a is a byte stream: the state after ``job NUL`` is shared by every node, which keeps
    # the pure-Python baseline to a few seconds.
    states = []
    for job in jobs:
        h = _FNV_OFFSET
        for byte in job.encode() + b"\x00":
            h = ((h ^ byte) * _FNV_PRIME) & _MASK
        states.append(h)
    return states


def _fnv_column(states: Sequence[int], node: str) -> list[int]:
    tail = node.encode()
    out = []
    for h in states:
        for byte in tail:
            h = ((h ^ byte) * _FNV_PRIME) & _MASK
        out.append(h)
    return out


def _owners(columns: dict[str, list[int]], nodes: Sequence[str], count: int) -> list[str]:
    ordered = sorted(nodes)
    owners = []
    for i in range(count):
        best = ordered[0]
        best_score = columns[best][i]
        for node in ordered[1:]:
            s = columns[node][i]
            if s > best_score:
                best, best_score = node, s
        owners.append(best)
    return owners


@dataclass(frozen=True)
class Quality:
    max_over_mean: float
    join_moved: float
    join_ideal: float
    leave_moved: float
    leave_share: float
    stray_moves: int


def _quality(columns: dict[str, list[int]], nodes: Sequence[str]) -> Quality:
    cluster, newcomer = list(nodes[:-1]), nodes[-1]
    total = len(JOBS)
    base = _owners(columns, cluster, total)
    counts = {n: 0 for n in cluster}
    for o in base:
        counts[o] += 1
    # The worst leave: the most loaded member goes, so its whole share has to move.
    leaver = max(cluster, key=lambda n: (counts[n], n))
    joined = _owners(columns, [*cluster, newcomer], total)
    left = _owners(columns, [n for n in cluster if n != leaver], total)
    join_moved = sum(a != b for a, b in zip(base, joined, strict=True))
    leave_moved = sum(a != b for a, b in zip(base, left, strict=True))
    # Moves HRW should never make: to anyone but the newcomer, or away from anyone but the
    # leaver. They stay 0 whatever the hash; the row shows it is measured, not assumed.
    stray = sum(a != b and b != newcomer for a, b in zip(base, joined, strict=True))
    stray += sum(a != b and a != leaver for a, b in zip(base, left, strict=True))
    return Quality(
        max_over_mean=max(counts.values()) / (total / len(cluster)),
        join_moved=join_moved / total,
        join_ideal=1 / (len(cluster) + 1),
        leave_moved=leave_moved / total,
        leave_share=counts[leaver] / total,
        stray_moves=stray,
    )


def _best(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def timing() -> tuple[float, float, float]:
    """Best-of-N seconds for owners(), an owner() loop and the bare-hash floor, interleaved."""
    jobs = [f"job-{n}" for n in range(TIMING_JOBS)]
    suffixes = [b"\x00" + n.encode() for n in TIMING_NODES]
    inputs = [
        f"job-{i // len(suffixes)}".encode() + suffixes[i % len(suffixes)]
        for i in range(FLOOR_HASHES)
    ]
    xxh3 = xxhash.xxh3_64_intdigest

    def floor() -> None:
        for data in inputs:
            xxh3(data)

    def bulk() -> None:
        hrw.owners(jobs, TIMING_NODES)

    def loop() -> None:
        owner = hrw.owner
        for job in jobs:
            owner(job, TIMING_NODES)

    results = {"floor": float("inf"), "bulk": float("inf"), "loop": float("inf")}
    for _ in range(REPEATS):
        for name, fn in (("floor", floor), ("bulk", bulk), ("loop", loop)):
            start = time.perf_counter()
            fn()
            results[name] = min(results[name], time.perf_counter() - start)
    return results["bulk"], results["loop"], results["floor"]


def run() -> str:
    states = _fnv_states(JOBS)
    lines = [
        "## HRW: xxh3-64 against FNV-1a-64",
        "",
        f"{len(JOBS):,} jobs `job-0..{len(JOBS) - 1}`, N members.",
        "",
        "- *max/mean*: the most loaded member's jobs over the fair share.",
        "- *join*: share of jobs moved when one more node of the same pattern joins"
        " (ideal 1/(N+1)).",
        "- *leave*: share moved when the most loaded member leaves: HRW moves exactly that"
        " member's share, so a hot member costs more than the fair 1/N.",
        "- *stray*: moves not to the newcomer or not from the leaver (HRW: always 0).",
        "",
        "| nodes | N | hash | max/mean | join moved (ideal) | leave moved (fair) | stray |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    # Patterns share node ids (scheduler-0..3 recur), so each column is hashed once.
    xxh3_cache: dict[str, list[int]] = {}
    fnv_cache: dict[str, list[int]] = {}
    for label, nodes in patterns():
        for node in nodes:
            if node not in fnv_cache:
                fnv_cache[node] = _fnv_column(states, node)
                # The fast stream form must be the very function the unit tests hold to account.
                assert fnv_cache[node][:50] == [hrw.fnv1a_score(j, node) for j in JOBS[:50]]
                xxh3_cache[node] = _xxh3_column(JOBS, node)
        n = len(nodes) - 1
        for name, cache in (("xxh3-64", xxh3_cache), ("FNV-1a-64", fnv_cache)):
            columns = {node: cache[node] for node in nodes}
            q = _quality(columns, nodes)
            lines.append(
                f"| {label} | {n} | {name} | {q.max_over_mean:.3f} "
                f"| {q.join_moved:.3f} ({q.join_ideal:.3f}) "
                f"| {q.leave_moved:.3f} ({1 / n:.3f}) | {q.stray_moves} |"
            )
    bulk, loop, floor = timing()
    lines += [
        "",
        f"### owners(): {TIMING_JOBS:,} jobs × {len(TIMING_NODES)} nodes",
        "",
        f"Best of {REPEATS}, measured side by side. Floor: a bare loop calling "
        f"`xxh3_64_intdigest` {FLOOR_HASHES:,} times on prebuilt inputs (no concatenation, "
        "no comparison), the least any owner computation over the same "
        "(job, node) pairs can cost in CPython.",
        "",
        "| what | seconds | × floor |",
        "|---|---:|---:|",
        f"| floor: {FLOOR_HASHES:,} × xxh3_64_intdigest | {floor:.3f} | 1.00 |",
        f"| `owners(jobs, nodes)` | {bulk:.3f} | {bulk / floor:.2f} |",
        f"| `owner(job, nodes)` per job | {loop:.3f} | {loop / floor:.2f} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
