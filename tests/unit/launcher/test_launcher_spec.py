"""The job spec: strict, bounded, and refused with a one-line reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from posttrain_launcher.spec import (
    MAX_INPUTS,
    MAX_SCRIPT_BYTES,
    PARTS_ENV,
    SPEC_ENV,
    JobSpec,
    Limits,
    SpecError,
    host_path,
    input_env_name,
    load_spec,
    parse_spec,
    spec_environment,
)


def spec_dict(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "version": 1,
        "role": "agent",
        "script": "print('hello')",
        "packages": ["numpy==2.3.4"],
        "inputs": {"model": "/inputs/model", "train": "/inputs/datasets/train"},
        "output_dir": "/outputs",
        "limits": {"max_output_bytes": 1073741824, "max_log_bytes": 1048576, "max_open_files": 1024},
    }
    base.update(over)
    return base


def test_the_contract_example_parses() -> None:
    spec = parse_spec(json.dumps(spec_dict()))
    assert spec.role == "agent"
    assert spec.inputs["train"] == "/inputs/datasets/train"
    assert spec.limits == Limits(max_output_bytes=1 << 30, max_log_bytes=1 << 20, max_open_files=1024)


def test_round_trip_through_to_json() -> None:
    spec = JobSpec(role="grader", script="x = 1", output_dir="/results")
    assert parse_spec(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("over", "want"),
    [
        pytest.param({"extra": 1}, "extra", id="unknown top-level field"),
        pytest.param({"limits": {"max_cpu": 1}}, "limits.max_cpu", id="unknown limit"),
        pytest.param({"version": 2}, "version", id="unknown version"),
        pytest.param({"role": "admin"}, "role", id="unknown role"),
        pytest.param({"script": ""}, "script", id="empty script"),
        pytest.param({"script": "x" * (MAX_SCRIPT_BYTES + 1)}, "larger than", id="script over 256 KiB"),
        # 2 bytes per character: under the cap in characters, over it in bytes.
        pytest.param(
            {"script": "é" * (MAX_SCRIPT_BYTES // 2 + 1)}, "larger than", id="script bytes not chars"
        ),
        pytest.param({"packages": ["six"] * 33}, "packages", id="33 packages"),
        pytest.param({"packages": ["a" * 201]}, "packages.0", id="package over 200 chars"),
        pytest.param({"packages": [1]}, "packages.0", id="package not a string"),
        pytest.param({"role": "grader"}, "grader jobs take no packages", id="grader with packages"),
        pytest.param({"inputs": {"Model": "/m"}}, "inputs", id="upper-case input name"),
        pytest.param({"inputs": {"a-b": "/m"}}, "inputs", id="dash in input name"),
        pytest.param({"inputs": {"m": "relative/path"}}, "absolute", id="relative input"),
        pytest.param({"inputs": {"m": "/inputs/../etc"}}, "normalised", id="dot-dot input"),
        pytest.param({"inputs": {"m": "/inputs//m"}}, "normalised", id="double slash"),
        pytest.param({"inputs": {"m": "/outputs/m"}}, "overlaps", id="input inside outputs"),
        pytest.param({"inputs": {"m": "/"}}, "overlaps", id="input contains outputs"),
        pytest.param({"output_dir": "/"}, "must not be '/'", id="output dir is root"),
        pytest.param({"output_dir": "out"}, "absolute", id="relative output dir"),
        pytest.param({"limits": {"max_output_bytes": "1024"}}, "max_output_bytes", id="string for int"),
        pytest.param({"limits": {"max_log_bytes": 10}}, "max_log_bytes", id="log cap too small"),
        pytest.param({"limits": {"max_open_files": 10**6}}, "max_open_files", id="too many open files"),
        pytest.param(
            {"inputs": {f"i{n}": f"/in/{n}" for n in range(MAX_INPUTS + 1)}}, "inputs", id="too many inputs"
        ),
    ],
)
def test_invalid_specs_are_refused_with_the_field_named(over: dict[str, Any], want: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(json.dumps(spec_dict(**over)))
    assert want in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_malformed_spec() -> None:
    with pytest.raises(SpecError, match="POSTTRAIN_JOB_SPEC is not set"):
        load_spec({})
    with pytest.raises(SpecError, match="not valid JSON"):
        load_spec({"POSTTRAIN_JOB_SPEC": "{nope"})
    with pytest.raises(SpecError, match="larger than"):
        parse_spec(json.dumps(spec_dict(script="x" * (2 << 20))))


def test_paths_live_under_posttrain_root() -> None:
    assert host_path("/", "/outputs") == "/outputs"
    assert host_path("/srv/job1", "/inputs/model") == "/srv/job1/inputs/model"
    assert input_env_name("train_2") == "POSTTRAIN_INPUT_TRAIN_2"


def test_a_spec_past_what_one_variable_may_hold_travels_in_parts() -> None:
    script = ("# " + "é" * 60 + "\n") * 2000  # 246 KB of UTF-8; JSON escapes make it more
    spec = JobSpec(role="agent", script=script, inputs={}, output_dir="/outputs")
    env = spec_environment(spec.to_json())
    assert SPEC_ENV not in env and int(env[PARTS_ENV]) == len(env) - 1 > 1
    # Linux refuses to exec with a variable (NAME=value) over 128 KiB.
    assert all(len(f"{name}={value}".encode()) < 128 * 1024 for name, value in env.items())
    assert load_spec(env) == spec
    small = spec_environment(JobSpec(role="agent", script="print(1)", inputs={}, output_dir="/o").to_json())
    assert list(small) == [SPEC_ENV]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"POSTTRAIN_JOB_SPEC_1": None}, "POSTTRAIN_JOB_SPEC_1 is not set"),
        ({PARTS_ENV: "x"}, "is not a part count"),
        ({PARTS_ENV: "0"}, "is not a part count"),
        ({PARTS_ENV: "100000"}, "is not a part count"),
        ({"POSTTRAIN_JOB_SPEC_0": "{"}, "not valid JSON"),
    ],
)
def test_parts_that_do_not_make_a_spec_are_refused(change: dict[str, str | None], error: str) -> None:
    env = spec_environment(JobSpec(role="agent", script="#" * 100_000, inputs={}, output_dir="/o").to_json())
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(SpecError, match=error):
        load_spec(env)
