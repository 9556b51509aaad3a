"""The sampled estimate's rule: an order statistic bounding the 95th percentile."""

from __future__ import annotations

import math
import random

import pytest

from jobs.services.sampling import order_statistic_index, upper_bound


def coverage(n: int, k: int, q: float = 0.95) -> float:
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k))


@pytest.mark.parametrize("n,expected", [(58, None), (59, 59), (64, 64), (100, 99), (300, 292)])
def test_the_smallest_order_statistic_with_95_percent_confidence(n: int,
                                                                  expected: int | None) -> None:
    k = order_statistic_index(n)
    assert k == expected
    if k is not None:
        assert coverage(n, k) >= 0.95 > coverage(n, k - 1)


def test_the_bound_covers_the_95th_percentile_at_least_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    population = [int(rng.lognormvariate(5, 1)) for _ in range(20_000)]
    truth = sorted(population)[int(0.95 * len(population))]
    trials = 400
    covered = sum(upper_bound(rng.sample(population, 64), whole_file=False) >= truth
                  for _ in range(trials))
    assert covered / trials >= 0.93  # 0.96 expected; a little slack for 400 trials


def test_a_small_file_generated_whole_uses_its_longest_answer() -> None:
    assert upper_bound([5, 90, 12], whole_file=True) == 90
