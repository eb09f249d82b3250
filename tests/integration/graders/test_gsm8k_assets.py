"""`python -m graders.assets publish --task gsm8k` and `mirror --task gsm8k`, run as a lab runs them,
against the emulator's Hub through the real huggingface_hub client: GSM8K republished from an upstream
repo in its published format (parquet under `main/`, here written from the stand-in's data) into the
task's three private split repos, and every repo the task mounts mirrored into a pods store. Both are
idempotent, and a revision that names other content is refused with its name, changing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import HfApi

from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from tests.integration.support import HF_NAMESPACE, HF_TOKEN, REPO, make_emulator

pyarrow = pytest.importorskip("pyarrow")
import pyarrow.parquet as parquet  # noqa: E402
from posttrain_task_gsm8k.standin import build_model, splits  # noqa: E402

UPSTREAM = f"{HF_NAMESPACE}/gsm8k-upstream"
BASE = f"{HF_NAMESPACE}/tiny-qwen3-base"
BASE_REVISION = "main"  # a branch, so it can move (a lab should pin a commit)
DATASETS_TAG = "gsm8k-v1"


@pytest.fixture(scope="module")
def standin_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("base")
    build_model(base, lambda _message: None)
    return base


@pytest.fixture
def hub(standin_base: Path, tmp_path: Path) -> Iterator[tuple[HfEmulator, HfApi, dict[str, str]]]:
    """An emulator holding an upstream GSM8K and a base model, and the settings naming them."""
    emu, data_dir = make_emulator(data_dir=Path(tempfile.mkdtemp(prefix="hf-emulator-")))
    api = HfApi(endpoint=emu.url, token=HF_TOKEN)
    upstream = tmp_path / "upstream"
    (upstream / "main").mkdir(parents=True)
    data = splits()
    for split, records in (("train", data["train"] + data["dev"]), ("test", data["hidden"])):
        parquet.write_table(
            pyarrow.Table.from_pylist(records), upstream / "main" / f"{split}-00000-of-00001.parquet"
        )
    api.create_repo(UPSTREAM, repo_type="dataset")
    api.upload_folder(repo_id=UPSTREAM, repo_type="dataset", folder_path=upstream)
    api.create_repo(BASE)
    api.upload_folder(repo_id=BASE, folder_path=standin_base)
    settings = {
        "POSTTRAIN_TASK_GSM8K_UPSTREAM_DATASET": UPSTREAM,
        "POSTTRAIN_TASK_GSM8K_BASE_MODEL": BASE,
        "POSTTRAIN_TASK_GSM8K_BASE_REVISION": BASE_REVISION,
        "POSTTRAIN_TASK_GSM8K_DATASETS_NAMESPACE": HF_NAMESPACE,
        "POSTTRAIN_TASK_GSM8K_DATASETS_REVISION": DATASETS_TAG,
    }
    yield emu, api, settings
    emu.stop()
    remove_tree(data_dir)


def assets(
    emu: HfEmulator, settings: dict[str, str], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "POSTTRAIN_"))}
    env.update(settings, HF_ENDPOINT=emu.url, HF_TOKEN=HF_TOKEN, HF_HOME=str(tmp_path / "hf-home"))
    return subprocess.run(
        [sys.executable, "-m", "graders.assets", *args, "--json"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600,
    )  # fmt: skip


def _records(api: HfApi, repo_id: str) -> list[dict[str, Any]]:
    path = api.hf_hub_download(repo_id, "data.jsonl", repo_type="dataset", revision=DATASETS_TAG)
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_publish_republishes_the_splits_and_is_idempotent(
    hub: tuple[HfEmulator, HfApi, dict[str, str]], tmp_path: Path
) -> None:
    emu, api, settings = hub
    first = assets(emu, settings, tmp_path, "publish", "--task", "gsm8k")
    assert first.returncode == 0, first.stderr
    published = json.loads(first.stdout)
    names = {f"{HF_NAMESPACE}/gsm8k-{split}" for split in ("train", "dev", "hidden")}
    assert {p["repo_id"] for p in published} == names and {p["revision"] for p in published} == {DATASETS_TAG}
    for repo_id in names:
        assert api.repo_info(repo_id, repo_type="dataset").private, repo_id  # the hidden split above all
    train, dev, hidden = (_records(api, f"{HF_NAMESPACE}/gsm8k-{s}") for s in ("train", "dev", "hidden"))
    data = splits()
    assert hidden == data["hidden"]  # the upstream test set, as it was
    questions = [r["question"] for r in train + dev]
    assert sorted(questions) == sorted(r["question"] for r in data["train"] + data["dev"])
    assert len(set(questions)) == len(questions)  # dev is held out of train
    assert len(dev) == len(data["train"] + data["dev"]) // 2  # half of a train set this small

    again = assets(emu, settings, tmp_path, "publish", "--task", "gsm8k")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == published  # nothing new: the same commits under the same tag


def test_publish_refuses_a_tag_that_names_other_splits_and_uploads_nothing(
    hub: tuple[HfEmulator, HfApi, dict[str, str]], tmp_path: Path
) -> None:
    emu, api, settings = hub
    hidden = f"{HF_NAMESPACE}/gsm8k-hidden"
    api.create_repo(hidden, repo_type="dataset", private=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.jsonl").write_text('{"question": "?", "answer": "#### 1"}\n')
    commit = api.upload_folder(repo_id=hidden, repo_type="dataset", folder_path=other).oid
    api.create_tag(hidden, tag=DATASETS_TAG, repo_type="dataset", revision=commit)

    refused = assets(emu, settings, tmp_path, "publish", "--task", "gsm8k")
    assert refused.returncode == 1
    assert f"dataset {hidden}: tag '{DATASETS_TAG}' already names other files" in refused.stderr
    assert not api.repo_exists(f"{HF_NAMESPACE}/gsm8k-train", repo_type="dataset")  # checked first
    assert api.list_repo_refs(hidden, repo_type="dataset").tags[0].target_commit == commit  # not moved


def test_mirror_fills_the_store_once_and_refuses_a_copy_that_differs(
    hub: tuple[HfEmulator, HfApi, dict[str, str]], tmp_path: Path
) -> None:
    emu, api, settings = hub
    assert assets(emu, settings, tmp_path, "publish", "--task", "gsm8k").returncode == 0
    store = tmp_path / "store"
    first = assets(emu, settings, tmp_path, "mirror", "--task", "gsm8k", "--store", str(store))
    assert first.returncode == 0, first.stderr
    mirrored = json.loads(first.stdout)
    assert [(m["kind"], m["repo_id"], m["revision"], m["downloaded"]) for m in mirrored] == [
        ("model", BASE, BASE_REVISION, True),
        *[("dataset", f"{HF_NAMESPACE}/gsm8k-{s}", DATASETS_TAG, True) for s in ("train", "dev", "hidden")],
    ]
    base = store / "repos" / "model" / BASE / BASE_REVISION
    assert (base / "model.safetensors").is_file() and (base / "tokenizer.json").is_file()
    assert not (base / ".cache").exists()
    assert oct((base / "model.safetensors").stat().st_mode & 0o777) == "0o644"  # jobs' uid reads it

    again = assets(emu, settings, tmp_path, "mirror", "--task", "gsm8k", "--store", str(store))
    assert again.returncode == 0, again.stderr
    assert not any(m["downloaded"] for m in json.loads(again.stdout))

    # The branch moved on the Hub: the copy in the store no longer matches it, and is not replaced.
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "extra.json").write_text("{}")
    api.upload_folder(repo_id=BASE, folder_path=moved)
    before = sorted(p.name for p in base.iterdir())
    refused = assets(emu, settings, tmp_path, "mirror", "--task", "gsm8k", "--store", str(store))
    assert refused.returncode == 1
    assert f"model {BASE}@{BASE_REVISION}: {base} holds other files than the Hub lists" in refused.stderr
    assert sorted(p.name for p in base.iterdir()) == before
