"""How many generator threads one rank may use."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (affinity, cgroup-pinned jobs included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gen_thread_budget(ranks_on_node: int, override: int = 0) -> int:
    """Generator threads per rank: the usable CPUs shared by the ranks on
    this node (never the global world size), unless overridden."""
    if override > 0:
        return override
    return max(1, usable_cpus() // max(1, ranks_on_node))
