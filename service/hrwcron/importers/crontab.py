"""A Vixie/cronie crontab as job specs, read line by line the way cronie's ``load_user``,
``load_env`` and ``load_entry`` read it (and ``do_command`` splits a command at ``%``).

- A line whose first non-blank character is ``#`` is a comment, a blank line is skipped. A
  ``# name: NAME`` comment in the comments directly above an entry names its job; the other
  comment lines there, back to a blank or an empty ``#`` line, are then its description.
- A line that reads as ``NAME = VALUE`` (either may be quoted) sets a variable for the entries
  below it, as cronie does; they go into each job's payload (``env``). ``CRON_TZ`` picks the
  zone the entries below are scheduled in (an empty one: the host's, ``--tz``); ``TZ`` only
  reaches the commands' environment, as in cronie. ``RANDOM_DELAY`` (minutes) becomes the
  job's ``jitter``.
- An entry is five fields (or an ``@`` macro), the user with ``system``, cronie's ``-n`` option,
  then the command up to the end of the line: there are no line continuations in cronie, a
  trailing backslash is part of the command. The first unescaped ``%`` ends the command; the
  rest is its standard input, each ``%`` a newline, ``\\%`` a ``%``.
- cronie ignores a last line without a newline; so that nothing is lost silently, that line is
  a problem here.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from hrwcron.core.errors import HrwcronError, Problem, ScheduleError
from hrwcron.core.model import job_name_problem, tz_problem
from hrwcron.importers.common import (
    MAX_ENTRIES,
    MAX_SOURCE_BYTES,
    Draft,
    Report,
    command_slug,
    finish,
)
from hrwcron.importers.fields import CRONIE_FIELDS, cronie_field

_MACROS = ("yearly", "annually", "monthly", "weekly", "daily", "midnight", "hourly")
_NAME_COMMENT = re.compile(r"#\s*name:\s*(.*?)\s*")
# cronie takes RANDOM_DELAY up to a day; hrwcron's jitter goes up to an hour.
_MAX_DELAY_MINUTES = 60
_MAX_DESCRIPTION = 1024
# load_env's states: a name (quoted, or up to a blank or '='), blanks, '=', blanks, a value
# (quoted, then only blanks; or the rest of the line, trailing blanks trimmed). A quote opens
# a quoted name or value only as its first character.
_SPACE = "[ \t\v\f\r]"
_VARIABLE = re.compile(
    rf"""(?:'([^'=]*)'|"([^"=]*)"|((?!['"])[^=\s]*)){_SPACE}*={_SPACE}*"""
    rf"""(?:'([^']*)'|"([^"]*)"|((?!['"]).*?)){_SPACE}*"""
)


@dataclass(frozen=True)
class CrontabOptions:
    """``system``: an ``/etc/crontab`` with a user column; ``user``: the owner of a user
    crontab (recorded in the payload); ``tz``: the zone of the host cronie ran on, where
    entries without ``CRON_TZ`` are scheduled; ``prefix``: put before every job name."""

    system: bool = False
    user: str | None = None
    tz: str = "UTC"
    prefix: str | None = None


class _LineError(HrwcronError):
    """Why one line cannot become a job; the reader adds its location."""


@dataclass
class _State:
    source: str
    options: CrontabOptions
    report: Report
    env: dict[str, str]
    zone_bad: bool = False
    jitter: float = 0.0
    entries: int = 0


def read_crontab(data: bytes, source: str, options: CrontabOptions | None = None) -> Report:
    """The jobs of the crontab ``data`` (read from ``source``, the name used in messages)."""
    options = options or CrontabOptions()
    report = Report()
    if len(data) > MAX_SOURCE_BYTES:
        report.problems.append(
            Problem(source, f"is more than {MAX_SOURCE_BYTES} bytes, the most one file may be")
        )
        return report
    state = _State(source, options, report, {})
    lines = data.split(b"\n")
    unterminated = lines.pop() if lines else b""  # b"" when the file ends with a newline
    drafts: list[Draft] = []
    block: list[tuple[int, str]] = []
    for number, raw in enumerate([*lines, unterminated], 1):
        where = f"{source}:{number}"
        content = raw.lstrip(b" \t")
        if not content or content.startswith(b"#"):
            if content:
                block.append((number, content.decode("utf-8", "replace")))
            else:
                _discard(state, block)
                block = []
            continue
        above, block = block, []
        try:
            if number > len(lines):
                raise _LineError(
                    "the file does not end with a newline, and cronie ignores a last line "
                    "without one: add the newline"
                )
            text = _text(content)
            pair = _variable(text)
            if pair is not None:
                _discard(state, above)
                _set(state, where, *pair)
                continue
            state.entries += 1
            if state.entries > MAX_ENTRIES:
                report.problems.append(
                    Problem(where, f"more than {MAX_ENTRIES} entries; import fewer at once")
                )
                break
            drafts.append(_draft(state, where, text, above))
        except _LineError as exc:
            report.problems.append(Problem(where, str(exc)))
        except ScheduleError as exc:
            report.problems += [Problem(where, str(p)) for p in exc.problems]
    _discard(state, block)
    finish(report, drafts, options.prefix)
    return report


