"""Log set-up: human text or one JSON object per line, with job/tick/node fields when given."""

from __future__ import annotations

import json
import logging
import sys
import time

from hrwcron.core.config import redact_secrets

_EXTRA_FIELDS = ("job", "tick", "node", "outcome", "rank", "attempt")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _EXTRA_FIELDS:
            if name in record.__dict__:
                entry[name] = record.__dict__[name]
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RedactSecrets(logging.Filter):
    """Masks anything shaped like a seed, a JWT or a creds block in every record, whatever
    logged it (nats-py quotes what it was given in some errors)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def setup_logging(level: str = "info", fmt: str = "text", node: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactSecrets())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        prefix = f"[{node}] " if node else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)-7s {prefix}%(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # nats-py logs every reconnect attempt at error level; our own callbacks report them once.
    logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)
