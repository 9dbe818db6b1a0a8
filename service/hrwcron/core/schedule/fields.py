"""Cron fields: numbers, names, ranges, steps and lists, and the dialect forms (``L``, ``L-n``,
``nW``, ``LW``, ``nL``, ``n#k``, ``?`` and Jenkins' hashed ``H``) read into sets of values and
day rules."""

from __future__ import annotations

import re
from dataclasses import dataclass

import xxhash

from hrwcron.core.schedule.civil import schedule_error

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


# A 6-field expression listing every value of every field is about 530 characters.
MAX_EXPRESSION_LENGTH = 1024

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_SYNTAX = "use numbers{names}, '*', ranges a-b, steps /n, lists a,b and H"
# What each field accepts beyond plain values, quoted when a token is not understood.
_FORMS = {
    "day-of-month": "day-of-month also takes L, L-n, nW, LW, ? and H",
    "day-of-week": "day-of-week also takes nL, n#k, ? and H",
}
_DAY_FORMS = "L, L-n, nW and LW are day-of-month forms; nL and n#k day-of-week forms"
_MAX_DIGITS = 9  # longer numbers are out of every range (and int() refuses 4301 digits)
_HASH_FORM = re.compile(r"H(?:\(([0-9A-Z]*)-([0-9A-Z]*)\))?(?:/([0-9]*))?")
# An item that starts with H, wherever it is; no month or weekday name starts with H.
HASH_ITEM = re.compile(r"(?:^|[\s,])[Hh]")


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    lo: int
    hi: int  # the largest value accepted as written (7 for day-of-week)
    star_hi: int  # where '*' and 'a/n' stop (6 for day-of-week, so Sunday is not counted twice)
    names: dict[str, int] | None = None
    hash_hi: int = -1  # where a bare H stops, when not at star_hi

    @property
    def hash_range(self) -> tuple[int, int]:
        return self.lo, self.star_hi if self.hash_hi < 0 else self.hash_hi


_FIELDS = (
    _FieldSpec("second", 0, 59, 59),
    _FieldSpec("minute", 0, 59, 59),
    _FieldSpec("hour", 0, 23, 23),
    # A bare H in day-of-month picks from 1-28 so that the job fires every month.
    _FieldSpec("day-of-month", 1, 31, 31, hash_hi=28),
    _FieldSpec("month", 1, 12, 12, _MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, 6, _DOW_NAMES),
)
SEC, MIN, HOUR, DOM, MON, DOW = _FIELDS
_STAR: dict[str, tuple[frozenset[int], tuple[tuple[int, int, int], ...]]] = {
    spec.name: (frozenset(range(spec.lo, spec.star_hi + 1)), ()) for spec in _FIELDS
}


def next_table(values: frozenset[int], size: int) -> tuple[int, ...]:
    """``table[v]`` is the smallest allowed value >= v, or -1; one slot past the end reads -1."""
    table = [-1] * (size + 1)
    nxt = -1
    for v in range(size - 1, -1, -1):
        if v in values:
            nxt = v
        table[v] = nxt
    return tuple(table)


ALL_DAYS = {dim: next_table(frozenset(range(1, dim + 1)), 33) for dim in (28, 29, 30, 31)}


# --- day rules: days that depend on a month's length and the weekday it starts on ----------

# A rule (kind, a, b) names at most one day in a month of ``dim`` days whose 1st falls on
# weekday ``first`` (Sunday = 0); the same (dim, first) always gives the same day.
_LAST = 0  # L-a: a days before the last day (L is L-0)
_NEAREST = 1  # aW: the weekday (Monday to Friday) nearest day a, inside the month
_LAST_WEEKDAY = 2  # LW: the last weekday (Monday to Friday) of the month
_NTH = 3  # a#b: the b-th weekday a of the month
_LAST_OF = 4  # aL: the last weekday a of the month

Rule = tuple[int, int, int]


def rule_day(rule: Rule, dim: int, first: int) -> int:
    """The day of the month ``rule`` names, or 0 when this month has none."""
    kind, a, b = rule
    if kind == _LAST:
        return max(dim - a, 0)
    if kind == _NEAREST:
        if a > dim:
            return 0  # like a plain 31, 31W passes over the months without a 31st
        weekday = (first + a - 1) % 7
        if weekday == 6:  # Saturday: the Friday before, unless that is in the previous month
            return a - 1 if a > 1 else a + 2
        if weekday == 0:  # Sunday: the Monday after, unless that is in the next month
            return a + 1 if a < dim else a - 2
        return a
    if kind == _LAST_WEEKDAY:
        weekday = (first + dim - 1) % 7
        return dim - 1 if weekday == 6 else dim - 2 if weekday == 0 else dim
    if kind == _NTH:
        day = 1 + (a - first) % 7 + 7 * (b - 1)
        return day if day <= dim else 0
    return dim - (first + dim - 1 - a) % 7  # _LAST_OF


