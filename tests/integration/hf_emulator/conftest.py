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

import pytest
from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.utils import _http

from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from tests.integration.hf_emulator.support import CLIENT_TIMEOUT, install_client_timeout


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
