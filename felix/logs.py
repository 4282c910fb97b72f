"""Structured logs: one JSON object per line, with the fields a log pipeline indexes."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else passed via `extra=` becomes a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts":..., "level":..., "logger":..., "msg":..., <extra fields>}`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "info", node: str | None = None) -> None:
    """Send JSON logs to stderr; `node` is stamped on every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    if node:
        handler.addFilter(_NodeStamp(node))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class _NodeStamp(logging.Filter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node
        return True
