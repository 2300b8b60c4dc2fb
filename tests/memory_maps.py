"""What the kernel says about a buffer's memory, read independently of the code under test."""
from __future__ import annotations

import struct

from dlio_ckpt_ext.engine.buffers import PAGE, address


def resident_bytes(buf: memoryview) -> int:
    """Resident bytes of buf itself: pages present in /proc/self/pagemap (bit
    63). Not smaps: the kernel merges adjacent private mappings, so a mapping's
    Rss can be several buffers'."""
    start, pages = address(buf), len(buf) // PAGE
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(start // PAGE * 8)
        entries = struct.unpack(f"{pages}Q", fh.read(pages * 8))
    return sum(PAGE for e in entries if e >> 63)


def anon_huge_pages() -> int:
    """This process's memory in transparent huge pages (smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("AnonHugePages:"))


def mapping_permissions(buf: memoryview) -> str:
    """The r/w/x and private/shared flags of the mapping holding buf (/proc/self/maps)."""
    start = address(buf)
    with open("/proc/self/maps") as fh:
        for line in fh:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= start < hi:
                return line.split()[1]
    raise AssertionError("mapping not found")
