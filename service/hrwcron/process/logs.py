"""Log set-up: human text or one JSON object per line, with job/tick/node fields when given."""

from __future__ import annotations

import json
import logging
import sys
import time

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


def setup_logging(level: str = "info", fmt: str = "text", node: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
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
