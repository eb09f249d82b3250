"""The gateway's JSON boundary: what it refuses (and how a websocket ends over it), which JSON-RPC ids
it takes, and that every reply encodes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from env_gateway.codec import (
    MAX_DEPTH,
    MAX_VALUES,
    DecodeError,
    InvalidRequest,
    decode_json,
    encode_json,
    encode_text,
    request_id,
    sanitized,
)


@pytest.mark.parametrize(
    ("data", "close_code"),
    [
        (b"[" * 10_000 + b"]" * 10_000, 1008),
        (b"[" * 1000 + b"]" * 1000, 1008),  # parses, then refused by depth
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), 1008),
        (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), 1008),
        (("[" + ",".join(["[]"] * 300_000) + "]").encode(), 1008),
        (b'{"id":"\\ud800"}', 1007),
        (b'{"\\udfff":1}', 1007),
        (b'["ok","\\udc00\\ud800"]', 1007),
        (b'{"id":"\xed\xa0\x80"}', 1007),
        (b"\xff", 1007),
        (b'"\xc0\x80"', 1007),
        (b"1e400", 1008),
        (b"[-1e999]", 1008),
        (b"9" * 5000, 1008),
        (b"NaN", None),
        (b'{"a":Infinity}', None),
        (b"", None),
        (b"{", None),
        (b'{"a":1,}', None),
        (b"\xef\xbb\xbf{}", None),
    ],
    ids=[
        "10000-deep", "1000-deep", "one-too-deep", "one-too-deep-objects", "too-many-values",
        "lone-high-surrogate", "lone-low-surrogate-key", "reversed-pair", "encoded-surrogate-bytes",
        "stray-byte", "overlong", "float-overflow", "negative-overflow", "5000-digits", "nan",
        "infinity", "empty", "truncated", "trailing-comma", "bom",
    ],
)  # fmt: skip
def test_decode_refuses_with_a_decode_error_and_a_close_code(data: bytes, close_code: int | None) -> None:
    with pytest.raises(DecodeError) as refused:
        decode_json(data)
    assert refused.value.close_code == close_code
    with pytest.raises(DecodeError):
        decode_json(data.decode("utf-8", "surrogateescape"))  # the same as text, as a websocket frame


def test_decode_takes_what_legitimate_clients_send() -> None:
    assert decode_json(b'{"id":"\\ud83e\\udd80"}') == {"id": "\N{CRAB}"}  # a pair is one character
    assert decode_json("\N{CRAB}".join('""').encode()) == "\N{CRAB}"
    assert decode_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert decode_json(b"18446744073709551616") == 2**64
    assert decode_json(b"1e-400") == 0.0 and decode_json(b"-0.0") == 0.0
    # A 256 KiB script full of separators is one string value, however many commas it holds.
    script = "x = [1, 2, {3: 4}]\n" * 13_000
    assert decode_json(json.dumps({"script": script, "packages": ["a"] * 32})) == {
        "script": script, "packages": ["a"] * 32,
    }  # fmt: skip
    assert decode_json("[" + ",".join(["1"] * (MAX_VALUES // 2)) + "]") == [1] * (MAX_VALUES // 2)


@pytest.mark.parametrize("rid", [None, 0, -1, 2**64, "1", "\N{CRAB}", "x" * 256])
def test_request_ids_are_strings_integers_or_null(rid: Any) -> None:
    assert request_id({"jsonrpc": "2.0", "id": rid, "method": "ping"}) == rid


def test_an_absent_id_is_null() -> None:
    assert request_id({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None


@pytest.mark.parametrize(
    "message",
    [{"id": 1.5}, {"id": 1.0}, {"id": True}, {"id": [1]}, {"id": {"a": 1}}, {"id": "x" * 257},
     {"id": 10**300}, [], [{"id": 1}], "ping", 7],
    ids=["fraction", "float", "bool", "array", "object", "long-string", "long-number", "empty-batch",
         "batch", "string", "number"],
)  # fmt: skip
def test_any_other_id_or_message_is_an_invalid_request(message: Any) -> None:
    with pytest.raises(InvalidRequest):
        request_id(message)


def test_every_reply_encodes_and_clean_ones_are_untouched() -> None:
    clean = {"a": ["\N{CRAB}", 1, 2.5, None, True], "b": {"c": "d"}}
    assert json.loads(encode_json(clean)) == clean
    assert sanitized(clean) is clean
    dirty = {"log": "bad \ud800 byte", "reward": float("nan"), "when": object(), 7: (1, 2)}
    text = encode_text(dirty)
    text.encode("utf-8")  # a lone surrogate would raise here
    assert json.loads(text)["log"] == "bad \ufffd byte" and json.loads(text)["reward"] is None
    assert json.loads(text)["7"] == [1, 2]
    assert sanitized(dirty)["log"] == "bad \ufffd byte"
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    json.loads(encode_text({"deep": deep}))  # too deep for json.dumps: cut, not a RecursionError
