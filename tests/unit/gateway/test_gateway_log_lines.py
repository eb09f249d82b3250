"""`logging.format: json`: each record one JSON object, an access record with its request's fields."""

from __future__ import annotations

import json
import logging
import sys

from env_gateway.logs import ACCESS_LOGGER, JsonLines, use_json_lines


def _record(name: str, msg: str, args: tuple[object, ...] = (), exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("the broker is gone")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, exc_info)


def test_an_access_line_is_one_object_with_its_request_fields() -> None:
    args = ("10.0.0.7:51234", "POST", "/mcp?session=x", "1.1", 503)
    line = JsonLines().format(_record(ACCESS_LOGGER, '%s - "%s %s HTTP/%s" %d', args))
    assert "\n" not in line
    found = json.loads(line)
    assert found["message"] == '10.0.0.7:51234 - "POST /mcp?session=x HTTP/1.1" 503'
    assert (found["client"], found["method"], found["path"], found["http_version"], found["status"]) == args
    assert (found["level"], found["logger"]) == ("INFO", ACCESS_LOGGER)
    assert found["time"].endswith("+00:00")


def test_an_error_keeps_its_traceback_inside_the_one_line() -> None:
    line = JsonLines().format(_record("env_gateway.gateway", "call failed: %s", ("x",), exc=True))
    assert "\n" not in line
    found = json.loads(line)
    assert found["message"] == "call failed: x"
    assert "ValueError: the broker is gone" in found["exception"] and "client" not in found


def test_use_json_lines_swaps_the_server_loggers_formatters() -> None:
    handler = logging.StreamHandler()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    try:
        use_json_lines()
        assert isinstance(handler.formatter, JsonLines)
    finally:
        logger.removeHandler(handler)
