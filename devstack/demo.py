"""`make demo`: bring the whole stack up, run the scripted agent through both first tasks, write each
episode's report (and one of the namespace), print what each episode earned and spent, and tear
everything down again."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from devstack import stack
from devstack.toolchain.build import log
from posttrain_cli.main import main as posttrain

REPORTS = Path("demo-reports")

TASKS = ("t0_artifact", "t0_arithmetic_format")


def _load_agent() -> object:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import scripted_sft_agent

    return scripted_sft_agent


def main() -> int:
    agent = _load_agent()
    started = time.monotonic()
    state = stack.up()
    log(f"stack ready in {time.monotonic() - started:.0f}s; gateway at {state.gateway_url}")
    results = []
    reports: list[Path] = []
    failed = False
    try:
        for task in TASKS:
            log(f"running the scripted agent on {task}")
            try:
                results.append(
                    asyncio.run(
                        agent.run_episode(  # type: ignore[attr-defined]
                            state.gateway_url, state.orchestrator_token, task, say=log
                        )
                    )
                )
            except Exception as exc:  # report and go on: the table says which task failed
                log(f"{task} failed: {exc}")
                failed = True
        reports = _write_reports(state, [r.episode for r in results])
    finally:
        log("tearing the stack down")
        stack.down()
    print()
    print(f"{'task':24} {'reward':>7} {'dev':>6} {'spend $':>10} {'jobs':>5} {'wall s':>7}")
    for r in results:
        print(
            f"{r.task:24} {r.reward or 'null':>7} {r.dev_score or '-':>6} {r.spend_usd:>10} "
            f"{r.jobs:>5} {r.wall_seconds:>7}"
        )
    print(f"\ntotal wall time {time.monotonic() - started:.0f}s")
    if reports:
        print("\nreports (self-contained HTML, open in a browser):")
        for path in reports:
            print(f"  {path.resolve()}")
    return 1 if failed or len(results) != len(TASKS) else 0


def _write_reports(state: stack.StackState, episodes: list[str]) -> list[Path]:
    """With `posttrain report`, while the cluster still holds the episodes: one per episode (with its
    figure as a PNG beside it) and one of the namespace."""
    REPORTS.mkdir(exist_ok=True)
    common = ["--kubeconfig", state.kubeconfig, "--namespace", stack.DEMO_NAMESPACE, "report"]
    written = []
    for episode in episodes:
        html, png = REPORTS / f"{episode}.html", REPORTS / f"{episode}.png"
        if posttrain([*common, episode, "--output", str(html), "--png", str(png)]) == 0:
            written += [html, png]
    summary = REPORTS / f"episodes-{stack.DEMO_NAMESPACE}.html"
    if posttrain([*common, "--output", str(summary)]) == 0:
        written.append(summary)
    return written


if __name__ == "__main__":
    sys.exit(main())