# --- parsing --------------------------------------------------------------------------------


def _digits(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _hint(token: str, spec: _FieldSpec) -> str:
    if spec.name in _FORMS:
        return f" ({_FORMS[spec.name]})"
    if re.fullmatch(r"[0-9]*[LW]|L-[0-9]*|LW|[0-9]*#[0-9]*", token.upper()):
        return f" ({_DAY_FORMS})"
    return ""


def _value(token: str, spec: _FieldSpec, *, upper: bool = False) -> int:
    if not token:
        raise schedule_error(
            spec.name, "a value is missing (a range or step without its start or end)"
        )
    if _digits(token):
        if len(token) > _MAX_DIGITS:
            raise schedule_error(
                spec.name, f"{token[:_MAX_DIGITS]}... is out of range {spec.lo}-{spec.hi}"
            )
        v = int(token)
        if not spec.lo <= v <= spec.hi:
            raise schedule_error(spec.name, f"{v} is out of range {spec.lo}-{spec.hi}")
        return v
    if spec.names is not None and token.lower() in spec.names:
        v = spec.names[token.lower()]
        # SAT-SUN reads as Saturday to Sunday: Sunday closing a range is 7, not 0.
        return 7 if upper and spec is DOW and v == 0 else v
    kind = "a number or a name" if spec.names else "a number"
    raise schedule_error(spec.name, f"{token!r} is not {kind}{_hint(token, spec)}")


def _step(text: str, item: str, spec: _FieldSpec) -> int:
    if not _digits(text):
        raise schedule_error(spec.name, f"step {text!r} in {item!r} is not a number")
    if len(text) > _MAX_DIGITS:
        raise schedule_error(spec.name, f"step {text[:_MAX_DIGITS]}... in {item!r} is too large")
    step = int(text)
    if step == 0:
        raise schedule_error(spec.name, f"step 0 in {item!r} must be 1 or more")
    return step


def field_hash(job: str, field_name: str) -> int:
    """The number ``H`` stands on in one field of a job's schedule.

    ``xxh3_64(utf8(job) || 0x00 || utf8(field_name))``, seed 0: the HRW score of the job
    against a node named after the field (``second``, ``minute``, ``hour``, ``day-of-month``,
    ``month`` or ``day-of-week``), so each field of one job gets an independent value."""
    return xxhash.xxh3_64_intdigest(job.encode() + b"\x00" + field_name.encode())


def _hashed(item: str, spec: _FieldSpec, job: str | None) -> range:
    """Jenkins' H: one value of the range picked by the job's name (``H``, ``H(a-b)``), or, with
    a step n, every n-th value from an offset below n picked the same way (``H/n``, ``H(a-b)/n``).
    """
    form = _HASH_FORM.fullmatch(item.upper())
    if form is None:
        raise schedule_error(
            spec.name, f"{item!r} is not a hashed value: use H, H(a-b), H/n or H(a-b)/n"
        )
    if job is None:
        raise schedule_error(
            "job",
            f"'H' in {spec.name} stands for a value hashed from the job's name, "
            "and no job name was given",
        )
    first, last, step_text = form.groups()
    if first is None:
        lo, hi = spec.hash_range
    else:
        lo, hi = _value(first, spec), _value(last, spec, upper=True)
        if lo > hi:
            raise schedule_error(spec.name, f"range in {item!r} runs backwards ({lo} > {hi})")
    span = hi - lo + 1
    h = field_hash(job, spec.name)
    if step_text is None:
        return range(lo + h % span, lo + h % span + 1)
    step = _step(step_text, item, spec)
    # A step wider than the range leaves one value, still picked by the hash.
    return range(lo + h % min(step, span), hi + 1, step)


def _dom_rule(item: str) -> Rule | None:
    base, slash, _ = item.partition("/")
    up = base.upper()
    if up == "L":
        rule = (_LAST, 0, 0)
    elif up == "LW":
        rule = (_LAST_WEEKDAY, 0, 0)
    elif up.startswith("L-"):
        n = up[2:]
        if not (_digits(n) and len(n) <= 2 and 1 <= int(n) <= 30):
            raise schedule_error(
                DOM.name,
                f"{item!r}: L-n counts n days back from the last day, n from 1 to 30",
            )
        rule = (_LAST, int(n), 0)
    elif up.endswith("W") and _digits(up[:-1]):
        rule = (_NEAREST, _value(up[:-1], DOM), 0)
    else:
        return None
    if slash:
        raise schedule_error(DOM.name, f"{item!r}: a step does not apply to {base!r}")
    return rule


def _dow_rule(item: str) -> Rule | None:
    base, slash, _ = item.partition("/")
    up = base.upper()
    if "#" in base:
        day, _, nth = base.partition("#")
        weekday = _value(day, DOW) % 7
        if not (_digits(nth) and len(nth) == 1 and 1 <= int(nth) <= 5):
            raise schedule_error(
                DOW.name, f"{item!r}: in n#k, k is from 1 to 5 (the k-th weekday n of the month)"
            )
        rule = (_NTH, weekday, int(nth))
    elif up == "L":
        raise schedule_error(
            DOW.name,
            "'L' alone is not a day of the week: nL is the last weekday n of the month, "
            "e.g. 5L the last Friday",
        )
    elif up.endswith("L"):
        rule = (_LAST_OF, _value(base[:-1], DOW) % 7, 0)
    elif up.startswith("L") and _digits(up[1:]):
        raise schedule_error(
            DOW.name, f"{item!r}: write the last weekday n of the month as nL, e.g. 5L"
        )
    else:
        return None
    if slash:
        raise schedule_error(DOW.name, f"{item!r}: a step does not apply to {base!r}")
    return rule


def _check_chars(text: str, spec: _FieldSpec) -> None:
    day_field = spec is DOM or spec is DOW
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch in "*,-/()"):
            continue
        if (ch == "#" and spec is DOW) or (ch == "?" and day_field):
            continue
        if ch == "#":
            message = "'#' belongs in day-of-week only (n#k: the k-th weekday n of the month)"
        elif ch == "?":
            message = "'?' belongs in day-of-month and day-of-week only (it means '*')"
        else:
            names = ", names" if spec.names else ""
            message = f"{ch!r} is not allowed: {_SYNTAX.format(names=names)}"
        raise schedule_error(spec.name, message)


