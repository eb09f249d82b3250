"""`gsm8k` played to the end on the HF Jobs emulator, on the stand-in (a tiny Qwen3 with a real BPE
tokenizer and GSM8K-format data, built here): the scripted agent fine-tunes it with trl's SFTTrainer,
checks it with `dev_evaluate` and submits it; the operator's score job grades it over three seeds.
Everything but the repo ids is the real task's."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.hf_emulator import HfEmulator
from graders import tasks
from tests.helpers import Kubectl, kubectl_json
from tests.integration.gateway.support import GatewayServer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import scripted_sft_agent


# Training, a dev evaluation and three seeds of hidden-split grading: minutes on a quiet machine, and
# more than the default 10 on a loaded one (its SFT alone took over 520 s beside other work).
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_scripted_agent_plays_the_stand_in_to_a_seed_mean_reward_with_its_interval(
    kubectl: Kubectl, standin_gateway: GatewayServer, executing_emulator: HfEmulator
) -> None:
    gw = standin_gateway
    result = asyncio.run(
        scripted_sft_agent.run_episode(
            gw.url, gw.orchestrator_token, "gsm8k", say=lambda m: print(m, flush=True)
        )
    )
    print(f"gsm8k stand-in: dev {result.dev_score} hidden {result.reward} {result.reward_interval}")
    assert result.outcome == "Scored" and result.reward is not None, result
    assert result.dev_score is not None

    episode: dict[str, Any] = kubectl_json(kubectl, "-n", gw.namespace, "get", "episode", result.episode)
    status = episode["status"]
    score_job = kubectl_json(kubectl, "-n", gw.namespace, "get", "agentjob", status["scoringJob"])
    graded = score_job["status"]["result"]
    # The reward is the score job's seed mean, and its interval (in status) contains it.
    assert status["reward"] == graded["score"] and status["rewardInterval"] == graded["interval"]
    low, high = (float(status["rewardInterval"][end]) for end in ("low", "high"))
    assert low <= float(status["reward"]) <= high
    assert result.reward_interval == [status["rewardInterval"]["low"], status["rewardInterval"]["high"]]
    assert float(status["reward"]) > 0, "the fine-tuned stand-in answers some hidden questions"
    # A clean episode: its SFT checkpoint descends from the base, and nothing of the hidden split was
    # in its jobs' outputs.
    assert result.integrity == "clean" and status["integrity"]["label"] == "clean", status.get("integrity")
    assert not status["integrity"].get("findings") and not graded.get("findings")

    # The hidden split is mounted into the score job and into no other job (the emulator's records).
    hidden = tasks.get_task("gsm8k").hidden_split.repo_id
    jobs = kubectl_json(kubectl, "-n", gw.namespace, "get", "agentjobs")["items"]
    mounts = {
        job["spec"]["purpose"]: {
            volume["source"] for volume in executing_emulator.job(job["status"]["backendJobId"])["volumes"]
        }
        for job in jobs
        if job["spec"]["episode"] == result.episode
    }
    assert set(mounts) == {"train", "devEval", "score"}, mounts
    assert hidden in mounts["score"]
    assert all(hidden not in sources for purpose, sources in mounts.items() if purpose != "score"), mounts
