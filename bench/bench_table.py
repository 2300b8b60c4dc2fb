"""A bench's result table: printed at the end of its run, and with --json saved
with the date, the machine and the command, for docs/benchmarks.md
(run_scripts/bench_docs.py renders the page from bench/results/*.json, so every
figure in the docs is a run's output)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, Optional


def machine() -> str:
    """What the figures were measured on, in one line."""
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpus = len(os.sched_getaffinity(0))
    return (f"{cpus} CPUs{f' ({model})' if model else ''}, {ram:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def command() -> str:
    return "python " + shlex.join([os.path.relpath(sys.argv[0]) if os.path.isabs(sys.argv[0]) else sys.argv[0],
                                   *sys.argv[1:]])


class BenchTable:
    def __init__(self, bench: str, title: str, columns: list[str]) -> None:
        self.bench, self.title, self.columns = bench, title, columns
        self.rows: list[list[str]] = []
        self.notes: list[str] = []
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])

    def note(self, text: str) -> None:
        self.notes.append(text)

    def text(self) -> str:
        widths = [max(len(r[i]) for r in [self.columns, *self.rows]) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [self.columns, *self.rows]]
        return "\n".join([f"\n{self.title}", *lines, *self.notes])

    def finish(self, json_path: Optional[str], figures: Optional[dict] = None) -> None:
        """Print the table; with json_path, save it (and the raw figures) there."""
        print(self.text(), flush=True)
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(
                {"bench": self.bench, "title": self.title, "date": self.date, "machine": machine(),
                 "command": command(), "columns": self.columns, "rows": self.rows, "notes": self.notes,
                 "figures": figures or {}}, indent=1, default=str) + "\n")
            print(f"saved: {json_path} (python run_scripts/bench_docs.py puts it in docs/benchmarks.md)")