def _text(content: bytes) -> str:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise _LineError("is not UTF-8 text") from None
    if text.endswith("\r"):
        raise _LineError(
            "ends with a carriage return (Windows line endings), which cronie keeps as part "
            "of the line"
        )
    return text


def _variable(text: str) -> tuple[str, str] | None:
    """``load_env``: the name and value when ``text`` is a variable line, else None."""
    m = _VARIABLE.fullmatch(text)
    if m is None:
        return None
    name = next(g for g in m.groups()[:3] if g is not None)
    value = next(g for g in m.groups()[3:] if g is not None)
    return name, value


def _set(state: _State, where: str, name: str, value: str) -> None:
    state.env[name] = value
    if name == "CRON_TZ":
        bad = tz_problem(value) if value else None
        state.zone_bad = bad is not None
        if bad:
            raise _LineError(f"CRON_TZ: {bad}")
    elif name == "TZ":
        state.report.notes.append(
            Problem(
                where,
                "TZ reaches the commands' environment only: cronie schedules the entries "
                "below in CRON_TZ's zone or the host's (--tz), and so does this import",
            )
        )
    elif name == "RANDOM_DELAY":
        digits = re.match(r"\s*([+-]?[0-9]+)", value)
        minutes = int(digits.group(1)) if digits else 0
        if not 0 <= minutes <= 24 * 60:
            state.jitter = 0.0
            state.report.notes.append(
                Problem(where, "cronie ignores a RANDOM_DELAY outside 0-1440 minutes")
            )
        elif minutes > _MAX_DELAY_MINUTES:
            raise _LineError(
                f"RANDOM_DELAY={minutes}: hrwcron delays a job by at most "
                f"{_MAX_DELAY_MINUTES} minutes (jitter = 3600 s)"
            )
        else:
            state.jitter = minutes * 60.0


def _discard(state: _State, block: list[tuple[int, str]]) -> None:
    """A comment block that is not directly above an entry: a name in it names nothing."""
    for number, text in block:
        if _NAME_COMMENT.fullmatch(text):
            state.report.notes.append(
                Problem(
                    f"{state.source}:{number}",
                    "this name comment is not directly above an entry, so it names nothing",
                )
            )


def _draft(state: _State, where: str, text: str, above: list[tuple[int, str]]) -> Draft:
    schedule, rest = _schedule(text)
    user = state.options.user
    if state.options.system:
        user, rest = _word(rest)
        if not rest:
            raise _LineError("bad command: nothing after the user")
    mail_only_on_error = False
    while rest.startswith("-"):
        if rest[1:2] != "n" or rest[2:3] not in (" ", "\t") or mail_only_on_error:
            raise _LineError(
                f"bad option {rest.split()[0]!r}: cronie takes only -n (mail on error) "
                "before a command"
            )
        mail_only_on_error = True
        rest = rest[3:].lstrip(" \t")
    if not rest:
        raise _LineError("bad command: no command")
    if rest.endswith("\\"):
        state.report.notes.append(
            Problem(
                where,
                "ends with '\\': cronie has no line continuations, so the backslash stays in "
                "the command and the next line is read on its own",
            )
        )
    command, stdin = split_percent(rest)
    for part, label in ((command, "the command"), (stdin or "", "the standard input after %")):
        odd = next((c for c in part if unicodedata.category(c) == "Cc" and c not in "\t\n"), None)
        if odd is not None:
            raise _LineError(f"{label} is not plain text: it holds the control character {odd!r}")
    payload: dict[str, Any] = {"command": command}
    if stdin is not None:
        payload["stdin"] = stdin
    if user:
        payload["user"] = user
    if state.env:
        payload["env"] = dict(state.env)
    if mail_only_on_error:
        payload["mail_only_on_error"] = True
    fields: dict[str, Any] = {"schedule": schedule, "payload": payload}
    zone = state.env.get("CRON_TZ") or state.options.tz
    fields["tz"] = "UTC" if state.zone_bad else zone  # its CRON_TZ line holds the problem
    if state.jitter:
        fields["jitter"] = state.jitter
    name, description = _comments(state, above)
    if description:
        fields["description"] = description
    return Draft(where, name, command_slug(command), fields)


