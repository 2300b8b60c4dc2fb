"""What the raw reference ranks (raw_posix_rank.py, raw_s3_rank.py) share."""
from __future__ import annotations

import argparse
import json
from typing import Callable


def parser(target: str, target_help: str) -> argparse.ArgumentParser:
    """The options every raw rank takes: where, what sizes, how many checkpoints."""
    ap = argparse.ArgumentParser()
    ap.add_argument(target, required=True, help=target_help)
    ap.add_argument("--sizes", required=True, help="comma-separated sizes of one rank's files or objects")
    ap.add_argument("--writes", type=int, default=2)
    ap.add_argument("--reads", type=int, default=2)
    return ap


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
