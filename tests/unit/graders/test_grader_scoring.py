import pytest
from pydantic import ValidationError

from graders.result import GraderResult
from graders.scoring import artifact_matches, exact_match_accuracy, is_correct, parse_formatted_answer


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        pytest.param(" #### 17", "17", id="exact-format"),
        pytest.param(" #### 0", "0", id="zero"),
        pytest.param(" #### 17\nQ: 1+1", "17", id="newline-ends-the-answer"),
        pytest.param("#### 17", None, id="missing-leading-space"),
        pytest.param(" ####17", None, id="missing-inner-space"),
        pytest.param(" ### 17", None, id="three-hashes"),
        pytest.param(" #### 017", None, id="leading-zero"),
        pytest.param(" #### 17 ", None, id="trailing-space"),
        pytest.param(" #### 17#### 17", None, id="run-on-text"),
        pytest.param(" 17", None, id="bare-number"),
        pytest.param("17", None, id="pretraining-format"),
        pytest.param(" #### ", None, id="no-number"),
        pytest.param(" #### -3", None, id="negative"),
        pytest.param(" #### 1<pad>", None, id="special-token-text"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_formatted_answer(completion: str, want: str | None) -> None:
    assert parse_formatted_answer(completion) == want


def test_is_correct_needs_the_right_number_in_the_right_format() -> None:
    assert is_correct(" #### 7", "7")
    assert not is_correct(" #### 8", "7")
    assert not is_correct("7", "7")


def test_exact_match_accuracy_counts_correct_and_formatted() -> None:
    accuracy, correct, formatted = exact_match_accuracy(
        [" #### 3", " #### 5", "4", " #### 10"], ["3", "4", "4", "10"]
    )
    assert (accuracy, correct, formatted) == (0.5, 2, 3)


def test_exact_match_accuracy_refuses_mismatched_or_empty_input() -> None:
    with pytest.raises(ValueError, match="completions"):
        exact_match_accuracy([" #### 1"], ["1", "2"])
    with pytest.raises(ValueError, match="empty"):
        exact_match_accuracy([], [])


CHECKS = [{"key": "k00", "expected": 12}, {"key": "k01", "expected": -5}]


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param({"k00": 12, "k01": -5}, (True, 2), id="right"),
        pytest.param({"k00": 12, "k01": -5, "k99": 1}, (True, 2), id="extra-keys-are-ignored"),
        pytest.param({"k00": 12, "k01": -4}, (False, 1), id="one-wrong-sum"),
        pytest.param({"k00": 12}, (False, 1), id="missing-key"),
        pytest.param({"k00": 12.0, "k01": -5}, (False, 1), id="float-is-not-exact"),
        pytest.param({"k00": "12", "k01": -5}, (False, 1), id="string-is-not-an-integer"),
        pytest.param([12, -5], (False, 0), id="not-an-object"),
    ],
)
def test_artifact_matches(answer: object, want: tuple[bool, int]) -> None:
    assert artifact_matches(answer, CHECKS) == want


def test_artifact_bool_is_not_an_integer() -> None:
    assert artifact_matches({"k": True}, [{"key": "k", "expected": 1}]) == (False, 0)


@pytest.mark.parametrize("interval", [(0.6, 0.4), (-0.1, 0.5), (0.2, 1.5)])
def test_a_result_refuses_an_interval_out_of_order_or_outside_the_unit_range(
    interval: tuple[float, float],
) -> None:
    with pytest.raises(ValidationError, match="interval must be ordered within"):
        GraderResult(score=0.5, n=10, status="ok", grader_version="g/1", interval=interval)
    ok = GraderResult(score=0.5, n=10, status="ok", grader_version="g/1", interval=(0.4, 0.6))
    assert GraderResult.model_validate_json(ok.model_dump_json()).interval == (0.4, 0.6)
