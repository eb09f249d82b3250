"""The seeded map and its splits (standard library only: the registry and the builders share it)."""

from __future__ import annotations

import random

SEED = 20261201
INPUT_SIZE = 5
OUTPUT_SIZE = 3
SPLIT_SIZES = {"train": 200, "dev": 50, "hidden": 200}


def hidden_map() -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randint(-4, 4) for _ in range(INPUT_SIZE)] for _ in range(OUTPUT_SIZE)]


def splits() -> dict[str, list[dict[str, list[int]]]]:
    """Disjoint example sets: no held-out x is ever shown to the agent."""
    weight = hidden_map()
    rng = random.Random(SEED + 1)
    seen: set[tuple[int, ...]] = set()
    result: dict[str, list[dict[str, list[int]]]] = {}
    for split, size in SPLIT_SIZES.items():
        records: list[dict[str, list[int]]] = []
        while len(records) < size:
            x = tuple(rng.randint(-9, 9) for _ in range(INPUT_SIZE))
            if x in seen:
                continue
            seen.add(x)
            y = [sum(w * v for w, v in zip(row, x, strict=True)) for row in weight]
            records.append({"x": list(x), "y": y})
        result[split] = records
    return result
