"""The fleet page at /: this replica, the members, the job set in numbers, the next hour per
member and minute, and the last hour's late and missed ticks. The script refreshes the fleet
part when a pulse says it changed."""

from __future__ import annotations

from hrwcron.adapters.tick_log import LATE_MS
from hrwcron.console.fleet import MINUTE_MS, Fleet, Timeline
from hrwcron.console.html import e
from hrwcron.core.ticks import format_ms


def _hhmm(epoch_ms: int) -> str:
    seconds = epoch_ms // 1000
    return f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}"


def _hhmmss(epoch_ms: int) -> str:
    seconds = epoch_ms // 1000
    return f"{_hhmm(epoch_ms)}:{seconds % 60:02d}"


def _members(fleet: Fleet) -> str:
    rows = []
    for m in fleet.members:
        if m["live"]:
            state = '<span class="ok">live, ready</span>'
        else:
            state = f'<span class="bad">not ready: {e(m["reason"] or "heartbeat late")}</span>'
        digest = "" if m["digest_matches"] else ' <span class="bad">(differs)</span>'
        offset = f"{fleet.offset_ms if m['self'] else m['offset_ms']:g} ms"
        me = ' class="me"' if m["self"] else ""
        rows.append(
            f"<tr{me}><td>{e(m['node'])}</td><td>{state}</td>"
            f'<td class="num">{e(m["heartbeat_age_s"])} s</td>'
            f'<td class="num">{e(fleet.owned.get(m["node"], 0))}</td>'
            f'<td class="num">{offset}</td><td>{e(m["version"])}</td>'
            f'<td class="mono">{e(m["digest"])}{digest}</td>'
            f'<td class="num">{e(m["jobs"])}</td><td>{e(", ".join(m["tags"]))}</td>'
            f'<td class="num">{e(m["weight"])}</td></tr>'
        )
    if not rows:
        rows.append('<tr><td colspan="10" class="muted">no members in view</td></tr>')
    return (
        '<table id="members"><thead><tr><th>member</th><th>state</th><th>heartbeat age</th>'
        "<th>owns</th><th>clock offset</th><th>version</th><th>job-set digest</th>"
        "<th>jobs</th><th>tags</th><th>weight</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _timeline(t: Timeline | None) -> str:
    if t is None:
        return '<p id="timeline-pending" class="muted">counting the next hour\'s ticks…</p>'
    if not t.per_member:
        return '<p class="muted">no live members</p>'
    bar, row_h, label_w = 12, 36, 170
    buckets = max(len(c) for c in t.per_member.values())
    peak = max([1] + [max(c) for c in t.per_member.values() if c])
    width, height = label_w + buckets * bar + 20, row_h * len(t.per_member) + 24
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="ticks per member and minute, next hour">'
    ]
    for i, (node, counts) in enumerate(t.per_member.items()):
        top = 8 + i * row_h
        parts.append(
            f'<text x="4" y="{top + row_h // 2 + 4}" class="label">{e(node)} '
            f"({sum(counts):,})</text>"
        )
        for b, count in enumerate(counts):
            if count:
                h = max(1, round((row_h - 8) * count / peak))
                minute = t.start_ms + b * MINUTE_MS
                parts.append(
                    f'<rect class="tick" x="{label_w + b * bar}" y="{top + row_h - 4 - h}" '
                    f'width="{bar - 2}" height="{h}"><title>{e(node)}: {count:,} ticks in the '
                    f"minute from {_hhmm(minute)} UTC</title></rect>"
                )
    for b in range(0, buckets, 10):
        parts.append(
            f'<text x="{label_w + b * bar}" y="{height - 6}" class="axis">'
            f"{_hhmm(t.start_ms + b * MINUTE_MS)}</text>"
        )
    parts.append("</svg>")
    heavy = "".join(
        f'<li><span class="mono">{_hhmmss(second)}</span> UTC: {count:,} ticks</li>'
        for second, count in t.heaviest
    )
    note = f'<p class="muted">{t.ticks:,} ticks in the next hour, by current ownership'
    if t.partial:
        note += " (partial: more than the timeline counts)"
    note += "</p>"
    return "".join(parts) + note + f'<h3>Heaviest seconds</h3><ol id="heaviest">{heavy}</ol>'


def _last_hour(fleet: Fleet) -> str:
    minutes = [m for m in fleet.minutes if m.late or m.missed]
    total = fleet.summary.get("missed_last_hour", 0)
    published = sum(m.published for m in fleet.minutes)
    late = sum(m.late for m in fleet.minutes)
    head = (
        f'<p id="last-hour">published here: {published:,} · late (over {LATE_MS:.0f} ms): '
        f"{late:,} · missed: {e(total)}</p>"
    )
    if not minutes:
        return head + '<p class="muted">no late or missed tick in the last hour</p>'
    rows = "".join(
        f'<tr><td>{_hhmm(m.start_ms)}</td><td class="num">{m.published}</td>'
        f'<td class="num">{m.late}</td><td class="num">{m.missed}</td>'
        f'<td class="num">{m.worst_ms:.0f} ms</td></tr>'
        for m in minutes
    )
    return head + (
        '<table id="troubled-minutes"><thead><tr><th>minute (UTC)</th><th>published</th>'
        f"<th>late</th><th>missed</th><th>latest</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def fleet_part(fleet: Fleet) -> str:
    s = fleet.summary
    ready = (
        '<span class="ok">ready</span>'
        if fleet.ready
        else f'<span class="bad">not ready: {e(fleet.reason)}</span>'
    )
    return (
        f'<section id="fleet"><p id="summary">{ready} · server time {e(format_ms(fleet.now_ms))}'
        f" · clock offset {e(fleet.offset_ms)} ms</p>"
        f'<p id="jobs-summary"><a href="/jobs">{e(s["jobs"])} jobs</a>: '
        f'<a href="/jobs?state=paused">{e(s["paused"])} paused</a>, '
        f'<a href="/jobs?state=bad">{e(s["bad"])} bad</a>, '
        f"{e(s['no_owner'])} with no eligible member · "
        f'<a href="/jobs?missed=1">{e(s["missed_last_hour"])} ticks missed</a> in the last '
        "hour</p>"
        f"<h2>Members</h2>{_members(fleet)}"
        f"<h2>Next hour: ticks per member and minute</h2>{_timeline(fleet.timeline)}"
        f"<h2>Last hour on this replica</h2>{_last_hour(fleet)}</section>"
    )


def page_body(fleet: Fleet) -> str:
    return f"<h1>Fleet</h1>{fleet_part(fleet)}"
