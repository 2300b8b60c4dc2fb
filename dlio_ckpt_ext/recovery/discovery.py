"""The newest whole checkpoint in a checkpoint folder, found as a restarting
job's framework finds it, every request counted (docs/recovery.md).

The layouts choose their framework's way (Layout.find_latest); the ways
themselves are here: a tracker file every rank reads (Megatron, DeepSpeed's
`latest`), a listing with a commit marker probed in each candidate
(torchtitan's DCP), a listing with the commit check (Orbax), and a bare
listing whose newest complete folder wins (DLIO's files, a publish), the
completeness judged from the listing's sizes against the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from dlio_ckpt_ext.recovery.saved_shape import SavedShape

CheckpointId = tuple[int, int]  # (step, epoch)
#: keys an object store's listing returns a page
LIST_PAGE = 1000


class Storage(Protocol):
    """What a discovery asks of the storage (the engine's Backend answers it)."""
    has_directories: bool
    def children(self, directory: str) -> list[str]: ...
    def list_sizes(self, directory: str) -> dict[str, int]: ...
    def read_marker(self, path: str) -> Optional[bytes]: ...
    def exists(self, path: str) -> bool: ...


class Look:
    """One rank's requests while it looks, counted by kind (LIST, GET, HEAD).

    agree_max(v): the largest v of every rank (an all-reduce); share(v): rank
    0's v on every rank (a broadcast). A single process passes identities."""

    def __init__(self, backend: Storage, rank: int, agree_max: Callable[[int], int] = lambda v: v,
                 share: Callable[[object], object] = lambda v: v) -> None:
        self.backend, self.rank, self.agree_max, self.share = backend, rank, agree_max, share
        self.requests: dict[str, int] = {}
        #: each folder this rank listed, its names: what a framework's glob of it saw
        self.listed: dict[str, list[str]] = {}

    def _count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    def _listed(self, entries: int) -> None:
        # an object store answers a listing 1,000 entries a page (ListObjectsV2, List Blobs)
        pages = 1 if self.backend.has_directories else max(1, -(-entries // LIST_PAGE))
        self.requests["LIST"] = self.requests.get("LIST", 0) + pages

    def list(self, directory: str = "") -> list[str]:
        names = self.backend.children(directory)
        self._listed(len(names))
        self.listed[directory] = names
        return names

    def sizes(self, directory: str) -> dict[str, int]:
        found = self.backend.list_sizes(directory)
        self._listed(len(found))
        below = directory.strip("/") + "/" if directory.strip("/") else ""
        self.listed[directory] = sorted({k[len(below):].split("/", 1)[0] for k in found})
        return found

    def read(self, path: str) -> Optional[bytes]:
        self._count("GET")
        return self.backend.read_marker(path)

    def exists(self, path: str) -> bool:
        self._count("HEAD")
        return self.backend.exists(path)


@dataclass
class Latest:
    """What a discovery found: the checkpoint (None: no whole one), its folder,
    the newer folders it passed over as half-written, how it looked, and how
    the checkpoint was saved where the looking learned it (saved_shape)."""
    checkpoint: Optional[CheckpointId]
    name: str = ""
    skipped: list[str] = field(default_factory=list)
    how: str = ""
    saved: Optional[SavedShape] = None

    def warning(self) -> Optional[str]:
        if not self.skipped:
            return None
        found = f"restoring {self.name}" if self.checkpoint else "no whole checkpoint found"
        return (f"[WARNING] half-written checkpoint {', '.join(self.skipped)} skipped (no commit, or files missing "
                f"or short): {found}")


def listed(layout, names: list[str]) -> list[tuple[int, int, str]]:
    """The checkpoint folders among `names`, newest first: (step, epoch, name)."""
    found = [(*ident, n) for n in names if (ident := layout.step_of(n)) is not None]
    return sorted(found, key=lambda f: (f[1], f[0]), reverse=True)


def half_written(layout, names: list[str], than: Optional[CheckpointId]) -> list[str]:
    """Folders newer than checkpoint `than` (a committed one, or none): whole
    ones would have been found, so these are half-written, as are temporary ones."""
    newer = [n for s, e, n in listed(layout, names) if than is None or (e, s) > (than[1], than[0])]
    staged = [n for n in names if (ident := layout.staged_step_of(n)) is not None
              and (than is None or (ident[1], ident[0]) > (than[1], than[0]))]
    return sorted(newer + staged)


def _newer_on_rank0(layout, look: Look, found: Optional[CheckpointId]) -> list[str]:
    """Rank 0's one listing naming what the framework passed over (ours: so the warning can name it)."""
    return look.share(half_written(layout, look.list(), found) if look.rank == 0 else None)


def whole(sizes: dict[str, int], name: str, expected: dict[str, int]) -> bool:
    return all(sizes.get(f"{name}/{f}") == n for f, n in expected.items())


#: one checkpoint's files, every rank's, name -> size, at a saved world size (None: this run's)
Expected = Callable[[Optional[int]], dict[str, int]]


def by_listing(layout, look: Look, expected: Expected) -> Latest:
    """Rank 0 lists the folder, then each candidate newest first until one holds
    every planned file at its size, planned at the world size the candidate's
    own names say it was saved at (expected: asked for on rank 0 alone); every
    rank gets its answer (no framework marker to trust: DLIO's files, Hugging
    Face's checkpoint-N)."""
    answer = None
    if look.rank == 0:
        skipped, found, shape = [], None, None
        for step, epoch, name in listed(layout, look.list()):
            sizes = look.sizes(name)
            shape = layout.saved_shape(look, name)
            if whole(sizes, name, expected(shape.world if shape else None)):
                found = (step, epoch)
                break
            skipped.append(name)
        answer = (found, sorted(skipped), shape if found else None)
    found, skipped, shape = look.share(answer)
    return Latest(found, layout.checkpoint_dir(*found) if found else "", skipped,
                  "rank 0 lists the folder, then each newest candidate's files against the plan", shape)


def saved_shape(layout, look: Look, latest: Latest) -> Optional[SavedShape]:
    """How the found checkpoint was saved: what the looking learned, else rank 0
    reads the layout's record once and every rank gets its answer."""
    if latest.checkpoint is None or latest.saved is not None:
        return latest.saved
    return look.share(layout.saved_shape(look, latest.name) if look.rank == 0 else None)


def by_tracker(layout, look: Look, tracker: str, parse: Callable[[bytes], Optional[int]],
               expected: Expected,
               opened: Callable[[Look, str], None] = lambda look, name: None) -> Latest:
    """Every rank probes and reads the tracker file, then the largest iteration
    of all ranks wins (Megatron's all-reduce), and each rank makes its
    framework's requests in the folder it names (`opened`); with no tracker on
    any rank, a listing (DeepSpeed's load would start from scratch: ours goes on
    as a user restarting by hand would)."""
    text = look.read(tracker) if look.exists(tracker) else None
    step = parse(text) if text else None
    step = look.agree_max(-1 if step is None else step)
    if step < 0:
        latest = by_listing(layout, look, expected)
        latest.how = f"no {tracker} on any rank: " + latest.how
        return latest
    found = (step, 1)
    opened(look, layout.checkpoint_dir(step))
    return Latest(found, layout.checkpoint_dir(step), _newer_on_rank0(layout, look, found),
                  f"every rank reads {tracker}, a max all-reduce, then its folder; rank 0 lists the checkpoint "
                  "folder to name what was passed over (ours)")


def by_probe(layout, look: Look, markers: tuple[str, ...]) -> Latest:
    """Every rank lists the folder and probes every marker in every candidate
    (torchtitan's _find_load_step); the newest holding the first one wins."""
    names = look.list()
    marked = []
    for step, epoch, name in listed(layout, names):
        there = [look.exists(f"{name}/{m}") for m in markers]
        if there[0]:
            marked.append((step, epoch))
    found = marked[0] if marked else None
    return Latest(found, layout.checkpoint_dir(*found) if found else "", half_written(layout, names, found),
                  f"every rank lists the folder and probes {' and '.join(markers)} in every step folder")


def by_commit(layout, look: Look, marker: Optional[str], metadata: str) -> Latest:
    """Every rank lists the step folders (Orbax's CheckpointManager at start,
    by default on every process): a folder under its temporary name is
    uncommitted, and where the storage has no rename each candidate's `marker`
    is probed; every committed step's `metadata` is read (its commit time)."""
    names = look.list()
    committed = [(s, e) for s, e, n in listed(layout, names) if marker is None or look.exists(f"{n}/{marker}")]
    for step, epoch in committed:
        look.read(f"{layout.checkpoint_dir(step, epoch)}/{metadata}")
    found = committed[0] if committed else None
    return Latest(found, layout.checkpoint_dir(*found) if found else "", half_written(layout, names, found),
                  f"every rank lists the step folders, checks each one's commit and reads its {metadata}")
