"""One cron field as cronie reads it (``entry.c``: ``get_range``) and as the Kubernetes CronJob
controller's parser, robfig/cron v3, reads it (``parser.go``: ``getRange``), written back as
text hrwcron reads to the same values.

hrwcron accepts more than either (``L``, ``W``, ``#``, ``N/step``, ...), so a field is checked
against its own dialect's grammar first: what that dialect refuses is refused here too, with
the reason. Where the same text means something else to hrwcron, the text is rewritten:

- cronie's ``a~b`` (a random value, picked when the crontab is loaded) becomes ``H(a-b)``, a
  value picked by hashing the job's name: fixed while the job keeps its name.
- cronie reads a day-of-week range ending in 0 (``5-0``) as ending in 7; hrwcron refuses it.
- robfig reads ``*/n`` (n > 1) in a day field as a restriction, so that the day-of-month /
  day-of-week OR rule applies; hrwcron (like cronie) does not, unless it is written ``lo-hi/n``.
- robfig reads ``?`` as ``*`` in every field, and ``*`` anywhere in a list as the whole field.
- Sunday by name at the end of a range is 7 in hrwcron, 0 in both others (``sun-sun``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hrwcron.core.errors import Problem, ScheduleError

FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(frozen=True)
class Field:
    name: str
    lo: int
    hi: int
    names: tuple[str, ...] = ()

    @property
    def day(self) -> bool:
        return self.name in ("day-of-month", "day-of-week")


def _fields(dow_hi: int) -> tuple[Field, ...]:
    return (
        Field("minute", 0, 59),
        Field("hour", 0, 23),
        Field("day-of-month", 1, 31),
        Field("month", 1, 12, _MONTHS),
        Field("day-of-week", 0, dow_hi, _DAYS),
    )


# cronie's day-of-week runs 0-7 (both Sunday); robfig's 0-6.
CRONIE_FIELDS = _fields(7)
ROBFIG_FIELDS = _fields(6)


def bad(field: Field, message: str) -> ScheduleError:
    return ScheduleError(Problem(field.name, message))


def _name_value(token: str, field: Field) -> int | None:
    lowered = token.lower()
    if lowered in field.names:
        return field.names.index(lowered) + (1 if field.names is _MONTHS else 0)
    return None


def _quoted(token: str, item: str) -> str:
    return repr(token) if token == item else f"{token!r} in {item!r}"


def _hint(item: str, dialect: str) -> str:
    if any(c in item.upper() for c in "LW#?H"):
        return f" ({dialect} has none of the L, W, #, ? and H forms hrwcron knows)"
    return ""


# --- cronie ---------------------------------------------------------------------------------


def cronie_field(text: str, field: Field) -> str:
    """``text`` as cronie's ``get_list`` reads it, as hrwcron text with the same values."""
    return ",".join(_cronie_item(item, field) for item in text.split(","))


def _cronie_number(token: str, field: Field, item: str) -> int:
    """``get_number``: all digits, or (month and day-of-week) a name, in any case."""
    if token.isascii() and token.isdigit():
        return int(token)
    named = _name_value(token, field)
    if named is None:
        kind = "a number or a name" if field.names else "a number"
        raise bad(field, f"{_quoted(token, item)} is not {kind}{_hint(item, 'cronie')}")
    return named


