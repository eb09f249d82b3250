"""The one JSON boundary of every gateway surface (HTTP `/mcp`, the MCP SDK session, `/ws`).

In: text is strict UTF-8, nesting is bounded, numbers are finite and of bounded length, and no
string carries a lone surrogate (valid JSON escapes, but no Unicode text: such a string could never
be sent back). JSON-RPC ids are strings, integers or null. Out: every reply encodes, whatever it
carries (a tool result may hold text the gateway did not write, such as job logs).
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

log = logging.getLogger(__name__)

MAX_DEPTH = 32  # nested objects/arrays; the deepest legitimate message is under 10
# JSON values in one message (a legitimate one has under 200): parsing builds one Python object per
# value while holding the event loop, so 1 MiB of `[],[],...` must be refused before it is parsed.
MAX_VALUES = 10_000
MAX_ID_CHARS = 256

# WebSocket close codes (RFC 6455 section 7.4.1).
WS_NORMAL = 1000
WS_UNSUPPORTED_DATA = 1003  # a binary frame where JSON text is expected
WS_INVALID_DATA = 1007  # text that is not valid Unicode
WS_POLICY = 1008  # beyond a limit: depth, number size; or a refused handshake
WS_TOO_BIG = 1009
WS_INTERNAL_ERROR = 1011

RequestId = str | int | None

# What `_check_tree` looks into, as a tuple: `isinstance` with one is several times cheaper than with a
# `str | dict | list` union, which would also be built anew at every test.
_CHECKED = (str, dict, list)
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


class DecodeError(Exception):
    """Input that is not acceptable JSON. `close_code` is how a websocket ends over it; None means a
    plain syntax error, answered like OpenEnv does (an error reply, the connection stays)."""

    def __init__(self, message: str, close_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.close_code = close_code


class InvalidRequest(Exception):
    """Valid JSON that is not a JSON-RPC request this gateway takes (JSON-RPC -32600)."""


def decode_json(data: bytes | str) -> Any:
    """Parse one message. Raises DecodeError; never RecursionError, UnicodeError or a bare ValueError."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")  # strict: refuses encoded surrogates and overlong forms
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8 text (bad byte at offset {exc.start})", WS_INVALID_DATA) from None
    else:
        text = data
    if _too_many_values(text):
        raise DecodeError(f"more than {MAX_VALUES} values", WS_POLICY)
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise DecodeError(f"nested deeper than {MAX_DEPTH} levels", WS_POLICY) from None
    except json.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    except ValueError:  # an integer beyond the interpreter's digit limit
        raise DecodeError("a number is too long", WS_POLICY) from None
    _check_tree(value)
    return value


def _too_many_values(text: str) -> bool:
    """An upper bound of the values (every value but a container's first follows a `,` or a `:`),
    counted in C: first over the whole text, then, only if that is over the limit, outside strings."""
    if _separators(text) <= MAX_VALUES:
        return False
    return _separators(_STRING.sub('""', text)) > MAX_VALUES


def _separators(text: str) -> int:
    return text.count(",") + text.count(":") + text.count("[") + text.count("{")


def _refuse_constant(name: str) -> Any:
    raise DecodeError(f"not JSON: {name} is not a JSON value")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise DecodeError("a number is out of range", WS_POLICY)
    return value


def _check_tree(value: Any) -> None:
    """Depth and text checks without recursion (the parsed tree may be ~1,000 levels deep)."""
    stack: list[tuple[Any, int]] = [(value, 0)] if isinstance(value, _CHECKED) else []
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if depth >= MAX_DEPTH:
            raise DecodeError(f"nested deeper than {MAX_DEPTH} levels", WS_POLICY)
        if isinstance(item, dict):
            for key, inner in item.items():
                _check_text(key)
                if isinstance(inner, _CHECKED):
                    stack.append((inner, depth + 1))
        else:
            stack.extend((inner, depth + 1) for inner in item if isinstance(inner, _CHECKED))


def _check_text(text: str) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise DecodeError("a string holds a lone surrogate, which is not Unicode text", WS_INVALID_DATA)


def request_id(message: Any) -> RequestId:
    """The id of one JSON-RPC message: a string, an integer or null (also when absent). A batch, a
    non-object, or an id of another type (float, bool, object, array) is an InvalidRequest."""
    if isinstance(message, list):
        raise InvalidRequest("batches are not supported: send one request per message")
    if not isinstance(message, dict):
        raise InvalidRequest("a JSON-RPC 2.0 request object is required")
    rid = message.get("id")
    if rid is None:
        return None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        raise InvalidRequest(f"id must be a string, an integer or null, not {_json_type(rid)}")
    if len(str(rid)) > MAX_ID_CHARS:
        raise InvalidRequest(f"id longer than {MAX_ID_CHARS} characters")
    return rid


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a non-integer number"
    return "an object" if isinstance(value, dict) else "an array"


_UNENCODABLE = (UnicodeEncodeError, ValueError, TypeError, RecursionError)


def encode_json(value: Any) -> bytes:
    """UTF-8 JSON that is always produced. Data that cannot be sent as it is (a lone surrogate, a
    non-finite number, a foreign type) is replaced, and logged: it means a reply carried it."""
    try:
        return _dumps(value).encode("utf-8")
    except _UNENCODABLE:
        log.warning("a reply carried data JSON cannot carry; sending a cleaned copy")
        return _dumps(encodable(value)).encode("utf-8")


def encode_text(value: Any) -> str:
    return encode_json(value).decode("utf-8")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encodable(value: Any, _depth: int = 0) -> Any:
    """A copy of `value` that JSON can carry: lone surrogates become U+FFFD, non-finite numbers null,
    other types their text, anything nested beyond 4 x MAX_DEPTH null."""
    if _depth > 4 * MAX_DEPTH:
        return None
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {encodable(str(k), _depth): encodable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v, _depth + 1) for v in value]
    return encodable(str(value), _depth)


def sanitized(value: Any) -> Any:
    """`value` itself when it encodes as it is (the usual case), else its `encodable` copy."""
    try:
        _dumps(value).encode("utf-8")
    except _UNENCODABLE:
        log.warning("a reply carried data JSON cannot carry; sending a cleaned copy")
        return encodable(value)
    return value
