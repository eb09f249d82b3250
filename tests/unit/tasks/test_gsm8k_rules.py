"""GSM8K's rules as the task applies them: lm-evaluation-harness's extraction and exact match, the fixed
prompt, and the seed-mean score with its bootstrap interval."""

from __future__ import annotations

import jinja2
import pytest
from posttrain_task_gsm8k import prompt
from posttrain_task_gsm8k.scoring import INVALID, exact_match, flexible_answer, grade, strict_answer
from posttrain_task_gsm8k.statistics import seed_mean_with_interval

# A reference as GSM8K's `answer` field holds it: the worked solution, then the final number.
REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72.\n#### 72"
)


@pytest.mark.parametrize(
    ("completion", "strict", "flexible"),
    [
        ("She sold 24 in May, so 48 + 24 = 72.\n#### 72", "72", "72"),
        ("#### 72.\nThat is all.", "72.", "72."),  # the trailing dot goes at the match
        ("The total is 1,072 dollars.\n#### $1,072", INVALID, "$1,072"),  # strict wants a digit after ####
        ("#### -3 and later 5", "-3", "5"),  # strict takes the first; flexible the last number
        ("no number at all", INVALID, INVALID),
    ],
)
def test_answers_are_extracted_as_the_harness_does(completion: str, strict: str, flexible: str) -> None:
    assert (strict_answer(completion), flexible_answer(completion)) == (strict, flexible)


def test_exact_match_ignores_commas_dollars_a_trailing_dot_and_the_worked_solution() -> None:
    assert exact_match("72", REFERENCE)
    assert exact_match("72.", REFERENCE) and exact_match("$72", REFERENCE)
    assert exact_match("1,072", "Work...\n#### 1072")
    assert not exact_match("72.0", REFERENCE)  # numbers are compared as text, as the harness does
    assert not exact_match(INVALID, "#### [invalid]")  # nothing extracted never matches


def test_a_completion_is_graded_both_ways_and_strict_is_the_answer_shown() -> None:
    graded = grade("Half of 48 is 24; 48 + 24 = 72.\n#### 72", REFERENCE)
    assert (graded.strict, graded.flexible, graded.answer) == (True, True, "72")
    loose = grade("So the answer is 72", REFERENCE)
    assert (loose.strict, loose.flexible, loose.answer) == (False, True, "72")


def test_the_prompt_is_the_chat_template_rendered_and_stops_where_a_turn_ends() -> None:
    question = "Natalia sold clips to 48 of her friends in April... How many did she sell?"
    template = jinja2.Environment().from_string(prompt.CHAT_TEMPLATE)
    rendered = template.render(
        messages=[{"role": "user", "content": prompt.user_message(question)}], add_generation_prompt=True
    )
    assert prompt.render(question) == rendered
    assert rendered.endswith("<|im_start|>assistant\n") and question in rendered
    assert prompt.cut_at_stop("#### 72<|im_end|><|im_start|>user") == "#### 72"
    assert prompt.cut_at_stop("#### 72\n\nQuestion: and now?") == "#### 72"
    assert prompt.cut_at_stop("#### 72") == "#### 72"


def test_the_score_is_the_seed_mean_and_its_interval_is_reproducible_and_contains_it() -> None:
    by_seed = [[q % 3 != 0 for q in range(300)], [q % 4 != 0 for q in range(300)]]
    score = seed_mean_with_interval(by_seed)
    assert score.per_seed == (200 / 300, 225 / 300)
    assert score.mean == pytest.approx((200 + 225) / 600)
    assert score.low < score.mean < score.high and score.high - score.low < 0.12
    assert seed_mean_with_interval(by_seed) == score  # its own seeded generator: the same interval


def test_a_perfect_or_an_empty_record_is_handled_and_a_ragged_one_refused() -> None:
    perfect = seed_mean_with_interval([[True] * 50] * 3)
    assert (perfect.mean, perfect.low, perfect.high) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="the same questions"):
        seed_mean_with_interval([[True, False], [True]])
    with pytest.raises(ValueError, match="no seed or no question"):
        seed_mean_with_interval([])
