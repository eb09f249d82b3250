"""HF Jobs API requests per minute with 10 and with 500 active jobs (the goal is flat).

    python bench/hf_api_calls.py [--devstack NAME] [--window 60]

The operator runs as a real process against the devstack control plane and the HF Jobs emulator
(jobs 'run' for an hour, so they stay active); the emulator counts every request it serves.
"""

from __future__ import annotations

import argparse
import asyncio

from operator_scale import Stack, polling_cost


async def run(args: argparse.Namespace) -> None:
    stack = await Stack(args.devstack).start()
    try:
        few = await polling_cost(stack, 2, 5, args.window)
        many = await polling_cost(stack, 98, 5, args.window, first=2)
    finally:
        await stack.stop()
    print(f"HF API requests/min with  10 active jobs: {few:7.1f}")
    print(f"HF API requests/min with 500 active jobs: {many:7.1f}")
    print(f"ratio (500 / 10 jobs):                    {many / few:7.2f}   (50x the jobs)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devstack", help="attach to this running devstack cluster instead of starting one")
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which requests are counted")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
