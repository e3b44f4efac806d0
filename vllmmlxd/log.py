"""Logfmt logging: one line per event, a stable event name plus fields.

Use ``log_event(logger, "worker.ready", model="llama", port=8001)``. Under journald
(``JOURNAL_STREAM`` set) lines carry a ``<N>`` priority prefix and no timestamp,
since journald stamps them itself.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


# Control characters never reach the log raw: a value with a newline or an escape sequence
# (from a client's request id, a model's name, an exception) must not forge or repaint lines.
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    if c.isprintable():
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"  # C0/C1 controls, U+2028...


def format_value(value: Any) -> str:
    """Render one logfmt value, quoted (and escaped) when it holds spaces, quotes, '=' or control characters."""
    text = str(value)
    if text == "" or any(c in ' "=' or not c.isprintable() for c in text):
        text = '"' + "".join(_escape(c) for c in text) + '"'
    return text


def event_name(record: logging.LogRecord) -> str:
    """A record's event: the one it was logged with, else its logger's name.

    uvicorn says everything through a logger named ``uvicorn.error``; its routine lines
    (started, shutting down) are not errors, so below WARNING they are ``server``.
    """
    event = getattr(record, "event", None)
    if event:
        return event
    if record.name == "uvicorn.error" and record.levelno < logging.WARNING:
        return "server"
    return record.name


def format_fields(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in fields.items() if v is not None)


def event_line(event: str, level: str = "info", **fields: Any) -> str:
    """One logfmt line formatted as :class:`LogfmtFormatter` would, for lines kept or forwarded by hand."""
    record = logging.LogRecord("vllmmlxd", logging.getLevelName(level.upper()), "", 0, event, None, None)
    record.event, record.fields = event, fields
    return LogfmtFormatter(journald=under_journald()).format(record)


class LogfmtFormatter(logging.Formatter):
    """Formats records as ``ts=... level=... event=... k=v``."""

    def __init__(self, *, journald: bool = False, static: dict[str, Any] | None = None):
        super().__init__()
        self.journald = journald
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if not self.journald:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
            fields["ts"] = f"{stamp}.{int(record.msecs):03d}"
        fields["level"] = record.levelname.lower()
        event = getattr(record, "event", None)
        fields["event"] = event_name(record)
        fields.update(self.static)
        fields.update(getattr(record, "fields", {}) or {})
        if not event:
            fields["msg"] = record.getMessage()
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info).splitlines()[-1]
        line = format_fields(fields)
        if self.journald:
            line = f"<{_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log one event with fields, formatted as logfmt by :class:`LogfmtFormatter` (positional
    ``level``: every keyword is a field)."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "fields": fields})


def under_journald() -> bool:
    return bool(os.environ.get("JOURNAL_STREAM"))


def setup_logging(level: str = "info", **static: Any) -> None:
    """Send all logging to stderr as logfmt; ``static`` fields go on every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(journald=under_journald(), static=static))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own loggers speak in prose; route them through ours, access log off.
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
        lg.setLevel(max(root.level, logging.WARNING))  # its start/stop prose repeats our own events
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check is noise
    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # config.changed says it better
