"""The server's logging: uvicorn's own configuration plus one filter on every handler, so that
no log line ever holds a credential or a raw control character (DESIGN §4).

* A query string is never logged: it is where a client that misplaces a key puts it
  (``?api_key=…``, ``?token=…``) — the request is refused, but uvicorn's access line would still
  print it. The path keeps ``?[redacted]`` so the line still shows that there was one.
* Anything shaped like one of our keys (``ito_req_AbCdEfGh_<secret>``) keeps its public prefix
  and loses its secret; a ``Bearer <token>`` loses the token. Request headers are never logged.
* A path is logged percent-decoded, so what is redacted is what the server read.
* Control characters (newlines included: one record, one line) and bidi overrides are written
  as visible escapes, so a hostile path cannot forge or hide log lines.

Our own ``ito.*`` loggers write through the same handler as uvicorn's at INFO.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any
from urllib.parse import unquote

from ito.core.text import escape_unsafe

__all__ = ["RedactFilter", "log_config", "redact"]

_KEY = re.compile(r"(ito_[A-Za-z]{3}_[A-Za-z0-9]{8})_[A-Za-z0-9_\-]+")
_BEARER = re.compile(r"(?i)(bearer\s+)\S+")
_QUERY = re.compile(r"\?[^\s\"]*")


def redact(text: str, *, is_path: bool = False) -> str:
    """``text`` fit for a log line: no query string (paths), no key secret, no bearer token,
    no raw control character."""
    if is_path:
        # Redacted as the server reads it: a key percent-encoded in the path
        # (``ito%5Freq%5F…``) is a key all the same.
        text = unquote(_QUERY.sub("?[redacted]", text, count=1))
    text = _KEY.sub(r"\1_[redacted]", text)
    text = _BEARER.sub(r"\1[redacted]", text)
    safe: str = escape_unsafe(text, multiline=False)
    return safe


class RedactFilter(logging.Filter):
    """Rewrites each record in place (it never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.name == "uvicorn.access"
            and isinstance(record.args, tuple)
            and len(record.args) == 5
        ):
            # (client_addr, method, full_path, http_version, status_code): the access formatter
            # unpacks exactly these.
            client, method, path, version, status = record.args
            record.args = (
                redact(str(client)),
                redact(str(method)),
                redact(str(path), is_path=True),
                redact(str(version)),
                status,
            )
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with :class:`RedactFilter` on every handler and
    the ``ito`` loggers routed to the same output."""
    import uvicorn.config

    config: dict[str, Any] = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": RedactFilter}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["loggers"]["ito"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config
