"""What every layout answers: the files each rank writes, the ranges each rank
reads, and its own refusals. A layout module subclasses Layout and overrides
what its framework does differently; the rest of the package asks a layout
object (layouts.get) and never compares a layout's name."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Optional

from dlio_ckpt_ext.shared_plans import load_plan, plan
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.recovery import discovery, saved_shape
from dlio_ckpt_ext.recovery.saved_shape import SavedShape
from dlio_ckpt_ext.shared_plans.load_plan import LoadJob, ReadRange
from dlio_ckpt_ext.shared_plans.plan import ModelShape, Parallelism, RankPlan


class Layout:
    #: the value of checkpoint.layout
    name = ""
    #: rank 0 writes RankPlan.commit_files once every rank's files are down, and
    #: the save returns on every rank only after them (DCP's .metadata, an index)
    committed = False
    #: published weights loaded by serving replicas, not a training checkpoint:
    #: loads follow workload.model_load.pattern and read one publish again and again
    model_load = False
    #: the load patterns and the key that chooses one
    patterns: tuple[str, ...] = load_plan.RESTORE_PATTERNS
    pattern_key = "checkpoint.restore"
    #: the framework whose files these are, for the results
    framework = ""
    #: how its framework loads a checkpoint saved at another world size (a resume's RECOVERY line)
    reshards = ""
    #: what the framework's own save waits for on a file system (as strace showed it,
    #: fidelity/manifests): RESULTS says it beside what ours waits for
    durability = ""
    #: MLPerf Storage's reference layout: the only one a CLOSED submission writes
    mlperf_closed = False
    #: checkpoint.replicas means something to it (Orbax's slices); the others refuse it
    has_replicas = False
    #: checkpoint.devices_per_rank and checkpoint.platform mean something to it (Orbax's)
    has_devices = False
    #: model.parallelism.overlap_grad_reduce means something to it (Megatron's DDP buckets)
    has_buckets = False
    #: checkpoint.deepspeed_files means something to it (DeepSpeed's own files beside DLIO's)
    has_framework_files = False
    #: a file of the checkpoint every rank asks about before it writes, and the commit again before
    #: renaming onto it (torch DCP's FileSystemWriter: its overwrite check and finish()); on object
    #: storage each is a HEAD, a stat on a file system
    existence_probe = ""
    #: its checkpoint names carry DLIO's epoch beside the step (DLIO's own names);
    #: the others name a checkpoint by the training iteration alone, as their frameworks do
    names_epoch = False

    # -- names ----------------------------------------------------------------
    def checkpoint_dir(self, step: int, epoch: int = 1) -> str:
        """The directory of one checkpoint, below the checkpoint folder."""
        raise NotImplementedError

    def staging_dir(self, step: int, epoch: int = 1) -> Optional[str]:
        """Where a checkpoint is written before its commit renames it to
        checkpoint_dir, on storage with directories (Orbax's temporary folder);
        None: written in place. Object stores always write in place."""
        return None

    def item_staging(self) -> Optional[tuple[str, str]]:
        """(folder, temporary name) of a folder of the checkpoint written under the
        temporary name and renamed by the commit before the checkpoint's own
        rename (Orbax's item), when the checkpoint is staged; None: none."""
        return None

    def subdirs(self, m: ModelShape, p: Parallelism, world: int) -> list[str]:
        """Folders below a checkpoint's directory that its files go in, parents
        first: made by rank 0 before any rank writes."""
        return []

    def tracker(self, step: int) -> Optional[tuple[str, bytes]]:
        """The file at the checkpoint folder's root that names the last whole
        checkpoint (Megatron's), and its content, written after the commit; None: none."""
        return None

    def root_files(self, step: int) -> tuple[tuple[str, bytes], ...]:
        """Every file rank 0 writes at the checkpoint folder's root after a
        checkpoint (the tracker, scripts), with its content, in writing order."""
        tracker = self.tracker(step)
        return (tracker,) if tracker else ()

    def step_of(self, name: str) -> Optional[tuple[int, int]]:
        """(step, epoch) of a checkpoint folder named `name`; None for any other entry."""
        return _named(self.checkpoint_dir, name)

    def staged_step_of(self, name: str) -> Optional[tuple[int, int]]:
        """(step, epoch) of a checkpoint folder still under its temporary name (never committed)."""
        return _named(self.staging_dir, name)

    def find_latest(self, look: discovery.Look, expected: discovery.Expected) -> discovery.Latest:
        """The newest whole checkpoint below the folder, found as the layout's
        framework finds it on restart; expected(world): one checkpoint's files and
        sizes saved at `world` ranks (every rank's plan: asked for only where the
        framework's way needs it)."""
        return discovery.by_listing(self, look, expected)

    def saved_shape(self, look: discovery.Look, name: str) -> Optional[SavedShape]:
        """How the checkpoint in folder `name` was saved, read from it as its
        framework reads it (on one rank; look.listed holds the folders it has
        listed already). None: nothing in it says (a publish: any world loads it)."""
        return None

    def shape_header(self, p: Parallelism, world: int) -> bytes:
        """The head line of the file that records the save's shape (DCP's and Megatron's .metadata)."""
        return saved_shape.header(world, p)

    def facts(self, m: ModelShape, p: Parallelism, world: int) -> list[str]:
        """What the plan command says of the save's structure beyond files and
        bytes (Megatron's DDP buckets, Orbax's processes), a line each."""
        return []

    def variant(self, p: Parallelism) -> "Layout":
        """This layout as p's settings choose it (DeepSpeed's own files); itself for most."""
        return self

    # -- the save plan --------------------------------------------------------
    def check(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        """The layout's own refusals, after the checks every layout shares."""

    def validate(self, m: ModelShape, p: Parallelism, comm_size: int) -> None:
        """Raise ConfigError for a shape, parallelism or world size this layout cannot be saved at."""
        plan.validate(m, p, comm_size)
        if not self.has_replicas and p.replicas != 1:
            raise ConfigError("checkpoint.replicas", p.replicas, f"1 with checkpoint.layout {self.name} (its "
                                                                 "replicas follow from the parallelism)")
        if isinstance(p.replicas, bool) or not isinstance(p.replicas, int) or p.replicas < 1:
            raise ConfigError("checkpoint.replicas", p.replicas, "a positive integer")
        self.check(m, p, comm_size)

    def plan_rank(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        """The files `rank` writes, validated inputs (each layout's own)."""
        raise NotImplementedError

    def rank_plan(self, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
        """The files `rank` writes in one checkpoint, with exact byte sizes."""
        return _rank_plan(self, m, p, world, rank)

    def checkpoint_bytes(self, m: ModelShape, p: Parallelism, world: int) -> int:
        """Bytes of one whole checkpoint, all ranks together."""
        return sum(self.rank_plan(m, p, world, r).total_bytes for r in range(world))

    def saved_files(self, m: ModelShape, p: Parallelism, world: int) -> dict[str, int]:
        """Every file of the saved checkpoint, name -> size."""
        return {f.name: f.size for r in range(world) for f in self.rank_plan(m, p, world, r).all_files}

    # -- the load plan --------------------------------------------------------
    def validate_job(self, m: ModelShape, p: Parallelism, job: LoadJob) -> None:
        """Raise ConfigError for a load no framework makes (keys as DLIO's config names them)."""
        if job.pattern not in self.patterns:
            raise ConfigError(self.pattern_key, job.pattern, " or ".join(self.patterns))
        if isinstance(job.saved_ranks, bool) or not isinstance(job.saved_ranks, int) or job.saved_ranks <= 0:
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks, "a positive integer (0: this run's ranks)")
        if not job.resharded:
            return
        if job.pattern == "own":
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              f"this run's {job.ranks} ranks with restore=own (each rank reads the files it "
                              "wrote); a checkpoint saved at another world size is read with restore=framework")
        if p.mode == "subset":
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              "this run's ranks in subset mode (a subset's files are no whole checkpoint to "
                              "reshard)")
        try:
            self.validate(m, p, job.saved_ranks)
        except ConfigError as exc:
            raise ConfigError("checkpoint.saved_ranks", job.saved_ranks,
                              f"a world size the layout can be saved at ({exc.key}: {exc.allowed})") from None

    def saved(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> RankPlan:
        """What saved rank `rank` wrote, at the saved world size."""
        return self.rank_plan(m, p, job.saved_ranks, rank)

    def load_dir(self, p: Parallelism, job: LoadJob, directory: str) -> str:
        """The folder a load of checkpoint folder `directory` reads its ranges in
        (DeepSpeed's universal checkpoint beside it, at another world size)."""
        return directory

    def read_files(self, m: ModelShape, p: Parallelism, job: LoadJob) -> dict[str, int]:
        """Every file a load reads from, name -> size: the saved checkpoint's, or its conversion's."""
        return self.saved_files(m, p, job.saved_ranks)

    def converts(self, p: Parallelism, job: LoadJob) -> bool:
        """Whether the load needs the checkpoint converted first (load_dir is then the conversion's)."""
        return False

    def metadata_reads(self, m: ModelShape, p: Parallelism, job: LoadJob) -> list[ReadRange]:
        """Files every loading rank reads whole before its data (DCP's .metadata)."""
        return []

    def rank_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> tuple[ReadRange, ...]:
        """The ranges `rank` of the loading job reads, in the order it reads them."""
        if not 0 <= rank < job.ranks:
            raise ConfigError("rank", rank, f"0..{job.ranks - 1}")
        if job.pattern == "own":
            src = (rank + job.shift) % job.ranks
            # a file written again (Orbax's manifest at each commit) is read once, as it ended
            last = {f.name: f for f in self.saved(m, p, job, src).files}
            return tuple(self.metadata_reads(m, p, job) + [load_plan.whole(f, src) for f in last.values()])
        return tuple(self.framework_reads(m, p, job, rank))

    def framework_reads(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int) -> list[ReadRange]:
        """restore=framework: what the layout's framework reads on `rank`."""
        raise NotImplementedError

    def range_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange,
                      rank: int = 0) -> tuple[int, ...]:
        """Every rank of the loading job whose plan reads exactly range r: the
        group that shares it (share=broadcast). O(the ranks that could read it)."""
        if r.name in {f.name for f in self.saved(m, p, job, 0).commit_files}:
            return tuple(range(job.ranks))  # read whole by every rank
        return tuple(c for c in self.candidate_readers(m, p, job, r) if r in self.rank_reads(m, p, job, c))

    def candidate_readers(self, m: ModelShape, p: Parallelism, job: LoadJob, r: ReadRange) -> Iterable[int]:
        """The ranks that could read range r (a superset; range_readers keeps those that do)."""
        if job.pattern == "own":
            return [(r.writer - job.shift) % job.ranks]
        return range(job.ranks)

    def shares(self, job: LoadJob, share: str) -> bool:
        """Whether ranks reading the same range split it and broadcast."""
        return share == "broadcast"

    def read_owner(self, m: ModelShape, p: Parallelism, job: LoadJob, rank: int, r: ReadRange,
                   reads: tuple[ReadRange, ...]) -> Optional[int]:
        """The one member of a sharing group that reads range r whole for all,
        where the loader has one (None: the members split it)."""
        return None

    def owner_reads(self, job: LoadJob) -> bool:
        """Whether one member of each sharing group reads a range whole for all (read_owner)."""
        return False

    def storage_group(self, p: Parallelism, rank: int) -> Optional[int]:
        """Where one member reads for all (owner_reads): the group `rank` shares with."""
        return None

    def reads_inside_files(self, job: LoadJob) -> bool:
        """Whether a load reads ranges that start inside a file (content made
        with dedup or compression then regenerates only from a file's start)."""
        return False

    def summary(self, m: ModelShape, p: Parallelism, job: LoadJob, read_size: int, share: str = "none") -> dict:
        """The whole job's load, from the plans alone: bytes and requests per rank,
        readers per file (fan-in: the ranks that get its bytes, and the ranks that
        ask storage for them), bytes read against the checkpoint's size
        (amplification), and with sharing the bytes storage serves and the
        broadcast carries. O(ranks x ranges a rank reads)."""
        files = self.read_files(m, p, job)
        size = sum(files.values())
        shared = self.shares(job, share)
        owner_reads = self.owner_reads(job)
        readers: dict[str, set[int]] = {}
        groups: dict[tuple, set[int]] = {}  # with sharing: (group, range) -> its readers
        per_rank = []
        for rank in range(job.ranks):
            reads = self.rank_reads(m, p, job, rank)
            for r in reads:
                readers.setdefault(r.name, set()).add(rank)
                if shared:
                    group = self.storage_group(p, rank) if owner_reads else None
                    groups.setdefault((group, r.key), set()).add(rank)
            per_rank.append((rank, sum(r.length for r in reads), sum(load_plan.requests(r, read_size) for r in reads), reads))
        total = sum(b for _, b, _, _ in per_rank)
        req_by_file: dict[str, int] = {}
        storage_readers: dict[str, int] = {}
        if shared:
            storage = storage_requests = 0
            for (_, (name, offset, length)), ranks in groups.items():
                pieces = load_plan.pieces(offset, length, read_size)
                storage += length
                storage_requests += pieces
                req_by_file[name] = req_by_file.get(name, 0) + pieces
                storage_readers[name] = storage_readers.get(name, 0) + (1 if owner_reads else load_plan.parts(pieces, len(ranks)))
        else:
            storage, storage_requests = total, sum(q for _, _, q, _ in per_rank)
            for _, _, _, reads in per_rank:
                for r in reads:
                    req_by_file[r.name] = req_by_file.get(r.name, 0) + load_plan.requests(r, read_size)
            storage_readers = {name: len(ranks) for name, ranks in readers.items()}
        fan_in = [len(v) for v in readers.values()] or [0]
        asking = list(storage_readers.values()) or [0]
        rank_bytes = [b for _, b, _, _ in per_rank]
        return {"pattern": job.pattern, "share": "broadcast" if shared else "none", "ranks": job.ranks,
                "saved_ranks": job.saved_ranks, "layout": self.name, "model_load": self.model_load, "read_size": read_size,
                "checkpoint_bytes": size, "checkpoint_files": len(files),
                "bytes_read": total, "storage_bytes": storage, "broadcast_bytes": total - storage,
                "amplification": total / size if size else 0.0,
                "storage_amplification": storage / size if size else 0.0,
                "requests": sum(q for _, _, q, _ in per_rank), "storage_requests": storage_requests,
                "files_read": len(readers), "files_unread": len(files) - len(readers),
                "readers_per_file_max": max(fan_in), "readers_per_file_mean": sum(fan_in) / len(fan_in),
                "storage_readers_per_file_max": max(asking), "storage_readers_per_file_mean": sum(asking) / len(asking),
                "requests_per_file_max": max(req_by_file.values(), default=0),
                "requests_per_file_mean": (sum(req_by_file.values()) / len(req_by_file)) if req_by_file else 0.0,
                "rank_bytes_min": min(rank_bytes), "rank_bytes_max": max(rank_bytes),
                "per_rank": [{"rank": rank, "bytes": b, "requests": q, "ranges": len(reads)}
                             for rank, b, q, reads in per_rank]}


_STEP, _EPOCH = 1234567, 7654321


def _named(name_of, name: str) -> Optional[tuple[int, int]]:
    """Read a folder's name back through the function that makes it (step, epoch) -> name."""
    sample = name_of(_STEP, _EPOCH)
    if sample is None:
        return None
    pattern = re.escape(sample).replace(str(_STEP), r"(?P<step>\d+)", 1).replace(str(_EPOCH), r"(?P<epoch>\d+)", 1)
    m = re.fullmatch(pattern, name)
    if m is None:
        return None
    return int(m["step"]), int(m["epoch"]) if "epoch" in m.groupdict() else 1


@lru_cache(maxsize=8192)
def _rank_plan(layout: Layout, m: ModelShape, p: Parallelism, world: int, rank: int) -> RankPlan:
    layout.validate(m, p, world)
    if not 0 <= rank < world:
        raise ConfigError("rank", rank, f"0..{world - 1}")
    return layout.plan_rank(m, p, world, rank)
