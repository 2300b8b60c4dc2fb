"""How many generator threads one rank may use."""
from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Collection, Sequence


def cpu_mask() -> frozenset[int]:
    """The CPUs this process may run on (mpirun's binding, cgroup-pinned jobs included)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    return len(cpu_mask())


def cpu_share(mine: Collection[int], node: Sequence[Collection[int]]) -> float:
    """The CPUs a rank may really use: over the CPUs in its mask, the sum of
    1 / (how many of the node's ranks may run on that CPU). Unbound ranks
    share every CPU; ranks bound apart own theirs; dividing a bound rank's
    mask by the ranks on the node again would count its share twice."""
    counts = Counter(c for mask in node for c in set(mask))
    return sum(1.0 / counts[c] for c in set(mine) if counts[c])


def _cpu_list(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def _topology_sets(root: Path = Path("/sys/devices/system")) -> dict[str, set[frozenset[int]]]:
    """The CPU sets of this node's cores, NUMA nodes and packages (sockets)."""
    kinds: dict[str, set[frozenset[int]]] = {"core": set(), "numa": set(), "package": set()}
    for cpu in root.glob("cpu/cpu[0-9]*/topology"):
        for kind, name in (("core", "thread_siblings_list"), ("package", "package_cpus_list")):
            try:
                kinds[kind].add(_cpu_list((cpu / name).read_text()))
            except OSError:
                pass
    for node in root.glob("node/node[0-9]*/cpulist"):
        try:
            kinds["numa"].add(_cpu_list(node.read_text()))
        except OSError:
            pass
    return kinds


def binding(node: Sequence[Collection[int]], online: Collection[int] | None = None,
            topology: dict[str, set[frozenset[int]]] | None = None) -> str:
    """mpirun's binding of a node's ranks as seen from their masks: none (each
    may run on every CPU), core, numa, package, or cpuset (another set); mixed
    when the ranks differ."""
    online = frozenset(online) if online is not None else frozenset().union(*map(frozenset, node))
    topology = _topology_sets() if topology is None else topology

    def kind(mask: frozenset[int]) -> str:
        if mask >= online:
            return "none"
        if len(mask) == 1:
            return "core" if mask in topology.get("core", ()) or not topology.get("core") else "hwthread"
        for name in ("core", "numa", "package"):
            if mask in topology.get(name, ()):
                return name
        return "cpuset"

    kinds = {kind(frozenset(m)) for m in node}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def online_cpus() -> frozenset[int]:
    try:
        return _cpu_list(Path("/sys/devices/system/cpu/online").read_text())
    except OSError:
        return frozenset(range(os.cpu_count() or 1))


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

    def __init__(self, share: float, override: int = 0) -> None:
        self.limit = gen_thread_budget(share, override)
        self.fixed = override > 0
        self.current = self.limit if self.fixed else 1
        self.used: list[int] = []
        #: files saved at the thread limit with generation still under the target margin
        self.starved_files = 0
        #: per checkpoint step: [bytes saved, bytes of files generation limited]
        self._step_bytes: dict[int, list[int]] = {}

    @property
    def starved(self) -> bool:
        """Generation, not the storage, set this rank's figure for some checkpoint."""
        return bool(self.generation_limited_steps)

    @property
    def generation_limited_steps(self) -> list[int]:
        """The checkpoints where this rank's CPU share bounded the measured save:
        files at the thread limit whose generation took longer than their I/O
        (the writer waited for bytes) carried more than half the bytes. A file
        merely under the target margin is not one: generation still outran I/O,
        and a handful such among many leaves the figure the storage's."""
        return sorted(s for s, (total, limited) in self._step_bytes.items() if limited * 2 > total)

    def observe(self, fill_s: float, io_s: float, nbytes: int = 0, step: int = 0) -> None:
        """One saved file of checkpoint `step`: its pure generation and I/O seconds."""
        self.used.append(self.current)
        sums = self._step_bytes.setdefault(step, [0, 0])
        sums[0] += nbytes
        if self.fixed or fill_s <= 0 or io_s <= 0:
            return
        margin = io_s / fill_s  # generation rate / I/O rate for the same bytes
        t = self.current
        if t >= self.limit and margin < 1.0:
            sums[1] += nbytes
        if margin < TARGET_MARGIN and t >= self.limit:
            self.starved_files += 1
        if margin < TARGET_MARGIN and t < self.limit:
            self.current = t + 1
        elif t > 1 and margin * (t - 1) / t >= 1.25 * TARGET_MARGIN:  # one fewer would still keep it
            self.current = t - 1

    def describe(self) -> dict:
        return {"mode": "fixed" if self.fixed else "adaptive", "limit": self.limit, "final": self.current,
                "target_margin": None if self.fixed else TARGET_MARGIN,
                "used_per_file": self.used, "files_at_limit_under_target": self.starved_files,
                "generation_limited_steps": self.generation_limited_steps}


def gen_thread_budget(share: float, override: int = 0) -> int:
    """Generator threads per rank: its share of the node's CPUs (cpu_share;
    never CPUs / world size), unless overridden."""
    if override > 0:
        return override
    return max(1, math.floor(share + 1e-9))


def unbound_share(ranks_on_node: int) -> float:
    """A rank's share when the node's ranks share every usable CPU (no binding)."""
    return usable_cpus() / max(1, ranks_on_node)
