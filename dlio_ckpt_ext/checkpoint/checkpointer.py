"""One rank's checkpoints: the shard plan driven through the streaming engine.

Independent of DLIO and MPI (ranks and node sizes are plain arguments), so
it can be tested and benchmarked on its own.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from dlio_ckpt_ext.shared_plans import load_plan, plan, universal_plan
from dlio_ckpt_ext.config import CheckpointId, RunConfig
from dlio_ckpt_ext.engine import (BufferPool, ContentSpec, FileStats, FileWindow, derive_seed, load_file,
                                  send_file, write_from_memory)
from dlio_ckpt_ext.engine.buffers import PAGE, allocate, release
from dlio_ckpt_ext.engine.content import TENSOR_TOP
from dlio_ckpt_ext.engine.share import Broadcast, read_shared
from dlio_ckpt_ext.engine.spans import SpanSink, Tracer
from dlio_ckpt_ext.engine.staging import StagingArea, stage_file
from dlio_ckpt_ext.engine.stream import Progress
from dlio_ckpt_ext.engine.threads import ThreadBudget, unbound_share
from dlio_ckpt_ext.errors import StorageError
from dlio_ckpt_ext.storage import Backend, join_root, open_backend


class Checkpointer:
    def __init__(self, cfg: RunConfig, rank: int, comm_size: int, ranks_per_node: int,
                 cpu_share: Optional[float] = None) -> None:
        """cpu_share: the CPUs this rank may really use (default: the node's
        usable CPUs shared by its ranks, as when they are not bound)."""
        self.cfg, self.rank, self.comm_size, self.ranks_per_node = cfg, rank, comm_size, ranks_per_node
        self.cpu_share = unbound_share(ranks_per_node) if cpu_share is None else cpu_share
        sto = cfg.storage
        self.root = join_root(sto.storage_root, cfg.checkpoint.checkpoint_folder)
        self.backend: Backend = open_backend(sto.storage_type, self.root, dict(sto.storage_options),
                                             cfg.checkpoint.fsync, self.cpu_share, cfg.checkpoint.layout)
        self.threads = ThreadBudget(self.cpu_share, cfg.streaming.gen_threads)
        self.pool: BufferPool | None = None
        self.read_pool: BufferPool | None = None
        self.staging: StagingArea | None = None
        self.layout = cfg.layout
        self._plans: dict[int, plan.RankPlan] = {}
        #: what this run's loads read: pattern, world size, the saved one (load_plan)
        self.job = cfg.load_job(comm_size, ranks_per_node)
        self._reads: Optional[tuple[load_plan.ReadRange, ...]] = None
        self._by_name: dict[int, dict[str, plan.ShardFile]] = {}
        self._groups: Optional[list[tuple[tuple[int, ...], list[load_plan.ReadRange]]]] = None
        #: share=broadcast: makes the group of ranks reading a range (the DLIO layer's, over MPI)
        self.sharer: Optional[Callable[[tuple[int, ...]], Broadcast]] = None
        #: share=broadcast: what the last load received by broadcast, and its seconds
        self.last_broadcast = {"broadcast_bytes": 0, "broadcast_s": 0.0}
        self._share_window: Optional[tuple] = None
        #: async mode: generation seconds of each file at its last staging
        self.staged_fill_s: dict[str, float] = {}
        #: told of every chunk and file when a trace is being written
        self.tracer: Optional[Tracer] = None
        #: the file being written or read now (its path below the root)
        self.current_file = ""
        #: a universal conversion's folder and the files this rank wrote in it (checkpoint/universal.py)
        self.converted: Optional[tuple[str, list[str]]] = None

    @property
    def gen_threads(self) -> int:
        """Generator threads the next file gets (see ThreadBudget)."""
        return self.threads.current

    def write_buffers(self) -> BufferPool:
        """The write pool (pool_depth x chunk_size), allocated before the first save;
        empty where the storage lends the memory the generator fills (S3 parts)."""
        if self.pool is None:
            depth = 0 if self.backend.lends_write_memory else self.cfg.streaming.pool_depth
            self.pool = BufferPool(depth, self.cfg.chunk_size)
        return self.pool

    def read_buffers(self) -> BufferPool:
        """The read pool: a buffer per request in flight, one being verified and a
        spare; page-sized tokens where the readers lend their memory (S3)."""
        if self.read_pool is None:
            size = PAGE if self.backend.lends_read_memory else self.cfg.read_size
            self.read_pool = BufferPool(self.cfg.read_parallelism + 2, size)
        return self.read_pool

    def staging_area(self) -> StagingArea:
        """Async mode: this rank's whole share of a checkpoint in host memory."""
        if self.staging is None:
            self.staging = StagingArea({f.name: f.size for f in self.files(self.rank)})
        return self.staging

    # -- plan -------------------------------------------------------------
    def rank_plan(self, rank: int) -> plan.RankPlan:
        """The files `rank` wrote in the saved checkpoint (at the saved world
        size: this run's whenever it writes)."""
        # kept: the inventory asks for every rank's plan once per checkpoint
        if rank not in self._plans:
            self._plans[rank] = self.layout.rank_plan(self.cfg.shape, self.cfg.parallelism, self.job.saved_ranks, rank)
        return self._plans[rank]

    def files(self, rank: int) -> tuple[plan.ShardFile, ...]:
        """The files `rank` writes before the commit (all of them, but the layout's commit files)."""
        return self.rank_plan(rank).files

    def reads(self) -> tuple[load_plan.ReadRange, ...]:
        """The ranges this rank reads in each load, in order (its layout's load plan)."""
        if self._reads is None:
            self._reads = self.layout.rank_reads(self.cfg.shape, self.cfg.parallelism, self.job, self.rank)
        return self._reads

    def share_groups(self) -> list[tuple[tuple[int, ...], list[load_plan.ReadRange]]]:
        """share=broadcast: this rank's distinct ranges by the ranks reading them,
        in the order every rank takes them (by members, then by range), so
        the groups' broadcasts never wait on one another in a circle."""
        if self._groups is None:
            groups: dict[tuple[int, ...], list[load_plan.ReadRange]] = {}
            for r in dict.fromkeys(self.reads()):
                members = self.layout.range_readers(self.cfg.shape, self.cfg.parallelism, self.job, r, self.rank)
                groups.setdefault(members, []).append(r)
            self._groups = sorted(((m, sorted(rs, key=lambda r: r.key)) for m, rs in groups.items()),
                                  key=lambda g: g[0])
        return self._groups

    def directory(self, step: int, epoch: int = 1) -> str:
        return self.layout.checkpoint_dir(step, epoch)

    def write_dir(self, step: int, epoch: int = 1) -> str:
        """Where a save writes its files: the layout's temporary folder, renamed to
        directory() by the commit, on storage with directories; else directory()."""
        staging = self.layout.staging_dir(step, epoch) if self.backend.has_directories else None
        return staging or self.directory(step, epoch)

    def source_rank(self) -> int:
        """Whose files this rank loads: with recovery_rank_shift, a rank on
        another node, so no node reads back what its own page cache holds."""
        if self.cfg.checkpoint.recovery_rank_shift:
            return (self.rank + self.ranks_per_node) % self.comm_size
        return self.rank

    def content(self, directory: str, rank: int, name: str) -> ContentSpec:
        """A file's bytes: generated from a seed of its checkpoint, writer and
        name, after the bytes it starts with where it has them (safetensors)."""
        st = self.cfg.streaming
        return ContentSpec(derive_seed(st.seed, directory, rank, name), st.dedup_ratio, st.compress_ratio,
                           self.prefix(rank, name), self.number_bytes(rank, name))

    def number_bytes(self, rank: int, name: str) -> int:
        """streaming.content=tensors: the size of file `name`'s numbers (weights: the
        model's datatype; optimizer and mixed state: the optimizer's, most of its
        bytes); 0: incompressible bytes (the default, and metadata)."""
        if self.cfg.streaming.content != "tensors":
            return 0
        planned = self._named_files(rank).get(name)
        kind = planned.kind if planned else "metadata"
        dtype = {"model": self.cfg.shape.model_datatype, "weights": self.cfg.shape.model_datatype,
                 "optimizer": self.cfg.shape.optimizer_datatype, "state": self.cfg.shape.optimizer_datatype}.get(kind)
        size = plan.DTYPE_BYTES.get(dtype, 0) if dtype else 0
        return size if size in TENSOR_TOP else 0

    def prefix(self, rank: int, name: str) -> bytes:
        """The bytes file `name` of saved rank `rank` starts with, not generated
        (a header, an index); b"" for most files."""
        planned = self._named_files(rank).get(name)
        return planned.prefix if planned else b""

    def _named_files(self, rank: int) -> dict[str, plan.ShardFile]:
        """Saved rank `rank`'s files by name (a file written again stands once, as it ends),
        kept: every file a rank writes or reads asks for its prefix and its numbers."""
        if rank not in self._by_name:
            self._by_name[rank] = {f.name: f for f in self.rank_plan(rank).all_files}
        return self._by_name[rank]

    def expected_sizes(self, checkpoints: list[CheckpointId]) -> dict[str, int]:
        """Every file of the given checkpoints, all ranks, path -> size."""
        files = self.checkpoint_files()
        return {f"{self.directory(s, e)}/{name}": size for s, e in checkpoints for name, size in files.items()}

    def checkpoint_files(self, world: Optional[int] = None) -> dict[str, int]:
        """Every rank's files of one checkpoint, name (below its directory) -> size;
        world: saved at that many ranks (default: the saved world size of the loads)."""
        if world is not None and world != self.job.saved_ranks:
            return self.layout.saved_files(self.cfg.shape, self.cfg.parallelism, world)
        return {f.name: f.size for r in range(self.job.saved_ranks)
                for f in self.rank_plan(r).all_files}

    def use_job(self, job: load_plan.LoadJob) -> None:
        """Load what `job` says from now on (a resume that found the checkpoint
        saved at another world size): every plan made for the old one goes."""
        self.job = job
        self._plans, self._by_name, self._reads, self._groups = {}, {}, None, None

    def planned_writes(self, checkpoints: list[CheckpointId]) -> dict:
        """Where the given checkpoints go and what each holds (all ranks): enough
        to open the storage again after the run and tell complete checkpoints
        from half-written ones. The names are the same in every checkpoint, so
        they are listed once (a 1T run has tens of thousands)."""
        sto = self.cfg.storage
        return {"storage_type": sto.storage_type, "root": self.root, "storage_options": dict(sto.storage_options),
                "directories": {str(s) if e == 1 else f"{e}/{s}": self.directory(s, e) for s, e in checkpoints},
                "files": self.checkpoint_files()}

    # -- I/O --------------------------------------------------------------
    def concurrency(self) -> dict:
        """Requests in flight per rank and their sizes, by phase: what tells a
        latency-bound run from a bandwidth-bound one."""
        c = self.cfg.checkpoint
        out = {}
        if c.num_checkpoints_write:
            out["save"] = self.backend.write_concurrency(self.cfg.chunk_size)
            if self.backend.lends_write_memory and self.cfg.concurrent_files > 1:
                out["save"] = {**out["save"], "files_at_once": self.cfg.concurrent_files,
                               "requests_in_flight": out["save"]["requests_in_flight"] * self.cfg.concurrent_files,
                               "note": "per object; a file is closed after the next one's bytes were sent"}
        if c.num_checkpoints_read:
            out["load"] = self.backend.read_concurrency(self.cfg.read_parallelism, self.cfg.read_size)
        return out

    def durability(self) -> str:
        """What a save of ours waits for before it counts, beside what the layout's framework waits for."""
        if not self.backend.has_directories:
            ours = "each object durable once its upload completes"
        elif self.cfg.checkpoint.fsync:
            ours = "every file fsynced before the save counts (DLIO's and MLPerf's rule)"
        else:
            ours = "no fsync (checkpoint.fsync=false)"
        return f"{ours}; {self.layout.framework} itself: {self.layout.durability}" if self.layout.durability else ours

    def rank_bytes(self, rank: int) -> int:
        """Bytes `rank` writes in one checkpoint."""
        return self.rank_plan(rank).total_bytes

    def load_bytes(self) -> int:
        """Bytes this rank reads in one load (its ranges; with sharing, part of
        them come from the other readers)."""
        return sum(r.length for r in self.reads())

    def checkpoint_bytes(self) -> int:
        """Bytes of one whole checkpoint, all ranks (at the saved world size)."""
        return self.layout.checkpoint_bytes(self.cfg.shape, self.cfg.parallelism, self.job.saved_ranks)

    def prepare(self) -> None:
        self.backend.prepare("")
        if self.rank == 0:
            self._refuse_renaming_onto_a_checkpoint()
        # allocated and touched now, outside every timed window
        if self.cfg.checkpoint.num_checkpoints_write:
            self.write_buffers()
            if self.cfg.is_async:
                self.staging_area()
                self.write_buffers().scratch(self.cfg.chunk_size)
        if self.cfg.checkpoint.num_checkpoints_read:
            pool = self.read_buffers()
            if self.cfg.streaming.verify:
                pool.scratch(self.cfg.read_size)
            if self.shares():
                self.share_buffers()

    def _refuse_renaming_onto_a_checkpoint(self) -> None:
        """A layout committed by a rename (Orbax) cannot rename onto a step an
        earlier run left: said before anything is written, naming the folder."""
        for step in self.cfg.steps_saved():
            final = self.directory(step)
            if self.write_dir(step) != final and self.backend.children(final):
                raise StorageError(f"{self.backend.uri(final)} holds a checkpoint: {self.layout.framework} commits "
                                   f"step {step} by renaming its temporary folder to it; remove it or choose "
                                   "another checkpoint_folder")

    def _prepare(self, directory: str, into: str, barrier: Optional[Callable[[], None]]) -> None:
        """The checkpoint's directory (`into` while it is written) and the layout's
        folders in it, made by rank 0 while the others wait at `barrier` (a metadata
        server sees one mkdir each, not one per rank); without a barrier each rank
        that writes makes them. Object stores need none."""
        if not self.backend.has_directories:
            return
        if barrier is None:
            mine = self.rank_plan(self.rank)
            if mine.files or mine.commit_files:
                self._make_dirs(directory, into)
            return
        if self.rank == 0:
            self._make_dirs(directory, into)
        barrier()

    def _probe(self, directory: str) -> None:
        """The layout's framework asks, on every rank, whether the checkpoint is already there
        (DCP's overwrite check: a HEAD of .metadata on object storage)."""
        if self.layout.existence_probe:
            self.backend.exists(f"{directory}/{self.layout.existence_probe}")

    def _make_dirs(self, directory: str, into: str) -> None:
        for d in [into] + [self._target(directory, into, sub) for sub in self.layout.subdirs(
                self.cfg.shape, self.cfg.parallelism, self.job.saved_ranks)]:
            self.backend.prepare(d)

    def write_path(self, step: int, name: str, epoch: int = 1) -> str:
        """Where this run's save writes file `name` of checkpoint `step` before its
        commit (a staged checkpoint's temporary folders included), below the root."""
        return self._target(self.directory(step, epoch), self.write_dir(step, epoch), name)

    def _staged_item(self, directory: str, into: Optional[str]) -> Optional[tuple[str, str]]:
        """The layout's item folder and its temporary name while a staged checkpoint is written."""
        return self.layout.item_staging() if into and into != directory else None

    def _target(self, directory: str, into: Optional[str], name: str) -> str:
        """Where file or folder `name` of the checkpoint is written: in `into` while
        the checkpoint is staged, its item folder under the temporary name."""
        staged = self._staged_item(directory, into)
        if staged and (name == staged[0] or name.startswith(staged[0] + "/")):
            name = staged[1] + name[len(staged[0]):]
        return f"{into or directory}/{name}"

    def _spans(self, step: int) -> Optional[SpanSink]:
        return self.tracer.chunk_sink(step) if self.tracer else None

    def _traced(self, step: int, phase: str, files: list[FileStats]) -> list[FileStats]:
        """Files done, told to the tracer in the thread that did them."""
        if self.tracer:
            for stats in files:
                self.tracer.file_done(step, phase, stats)
        return files

    def write_files(self, directory: str, files: tuple[plan.ShardFile, ...], progress: Progress, step: int,
                    writer: int) -> list[FileStats]:
        """Generate and write files outside the plan (a conversion's) below `directory`,
        their content that of saved rank `writer`'s files of those names there."""
        return self._save_generated(directory, files, progress, step, writer=writer)

    def read_range(self, directory: str, r: load_plan.ReadRange, step: int, progress: Progress) -> FileStats:
        """Read range r below `directory`, verified against writer r.writer's content there."""
        return self._read_range(directory, r, step, progress)

    def write_root_file(self, name: str, content: bytes) -> None:
        self._write_root_file(name, content)

    def _save_generated(self, directory: str, files: tuple[plan.ShardFile, ...], progress: Progress,
                        step: int, into: Optional[str] = None, writer: Optional[int] = None) -> list[FileStats]:
        """Generate and write `files` in order. Where the storage lends each upload
        its own memory (S3), a file is closed only once the next concurrent_files
        - 1 files' bytes were sent, so its last parts upload while they start;
        on any failure every file still open is aborted. `into`: the folder the
        files go in when it is not their checkpoint's directory (a temporary one)."""
        window = FileWindow(self.cfg.concurrent_files if self.backend.lends_write_memory else 1)
        saved = []
        try:
            for f in files:
                closed = self._write_file(directory, into, f, lambda path, f=f: send_file(
                    self.backend, path, f.size, self.content(directory, self.rank if writer is None else writer,
                                                             f.name), self.write_buffers(),
                    self.gen_threads, progress, window, self._spans(step)), window)
                saved += self._traced(step, "save", self._observed(closed, step))
            saved += self._traced(step, "save", self._observed(window.close_all(), step))
        except BaseException:
            window.abort()
            raise
        return saved

    def _write_file(self, directory: str, into: Optional[str], f: plan.ShardFile,
                    send: Callable[[str], list[FileStats]], window: Optional[FileWindow] = None) -> list[FileStats]:
        """`send` writes file f at the path it is given: its place, or first its
        temporary name (f.tmp_suffix), closed, then renamed, as its framework
        commits it. Returns the files closed, named as they end."""
        path = self._target(directory, into, f.name)
        renames = self.backend.has_directories or self.backend.renames_objects
        staged = f"{path}{f.tmp_suffix}" if f.tmp_suffix and renames else path
        closed = send(self._named(staged))
        if staged != path:
            closed += window.close_all() if window else []
            if f.name == self.layout.existence_probe and self.backend.exists(path):  # DCP's finish()
                self.backend.delete_file(path)
            self.backend.rename(staged, path)
            closed = [replace(c, name=c.name[:-len(f.tmp_suffix)]) if c.name.endswith(staged) else c for c in closed]
        return closed

    def _named(self, path: str) -> str:
        """The file being written or read now, for whoever must name it (a stall)."""
        self.current_file = path
        return path

    def _observed(self, closed: list[FileStats], step: int) -> list[FileStats]:
        """Files closed: their fill and I/O time tell the thread chooser."""
        for stats in closed:
            self.threads.observe(stats.fill_s, stats.io_s + stats.close_s, stats.nbytes, step)
        return closed

    def _commit(self, directory: str, barrier: Optional[Callable[[], None]], progress: Progress,
                step: int, into: Optional[str] = None) -> list[FileStats]:
        """The layout's commit (DCP's): once every rank has finished its files,
        rank 0 writes the commit files (.metadata, an index), and the save
        returns on every rank only after that (DCP's all_reduce of the write
        results); a checkpoint written into a temporary folder is renamed to its
        directory then (Orbax's). A checkpoint counts as saved then."""
        if not self.layout.committed:
            return []
        if barrier:
            barrier()
        commit = self.rank_plan(self.rank).commit_files
        staged = self._staged_item(directory, into)
        item = tuple(f for f in commit if staged and f.name.startswith(staged[0] + "/"))
        saved = self._save_generated(directory, item, progress, step, into)
        if item:  # the item committed by its own rename first (Orbax's)
            self.backend.rename(f"{into}/{staged[1]}", f"{into}/{staged[0]}")
        # the rest lie outside the item (the step's own files)
        saved += self._save_generated(directory, tuple(f for f in commit if f not in item), progress, step, into)
        if commit and into and into != directory:
            self.backend.rename(into, directory)
        if self.rank == 0:  # the save root's pointer to the last whole checkpoint (and scripts), last of all
            for name, content in self.layout.root_files(step):
                self._write_root_file(name, content)
        if barrier:
            barrier()
        return saved

    def _write_root_file(self, name: str, content: bytes) -> None:
        """Written in place, as Megatron and DeepSpeed write their trackers (no
        temporary file, no rename): a reader during the write can see it empty.
        Through the pool's aligned buffers, as every file (O_DIRECT needs them)."""
        send_file(self.backend, self._named(name), len(content), ContentSpec(0, prefix=content),
                  self.write_buffers(), 1)

    def save(self, step: int, epoch: int = 1, progress: Progress = None,
             barrier: Optional[Callable[[], None]] = None) -> list[FileStats]:
        """Generate and write this rank's files; with a committed layout,
        `barrier` (every rank's) brackets the commit."""
        directory, into = self.directory(step, epoch), self.write_dir(step, epoch)
        self._prepare(directory, into, barrier)
        self._probe(directory)
        return self._save_generated(directory, self.files(self.rank), progress, step, into) + \
            self._commit(directory, barrier, progress, step, into)

    def stage(self, step: int, epoch: int = 1) -> dict:
        """Async mode, the part that blocks training: this rank's state copied
        into the staging area. Generation (the emulated device memory) is timed
        apart and is not part of staging."""
        directory = self.directory(step, epoch)
        area, source = self.staging_area(), self.write_buffers().scratch(self.cfg.chunk_size)
        copy_s = 0.0
        for f in self.files(self.rank):
            self.staged_fill_s[f.name], copy = stage_file(self.content(directory, self.rank, f.name), area.view(f.name),
                                                          source[:self.cfg.chunk_size], self.gen_threads)
            copy_s += copy
        return {"fill_s": sum(self.staged_fill_s.values()), "staging_s": copy_s,
                "bytes": sum(f.size for f in self.files(self.rank))}

    def persist(self, step: int, epoch: int = 1, progress: Progress = None,
                barrier: Optional[Callable[[], None]] = None) -> list[FileStats]:
        """Async mode, in the background: write the staged files, then commit."""
        directory, into = self.directory(step, epoch), self.write_dir(step, epoch)
        self._prepare(directory, into, barrier)
        self._probe(directory)
        area = self.staging_area()
        saved = []
        for f in self.files(self.rank):
            # a file written again (Orbax's manifest at each commit) is staged once, at its last size
            stats = self._write_file(directory, into, f, lambda path, f=f: [write_from_memory(
                self.backend, path, area.view(f.name)[:f.size], self.cfg.chunk_size, progress, self._spans(step))])
            for s in stats:  # its content was generated while staging: the report's generation figure
                s.fill_s, s.gen_threads = self.staged_fill_s.get(f.name, 0.0), self.gen_threads
            saved += self._traced(step, "save", stats)
        return saved + self._commit(directory, barrier, progress, step, into)

    def load(self, step: int, epoch: int = 1, progress: Progress = None) -> list[FileStats]:
        """Read this rank's ranges of checkpoint `step` (load_plan), each
        checked against the content regenerated at its offset when verifying;
        with share=broadcast, a range several ranks read is split among them.
        Returns the storage reads only (the broadcast is in last_broadcast)."""
        directory = self.layout.load_dir(self.cfg.parallelism, self.job, self.directory(self.cfg.read_step(step), epoch))
        if not self.shares():
            return [self._read_range(directory, r, step, progress) for r in self.reads()]
        self.last_broadcast = {"broadcast_bytes": 0, "broadcast_s": 0.0}
        out = []
        for members, ranges in self.share_groups():
            if len(members) == 1:
                out += [self._read_range(directory, r, step, progress) for r in ranges]
                continue
            group = self.sharer(members)
            for r in ranges:
                owner = self.layout.read_owner(self.cfg.shape, self.cfg.parallelism, self.job, self.rank, r,
                                               self.reads())
                if owner is not None:  # one member reads the range whole for all (fastsafetensors)
                    owner = members.index(owner)
                out += self._share_range(directory, r, group, step, progress, owner)
        return out

    def shares(self) -> bool:
        """Whether ranks reading the same range split it and broadcast (the layout's loader may always)."""
        return self.layout.shares(self.job, self.cfg.checkpoint.share)

    def _share_range(self, directory: str, r: load_plan.ReadRange, group: Broadcast, step: int,
                     progress: Progress, owner: Optional[int] = None) -> list[FileStats]:
        pool, st = self.read_buffers(), self.cfg.streaming
        window, received = self.share_buffers()
        shared = read_shared(self.backend, self._named(f"{directory}/{r.name}"), r.file_size, r.offset, r.length,
                             group, pool, window, received,
                             self.cfg.read_size, self.cfg.read_parallelism,
                             self.content(directory, r.writer, r.name) if st.verify else None, self.gen_threads,
                             progress, pool.scratch(self.cfg.read_size) if st.verify else None, owner)
        self.last_broadcast["broadcast_bytes"] += shared.broadcast_bytes
        self.last_broadcast["broadcast_s"] += shared.broadcast_s
        return self._traced(step, "load", shared.storage)

    def share_buffers(self) -> tuple[memoryview, memoryview]:
        """share=broadcast: one window of this rank's part (a request in flight
        each), and one piece received."""
        if self._share_window is None:
            self._share_window = (allocate(self.cfg.read_parallelism * self.cfg.read_size),
                                  allocate(self.cfg.read_size))
        return memoryview(self._share_window[0]), memoryview(self._share_window[1])

    def _read_range(self, directory: str, r: load_plan.ReadRange, step: int, progress: Progress) -> FileStats:
        content = self.content(directory, r.writer, r.name) if self.cfg.streaming.verify else None
        return self._traced(step, "load", [load_file(
            self.backend, self._named(f"{directory}/{r.name}"), r.file_size, self.read_buffers(), content,
            self.cfg.read_parallelism, self.gen_threads, progress, self.cfg.read_size, self._spans(step),
            r.offset, r.length, cuts=r.cuts)])[0]

    def inventory(self, checkpoints: list[CheckpointId], saved: bool = False) -> dict:
        """Compare one listing of the checkpoint folder with the plan; after
        this run's saves (`saved`), also the layout's tracker at the root.

        Call on one rank only: a listing per rank is a LIST storm at scale.
        """
        expected = self.expected_sizes(checkpoints)
        found = {}
        for step, epoch in checkpoints:
            found.update(self.backend.list_sizes(self.directory(step, epoch)))
        for name, content in self.layout.root_files(max(s for s, _ in checkpoints)) if saved and checkpoints else ():
            expected[name] = len(content)
            if self.backend.read_marker(name) == content:  # naming another checkpoint, it is missing
                found[name] = len(content)
        missing = sorted(set(expected) - set(found))
        wrong = sorted(p for p in expected if p in found and found[p] != expected[p])
        result = {"expected": len(expected), "present": len(set(expected) & set(found)),
                  "missing": missing[:20], "wrong_size": [[p, found[p], expected[p]] for p in wrong[:20]],
                  "unexpected": sorted(set(found) - set(expected))[:20]}
        result["ok"] = not missing and not wrong
        result["message"] = (f"{result['present']} files present, {result['expected']} expected, "
                             + ("sizes match" if result["ok"] else
                                f"{len(missing)} missing, {len(wrong)} with a wrong size"))
        return result

    def remove_written(self, checkpoints: list[CheckpointId]) -> int:
        """Delete exactly the files this rank wrote in the given checkpoints (as
        many a request as the storage takes): every rank its own, so cleanup
        lasts the slowest rank's share. Returns the files deleted."""
        mine = self.rank_plan(self.rank) if checkpoints else None
        roots = self.layout.root_files(max(s for s, _ in checkpoints)) if self.rank == 0 and checkpoints else ()
        converted = self.converted[1] if self.converted else []
        if converted and self.rank == 0:
            converted = converted + [universal_plan.LATEST_UNIVERSAL]
        return self.backend.delete_files(list(dict.fromkeys(
            [f"{self.directory(s, e)}/{f.name}" for s, e in checkpoints for f in mine.all_files]
            + [name for name, _ in roots] + converted)))

    def remove_empty_dirs(self, checkpoints: list[CheckpointId]) -> None:
        """After every rank's remove_written, on one rank: the step directories that
        left empty (never one holding files this run did not write)."""
        subdirs = self.layout.subdirs(self.cfg.shape, self.cfg.parallelism, self.job.saved_ranks)
        if self.converted:
            into = self.converted[0]
            names = [f.name for x in universal_plan.params(self.cfg.shape, self.cfg.parallelism.tensor)
                     for f in universal_plan.merged_files(self.cfg.shape, self.cfg.parallelism, x)]
            for folder in reversed(universal_plan.folders(names)):
                self.backend.remove_empty_dir(f"{into}/{folder}")
            self.backend.remove_empty_dir(into)
        for step, epoch in checkpoints:
            directory = self.directory(step, epoch)
            for sub in reversed(subdirs):
                self.backend.remove_empty_dir(f"{directory}/{sub}")
            self.backend.remove_empty_dir(directory)

    def close(self) -> None:
        for pool in (self.pool, self.read_pool, self.staging):
            if pool is not None:
                pool.close()
        for buf in self._share_window or ():
            release(buf)
        self.pool = self.read_pool = self.staging = self._share_window = None


def inventory_error(result: dict) -> StorageError:
    details = "; ".join([f"missing {p}" for p in result["missing"][:5]] +
                        [f"{p} has {got} bytes, expected {want}" for p, got, want in result["wrong_size"][:5]])
    return StorageError(f"checkpoint inventory failed: {result['message']}: {details}")
