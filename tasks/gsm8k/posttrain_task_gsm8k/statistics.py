"""The reported score: accuracy averaged over N generation seeds, with a bootstrap 95% interval.

Each question's correctness is first averaged over the seeds; the interval is the 2.5th and 97.5th
percentiles of that mean over questions resampled with replacement (a percentile bootstrap, its own
seeded generator, so the same results give the same interval on every machine).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20_240_521
CONFIDENCE = 0.95


@dataclass(frozen=True)
class SeedScore:
    mean: float  # the reward
    low: float
    high: float
    per_seed: tuple[float, ...]
    questions: int


def seed_mean_with_interval(
    correct_by_seed: Sequence[Sequence[bool]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> SeedScore:
    """`correct_by_seed[s][q]`: whether seed `s` answered question `q`. Every seed has every question."""
    if not correct_by_seed or not correct_by_seed[0]:
        raise ValueError("no seed or no question to score")
    questions = len(correct_by_seed[0])
    if any(len(row) != questions for row in correct_by_seed):
        raise ValueError("every seed must answer the same questions")
    seeds = len(correct_by_seed)
    per_question = [sum(row[q] for row in correct_by_seed) / seeds for q in range(questions)]
    mean = math.fsum(per_question) / questions
    rng = random.Random(seed)
    means = sorted(
        math.fsum(per_question[rng.randrange(questions)] for _ in range(questions)) / questions
        for _ in range(resamples)
    )
    tail = (1 - CONFIDENCE) / 2
    low = means[math.floor(tail * (resamples - 1))]
    high = means[math.ceil((1 - tail) * (resamples - 1))]
    per_seed = tuple(math.fsum(row) / questions for row in correct_by_seed)
    return SeedScore(mean=mean, low=low, high=high, per_seed=per_seed, questions=questions)
