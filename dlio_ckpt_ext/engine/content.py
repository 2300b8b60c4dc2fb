"""Deterministic checkpoint content from dgen-py.

A file's bytes are a pure function of its seed, so a reader regenerates
them to verify. dgen-py's stream for seed s+k equals the stream for seed s
shifted by k blocks of 1 MiB (with unit dedup/compress ratios), which makes
the content seekable at 1 MiB offsets; it also means counted seeds would
overlap, hence seeds come from a hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import dgen_py

BLOCK = 1 << 20
_SEED_BITS = 62  # headroom so seed + block index never overflows u64


def derive_seed(*parts: object) -> int:
    """Seed for one file from (run seed, checkpoint id, rank, file name, ...)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


@dataclass(frozen=True)
class ContentSpec:
    seed: int
    dedup_ratio: int = 1
    compress_ratio: int = 1

    @property
    def seekable(self) -> bool:
        return self.dedup_ratio == 1 and self.compress_ratio == 1


def generator(spec: ContentSpec, size: int, offset: int = 0, threads: int = 1,
              chunk_size: int = 32 * BLOCK) -> "dgen_py.Generator":
    """A dgen-py generator producing bytes [offset, offset+size) of the file."""
    if offset:
        if offset % BLOCK:
            raise ValueError(f"content offset {offset} is not a multiple of {BLOCK}")
        if not spec.seekable:
            raise ValueError("content with dedup/compress ratios other than 1 can only be "
                             "generated from the start of the file")
    return dgen_py.Generator(size=size, seed=spec.seed + offset // BLOCK, max_threads=threads,
                             chunk_size=chunk_size, dedup_ratio=float(spec.dedup_ratio),
                             compress_ratio=float(spec.compress_ratio))


def fill_exact(gen: "dgen_py.Generator", view: memoryview, offset: int, where: str) -> None:
    """Fill all of view from gen, or raise naming the file and offset."""
    n = len(view)
    got = gen.fill_chunk(view)
    if got != n:
        raise RuntimeError(f"dgen-py filled {got} bytes instead of {n} at offset {offset} of {where}")
