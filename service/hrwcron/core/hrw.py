"""Rendezvous (highest random weight) hashing: who fires a job's tick, and who takes over.

Every replica computes the same order from nothing but the job name and the member ids, so no
coordination is needed to agree on an owner. The byte layout is fixed and published with test
vectors (``tests/vectors``) because replicas written in other languages must agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import xxhash

SCHEME = "xxh3-64"

# The NUL keeps ("ab", "c") and ("a", "bc") apart. A NUL inside a name cannot make two nodes of
# one job collide either: they share the job prefix, so distinct node ids give distinct inputs.
_SEP = b"\x00"
_xxh3 = xxhash.xxh3_64_intdigest

_TWO_64 = 1 << 64
_HALF = 1 << 63
# 2**64 + 1 keeps u = (h + 1) / (2**64 + 1) strictly inside (0, 1): ln(u) is finite and non-zero.
_U_DENOM = _TWO_64 + 1

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK_64 = _TWO_64 - 1


def score(job: str, node: str) -> int:
    """xxh3-64 (seed 0) of ``utf8(job) NUL utf8(node)``, an unsigned 64-bit integer."""
    return _xxh3(job.encode() + _SEP + node.encode())


def rank(job: str, nodes: Iterable[str]) -> list[str]:
    """Every distinct node, owner first, then the failover candidates in order.

    Ties (equal scores) go to the lexicographically smaller node id: Python compares code points,
    which is the same order as comparing the UTF-8 bytes.
    """
    prefix = job.encode() + _SEP
    scored = [(-_xxh3(prefix + node.encode()), node) for node in set(nodes)]
    scored.sort()
    return [node for _, node in scored]


def prepare(nodes: Iterable[str]) -> list[tuple[bytes, str]]:
    """The node part of every score input, encoded once for :func:`rank_prepared`."""
    return [(_SEP + node.encode(), node) for node in sorted(set(nodes))]


def rank_prepared(job: str, prepared: Sequence[tuple[bytes, str]]) -> list[str]:
    """:func:`rank` over nodes encoded by :func:`prepare`: the same order, cheaper when many
    jobs are ranked against the same members."""
    prefix = job.encode()
    xxh3 = _xxh3
    scored = [(-xxh3(prefix + suffix), node) for suffix, node in prepared]
    scored.sort()
    return [node for _, node in scored]


def owner(job: str, nodes: Iterable[str]) -> str | None:
    """The first node of :func:`rank`, or None when there are no nodes."""
    prefix = job.encode() + _SEP
    best_score = -1
    best: str | None = None
    for node in nodes:
        s = _xxh3(prefix + node.encode())
        if s > best_score or (s == best_score and best is not None and node < best):
            best_score = s
            best = node
    return best


def _check_weight(weight: float) -> None:
    # NaN compares false with everything, so this also rejects it.
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"HRW weight must be a positive finite number, got {weight!r}")


def _weighted(h: int, weight: float) -> float:
    # Python's int / int is correctly rounded, so u and 1 - u below are the nearest doubles to the
    # exact fractions. log() is used where u is small and log1p(-(1 - u)) where u is close to 1:
    # computing log(u) there would first round u to 1.0 (ln = 0, division by zero) and collapse
    # the top 2**11 scores into one.
    ln_u = math.log((h + 1) / _U_DENOM) if h < _HALF else math.log1p(-(_TWO_64 - h) / _U_DENOM)
    return -weight / ln_u


def weighted_score(job: str, node: str, weight: float) -> float:
    """Logarithmic weighted HRW: ``-weight / ln(u)`` with ``u = (h + 1) / (2**64 + 1)``.

    A node wins a job with probability ``weight / sum(weights)``: ``-ln(u)`` is exponentially
    distributed, and the smallest of exponentials with rates ``w_i`` is the i-th with probability
    proportional to ``w_i``.
    """
    _check_weight(weight)
    return _weighted(score(job, node), weight)


def weighted_rank(job: str, nodes: Mapping[str, float]) -> list[str]:
    """Nodes ordered by :func:`weighted_score`, highest first.

    Equal weighted scores fall back to the raw hash, then to the node id: doubles resolve only
    about 2**53 distinct values of u, and with equal weights the raw hash is exactly the order of
    :func:`rank`, so equal weights give :func:`rank`'s order even where doubles collapse.
    """
    prefix = job.encode() + _SEP
    keyed: list[tuple[float, int, str]] = []
    for node, weight in nodes.items():
        _check_weight(weight)
        h = _xxh3(prefix + node.encode())
        keyed.append((-_weighted(h, weight), -h, node))
    keyed.sort()
    return [node for _, _, node in keyed]


def fnv1a_score(job: str, node: str) -> int:
    """The seed article's FNV-1a-64 over ``job NUL node``.

    Not used for ownership: its last input bytes are poorly mixed, so names that differ only in
    a trailing digit (``scheduler-0..4``) get very unequal shares. Kept to measure exactly that.
    """
    h = _FNV_OFFSET
    for byte in job.encode() + _SEP + node.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _MASK_64
    return h


def owners(jobs: Iterable[str], nodes: Sequence[str]) -> dict[str, str]:
    """The owner of every job among ``nodes`` (same result as :func:`owner` per job).

    Built for rebalancing a whole job table at once: the node suffixes are encoded once, and
    nodes are visited in id order so a strict ``>`` leaves ties with the smaller id.
    """
    ordered = sorted(set(nodes))
    if not ordered:
        return {}
    if len(ordered) == 1:
        only = ordered[0]
        return dict.fromkeys(jobs, only)
    first_suffix = _SEP + ordered[0].encode()
    first_node = ordered[0]
    rest = [(_SEP + node.encode(), node) for node in ordered[1:]]
    xxh3 = _xxh3
    out: dict[str, str] = {}
    for job in jobs:
        prefix = job.encode()
        best_score = xxh3(prefix + first_suffix)
        best = first_node
        for suffix, node in rest:
            s = xxh3(prefix + suffix)
            if s > best_score:
                best_score = s
                best = node
        out[job] = best
    return out
