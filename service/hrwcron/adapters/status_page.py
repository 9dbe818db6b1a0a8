"""The read-only status page served at ``/``: HTML tables of members and jobs and a timeline
of the coming ticks, every value escaped, under a policy that lets no script run."""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any
from urllib.parse import urlencode

REFRESH_SECONDS = 5
# The most jobs one status request lists (the page links to the next ones).
MAX_LIMIT = 10_000

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eee}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,monospace;font-size:.92em;white-space:pre-wrap;word-break:break-all}
.ok{color:#176117}.bad{color:#a11}.muted{color:#777}.me{font-weight:bold}
svg{background:#fff;border:1px solid #ddd}rect.tick{fill:#3b6fb6}
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
# No script at all may run on this page: job specs are written by operators and API clients,
# and escaping is the first line of defence, this policy the second.
PAGE_CSP = (
    "default-src 'none'; script-src 'none'; img-src 'none'; connect-src 'none'; "
    f"style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s ago"


def _until(ms: float) -> str:
    seconds = ms / 1000
    if abs(seconds) < 120:
        return f"in {seconds:.1f} s" if seconds >= 0 else f"{-seconds:.1f} s ago"
    minutes = seconds / 60
    if abs(minutes) < 120:
        return f"in {minutes:.0f} min" if minutes >= 0 else f"{-minutes:.0f} min ago"
    hours = minutes / 60
    return f"in {hours:.1f} h" if hours >= 0 else f"{-hours:.1f} h ago"


def _last_cell(last: dict[str, Any] | None) -> str:
    if not last:
        return '<span class="muted">none yet</span>'
    text = f"<code>{_e(last['tick'])}</code> (seq {_e(last['seq'])})"
    if last.get("lateness_ms") is not None:
        text += f"<br>{_e(last['lateness_ms'])} ms late, by {_e(last.get('by'))}"
    elif last.get("seen_after_ms") is not None:
        text += f'<br><span class="muted">seen here {_e(last["seen_after_ms"])} ms after due</span>'
    return text


def _members_table(status: dict[str, Any]) -> str:
    rows = []
    for m in status["members"]:
        state = (
            '<span class="ok">live</span>'
            if m["live"]
            else f'<span class="bad">not ready: {_e(m["reason"] or "heartbeat late")}</span>'
        )
        digest = "" if m["digest_matches"] else ' <span class="bad">(differs)</span>'
        me = ' class="me"' if m["self"] else ""
        rows.append(
            f"<tr{me}><td>{_e(m['node'])}</td><td>{state}</td>"
            f'<td class="num">{_e(_ago(m["heartbeat_age_s"]))}</td>'
            f'<td class="num">{_e(m["weight"])}</td><td>{_e(", ".join(m["tags"]))}</td>'
            f'<td class="mono">{_e(m["digest"])}{digest}</td><td class="num">{_e(m["jobs"])}</td>'
            f"<td>{_e(m['version'])}</td></tr>"
        )
    if not rows:
        rows.append('<tr><td colspan="8" class="muted">no members in view</td></tr>')
    return (
        '<table id="members"><tr><th>member</th><th>state</th><th>heartbeat</th><th>weight</th>'
        "<th>tags</th><th>job-set digest</th><th>jobs</th><th>version</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _window(job: dict[str, Any]) -> str:
    """The job's active window and exclusions under its schedule, when it has any."""
    parts = []
    if job.get("start"):
        parts.append(f"from {_e(job['start'])}")
    if job.get("end"):
        parts.append(f"until {_e(job['end'])}")
    excluded = job.get("exclude") or []
    if excluded:
        parts.append("except " + ", ".join(f"<code>{_e(x)}</code>" for x in excluded))
    return "".join(f'<br><span class="muted">{part}</span>' for part in parts)


def _jobs_table(status: dict[str, Any]) -> str:
    now = status["now_ms"]
    rows = []
    for j in status["jobs"]:
        owner = _e(j["owner"]) if j["owner"] else '<span class="bad">nobody eligible</span>'
        failover = " → ".join(_e(n) for n in j["failover"][1:]) or '<span class="muted">—</span>'
        state = j.get("state") or ("paused" if j["paused"] else "active")
        if state == "paused" or j["next_due_ms"] is None:
            due = f'<span class="muted">{_e(state if state != "active" else "—")}</span>'
        else:
            due = f"{_e(j['next_due'])}<br>{_e(_until(j['next_fire_ms'] - now))}"
            if state == "waiting":
                due = f'<span class="muted">waiting for start</span><br>{due}'
        if j.get("runs_left") is not None:
            left = f"{_e(j['runs_left'])} of {_e(j['max_runs'])} runs left"
            due += f'<br><span class="muted">{left}</span>'
        rows.append(
            f'<tr><td><code>{_e(j["name"])}</code><br><span class="muted">'
            f"{_e(j['description'])}</span></td>"
            f"<td><code>{_e(j['schedule'])}</code><br>{_e(j['tz'])}{_window(j)}</td>"
            f"<td>{owner}</td><td>{failover}</td><td>{due}</td>"
            f"<td>{_last_cell(j['last'])}</td><td>{_e(', '.join(j['tags']))}</td>"
            f'<td class="mono">{_e(j["payload"])}</td></tr>'
        )
    if not rows:
        rows.append('<tr><td colspan="8" class="muted">no jobs</td></tr>')
    shown = len(status["jobs"])
    note = ""
    if status.get("next"):
        query = {"limit": status["limit"], "after": status["next"]}
        if status.get("prefix"):
            query["prefix"] = status["prefix"]
        note = (
            f'<p class="muted">showing {shown} of {_e(status["jobs_total"])} jobs, soonest due '
            f'first; <a href="?{_e(urlencode(query))}">next {_e(status["limit"])}</a>, or add '
            f"?limit=N (up to {MAX_LIMIT}) to see more at once</p>"
        )
    return (
        note + '<table id="jobs"><tr><th>job</th><th>schedule</th><th>owner</th>'
        "<th>failover order</th><th>next due (UTC)</th><th>last trigger</th><th>tags</th>"
        "<th>payload</th></tr>" + "".join(rows) + "</table>"
    )


def _timeline_svg(timeline: dict[str, Any]) -> str:
    members = timeline["members"]
    if not members:
        return '<p class="muted">no live members</p>'
    bar, row_h, label_w = 10, 34, 150
    buckets = max(len(counts) for counts in members.values())
    peak = max([1] + [max(counts) for counts in members.values() if counts])
    width = label_w + buckets * bar + 40
    height = row_h * len(members) + 20
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="ticks per member and minute">'
    ]
    start = timeline["start_ms"]
    for i, (node, counts) in enumerate(members.items()):
        top = 10 + i * row_h
        total = sum(counts)
        parts.append(
            f'<text x="4" y="{top + row_h // 2 + 4}" font-size="12">{_e(node)} ({total})</text>'
        )
        for b, count in enumerate(counts):
            if not count:
                continue
            h = max(1, round((row_h - 8) * count / peak))
            minute = start + b * timeline["bucket_ms"]
            parts.append(
                f'<rect class="tick" x="{label_w + b * bar}" y="{top + row_h - 4 - h}" '
                f'width="{bar - 1}" height="{h}"><title>{_e(node)}: {count} ticks in the '
                f"minute from {_e(_hhmm(minute))} UTC</title></rect>"
            )
    for b in range(0, buckets, 10):
        x = label_w + b * bar
        minute = start + b * timeline["bucket_ms"]
        parts.append(
            f'<text x="{x}" y="{height - 4}" font-size="10" fill="#777">{_e(_hhmm(minute))}</text>'
        )
    parts.append("</svg>")
    partial = ""
    if timeline.get("partial"):
        partial = '<p class="muted">partial: too many ticks to count them all here</p>'
    return "".join(parts) + partial


def _hhmm(epoch_ms: int) -> str:
    seconds = epoch_ms // 1000
    return f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}"


def _summary(status: dict[str, Any]) -> str:
    """Every job in a few numbers: the same whether there are ten jobs or 100,000."""
    s = status.get("summary")
    if not s:
        return ""
    owned = ", ".join(f"{_e(node)} {_e(count)}" for node, count in s["owned"].items())
    orphans = f" · {_e(s['no_owner'])} with no eligible member" if s["no_owner"] else ""
    return (
        f'<p id="jobs-summary">{_e(s["jobs"])} jobs: {_e(s["paused"])} paused, '
        f"{_e(s['bad'])} bad · owned: {owned or 'nobody'}{orphans} · "
        f"{_e(s['missed_last_hour'])} ticks missed in the last hour</p>"
    )


def render_page(status: dict[str, Any]) -> str:
    """The status page; every value from the status document is escaped."""
    ready = (
        '<span class="ok">ready</span>'
        if status["ready"]
        else f'<span class="bad">not ready: {_e(status["reason"])}</span>'
    )
    owned = ", ".join(f"{_e(o['name'])} ({_e(_until(o['in_s'] * 1000))})" for o in status["owned"])
    bad = ""
    if status.get("bad_jobs"):
        items = "".join(
            f"<li><code>{_e(b['name'])}</code>: {_e(b['error'])}</li>" for b in status["bad_jobs"]
        )
        bad = f"<h2>Rejected job specs</h2><ul>{items}</ul>"
    timeline = _timeline_svg(status["timeline"]) if "timeline" in status else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hrwcron {_e(status["node"])}</title>
<style>{_STYLE}</style></head>
<body>
<h1>hrwcron replica <span id="node">{_e(status["node"])}</span></h1>
<p id="summary">{ready} · version {_e(status["version"])} · server time {_e(status["now"])}
· clock offset {_e(status["clock_offset_ms"])} ms · job-set digest
<span class="mono">{_e(status["digest"])}</span> · {_e(status["jobs_total"])} jobs,
{_e(status["owned_total"])} owned here · refreshes every {REFRESH_SECONDS} s</p>
{_summary(status)}
<h2>Members</h2>
{_members_table(status)}
<h2>Next hour: ticks per member and minute (by current ownership)</h2>
{timeline}
<h2>Jobs, soonest due first</h2>
{_jobs_table(status)}
<h2>Owned here, soonest first</h2>
<p>{owned or '<span class="muted">none</span>'}</p>
{bad}
</body></html>
"""