def _cronie_step(text: str, field: Field, item: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise bad(field, f"the step in {item!r} is not a whole number of at least 1")
    return int(text)


def _in_range(values: range, field: Field, item: str) -> None:
    outside = [v for v in values if not field.lo <= v <= field.hi]
    if outside:
        value = str(outside[0])
        raise bad(field, f"{_quoted(value, item)} is out of range {field.lo}-{field.hi}")


def _cronie_item(item: str, field: Field) -> str:
    if not item:
        raise bad(field, "an empty item in the list")
    base, slash, step_text = item.partition("/")
    step = _cronie_step(step_text, field, item) if slash else 1
    if "~" in base:
        if slash:
            raise bad(field, f"{item!r}: a random value (~) takes no step")
        first, _, last = base.partition("~")
        lo = _cronie_number(first, field, item) if first else field.lo
        hi = _cronie_number(last, field, item) if last else field.hi
        _in_range(range(lo, lo + 1), field, item)
        _in_range(range(hi, hi + 1), field, item)
        if lo > hi:
            raise bad(field, f"{item!r}: the random range runs backwards ({lo} > {hi})")
        return f"H({lo}-{hi})"
    if base == "*":
        return item
    first, dash, last = base.partition("-")
    lo = _cronie_number(first, field, item)
    if not dash:
        if slash:
            raise bad(
                field,
                f"{item!r}: cronie takes a step only after '*' or a range "
                f"(write {first}-{field.hi}/{step_text})",
            )
        _in_range(range(lo, lo + 1), field, item)
        return item
    written_hi = hi = _cronie_number(last, field, item)
    if lo > hi and hi == 0 and field.name == "day-of-week":
        hi = 7  # get_range: a range ending in 0 that starts above it ends on the other Sunday
    elif lo > hi:
        raise bad(field, f"the range {base!r} runs backwards ({lo} > {hi})")
    values = range(lo, hi + 1, step)
    _in_range(values, field, item)
    if hi > field.hi:
        hi = values[-1]  # cronie checks only the values a step reaches
    named_sunday = field.name == "day-of-week" and _name_value(last, field) == 0
    if hi != written_hi or named_sunday:
        return f"{first}-{hi}{slash}{step_text}"
    return item


# --- robfig/cron v3 -------------------------------------------------------------------------


def robfig_field(text: str, field: Field) -> tuple[str, bool]:
    """``text`` as robfig's ``getField`` reads it: hrwcron text with the same values, and
    whether the field counts as ``*`` for the day rule (a ``*`` or ``?`` item without a step
    above 1)."""
    items = [item for item in text.split(",") if item]  # FieldsFunc drops empty items
    if not items:
        raise bad(field, f"{text!r} has no value, so the schedule never fires")
    star = False
    out: list[str] = []
    for item in items:
        written, item_star = _robfig_item(item, field)
        star = star or item_star
        out.append(written)
    if star:
        return "*", True
    return ",".join(out), False


def restricted(text: str, field: Field) -> str:
    """A day field robfig reads as restricted, written so that hrwcron does too (for the day
    rule, which only looks at whether the field starts with ``*``)."""
    if text.startswith("*/"):
        return f"{field.lo}-{field.hi}{text[1:]}"
    return text


def _robfig_number(token: str, field: Field, item: str) -> int:
    """``parseIntOrName``: a name of the field in any case, else ``strconv.Atoi``."""
    named = _name_value(token, field)
    if named is not None:
        return named
    if not re.fullmatch(r"\+?[0-9]+", token):
        kind = "a number or a name" if field.names else "a number"
        raise bad(field, f"{_quoted(token, item)} is not {kind}{_hint(item, 'robfig/cron')}")
    return int(token)


def _robfig_item(item: str, field: Field) -> tuple[str, bool]:
    parts = item.split("/")
    if len(parts) > 2:
        raise bad(field, f"too many slashes in {item!r}")
    bounds = parts[0].split("-")
    star = bounds[0] in ("*", "?")
    if star:
        if len(bounds) > 1:
            raise bad(field, f"{item!r}: '*' is the whole field, it starts no range")
        lo, hi = field.lo, field.hi
    else:
        if len(bounds) > 2:
            raise bad(field, f"too many hyphens in {item!r}")
        lo = _robfig_number(bounds[0], field, item)
        hi = lo if len(bounds) == 1 else _robfig_number(bounds[1], field, item)
    step = 1
    if len(parts) == 2:
        step = _robfig_number(parts[1], Field(field.name, 0, 0), item)
        if len(bounds) == 1:
            hi = field.hi  # "N/step" means "N-max/step"
        star = star and step <= 1
    if lo < field.lo or hi > field.hi:
        raise bad(field, f"{item!r} is out of range {field.lo}-{field.hi}")
    if lo > hi:
        raise bad(field, f"the range in {item!r} runs backwards ({lo} > {hi})")
    if step == 0:
        raise bad(field, f"the step in {item!r} must be 1 or more")
    if bounds[0] in ("*", "?"):
        return "*" + (f"/{step}" if len(parts) == 2 else ""), star
    tail = f"/{step}" if len(parts) == 2 else ""
    if "+" in item or (len(bounds) == 2 and _name_value(bounds[1], field) == 0):
        return (f"{lo}" if len(bounds) == 1 else f"{lo}-{hi}") + tail, star
    return item, star
