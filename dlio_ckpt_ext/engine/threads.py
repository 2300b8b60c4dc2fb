"""How many generator threads one rank may use."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (affinity, cgroup-pinned jobs included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: generation must outrun I/O by this much; the adaptive budget adds a thread below it
TARGET_MARGIN = 2.0


class ThreadBudget:
    """Generator threads for the next file.

    Fixed when gen_threads is set. Otherwise the fewest threads that keep the
    measured generation rate at least TARGET_MARGIN x the measured I/O rate,
    between 1 and this rank's share of the node's CPUs, learnt from each saved
    file's fill and I/O times: on a small node every generator thread is CPU
    the storage client (or a VM's disk emulation) does not get, and one thread
    often outruns the disk; where it does not, the next file gets another.
    """

    def __init__(self, ranks_on_node: int, override: int = 0) -> None:
        self.limit = override if override > 0 else gen_thread_budget(ranks_on_node)
        self.fixed = override > 0
        self.current = self.limit if self.fixed else 1
        self.used: list[int] = []

    def observe(self, fill_s: float, io_s: float) -> None:
        """One saved file: its pure generation and I/O seconds."""
        self.used.append(self.current)
        if self.fixed or fill_s <= 0 or io_s <= 0:
            return
        margin = io_s / fill_s  # generation rate / I/O rate for the same bytes
        t = self.current
        if margin < TARGET_MARGIN and t < self.limit:
            self.current = t + 1
        elif t > 1 and margin * (t - 1) / t >= 1.25 * TARGET_MARGIN:  # one fewer would still keep it
            self.current = t - 1

    def describe(self) -> dict:
        return {"mode": "fixed" if self.fixed else "adaptive", "limit": self.limit, "final": self.current,
                "target_margin": None if self.fixed else TARGET_MARGIN,
                "used_per_file": self.used}


def gen_thread_budget(ranks_on_node: int, override: int = 0) -> int:
    """Generator threads per rank: the usable CPUs shared by the ranks on
    this node (never the global world size), unless overridden."""
    if override > 0:
        return override
    return max(1, usable_cpus() // max(1, ranks_on_node))
