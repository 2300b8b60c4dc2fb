"""A run's dftracer traces, in the form dftracer's current tools read.

pydftracer 2.x (upstream DLIO, MLCommons' fork) writes gzip-compressed JSON
lines with numbers as numbers: those are copied as they are. pydftracer
1.0.2 (DLIO 2.0.0) writes a plain `.pfw` JSON array with every number as a
string and the rank as the process id, and cannot be told otherwise (its
DFTRACER_TRACE_COMPRESSION does nothing there): dftracer-utils refuses the
file ("not gzip") and, gzipped, reads every duration as 0. Those files are
converted: numbers made numbers, each rank's real process id (from its rank
stats) put back, gzip-compressed.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

from dlio_ckpt_ext.report.results import RANK_STATS_DIR, ResultsError

TRACES_DIR = "traces"
_TRACE_1X = re.compile(r"^trace-(\d+)-of-(\d+)\.pfw$")
_TRACE_2X = re.compile(r"^trace-\d+-of-\d+-.*\.pfw\.gz$")
_NUMBER = re.compile(r"^-?\d+$")
#: event fields pydftracer 1.0.2 writes as strings
_NUMERIC_FIELDS = ("id", "pid", "tid", "ts", "dur")
#: arguments that are names even when they look like numbers
_TEXT_ARGS = frozenset({"fname", "hostname", "name", "value"})


def _number(value):
    return int(value) if isinstance(value, str) and _NUMBER.match(value) else value


def _events(text: str):
    """The events of a 1.x trace: a JSON array written one event a line."""
    for line in text.splitlines():
        line = line.strip().lstrip("[").rstrip(",]").strip()
        if line.startswith("{"):
            yield json.loads(line)


def convert_1x(text: str, pid: int) -> str:
    """A pydftracer 1.x trace as gzip-ready JSON lines: numbers, the real pid."""
    out = []
    for event in _events(text):
        for key in _NUMERIC_FIELDS:
            if key in event:
                event[key] = _number(event[key])
        event["pid"] = pid
        args = event.get("args")
        if isinstance(args, dict):
            event["args"] = {k: v if k in _TEXT_ARGS else _number(v) for k, v in args.items()}
        out.append(json.dumps(event, separators=(",", ":")))
    return "\n".join(out) + "\n"


def _rank_pids(run_dir: Path) -> dict[int, int]:
    pids = {}
    for path in (run_dir / RANK_STATS_DIR).glob("rank_*.json"):
        stats = json.loads(path.read_text())
        if "pid" in stats:
            pids[int(stats["rank"])] = int(stats["pid"])
    return pids


def collect_traces(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write the run's traces into out_dir (default RUN/traces) as dftracer's
    current tools read them; returns the files written. A folder of their own,
    because the analysers read any manifest.json beside traces as theirs."""
    run = Path(run_dir)
    names = sorted(p.name for p in run.glob("trace-*.pfw*")) if run.is_dir() else []
    if not names:
        raise ResultsError(f"{run} holds no dftracer trace (trace-*.pfw*): was the run made with DFTRACER_ENABLE=1?")
    out = Path(out_dir) if out_dir else run / TRACES_DIR
    out.mkdir(parents=True, exist_ok=True)
    pids = _rank_pids(run)
    written = []
    for name in names:
        old = _TRACE_1X.match(name)
        if old:
            rank = int(old[1])
            if rank not in pids:
                raise ResultsError(f"{run / RANK_STATS_DIR} has no process id for rank {rank}: the run predates "
                                   "dlio-ckpt-ext recording it, so its trace cannot be given real process ids")
            target = out / f"{name}.gz"
            target.write_bytes(gzip.compress(convert_1x((run / name).read_text(), pids[rank]).encode()))
        elif _TRACE_2X.match(name):
            target = out / name
            shutil.copyfile(run / name, target)
        else:
            continue
        written.append(target)
    return written
