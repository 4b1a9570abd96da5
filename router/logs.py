"""Log lines of the router and the watcher: JSON by default, text for a terminal.

JSON (``--log-format json``, the default): one object per line, so a log pipeline can index
every field, with a traceback inside the object (a multi-line traceback would be split into
unrelated lines by most collectors). Text (``--log-format text`` or ``EVENTOP_LOG_FORMAT=text``):
time, level, logger and message, for a person at a terminal; the fields stay in the JSON.

The router logs one line per event (``eventop.router.app``), whose message says what the event
was about and what each handler answered (:func:`event_message`), and one per handler failure.
Event *data* is never logged: it may be a Secret.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import warnings
from typing import Any

from eventop.events import is_kube_type

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


class TextFormatter(logging.Formatter):
    """``2026-11-24 03:49:59.524 INFO  eventop.router: message``, then the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        line = (f"{_second(int(created)).replace('T', ' ')}.{int(created % 1 * 1000):03d} "
                f"{record.levelname:<5} {record.name}: {record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def formatter(log_format: str | None = None) -> logging.Formatter:
    """The formatter for ``log_format`` (``json`` or ``text``; default ``EVENTOP_LOG_FORMAT``,
    else ``json``). Values were checked by the command line (:mod:`eventop.cli`)."""
    chosen = (log_format or os.environ.get("EVENTOP_LOG_FORMAT") or "json").strip().lower()
    return TextFormatter() if chosen == "text" else JsonFormatter()


def event_message(info: dict[str, Any], status: int, duration_ms: float,
                  results: list[dict[str, Any]] | None = None, error: str | None = None) -> str:
    """What a person needs from the per-event line, in its message.

    ``add ConfigMap team-a/settings: copy_rules.on_config_object: synced 3 copies (200 in 7.1
    ms)``: the change, the object, and each handler with what it returned (its detail), so
    the log tells what happened without a lookup of the ``results`` field.
    """
    type_ = str(info.get("type") or "")
    change = type_.rpartition(".")[2] if is_kube_type(type_) else type_
    name = "/".join(p for p in (info.get("namespace"), info.get("name")) if p)
    about = (" ".join(p for p in (change, info.get("kind"), name) if p)
             or " ".join(p for p in ("event", info.get("id")) if p))
    if results:
        said = "; ".join(
            f"{_short(r['handler'])}: "
            + ((r["detail"] or "done") if r["outcome"] == "ok" else f"FAILED: {r['detail']}")
            for r in results)
    elif error:
        said = error
    else:
        said = "no handler wants it"
    return f"{about}: {said} ({status} in {duration_ms:g} ms)"



def _short(handler: str) -> str:
    return handler.removeprefix("eventop.handlers.")


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


def configure(level: str | None = None, *, force: bool = False,
              log_format: str | None = None) -> None:
    """Send eventop's logs to stderr (JSON or text), unless logging is already set up.

    Called by :func:`eventop.router.app.create_app`: under gunicorn nothing configures the root
    logger, so without this the per-event lines would be dropped (Python's last-resort
    handler only prints warnings). If the host application or pytest has configured
    handlers, they are left alone and our records propagate to them. ``force`` (used by
    ``python -m eventop.router``) installs the handler regardless. The level comes from
    ``EVENTOP_LOG_LEVEL`` (default INFO), the format from ``EVENTOP_LOG_FORMAT`` (default json).
    """
    logger = logging.getLogger(LOGGER)
    level_name = (level or os.environ.get("EVENTOP_LOG_LEVEL") or "INFO").upper()
    if logger.level == logging.NOTSET or force:
        logger.setLevel(level_name)
    ours = [h for h in logger.handlers if getattr(h, "_eventop", False)]
    if ours:
        if log_format:
            for h in ours:
                h.setFormatter(formatter(log_format))
        return
    if not force and (logger.handlers or logging.getLogger().handlers):
        return
    handler: logging.Handler
    try:
        handler = LineHandler(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # stderr replaced by an in-memory stream
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler._eventop = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    if force:
        _warnings_as_lines(handler)


def _warnings_as_lines(handler: logging.Handler) -> None:
    """Python warnings become log lines in the same format, and urllib3's warning about a
    kubeconfig with ``insecure-skip-tls-verify`` comes once, not with every API request.

    urllib3 asks for that warning on every request ("always"), which buried the router's and
    the watcher's lines under two lines of text per request; the flag is the user's choice,
    said once it is enough.
    """
    from urllib3.exceptions import InsecureRequestWarning

    logging.captureWarnings(True)
    captured = logging.getLogger("py.warnings")
    if handler not in captured.handlers:
        captured.addHandler(handler)
    captured.propagate = False
    warnings.filterwarnings("once", category=InsecureRequestWarning)
