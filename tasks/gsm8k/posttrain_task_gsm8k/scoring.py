"""GSM8K's answer extraction and exact match, as lm-evaluation-harness's `gsm8k` task defines them.

- strict-match (the reported score): the first `#### <number>` of the completion;
- flexible-extract (reported beside it): the last number-like span of the completion;
- exact match against the reference's `#### <number>`, after removing from both: commas, `$`,
  everything up to `#### `, and one trailing `.`; case-insensitive.
A completion with nothing to extract scores 0 (its answer is "[invalid]").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INVALID = "[invalid]"
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = tuple(re.compile(pattern) for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"))


def strict_answer(completion: str) -> str:
    found = STRICT.search(completion)
    return found.group(1).strip() if found else INVALID


def flexible_answer(completion: str) -> str:
    found = FLEXIBLE.findall(completion)
    if not found:
        return INVALID
    groups = [group for group in found[-1] if group]
    return groups[0].strip() if groups else INVALID


def normalized(text: str) -> str:
    for pattern in IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def exact_match(answer: str, reference: str) -> bool:
    return answer != INVALID and normalized(answer) == normalized(reference)


@dataclass(frozen=True)
class Graded:
    strict: bool
    flexible: bool
    answer: str  # the strict answer, or the flexible one where strict found none


def grade(completion: str, reference: str) -> Graded:
    strict, flexible = strict_answer(completion), flexible_answer(completion)
    return Graded(
        strict=exact_match(strict, reference),
        flexible=exact_match(flexible, reference),
        answer=strict if strict != INVALID else flexible,
    )
