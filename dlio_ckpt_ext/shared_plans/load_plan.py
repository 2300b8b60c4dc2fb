"""The arithmetic every layout's load plan shares: a byte range of a saved file,
the loading job, requests per range, and the whole job's counts.

A save plan says which files a rank writes; a load plan says which (file,
offset, length) ranges a rank of the loading job reads, from the saved
checkpoint's layout and world size and the loading job's pattern and world
size. Each layout (dlio_ckpt_ext.layouts) makes its own ranges; this module
holds what they are made of and sums them up. Pure arithmetic, so it can be
printed for 1,024 ranks without running anything and checked against a
server's request counters at a few ranks. The frameworks each pattern follows
are in docs/restores.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from dlio_ckpt_ext.shared_plans import plan

#: own: every rank reads back the files it wrote (DLIO's and MLPerf's definition);
#: framework: what the layout's framework reads on a restore (another world size: resharded)
RESTORE_PATTERNS = ("own", "framework")
#: none: every rank reads all its ranges; broadcast: the ranks reading the same range
#: split it, each reads its part and broadcasts it to the others
SHARE_MODES = ("none", "broadcast")
#: the page a mapped file is read by
PAGE = 4096


@dataclass(frozen=True)
class ReadRange:
    """Bytes [offset, offset + length) of one saved file."""
    name: str        # below the checkpoint directory
    offset: int
    length: int
    writer: int      # the saved rank that wrote the file: whose content it holds
    file_size: int
    #: offsets inside the range where a request must end besides the read_size grid
    #: (a loader's own boundaries: runai-model-streamer's buffers and workers)
    cuts: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, int, int]:
        return self.name, self.offset, self.length


@dataclass(frozen=True)
class LoadJob:
    """The loading job: its pattern, its world size and the saved one."""
    pattern: str = "own"
    ranks: int = 1
    saved_ranks: int = 1
    #: own pattern: rank r reads the files of rank (r + shift) % ranks (recovery_rank_shift)
    shift: int = 0
    #: runai: the read size its requests are cut at, and whether the storage is an object
    #: store (8 workers split each of its buffers there, 16 on a file system)
    read_size: int = 8 << 20
    object_store: bool = False

    @property
    def resharded(self) -> bool:
        return self.saved_ranks != self.ranks


def whole(f: plan.ShardFile, writer: int) -> ReadRange:
    """All of file f, which saved rank `writer` wrote."""
    return ReadRange(f.name, 0, f.size, writer, f.size)


def coalesce(ranges: Iterable[ReadRange]) -> list[ReadRange]:
    """Adjacent ranges of one file as one request stream (a file system reads
    them as one sequential stream, s3torchconnector coalesces them into ranged GETs)."""
    out: list[ReadRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if last and last.name == r.name and last.offset + last.length == r.offset:
            out[-1] = ReadRange(r.name, last.offset, last.length + r.length, r.writer, r.file_size)
        else:
            out.append(r)
    return out


def requests(r: ReadRange, read_size: int) -> int:
    """Requests reading r as the engine does: pieces ending at multiples of
    read_size in the file (a range starting between two has a short first one),
    and at its cuts."""
    return pieces(r.offset, r.length, read_size) + sum(1 for c in r.cuts if c % read_size)


def pieces(offset: int, length: int, read_size: int) -> int:
    return -(-(offset + length) // read_size) - offset // read_size if length else 0


def parts(pieces: int, members: int) -> int:
    """Members with a non-empty part when `pieces` requests are split among them (engine.stream.split_range)."""
    if not pieces:
        return 0
    per = -(-pieces // max(1, members))
    return -(-pieces // per)
