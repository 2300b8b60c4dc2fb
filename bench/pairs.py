"""Ratios of interleaved pairs (A B / B A), kept apart by which side ran first.

On this VM a run is often measured under other conditions when the other
program ran just before it: in one local_bench run, raw O_DIRECT loads at 1
rank gave 1.49-1.80 GiB/s right after one of our runs and 2.19-2.52 right
after a raw run, and our loads at 2 ranks 1.21-1.55 right after a raw run
and 2.45-2.60 right after one of ours (bench/local_bench.py prints every
pair). A plain median over pairs then depends on how many pairs had each
order; the order-balanced ratio below does not.
"""
from __future__ import annotations

import math
import statistics


class OrderedRatios:
    """ours / reference ratios, by whether ours ran first in its pair."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.second: list[float] = []

    def add(self, ours_first: bool, ratio: float) -> None:
        (self.first if ours_first else self.second).append(ratio)

    def balanced(self) -> float:
        """Geometric mean of the median with ours first and the median with
        ours second: a multiplicative order effect cancels out."""
        if not self.first or not self.second:
            raise ValueError("an order-balanced ratio needs pairs of both orders")
        return math.sqrt(statistics.median(self.first) * statistics.median(self.second))

    def cell(self) -> str:
        """For a table: the balanced ratio with both medians."""
        return (f"{self.balanced():.3f} (first {statistics.median(self.first):.3f}, "
                f"second {statistics.median(self.second):.3f})")

    def describe(self) -> str:
        return (f"{self.balanced():.3f} (ours first {statistics.median(self.first):.3f} "
                f"{[round(x, 3) for x in self.first]}, second {statistics.median(self.second):.3f} "
                f"{[round(x, 3) for x in self.second]})")


def check_pairs(parser, pairs: int) -> None:
    """Refuse a pair count that would not give both orders equally often."""
    if pairs < 2 or pairs % 2:
        parser.error("--pairs must be even and >= 2: as many pairs with ours first as with the reference first")


def interleaved(count: int, label: str, ours, reference, nbytes: int) -> OrderedRatios:
    """A warm-up of each, then `count` pairs alternating which runs first; ours()
    and reference() return their seconds for `nbytes`. Prints every pair."""
    ours(), reference()
    ratios = OrderedRatios()
    for i in range(count):
        first = i % 2 == 0
        a, b = (ours(), reference()) if first else (reference(), ours())[::-1]
        ratios.add(first, b / a)  # throughput ours / raw = raw seconds / our seconds
        print(f"  {label}: pair {i + 1} ({'ours' if first else 'raw'} first): ours {nbytes / 2**30 / a:.3f} GiB/s, "
              f"raw {nbytes / 2**30 / b:.3f} GiB/s", flush=True)
    return ratios
