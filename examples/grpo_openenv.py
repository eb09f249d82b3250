"""TRL's GRPOTrainer on posttrain-operator episodes, through TRL's OpenEnv integration.

`GRPOTrainer(environment_factory=...)` makes one `PostTrainEnvironment` per rollout:
- `reset()` starts an episode over the gateway's OpenEnv `/ws` (the orchestrator's side) and returns
  the task's brief, which TRL appends to the prompt;
- its public methods are the gateway's tools, which the policy calls during generation, each one an
  OpenEnv `step` with a `call_tool` action;
- `get_reward()` is the episode's reward (the hidden-split score of its submission).
A second reward function, of weight 0, reports each rollout's service spend, so the trainer logs it
beside the reward (`rewards/service_spend_usd/mean`) without training on it.

A policy able to post-train a model is not something a test can hold: with `--finish scripted` the
task's scripted agent plays whatever the policy left of an episode before its reward is read, so the
reward path runs end to end with a tiny policy (`--policy tiny` builds a 2-layer Qwen3 carrying
Qwen3's own chat template, tools included). A real run passes a real policy and `--finish none`.

    python examples/grpo_openenv.py --gateway URL --orchestrator-token T --task t0_artifact --steps 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from datasets import Dataset
from llm_agent import add_gateway_arguments
from trl import GRPOConfig, GRPOTrainer
from trl_env_loop import StepResult, call_tool, scripted_policy
from websockets.sync.client import ClientConnection, connect

REPLY_TIMEOUT_SECONDS = 300  # a reset waits for the operator to start the episode
PROMPT = "You are post-training a model on a platform that runs your jobs. Use the tools to finish the task."


class PostTrainEnvironment:
    """One episode per rollout; the gateway's tools as methods (TRL exposes them to the policy)."""

    played: list[dict[str, Any]] = []  # every episode's outcome, for the run's summary

    def __init__(self, gateway: str, orchestrator_token: str, task: str, finish: str) -> None:
        self._url = gateway.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
        self._token, self._task, self._finish = orchestrator_token, task, finish
        self._conn: ClientConnection | None = None
        self._last: StepResult | None = None
        self._ended: dict[str, Any] | None = None

    def reset(self, **_: Any) -> str:
        self._close()
        self._ended = None
        self._conn = connect(self._url, additional_headers={"Authorization": f"Bearer {self._token}"})
        self._last = self._send({"type": "reset", "data": {"task": self._task}})
        episode = self._last.observation["episode"]
        return f"\n\nEpisode {episode} of task {self._task} has started."

    def jobs_submit(self, script: str, timeout_seconds: int = 600) -> str:
        """Submit a training job that runs a Python script.

        Args:
            script: The job's Python source.
            timeout_seconds: The most the job may run, in seconds.

        Returns:
            The submitted job, as JSON.
        """
        return self._tool("jobs_submit", script=script, timeout_seconds=timeout_seconds)

    def jobs_wait(self, job: str) -> str:
        """Wait (a bounded while) for a job to finish.

        Args:
            job: The job's name.

        Returns:
            Whether it finished, and the job, as JSON.
        """
        return self._tool("jobs_wait", job=job, timeout_seconds=20)

    def dev_evaluate(self, job: str) -> str:
        """Score a training job's checkpoint on the dev split.

        Args:
            job: The training job's name.

        Returns:
            The evaluation job, as JSON.
        """
        return self._tool("dev_evaluate", job=job)

    def submit(self, job: str) -> str:
        """Submit a training job's checkpoint as the final answer; the episode then ends with its score.

        Args:
            job: The training job's name.

        Returns:
            The submission, as JSON.
        """
        return self._tool("submit", job=job)

    def get_reward(self) -> float:
        return float(self._outcome()["reward"] or 0.0)  # a platform failure (null) trains as 0

    def _outcome(self) -> dict[str, Any]:
        """The episode played to its end (once), its reward and what it spent."""
        if self._ended is not None:
            return self._ended
        assert self._last is not None
        if not self._last.done and self._finish == "scripted":
            policy = scripted_policy(self._task)
            action = next(policy)
            while not self._last.done:
                self._last = self._step(action)
                if not self._last.done:
                    action = policy.send(self._last)
        while not self._last.done:  # the gateway's step limit ends every episode
            self._last = self._step(call_tool("jobs_wait", timeout_seconds=20))
        spend = self._last.metadata.get("service_spend") or {}
        self._ended = {
            "episode": self._last.metadata.get("episode"),
            "reward": self._last.reward,
            "service_spend_usd": float(spend.get("settled_usd") or 0),
        }
        PostTrainEnvironment.played.append(self._ended)
        self._close()
        return self._ended

    def _tool(self, tool: str, **arguments: Any) -> str:
        assert self._last is not None
        if self._last.done:
            return json.dumps({"error": "the episode has ended"})
        self._last = self._step(call_tool(tool, **arguments))
        observation = self._last.observation
        return json.dumps({"error": observation["error"]} if observation.get("error") else self._last.data())

    def _step(self, action: dict[str, Any]) -> StepResult:
        return self._send({"type": "step", "data": action})

    def _send(self, message: dict[str, Any]) -> StepResult:
        assert self._conn is not None
        self._conn.send(json.dumps(message))
        return StepResult.of(message, json.loads(self._conn.recv(timeout=REPLY_TIMEOUT_SECONDS)))

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.send(json.dumps({"type": "close"}))
            self._conn.close()
            self._conn = None


def service_spend_usd(environments: list[PostTrainEnvironment], **_: Any) -> list[float]:
    """Each rollout's settled spend: logged by the trainer, weighted 0 so it never trains the policy.
    TRL calls it before the environments' own reward, so the episodes are played to their end here, all
    at once (each waits on its jobs, not on this process)."""
    with ThreadPoolExecutor(max_workers=max(1, len(environments))) as pool:
        outcomes = list(pool.map(lambda environment: environment._outcome(), environments))
    return [outcome["service_spend_usd"] for outcome in outcomes]


def tiny_policy(directory: Path) -> str:
    """A 2-layer Qwen3 with a byte-level BPE tokenizer and Qwen3's chat template (tools included)."""
    import torch
    from posttrain_task_gsm8k.standin import build_tokenizer
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    build_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.save_pretrained(directory)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(directory)
    return str(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gateway_arguments(parser)
    parser.add_argument("--task", default="t0_artifact")
    parser.add_argument("--policy", default="tiny", help="a model dir or Hub id; `tiny` builds one here")
    parser.add_argument("--finish", choices=["scripted", "none"], default="scripted")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--generations", type=int, default=2, help="rollouts (episodes) per prompt")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="grpo-openenv-"))
    policy = tiny_policy(workdir / "policy") if args.policy == "tiny" else args.policy
    config = GRPOConfig(
        output_dir=str(workdir / "out"), max_steps=args.steps, per_device_train_batch_size=args.generations,
        num_generations=args.generations, max_completion_length=32, learning_rate=1e-5, logging_steps=1,
        reward_weights=[0.0], save_strategy="no", report_to=[], use_cpu=True, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[service_spend_usd],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}]}] * args.steps),
        environment_factory=lambda: PostTrainEnvironment(
            args.gateway, args.orchestrator_token, args.task, args.finish
        ),
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    summary = {
        "steps": trainer.state.global_step,
        "episodes": PostTrainEnvironment.played,
        "logged": [
            {key: entry[key] for key in entry if key == "reward" or key.startswith("rewards/")}
            for entry in logged
        ],
    }
    print(json.dumps(summary))
    return 0 if PostTrainEnvironment.played else 1


if __name__ == "__main__":
    sys.exit(main())
