"""Fixtures: an emulator per test, and the real huggingface_hub 2.4 client pointed at it.

No Kubernetes here. The client reads HF_HOME and the telemetry switch at import, so both are set
before `huggingface_hub` is imported; HF_HUB_OFFLINE would make every request fail, even to the
emulator (docs/hf-jobs-api.md, "The client").
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
if "HF_HOME" not in os.environ:
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hf-home-")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], True)
os.environ.pop("HF_HUB_OFFLINE", None)

import httpx2
import pytest
from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.utils import _http

from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree

CLIENT_TIMEOUT = 10.0


def install_client_timeout(seconds: float) -> None:
    """The client has no HTTP timeout by default (docs/hf-jobs-api.md, "The client"): install one."""
    set_client_factory(
        lambda: httpx2.Client(
            event_hooks={"request": [_http.hf_request_event_hook]},
            follow_redirects=True,
            timeout=httpx2.Timeout(seconds),
        )
    )


@pytest.fixture(autouse=True)
def _client_timeout() -> Iterator[None]:
    previous = _http._GLOBAL_CLIENT_FACTORY
    install_client_timeout(CLIENT_TIMEOUT)
    yield
    set_client_factory(previous)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not tmp_path: pytest's base temp dir is 0700, and the launcher (uid 10000) must traverse into
    # the job trees. The system temp dir is world-traversable.
    path = Path(tempfile.mkdtemp(prefix="hf-emulator-"))
    path.chmod(0o711)
    yield path
    remove_tree(path)


@pytest.fixture(scope="session")
def job_python() -> Iterator[str]:
    """An interpreter uid 10000 can run: as root, the launcher drops to that uid and execs the job
    with its own interpreter; `job_interpreter` builds one if this one is not."""
    from posttrain_launcher.host import job_interpreter

    workdir = Path(tempfile.mkdtemp(prefix="hf-emulator-python-"))
    workdir.chmod(0o755)
    try:
        yield job_interpreter(str(workdir))
    finally:
        remove_tree(workdir)


@pytest.fixture
def make_emulator(data_dir: Path) -> Iterator[Callable[..., HfEmulator]]:
    started: list[HfEmulator] = []

    def make(**kwargs: object) -> HfEmulator:
        emulator = HfEmulator(data_dir / f"emu{len(started)}", **kwargs)  # type: ignore[arg-type]
        started.append(emulator.start())
        return emulator

    yield make
    for emulator in started:
        emulator.stop()


@pytest.fixture
def emulator(make_emulator: Callable[..., HfEmulator]) -> HfEmulator:
    return make_emulator()


@pytest.fixture
def api(emulator: HfEmulator) -> HfApi:
    return HfApi(endpoint=emulator.url, token=emulator.token)
