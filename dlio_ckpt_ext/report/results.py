"""Reading a results directory (what one run of the benchmark leaves behind)."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dlio_ckpt_ext.result_files import CHUNKS_FILE, RANK_STATS_DIR, RECORD_FILE, RUNNING_FILE


class ResultsError(Exception):
    """A directory that is not a complete results directory."""


@dataclass
class Result:
    path: Path
    summary: dict

    @property
    def manifest(self) -> dict:
        return self.summary  # the record carries the manifest's fields at its top level

    @cached_property
    def rank_stats(self) -> list[dict]:
        return read_rank_stats(self.path)

    def throughput(self, phase: str) -> tuple[float, float] | None:
        p = self.summary.get(phase) or {}
        if not p.get("checkpoints"):
            return None
        return p["throughput_gib_s_mean"], p["throughput_gib_s_std"]


def read_json(path: Path, required: tuple[str, ...] = ()) -> dict:
    """A results file as a dict, or a ResultsError naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path} is incomplete or damaged (not valid JSON: {exc})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path} is damaged: it holds {type(data).__name__} {str(data)[:40]!r}, "
                           "not the expected JSON object")
    missing = [k for k in required if k not in data]
    if missing:
        raise ResultsError(f"{path} is damaged: it lacks {', '.join(missing)}")
    return data


def read_rank_stats(folder: Path) -> list[dict]:
    """Every rank's stats file; where the run kept every chunk's timings
    (streaming.record_chunks), each file's "chunks" put back from them."""
    out = []
    for path in sorted((Path(folder) / RANK_STATS_DIR).glob("rank_*.json")):
        stats = read_json(path, ("rank", "phases"))
        detail = path.with_name(CHUNKS_FILE.format(rank=stats["rank"]))
        if detail.exists():
            try:
                with gzip.open(detail, "rt") as fh:
                    chunks = json.load(fh)["phases"]
                for phase, recs in stats["phases"].items():
                    for rec, per_file in zip(recs, chunks[phase]):
                        for f, c in zip(rec["files"], per_file):
                            f["chunks"] = c
            except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
                raise ResultsError(f"{detail} is incomplete or damaged: {exc}") from None
        out.append(stats)
    return out


def load_result(path: str | Path) -> Result:
    p = Path(path)
    if not p.is_dir():
        raise ResultsError(f"{p}: no such directory")
    summary_path = p / RECORD_FILE
    if not summary_path.exists() and (p / RUNNING_FILE).exists():
        raise ResultsError(f"{p}: the run did not finish (its {RUNNING_FILE} is still there); "
                           f"dlio-ckpt-report status {p} lists what it left on the storage")
    if not summary_path.exists():
        raise ResultsError(f"{p} is not a results directory: it has no {RECORD_FILE} (rank 0 writes it "
                           "when a run completes, under either DLIO; a failed or unfinished run leaves none)")
    summary = read_json(summary_path, ("status",))
    if summary.get("status") != "success":
        raise ResultsError(f"{p}: the run did not complete (status {summary.get('status')!r})")
    for key, kind in (("ranks", int), ("save", dict), ("load", dict)):
        if not isinstance(summary.get(key), kind):
            raise ResultsError(f"{summary_path} is damaged: {key!r} is {summary.get(key)!r}, "
                               f"not {'a number' if kind is int else 'an object'}")
    ranks = summary["ranks"]
    found = len(list((p / RANK_STATS_DIR).glob("rank_*.json")))
    if found != ranks:
        raise ResultsError(f"{p} is incomplete: {found} of {ranks} per-rank stats files in {RANK_STATS_DIR}/")
    result = Result(p, summary)
    _ = result.rank_stats  # a damaged per-rank file is reported now, by name
    return result


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}, for comparing nested settings key by key."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}