def _schedule(text: str) -> tuple[str, str]:
    """The schedule in hrwcron's terms, and what follows it on the line."""
    if text.startswith("-"):
        text = text[1:]  # cronie's "do not log this job" mark; it concerns only cron's syslog
    if text.startswith("@"):
        macro, rest = _word(text)
        if macro == "@reboot":
            raise _LineError(
                "@reboot runs once when cron starts, which is no instant hrwcron can schedule: "
                "start it from the host's init system (a systemd unit, say)"
            )
        if macro[1:] not in _MACROS:
            raise _LineError(
                f"bad time specifier {macro!r}: cronie knows @reboot and "
                + " ".join(f"@{m}" for m in _MACROS)
            )
        schedule = macro
    else:
        fields = []
        rest = text
        for field in CRONIE_FIELDS:
            token, rest = _word(rest)
            if not token:
                raise _LineError(f"bad {field.name}: missing")
            fields.append(cronie_field(token, field))
        schedule = " ".join(fields)
    if not rest:
        raise _LineError("bad command: the line ends after the schedule")
    if rest.startswith("*"):
        raise _LineError("bad command: it starts with '*' (a sixth time field? cronie has five)")
    return schedule, rest


def _word(text: str) -> tuple[str, str]:
    m = re.match(r"([^ \t]*)[ \t]*(.*)", text, re.DOTALL)
    assert m is not None
    return m.group(1), m.group(2)


def split_percent(command: str) -> tuple[str, str | None]:
    """``do_command``: the command before the first unescaped ``%`` (``\\%`` becomes ``%``,
    other backslashes stay), and the standard input cronie writes from the rest (None when it
    writes none)."""
    out: list[str] = []
    escaped = False
    for i, ch in enumerate(command):
        if escaped:
            if ch == "%":
                out[-1] = "%"
            else:
                out.append(ch)
            escaped = False
        elif ch == "%":
            rest = command[i + 1 :]
            return "".join(out), _stdin(rest) if rest else None
        else:
            out.append(ch)
            escaped = ch == "\\"
    return "".join(out), None


def _stdin(data: str) -> str:
    """What cronie writes to the command's standard input: ``%`` is a newline, ``\\%`` a
    ``%``, other backslashes stay, and a newline ends it unless one already does."""
    out: list[str] = []
    escaped = need_newline = False
    for ch in data:
        if escaped:
            if ch != "%":
                out.append("\\")
        elif ch == "%":
            ch = "\n"
        escaped = ch == "\\"
        if not escaped:
            out.append(ch)
            need_newline = ch != "\n"
    if escaped:
        out.append("\\")
    if need_newline:
        out.append("\n")
    return "".join(out)


def _comments(state: _State, above: list[tuple[int, str]]) -> tuple[str | None, str]:
    """The name a ``# name:`` comment directly above gives, and the description: the other
    comment lines directly above, back to an empty ``#`` line."""
    name: str | None = None
    lines: list[str] = []
    for number, text in above:
        where = f"{state.source}:{number}"
        m = _NAME_COMMENT.fullmatch(text)
        if m is None:
            body = text[1:].strip()
            lines = [*lines, body] if body else []
            continue
        if name is not None:
            raise _LineError(f"a second name comment above one entry (the first: {name!r})")
        bad = job_name_problem(m.group(1))
        if bad:
            state.report.problems.append(Problem(where, f"name: {bad}"))
            continue
        name = m.group(1)
    # Only a named entry takes its comments: the comment directly above the first entry is
    # often the file's header (Debian's "# m h dom mon dow command").
    description = " ".join(lines) if name is not None else ""
    if len(description) > _MAX_DESCRIPTION:
        description = description[: _MAX_DESCRIPTION - 3] + "..."
    return name, description
