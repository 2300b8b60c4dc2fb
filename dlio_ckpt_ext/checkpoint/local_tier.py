"""One rank's local tier: NVIDIA's local checkpoints on a node-local folder.

Each save writes the parts of the rank's replication group (its own, then its
peers', which NVRx gathers over the network first: the network is not what
this benchmark measures), each as `.dirty`, renamed once written; the older
iteration is deleted once the caller confirms the new one whole on every
rank (`retire`). Independent of DLIO and MPI.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Callable, Optional

from dlio_ckpt_ext.shared_plans import tier_plan
from dlio_ckpt_ext.config import RunConfig
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, FileStats, derive_seed, load_file, send_file
from dlio_ckpt_ext.engine.stream import Progress
from dlio_ckpt_ext.engine.transfer import receive_part, send_part
from dlio_ckpt_ext.engine.threads import ThreadBudget
from dlio_ckpt_ext.storage import open_backend


def takes_direct_io(folder: str) -> bool:
    """Whether files in `folder` open with O_DIRECT (tmpfs before Linux 6.6 refuses it)."""
    probe = os.path.join(folder, f".direct-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600))
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return True


class LocalTier:
    def __init__(self, cfg: RunConfig, rank: int, ranks_per_node: int, part: Callable[[int], int],
                 threads: ThreadBudget, cpu_share: Optional[float] = None) -> None:
        """part(r): the bytes of rank r's share of a checkpoint (the layout's);
        threads: the generator budget the rank's foreground shares."""
        t = cfg.tiers
        self.cfg, self.rank, self.part, self.threads = cfg, rank, part, threads
        self.apart = tier_plan.jump(t.replication_jump, ranks_per_node)
        self.group = tier_plan.group(rank, t.replication, self.apart)
        self.folder = tier_plan.rank_folder(rank)
        # the local files are fsynced like the checkpoint's (NVRx's are not: docs/tiers.md)
        self.cpu_share = cpu_share
        self.backend = open_backend("local_fs", t.local_root, {}, cfg.checkpoint.fsync, cpu_share)
        self.pool: Optional[BufferPool] = None
        self.read_pool: Optional[BufferPool] = None
        #: the iterations whole in this rank's folder, oldest first
        self.kept: list[int] = []
        #: the file being written now (its path below the local root), for whoever must name it (a stall)
        self.current_file = ""

    def clique(self, rank: int) -> tuple[int, ...]:
        """The ranks that keep `rank`'s part (its replication group), `rank` first."""
        return tier_plan.group(rank, self.cfg.tiers.replication, self.apart)

    @property
    def bytes_per_save(self) -> int:
        return sum(self.part(r) for r in self.group)

    def refusal(self) -> Optional[str]:
        """Why this rank cannot keep its local tier (another run's files in its
        folder), or None; makes the folder, so it comes before any save."""
        key = "workload.tiers.local_root"
        where = self.backend.uri(self.folder)
        self.backend.prepare(self.folder)
        if not takes_direct_io(where):  # a ramdisk on an older kernel: its page cache is the device
            self.backend = open_backend("local_fs", self.cfg.tiers.local_root, {"write_mode": "buffered"},
                                        self.cfg.checkpoint.fsync, self.cpu_share)
        found = sorted(n for n in self.backend.children(self.folder) if n.startswith("iter_"))
        # a run that only comes back from a failure restores what an earlier run left
        if found and self.cfg.checkpoint.num_checkpoints_write:
            return (f"{key}: {where} holds local checkpoints ({', '.join(found[:3])}) of an earlier or live run; "
                    "remove them or choose another local_root")
        return None

    def room_refusal(self, node_need: int) -> Optional[str]:
        """node_need: two iterations of every part this node's ranks keep."""
        free = shutil.disk_usage(self.backend.uri(self.folder)).free
        if free >= node_need:
            return None
        return (f"workload.tiers.local_root: {self.cfg.tiers.local_root} has {free} bytes free, its node's ranks "
                f"need {node_need} for {tier_plan.ITERATIONS_KEPT} iterations of replication="
                f"{self.cfg.tiers.replication} parts each")

    def buffers(self) -> BufferPool:
        if self.pool is None:
            self.pool = BufferPool(self.cfg.streaming.pool_depth, self.cfg.chunk_size)
        return self.pool

    def read_buffers(self) -> BufferPool:
        """A recovery's reads: a buffer per request in flight, one being verified and a spare."""
        if self.read_pool is None:
            self.read_pool = BufferPool(self.cfg.read_parallelism + 2, self.cfg.read_size)
            self.read_pool.scratch(2 * self.cfg.read_size)  # a piece received, and its expected bytes
        return self.read_pool

    def held(self) -> set[tuple[int, int]]:
        """(iteration, owner) of every whole part in this rank's folder: one listing (NVRx's find_latest)."""
        return {p for n in self.backend.children(self.folder) if (p := tier_plan.parse_local(n)) is not None}

    def lose(self) -> int:
        """A replaced node's empty disk: every file in this rank's folder deleted. Returns files deleted."""
        names = self.backend.children(self.folder)
        self.kept = []
        return self.backend.delete_files([f"{self.folder}/{n}" for n in names])

    def _path(self, step: int, owner: int) -> str:
        return f"{self.folder}/{tier_plan.local_name(step, owner)}"

    def _expected(self, step: int, owner: int) -> Optional[ContentSpec]:
        return self.content(step, owner) if self.cfg.streaming.verify else None

    def read_part(self, step: int, owner: int, progress: Progress = None) -> FileStats:
        """Read `owner`'s part of iteration `step` from this rank's folder, verified when asked."""
        return load_file(self.backend, self._path(step, owner), self.part(owner), self.read_buffers(),
                         self._expected(step, owner), self.cfg.read_parallelism, self.threads.current, progress,
                         self.cfg.read_size)

    def send_part(self, step: int, owner: int, send: Callable[[memoryview], None],
                  progress: Progress = None) -> FileStats:
        """Read `owner`'s part from this rank's folder and send it piece by piece to the rank that lost it."""
        return send_part(self.backend, self._path(step, owner), self.part(owner), self.read_buffers(),
                         self.cfg.read_size, send, progress)

    def receive_part(self, step: int, recv: Callable[[memoryview], None], progress: Progress = None) -> FileStats:
        """This rank's own part of iteration `step`, received from its holder piece by piece, verified when asked."""
        size = self.cfg.read_size
        both = self.read_buffers().scratch(2 * size)
        piece, expected = both[:size], both[size:2 * size]
        return receive_part(f"{self.backend.uri(self._path(step, self.rank))} (from its holder)", self.part(self.rank),
                            self.cfg.read_size, recv, piece, self._expected(step, self.rank), expected,
                            self.threads.current, progress)

    def content(self, step: int, owner: int) -> ContentSpec:
        st = self.cfg.streaming
        return ContentSpec(derive_seed(st.seed, f"local/{step}", owner, tier_plan.local_name(step, owner)),
                           st.dedup_ratio, st.compress_ratio)

    def save(self, step: int, progress: Progress = None) -> list[FileStats]:
        """Write the group's parts of iteration `step` as .dirty, each renamed once whole."""
        saved = []
        for owner in self.group:
            dirty = self.current_file = f"{self.folder}/{tier_plan.local_name(step, owner, dirty=True)}"
            # on a failure the writer removes its partial file itself
            closed = send_file(self.backend, dirty, self.part(owner), self.content(step, owner),
                               self.buffers(), self.threads.current, progress)
            self.backend.rename(dirty, f"{self.folder}/{tier_plan.local_name(step, owner)}")
            for stats in closed:
                self.threads.observe(stats.fill_s, stats.io_s + stats.close_s, stats.nbytes, step)
            saved += closed
        self.kept.append(step)
        return saved

    def retire(self) -> int:
        """Every rank holds the newest iteration whole: delete the older ones. Returns files deleted."""
        old, self.kept = self.kept[:-1], self.kept[-1:]
        return self.remove(old)

    def remove(self, steps: list[int]) -> int:
        return self.backend.delete_files([f"{self.folder}/{tier_plan.local_name(s, r)}" for s in steps
                                          for r in self.group])

    def remove_all(self) -> int:
        removed = self.remove(self.kept)
        self.kept = []
        self.backend.remove_empty_dir(self.folder)
        return removed

    def close(self) -> None:
        for pool in (self.pool, self.read_pool):
            if pool is not None:
                pool.close()
        self.pool = self.read_pool = None
