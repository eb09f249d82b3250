"""Pure scoring rules (no torch): what counts as a correct answer."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# The exact answer line: a space, four '#', a space, a non-negative integer without leading zeros.
_ANSWER_LINE = re.compile(r" #### (0|[1-9][0-9]*)")


def answer_line(completion: str) -> str:
    """The part of a generated completion that is graded: everything before the first newline."""
    return completion.split("\n", 1)[0]


def parse_formatted_answer(completion: str) -> str | None:
    """The integer in an exactly formatted answer line, or None when the format is wrong."""
    match = _ANSWER_LINE.fullmatch(answer_line(completion))
    return match.group(1) if match else None


def is_correct(completion: str, expected: str) -> bool:
    return parse_formatted_answer(completion) == expected


def exact_match_accuracy(completions: Sequence[str], expected: Sequence[str]) -> tuple[float, int, int]:
    """(accuracy, correct, well_formatted) over paired completions and expected answers."""
    if len(completions) != len(expected):
        raise ValueError(f"{len(completions)} completions for {len(expected)} expected answers")
    if not expected:
        raise ValueError("cannot score an empty split")
    correct = sum(is_correct(c, e) for c, e in zip(completions, expected, strict=True))
    formatted = sum(parse_formatted_answer(c) is not None for c in completions)
    return correct / len(expected), correct, formatted


def artifact_matches(answer: Any, checks: Sequence[Mapping[str, Any]]) -> tuple[bool, int]:
    """Whether the artifact holds every checked key with its exact integer; and how many keys matched.

    JSON booleans are not integers here, nor are floats such as 12.0: the artifact must be exact.
    """
    if not isinstance(answer, dict):
        return False, 0
    matched = 0
    for check in checks:
        value = answer.get(check["key"])
        if type(value) is int and value == check["expected"]:
            matched += 1
    return matched == len(checks), matched
