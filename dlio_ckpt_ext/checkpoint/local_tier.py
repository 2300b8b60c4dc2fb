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
from dlio_ckpt_ext.engine import BufferPool, ContentSpec, FileStats, derive_seed, send_file
from dlio_ckpt_ext.engine.stream import Progress
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
        #: the iterations whole in this rank's folder, oldest first
        self.kept: list[int] = []
        #: the file being written now (its path below the local root), for whoever must name it (a stall)
        self.current_file = ""

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
        if found:
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
        if self.pool is not None:
            self.pool.close()
            self.pool = None
