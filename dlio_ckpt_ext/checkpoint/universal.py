"""One rank's part of DeepSpeed's universal checkpoint conversion
(shared_plans/universal_plan.py says what ds_to_universal reads and writes):
the optimizer files and parameters spread over the job's ranks, each file
read whole and verified, each file written generated, the fragments removed.
ds_to_universal runs on one node with a pool of workers (4 extracting, 2
merging by default); here the job's ranks are the workers, so the phase's
figures are the storage's for that work spread over the job.

Independent of DLIO and MPI: the barrier between the phases is an argument.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from dlio_ckpt_ext.engine import FileStats
from dlio_ckpt_ext.engine.stream import Progress
from dlio_ckpt_ext.shared_plans import load_plan, universal_plan as up


def _tally(out: dict, kind: str, files: list[FileStats]) -> None:
    out[f"{kind}_files"] = out.get(f"{kind}_files", 0) + len(files)
    out[f"{kind}_bytes"] = out.get(f"{kind}_bytes", 0) + sum(f.nbytes for f in files)


def convert(ck, directory: str, barrier: Callable[[], None], progress: Progress = None,
            step: int = 0) -> dict:
    """Convert the checkpoint in `directory` (saved at ck.job.saved_ranks) into
    universal_dir(directory), this rank's share of it; every rank calls it.
    Returns this rank's figures: files and bytes read, written and deleted,
    folders made, and each stage's start and end."""
    m, p, job, backend = ck.cfg.shape, ck.cfg.parallelism, ck.job, ck.backend
    into = up.universal_dir(directory)
    out: dict = {"start": time.time()}
    mine = range(ck.rank, job.saved_ranks, job.ranks)
    written: list[str] = []

    def write(files, writer: Optional[int]) -> None:
        if backend.has_directories:
            made = up.folders(f.name for f in files)
            for folder in made:
                backend.prepare(f"{into}/{folder}")
            out["folders_made"] = out.get("folders_made", 0) + len(made)
        _tally(out, "written", ck.write_files(into, tuple(files), progress, step, writer))
        written.extend(f"{into}/{f.name}" for f in files)

    def read(where: str, ranges: list[load_plan.ReadRange]) -> None:
        _tally(out, "read", [ck.read_range(where, r, step, progress) for r in ranges])
        out["read_requests"] = out.get("read_requests", 0) + sum(load_plan.requests(r, ck.cfg.read_size)
                                                                 for r in ranges)

    # 1. extract: each optimizer file read whole, its fragments written; the model states copied
    mp = p.tensor * p.pipeline
    for s in mine:
        saved = ck.layout.saved(m, p, job, s)
        read(directory, [load_plan.whole(f, s) for f in saved.files])
        t, pp_rank, d = s % p.tensor, (s // p.tensor) % p.pipeline, s // mp
        if any(f.kind == "optimizer" for f in saved.files):
            write(up.fragment_files(m, p, job.saved_ranks // mp, t, pp_rank, d), s)
        write([f for f in saved.files if f.kind == "model"], s)
    out["extracted"] = time.time()
    barrier()
    # 2. merge: each parameter's fragments read, its states written whole into zero/<param>/
    for x in up.params(m, p.tensor)[ck.rank::job.ranks]:
        read(into, [load_plan.whole(f, writer) for f, writer in up.fragments_of(m, p, job.saved_ranks, x)])
        write(up.merged_files(m, p, x), 0)
    # 3. the common optimizer state, from the first optimizer file read again
    if ck.rank == 0:
        first = ck.layout.saved(m, p, job, 0)
        read(directory, [load_plan.whole(f, 0) for f in first.files if f.kind == "optimizer"])
        write([up.optimizer_state_file()], 0)
    out["merged"] = time.time()
    barrier()
    # 4. tmp/ removed: every fragment, by the rank that wrote it
    fragments = [w for w in written if w.startswith(f"{into}/{up.TMP}/")]
    out["deleted_files"] = backend.delete_files(fragments)
    barrier()
    if ck.rank == 0:
        if backend.has_directories:  # ds_to_universal's rmtree of tmp/
            names = [f"{up.TMP}/{x.name}/{t}/-" for x in up.params(m, p.tensor) for t in range(p.tensor)]
            for folder in reversed(up.folders(names)):
                backend.remove_empty_dir(f"{into}/{folder}")
        ck.write_root_file(up.LATEST_UNIVERSAL, into.encode())
    removed = set(fragments)
    ck.converted = (into, [w for w in written if w not in removed])
    out["end"] = time.time()
    return out


#: the conversion's counts, summed over the ranks
COUNTS = ("read_files", "read_bytes", "read_requests", "written_files", "written_bytes", "deleted_files", "folders_made")


def summary(ck, ranks: list[dict]) -> dict:
    """The whole job's conversion from every rank's figures: its stages' global
    windows (the slowest rank's end from the first one's start), its counts,
    the folders zero/ holds and the listings the universal load makes (the plan's)."""
    m, p, job = ck.cfg.shape, ck.cfg.parallelism, ck.job
    start, extracted, merged = (min(c["start"] for c in ranks), max(c["extracted"] for c in ranks),
                                max(c["merged"] for c in ranks))
    return {"time_s": max(c["end"] for c in ranks) - start, "extract_s": extracted - start,
            "merge_s": merged - extracted, "zero_folders": len(up.params(m, p.tensor)),
            "load_listings": sum(len(up.held(m, p, job.ranks, r)) for r in range(job.ranks))} | \
        {k: sum(c.get(k, 0) for c in ranks) for k in COUNTS}


def convert_in_threads(cks: list, directory: str) -> list[dict]:
    """Every rank's part of the conversion in one process, a thread each, their
    barriers meeting (the benches and tests that hold every rank's checkpointer)."""
    barrier = threading.Barrier(len(cks))
    with ThreadPoolExecutor(len(cks)) as pool:
        return list(pool.map(lambda ck: convert(ck, directory, barrier.wait), cks))


def list_folders(ck, directory: str) -> int:
    """The universal load's listing of each parameter folder it reads
    (load_hp_checkpoint_state's os.listdir): returns the listings made."""
    m, p, job = ck.cfg.shape, ck.cfg.parallelism, ck.job
    into = up.universal_dir(directory)
    held = up.held(m, p, job.ranks, ck.rank)
    for x in held:
        ck.backend.children(f"{into}/{up.ZERO}/{x.name}")
    return len(held)
