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
        return self.line(record.created, record.levelname, record.name, record.getMessage(),
                         getattr(record, "fields", None),
                         self.formatException(record.exc_info) if record.exc_info else None)

    @staticmethod
    def line(created: float, level: str, logger: str, message: str, fields: Any = None,
             traceback: str | None = None) -> str:
        """The line of a record with these attributes (also written by :func:`log_fields`,
        which makes no record)."""
        out: dict[str, Any] = {
            "time": f"{_second(int(created))}.{int(created % 1 * 1000):03d}Z",
            "level": level.lower(),
            "logger": logger,
            "message": message,
        }
        if isinstance(fields, dict):
            out.update(fields)
        if traceback:
            out["traceback"] = traceback
        return _encode(out)


class TextFormatter(logging.Formatter):
    """``2026-11-24 03:49:59.524 INFO  eventop.router: message``, then the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return self.line(record.created, record.levelname, record.name, record.getMessage(),
                         None, self.formatException(record.exc_info) if record.exc_info else None)

    @staticmethod
    def line(created: float, level: str, logger: str, message: str, fields: Any = None,
             traceback: str | None = None) -> str:
        """The line of a record with these attributes; the fields stay in the JSON format."""
        line = (f"{_second(int(created)).replace('T', ' ')}.{int(created % 1 * 1000):03d} "
                f"{level:<5} {logger}: {message}")
        if traceback:
            line += "\n" + traceback
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
    name = "/".join([p for p in (info.get("namespace"), info.get("name")) if p])
    about = (" ".join([p for p in (change, info.get("kind"), name) if p])
             or " ".join([p for p in ("event", info.get("id")) if p]))
    if results:
        shown, more = folded(results, MESSAGE_RESULTS)
        said = "; ".join([
            f"{_short(r['handler'])}: "
            + ((r["detail"] or "done") if r["outcome"] == "ok" else f"FAILED: {r['detail']}")
            for r in shown])
        if more:
            failed = sum(1 for r in results if r["outcome"] != "ok")
            said += (f"; and {more} more ({len(results) - failed} ok, {failed} failed in "
                     "all; the event's answer lists each)")
    elif error:
        said = error.removeprefix(f"{about}: ")  # a 400's answer names the event too
    else:
        said = "no handler wants it"
    return f"{about}: {said} ({status} in {duration_ms:g} ms)"



#: Results spelt out in the per-event message, and kept in its ``results`` field: an event
#: that runs many keys (a rates refresh of every ExchangeRate, a namespace for every
#: CopyRule) would otherwise write one line of many kilobytes, the same failure repeated
#: per key, and lines over PIPE_BUF are no longer written whole beside other workers'.
MESSAGE_RESULTS = 5
FIELD_RESULTS = 20


def folded(results: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` results, failures first (what a reader looks for), and how many
    were left out."""
    if len(results) <= limit:
        return results, 0
    ordered = sorted(results, key=lambda r: r["outcome"] == "ok")  # stable: keeps the order
    return ordered[:limit], len(results) - limit


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
            self.write(self.format(record))
        except Exception:
            self.handleError(record)

    def write(self, line: str) -> None:
        """Write one formatted line (the caller holds the handler's lock, as ``emit`` does)."""
        data = (line + "\n").encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(self.fd, data):]


def log_fields(logger: logging.Logger, level: int, message: str, fields: dict[str, Any]) -> None:
    """``logger.log(level, "%s", message, extra={"fields": fields})``, made cheap for the
    router's line per event.

    When nothing but eventop's own :class:`LineHandler` would see the record (what ``python
    -m eventop.router`` sets up: no filter, no other handler on the way), the line is
    formatted and written straight away, byte for byte what the record would have given, with
    no :class:`logging.LogRecord`: making one (caller lookup, thread and process attributes)
    cost as much as formatting the line. Anywhere else (pytest's capture, an application's
    own logging set-up) the record is made and goes through ``logging`` as usual. Nothing is
    built for a level that is off.
    """
    if not logger.isEnabledFor(level):
        return
    handler = _sole_line_handler(logger, level)
    if handler is None:
        logger.log(level, "%s", message, extra={"fields": fields})
        return
    line = handler.formatter.line  # type: ignore[union-attr]  # checked by _sole_line_handler
    handler.acquire()
    try:
        handler.write(line(time.time(), logging.getLevelName(level), logger.name, message,
                           fields))
    except Exception:
        handler.handleError(logger.makeRecord(logger.name, level, "(unknown file)", 0,
                                              "%s", (message,), None,
                                              extra={"fields": fields}))
    finally:
        handler.release()


def _sole_line_handler(logger: logging.Logger, level: int) -> LineHandler | None:
    """The :class:`LineHandler` that alone would handle a record of ``logger`` at ``level``,
    if it is so (no filter on the logger or the handler, no other handler up to where
    propagation stops, a formatter of this module); else None."""
    if logger.filters or logger.disabled:
        return None
    found: LineHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if (found is not None or type(handler) is not LineHandler or handler.filters
                    or level < handler.level
                    or type(handler.formatter) not in (JsonFormatter, TextFormatter)):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


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


class _OneLine(logging.Filter):
    """A captured warning in one line: Python formats it as ``file:line: Category: text``
    followed by the source line that warned, which is noise in a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg).strip()
        record.msg, record.args = text.split("\n", 1)[0], None
        return True


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
    if not any(isinstance(f, _OneLine) for f in captured.filters):
        captured.addFilter(_OneLine())
    captured.propagate = False
    warnings.filterwarnings("once", category=InsecureRequestWarning)
