"""One JSON object per log line, for clusters whose log pipeline parses JSON (`logging.format: json`).

Every record becomes `{"time", "level", "logger", "message"}`, plus `exception` when it carries one;
an access record of uvicorn's also gets its request's fields (`client`, `method`, `path`,
`http_version`, `status`), so a pipeline can count statuses without parsing the line.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

ACCESS_LOGGER = "uvicorn.access"
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", ACCESS_LOGGER)


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.name == ACCESS_LOGGER and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, http_version, status = record.args
            line |= {"client": client, "method": method, "path": path, "http_version": http_version}
            line["status"] = status
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def use_json_lines() -> None:
    """Every handler uvicorn configured (and the root logger's) writes JSON lines from now on."""
    formatter = JsonLines()
    for name in (None, *SERVER_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(formatter)
