"""An eval-harness loop: N episodes of one task played by one agent, a table of reward and spend.

The agent is the scripted one (`scripted_sft_agent.py`) by default, or the LLM driver (`llm_agent.py`,
configured by its OPENAI_* environment variables) with `--agent llm`. Episodes run one after another,
so each row's wall time is that episode's own; an episode that fails is a row with outcome `Error` (the
reason on stderr) and the harness goes on.

    python examples/eval_harness.py --episodes 5                      # against `make up`'s stack
    OPENAI_MODEL=... python examples/eval_harness.py --agent llm --episodes 5 --max-tool-calls 40
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import llm_agent
import scripted_sft_agent


@dataclass
class Row:
    index: int
    episode: str
    reward: str | None
    outcome: str
    spend_usd: str
    wall_seconds: float


async def play_scripted(args: argparse.Namespace, index: int) -> Row:
    result = await scripted_sft_agent.run_episode(
        args.gateway, args.orchestrator_token, args.task, say=llm_agent.stderr, backend=args.backend
    )
    return Row(index, result.episode, result.reward, result.outcome, result.spend_usd, result.wall_seconds)


async def play_llm(args: argparse.Namespace, index: int) -> Row:
    chat = llm_agent.ChatEndpoint.from_env()
    try:
        run = await llm_agent.run_episode(
            args.gateway, args.orchestrator_token, args.task, chat, llm_agent.budget_from(args),
            llm_agent.stderr, args.backend,
        )  # fmt: skip
    finally:
        await chat.aclose()
    outcome = run.outcome or f"Stopped ({run.stop_reason})"
    spend = run.service_spend.get("settled_usd", "?")
    return Row(index, run.episode, run.reward, outcome, spend, run.wall_seconds)


async def evaluate(args: argparse.Namespace) -> list[Row]:
    play = play_llm if args.agent == "llm" else play_scripted
    rows = []
    for index in range(args.episodes):
        started = time.monotonic()
        try:
            rows.append(await play(args, index))
        except Exception as exc:  # one failed episode is a row, not the end of the evaluation
            cause = llm_agent.first_error(exc)
            llm_agent.stderr(f"episode {index} failed: {type(cause).__name__}: {cause}")
            rows.append(Row(index, "-", None, "Error", "?", round(time.monotonic() - started, 1)))
    return rows


def _decimal(value: str | None) -> Decimal | None:
    try:
        return Decimal(value) if value is not None else None
    except InvalidOperation:
        return None


def print_table(rows: list[Row]) -> None:
    print(f"{'#':>3}  {'episode':24} {'reward':>7} {'outcome':24} {'spend $':>10} {'wall s':>7}")
    for r in rows:
        print(
            f"{r.index:>3}  {r.episode:24} {r.reward or 'null':>7} {r.outcome:24} {r.spend_usd:>10} "
            f"{r.wall_seconds:>7}"
        )
    rewards = [d for d in map(_decimal, (r.reward for r in rows)) if d is not None]
    spends = [d for d in map(_decimal, (r.spend_usd for r in rows)) if d is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "null"
    scored = f"{sum(r.outcome == 'Scored' for r in rows)}/{len(rows)} scored"
    print(
        f"{'all':>3}  {'mean reward, total spend':24} {mean:>7} {scored:24} {sum(spends, Decimal(0)):>10} "
        f"{sum(r.wall_seconds for r in rows):>7.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    llm_agent.add_gateway_arguments(parser)
    parser.add_argument("--task", default="t0_artifact")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--agent", choices=["scripted", "llm"], default="scripted")
    parser.add_argument("--backend", choices=["hf-jobs", "pods"], help="default: the gateway's")
    llm_agent.add_budget_arguments(parser)
    args = parser.parse_args(argv)
    if args.agent == "scripted" and args.task not in scripted_sft_agent.SOLUTIONS:
        parser.error(f"the scripted agent knows {sorted(scripted_sft_agent.SOLUTIONS)}")
    rows = asyncio.run(evaluate(args))
    print_table(rows)
    return 0 if all(r.outcome == "Scored" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
