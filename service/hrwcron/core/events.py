"""What a trigger says when it is also a CloudEvent (binary mode of the CloudEvents NATS
protocol binding): its type, its default source, and how an attribute becomes a header value.

Binary mode leaves the body as it is, so a worker that knows nothing of CloudEvents reads the
same trigger as before; the attributes ride in ``ce-`` headers, which cost a few hundred bytes
and only when a deployment asks for them.
"""

from __future__ import annotations

import re

SPECVERSION = "1.0"
# Every trigger kind (scheduled, manual, backfill) is one occurrence of a job, so one type;
# the kind stays in the Hrwcron-Kind header and the body. An incompatible body (a new ``v``)
# gets a new type.
EVENT_TYPE = "io.hrwcron.tick"
DATA_CONTENT_TYPE = "application/json"
MAX_SOURCE = 255

# The characters RFC 3986 allows in a URI reference, a percent sign only as an escape.
_URI_REFERENCE = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")


def default_source(subject_prefix: str) -> str:
    """``/hrwcron/<subject prefix>``: a relative URI reference, as the CloudEvents spec allows,
    that stays the same across restarts and replicas and differs between deployments that
    share an account (their streams cannot share subjects). A prefix is tokens of letters,
    digits, ``_`` and ``-`` joined by dots, so it needs no escaping."""
    return f"/hrwcron/{subject_prefix}"


def source_problem(source: str) -> str | None:
    """Why ``source`` cannot be a trigger's CloudEvents source, or None when it can."""
    if len(source) > MAX_SOURCE:
        return f"at most {MAX_SOURCE} characters"
    if not _URI_REFERENCE.fullmatch(source):
        return (
            f"{source[:80]!r} is not a URI reference: letters, digits and - . _ ~ : / ? # [ ] "
            "@ ! $ & ' ( ) * + , ; = only, % only as in %20"
        )
    return None


def header_value(text: str) -> str:
    """``text`` as a NATS header value of a CloudEvents attribute: space, double quote,
    percent and everything outside printable ASCII percent-encoded (UTF-8, upper-case hex),
    as the binding prescribes, so a reader decodes it back to ``text``."""
    out: list[str] = []
    for char in text:
        if "!" <= char <= "~" and char not in '"%':
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)