def parse_field(
    text: str, spec: _FieldSpec, job: str | None
) -> tuple[frozenset[int], tuple[Rule, ...]]:
    """The values a field allows, and (day fields only) the rules that depend on the month."""
    if text == "*" or (text == "?" and (spec is DOM or spec is DOW)):
        return _STAR[spec.name]  # most fields of most schedules
    _check_chars(text, spec)
    if "?" in text:
        raise schedule_error(
            spec.name, f"'?' stands alone for the whole field (it means '*'): {text!r}"
        )
    values: set[int] = set()
    rules: list[Rule] = []
    for item in text.split(","):
        if not item:
            raise schedule_error(spec.name, f"empty item in the list {text!r}")
        if item[0] in "Hh":
            values.update(_hashed(item, spec, job))
            continue
        if not item.isdigit():  # plain numbers, the common case, are never day rules
            rule = _dom_rule(item) if spec is DOM else _dow_rule(item) if spec is DOW else None
            if rule is not None:
                rules.append(rule)
                continue
        base, slash, step_text = item.partition("/")
        step = _step(step_text, item, spec) if slash else 1
        if base == "*":
            lo, hi = spec.lo, spec.star_hi
        elif "-" in base:
            first, _, last = base.partition("-")
            if "-" in last:
                raise schedule_error(spec.name, f"{item!r} is not a range a-b")
            lo, hi = _value(first, spec), _value(last, spec, upper=True)
            if lo > hi:
                raise schedule_error(spec.name, f"range {base!r} runs backwards ({lo} > {hi})")
        else:
            lo = _value(base, spec)
            # 'a/n' means from a to the end of the field, as croniter and robfig/cron read it.
            hi = max(lo, spec.star_hi) if slash else lo
        # A step wider than the range keeps the range's first value only (Vixie cron, cronie
        # and croniter agree): '*/30' in hours is hour 0.
        values.update(range(lo, hi + 1, step))
    if spec is DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values), tuple(rules)
