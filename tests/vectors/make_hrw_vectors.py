"""Regenerate hrw_vectors.json from the reference implementation.

Run ``python tests/vectors/make_hrw_vectors.py`` after an intentional change to the scheme (which
would also change ``hrw.SCHEME``: every replica of a cluster must use the same one), or with
``--check`` to fail when the file and the code disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hrwcron.core import hrw

VECTORS = Path(__file__).with_name("hrw_vectors.json")

SCHEDULERS = [f"scheduler-{i}" for i in range(5)]

JOBS = [
    "job-0",
    "job-1",
    "job-19999",
    "backup.nightly",
    "reports.daily-summary",
    "a",
    "",
    # No Unicode normalisation is applied: the NFC and NFD spellings are different jobs.
    "café",
    "cafe\u0301",
    "über.bericht",
    "ジョブ.毎日",
    "задача-7",
    "emoji-🚀",
]

NODE_SETS = [
    SCHEDULERS,
    ["node-0", "node-1", "node-2"],
    ["hrwcron-7d4b9c8f6-x2x9z", "hrwcron-7d4b9c8f6-k8m4q", "hrwcron-7d4b9c8f6-b5w7t"],
    ["ip-10-0-1-23.ec2.internal", "ip-10-0-2-117.ec2.internal", "ip-10-0-3-5.ec2.internal"],
    ["nœud-1", "узел-2", "ノード-3", "node-4"],
    ["solo"],
]

WEIGHT_SETS: list[dict[str, float]] = [
    {"scheduler-0": 1.0, "scheduler-1": 2.0, "scheduler-2": 1.0},
    dict.fromkeys(SCHEDULERS, 1.0),
    {"big": 10.0, "medium": 2.5, "small": 0.5, "tiny": 0.01},
    {"nœud-1": 3.0, "ノード-3": 1.0},
]

WEIGHTED_JOBS = ["job-0", "job-1", "job-2", "job-3", "backup.nightly", "ジョブ.毎日"]


def _hex(h: int) -> str:
    return f"{h:016x}"


def build() -> dict[str, Any]:
    layout = [
        {
            "job": job,
            "node": node,
            "input_hex": (job.encode() + b"\x00" + node.encode()).hex(),
            "score": _hex(hrw.score(job, node)),
        }
        for job, node in [
            ("job-0", "scheduler-0"),
            ("", ""),
            ("café", "nœud-1"),
            ("ジョブ.毎日", "ノード-3"),
        ]
    ]
    cases = [
        {
            "job": job,
            "nodes": nodes,
            "scores": {node: _hex(hrw.score(job, node)) for node in nodes},
            "ranking": hrw.rank(job, nodes),
        }
        for nodes in NODE_SETS
        for job in JOBS
    ]
    weighted = [
        {
            "job": job,
            "weights": weights,
            "scores": {node: _hex(hrw.score(job, node)) for node in weights},
            "weighted_scores": {
                node: hrw.weighted_score(job, node, w) for node, w in weights.items()
            },
            "ranking": hrw.weighted_rank(job, weights),
        }
        for weights in WEIGHT_SETS
        for job in WEIGHTED_JOBS
    ]
    return {
        "scheme": hrw.SCHEME,
        "about": (
            "score = xxh3_64(utf8(job) || 0x00 || utf8(node)), seed 0, as 16 lowercase hex"
            " digits; ranking = highest score first, equal scores by smaller node id (UTF-8"
            " bytes). Weighted: -weight / ln((h + 1) / (2^64 + 1)), ranking by weighted score,"
            " then raw score, then node id. See README.md next to this file."
        ),
        "layout": layout,
        "cases": cases,
        "weighted_cases": weighted,
    }


def render() -> str:
    return json.dumps(build(), ensure_ascii=False, indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if VECTORS.read_text(encoding="utf-8") != text:
            print(f"{VECTORS.name} is out of date: regenerate it", file=sys.stderr)
            return 1
        return 0
    VECTORS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
