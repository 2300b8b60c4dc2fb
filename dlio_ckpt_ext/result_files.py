"""The names of a run's result files: one low place that the writers (dlio/records.py)
and the readers (report/, submit) share, so neither reaches into the other.

DLIO owns summary.json (its schema: dlio/dlio_schema.py); ours sit beside it.
"""
import json
import os

#: our record of a finished run: status "success", figures, manifest, config
RECORD_FILE = "ckpt_ext_summary.json"
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "effective_config.yaml"
#: one rank_NNNNN.json per rank
RANK_STATS_DIR = "rank_stats"
#: streaming.record_chunks: every chunk's timings of a rank, beside its rank file
CHUNKS_FILE = "chunks_{rank:05d}.json.gz"
#: written by rank 0 before the first checkpoint and removed after RECORD_FILE:
#: a run that leaves it behind did not finish (mpirun may still exit 0, e.g.
#: after losing a host), and it holds what `dlio-ckpt-report status` needs to
#: list (or remove) what the run left half-written
RUNNING_FILE = "ckpt_ext_running.json"
#: written by the hydra callback into a sweep job that failed, with the reason
FAILED_FILE = "job_failed.txt"
#: a live run's claim on its output folder and its checkpoint folder (dlio/ownership.py):
#: who runs there, and its heartbeat; storage listings leave it out
OWNER_FILE = "ckpt_ext_owner.json"
#: rank 0 appends each checkpoint's global window (every rank finished it) as it ends, one JSON
#: line each: what a run that breaks later still measured (`dlio-ckpt-report status`)
WINDOWS_FILE = "ckpt_ext_windows.jsonl"


def write_json(path: str, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    os.replace(tmp, path)
