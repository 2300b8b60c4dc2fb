"""Reading a results directory (what one run of the benchmark leaves behind)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dlio_ckpt_ext.dlio.records import RANK_STATS_DIR, RECORD_FILE


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
        return [json.loads(p.read_text()) for p in sorted((self.path / RANK_STATS_DIR).glob("rank_*.json"))]

    def throughput(self, phase: str) -> tuple[float, float] | None:
        p = self.summary.get(phase) or {}
        if not p.get("checkpoints"):
            return None
        return p["throughput_gib_s_mean"], p["throughput_gib_s_std"]


def load_result(path: str | Path) -> Result:
    p = Path(path)
    if not p.is_dir():
        raise ResultsError(f"{p}: no such directory")
    summary_path = p / RECORD_FILE
    if not summary_path.exists():
        raise ResultsError(f"{p} is not a results directory: it has no {RECORD_FILE} (rank 0 writes it "
                           "when a run completes, under either DLIO; a failed or unfinished run leaves none)")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{summary_path} is incomplete or damaged: {exc}") from None
    if summary.get("status") != "success":
        raise ResultsError(f"{p}: the run did not complete (status {summary.get('status')!r})")
    ranks = summary.get("ranks", 0)
    found = len(list((p / RANK_STATS_DIR).glob("rank_*.json")))
    if found != ranks:
        raise ResultsError(f"{p} is incomplete: {found} of {ranks} per-rank stats files in {RANK_STATS_DIR}/")
    return Result(p, summary)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}, for comparing nested settings key by key."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}
