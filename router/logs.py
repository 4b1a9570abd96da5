"""JSON log lines, one object per line, so a log pipeline can index every field.

The router logs one line per event (``eventop.router.app``) and one per handler failure, with the
traceback inside the JSON object (a multi-line traceback would be split into unrelated
lines by most collectors). Event *data* is never logged: it may be a Secret.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from typing import Any

LOGGER = "eventop"
# One encoder for all lines: json.dumps(..., default=str) builds a new encoder per call,
# which doubles the cost of the per-event log line.
_encode = json.JSONEncoder(default=str).encode


@functools.lru_cache(maxsize=4)
def _second(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", **fields}``; ``fields`` comes from ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        out: dict[str, Any] = {
            "time": f"{_second(int(created))}.{int(created % 1 * 1000):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return _encode(out)


class LineHandler(logging.Handler):
    """Write each formatted record as one line, with one ``write(2)`` on a file descriptor.

    Not ``StreamHandler``: with one line per event, its text layer (encode, line buffering,
    then a flush that finds nothing left to do) cost as much as formatting the line. One
    write per line also keeps the lines of several gunicorn workers sharing one stderr
    whole (atomic up to PIPE_BUF bytes on a pipe).
    """

    def __init__(self, fd: int = 2) -> None:
        super().__init__()
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            while data:
                data = data[os.write(self.fd, data):]
        except Exception:
            self.handleError(record)


def configure(level: str | None = None, *, force: bool = False) -> None:
    """Send eventop's logs to stderr as JSON, unless logging is already set up.

    Called by :func:`eventop.router.app.create_app`: under gunicorn nothing configures the root
    logger, so without this the per-event lines would be dropped (Python's last-resort
    handler only prints warnings). If the host application or pytest has configured
    handlers, they are left alone and our records propagate to them. ``force`` (used by
    ``python -m eventop.router``) installs the handler regardless. The level comes from
    ``EVENTOP_LOG_LEVEL`` (default INFO).
    """
    logger = logging.getLogger(LOGGER)
    level_name = (level or os.environ.get("EVENTOP_LOG_LEVEL") or "INFO").upper()
    if logger.level == logging.NOTSET or force:
        logger.setLevel(level_name)
    if any(getattr(h, "_eventop", False) for h in logger.handlers):
        return
    if not force and (logger.handlers or logging.getLogger().handlers):
        return
    handler: logging.Handler
    try:
        handler = LineHandler(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # stderr replaced by an in-memory stream
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._eventop = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
