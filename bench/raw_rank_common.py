"""What the raw reference ranks (raw_posix_rank.py, raw_s3_rank.py) share."""
from __future__ import annotations

import json
from typing import Callable


def hwm() -> int:
    """Peak resident memory of this process (VmHWM)."""
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))


def finish(comm, out: dict, writes: int, count: int, delete: Callable[[int, int], None]) -> None:
    """After the last checkpoint: every rank deletes what it wrote, then prints its record."""
    comm.barrier()
    for step in range(1, writes + 1):
        for i in range(count):
            delete(step, i)
    out["peak_rss_bytes"] = hwm()
    print(json.dumps(out), flush=True)
