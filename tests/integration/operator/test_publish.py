"""`python -m graders.assets publish` puts the tasks' repos on a Hub through the real huggingface_hub
client (here the emulator's repo API), and an operator configured with that namespace and revision
mounts exactly those repos into an episode that reaches its reward."""

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
from posttrain_launcher.host import job_interpreter

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from graders.assets import referenced_repos
from tests.helpers import Kubectl
from tests.integration.operator.test_full_episode import ARTIFACT_SCRIPT
from tests.integration.support import (
    HF_NAMESPACE,
    HF_TOKEN,
    REPO,
    agentjob_manifest,
    apply,
    episode_manifest,
    make_emulator,
    running_operator,
    wait_phase,
)

REVISION = "v1"


@pytest.fixture
def empty_hub() -> Iterator[HfEmulator]:
    """An emulator that runs jobs for real and holds no repo: only what gets published."""
    data_dir = Path(tempfile.mkdtemp(prefix="hf-emulator-"))
    data_dir.chmod(0o711)
    (data_dir / "interpreter").mkdir(mode=0o755)
    emu, _ = make_emulator(data_dir=data_dir, interpreter=job_interpreter(str(data_dir / "interpreter")))
    yield emu
    emu.stop()
    remove_tree(data_dir)


def publish(hub: HfEmulator, tmp_path: Path, revision: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "POSTTRAIN_"))}
    env.update(HF_ENDPOINT=hub.url, HF_TOKEN=HF_TOKEN, HF_HOME=str(tmp_path / "hf-home"))
    return subprocess.run(
        [sys.executable, "-m", "graders.assets", "publish", "--namespace", HF_NAMESPACE,
         "--revision", revision, "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_published_repos_are_what_an_episode_mounts_and_it_reaches_its_reward(
    cluster: devcluster.ClusterState,
    crds: None,
    kubectl: Kubectl,
    namespace: str,
    empty_hub: HfEmulator,
    tmp_path: Path,
) -> None:
    first = publish(empty_hub, tmp_path, REVISION)
    assert first.returncode == 0, first.stderr
    published: list[dict[str, Any]] = json.loads(first.stdout)
    names = {ref.repo_id.split("/", 1)[1] for ref in referenced_repos()}
    assert {p["repo_id"] for p in published} == {f"{HF_NAMESPACE}/{name}" for name in names}
    api = HfApi(endpoint=empty_hub.url, token=HF_TOKEN)
    for repo in published:
        info = api.repo_info(repo["repo_id"], repo_type=repo["kind"], revision=REVISION)
        assert info.private, repo  # a hidden split must never be public
        assert info.sha == repo["commit"]

    # Publishing again changes nothing: the same commits under the same tag.
    again = publish(empty_hub, tmp_path, REVISION)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == published

    def published_commit(repo_id: str) -> str:
        return next(str(p["commit"]) for p in published if p["repo_id"] == repo_id)

    # A tag that names other content is refused, not moved.
    records = f"{HF_NAMESPACE}/t0-artifact-records"
    other = api.upload_file(
        path_or_fileobj=b"x", path_in_repo="extra.txt", repo_id=records, repo_type="dataset"
    )
    api.create_tag(records, tag="v2", repo_type="dataset", revision=other.oid)
    refused = publish(empty_hub, tmp_path, "v2")
    assert refused.returncode == 1
    assert f"dataset {records}: tag 'v2' already names other files" in refused.stderr, refused.stderr
    refs = api.list_repo_refs(records, repo_type="dataset")
    tags = {t.name: t.target_commit for t in refs.tags}
    assert tags == {REVISION: published_commit(records), "v2": other.oid}
    assert [b.target_commit for b in refs.branches] == [other.oid]  # nothing uploaded before the refusal
    for repo in (p for p in published if p["repo_id"] != records):  # nor any other repo tagged
        tags = api.list_repo_refs(repo["repo_id"], repo_type=repo["kind"]).tags
        assert [t.name for t in tags] == [REVISION], repo

    # The operator, told where the repos are, mounts the published ones: the episode scores 1.
    where = {"POSTTRAIN_TASK_ASSETS_NAMESPACE": HF_NAMESPACE, "POSTTRAIN_TASK_ASSETS_REVISION": REVISION}
    with running_operator(cluster, empty_hub, tmp_path, namespace, **where):
        apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
        wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
        apply(
            kubectl, namespace, agentjob_manifest("answer", "ep1", script=ARTIFACT_SCRIPT, timeoutSeconds=300)
        )
        job = wait_phase(
            kubectl, namespace, "agentjob", "answer", {"Succeeded", "Failed", "Rejected"}, timeout=120
        )
        assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"])[:2000]
        patch = json.dumps({"spec": {"submission": {"checkpointFrom": "answer"}}})
        kubectl("-n", namespace, "patch", "episode", "ep1", "--type=merge", "-p", patch)
        episode = wait_phase(kubectl, namespace, "episode", "ep1", {"Completed", "Failed"}, timeout=180)
    assert episode["status"]["reward"] == "1", json.dumps(episode["status"])[:2000]
    mounted = {
        (v["source"], v.get("revision"))
        for j in empty_hub.jobs()
        for v in j.get("volumes") or []
        if v["type"] in ("model", "dataset")
    }
    assert mounted == {
        (records, REVISION),
        (f"{HF_NAMESPACE}/t0-artifact-hidden-checks", REVISION),
    }, mounted
