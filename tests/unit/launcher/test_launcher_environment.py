"""The job's environment: credential-like variables never pass; the job's own are set."""

from __future__ import annotations

import pytest
from posttrain_launcher.environment import is_secret_name, job_environment, scrub
from posttrain_launcher.spec import JobSpec


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "hf_token",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "GITHUB_TOKEN",
        "OPENAI_API_KEY",
        "api_key",
        "MY_APIKEY",
        "DB_PASSWORD",
        "MYSQL_PWD",
        "PGPASSFILE",
        "GPG_PASSPHRASE",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_CLIENT_ID",
        "SSH_AUTH_SOCK",
        "DOCKER_CONFIG",
        "KUBERNETES_SERVICE_HOST",
        "PIP_INDEX_URL",
        "Client_Secret",
        "POSTTRAIN_JOB_SPEC",
        "POSTTRAIN_ROOT",
        "SESSION_COOKIE",
        "NETRC",
    ],
)
def test_credential_like_names_are_dropped(name: str) -> None:
    assert is_secret_name(name)
    assert scrub({name: "v"}) == {}


@pytest.mark.parametrize(
    "name", ["PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "PWD", "CUDA_VISIBLE_DEVICES"]
)
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret_name(name)
    assert scrub({name: "v"}) == {name: "v"}


def test_values_with_url_credentials_are_dropped_whatever_the_name() -> None:
    env = {"DATABASE_URL": "postgres://user:pw@db/x", "MIRROR": "https://host/simple", "X": "a@b.c"}
    assert scrub(env) == {"MIRROR": "https://host/simple", "X": "a@b.c"}


def test_job_environment() -> None:
    spec = JobSpec(role="agent", script="x", inputs={"model": "/inputs/model"}, output_dir="/outputs")
    launcher_env = {
        "PATH": "/usr/bin",
        "HF_TOKEN": "hf_x",
        "PYTHONPATH": "/opt/posttrain",
        "POSTTRAIN_JOB_SPEC": "{}",
        "HOME": "/root",
    }
    env = job_environment(
        launcher_env,
        spec,
        inputs={"model": "/r/inputs/model"},
        output_dir="/r/outputs",
        private="/s",
        package_dir="/s/packages",
    )
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/s/home",
        "TMPDIR": "/s/tmp",
        "XDG_CACHE_HOME": "/s/home/.cache",
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "POSTTRAIN_ROLE": "agent",
        "POSTTRAIN_OUTPUT_DIR": "/r/outputs",
        "POSTTRAIN_NETWORK": "unix",
        "POSTTRAIN_INPUT_MODEL": "/r/inputs/model",
        # The agent's packages first, then what the image puts on the path (graders).
        "PYTHONPATH": "/s/packages:/opt/posttrain",
    }


def test_a_loopback_job_is_told_so_and_its_collectives_use_lo() -> None:
    spec = JobSpec(role="agent", script="x", output_dir="/o", network="loopback")
    inherited = {"GLOO_SOCKET_IFNAME": "eth0"}
    env = job_environment(inherited, spec, inputs={}, output_dir="/o", private="/s", package_dir=None)
    told = (env["POSTTRAIN_NETWORK"], env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"])
    assert told == ("loopback", "lo", "lo")


def test_no_pythonpath_without_packages_or_inherited_path() -> None:
    spec = JobSpec(role="grader", script="x", output_dir="/o")
    env = job_environment({}, spec, inputs={}, output_dir="/o", private="/s", package_dir=None)
    assert "PYTHONPATH" not in env
