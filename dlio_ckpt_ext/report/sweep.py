"""A hydra multirun directory -> one row per job, keyed by the swept overrides."""
from __future__ import annotations

import csv
from pathlib import Path

import yaml

from dlio_ckpt_ext.report.block_figures import block_figures
from dlio_ckpt_ext.report.results import ResultsError, load_result
from dlio_ckpt_ext.result_files import FAILED_FILE

#: the further blocks' figures a sweep tabulates (report/block_figures.py), where a job has them
BLOCK_COLUMNS = {"persist_slack_s": "tiers: persist slack mean (s)",
                 "foreground_slowdown": "tiers: foreground slowdown (x)",
                 "time_to_resume_s": "recovery: time to resume mean (s)",
                 "checkpoint_stall_s": "training: checkpoint stall mean (s)",
                 "goodput_pct": "goodput: goodput at the run's interval (%)"}
COLUMNS = ("save_gib_s", "save_std", "save_duration_s", "load_gib_s", "load_std", "load_duration_s")


def _overrides(job: Path) -> dict[str, str]:
    path = job / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(path.read_text()) if path.exists() else []
    return dict(item.lstrip("+").split("=", 1) for item in items or [] if "=" in item)


def sweep_table(sweep_dir: str | Path) -> tuple[list[str], list[dict], list[dict]]:
    """(swept parameter names, rows of the completed jobs, failed jobs).

    A job that did not complete (invalid settings, a failure, an unfinished
    run) is listed with the reason instead of a row; the others are tabulated."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ResultsError(f"{root}: no such directory")
    jobs = sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        raise ResultsError(f"{root} is not a sweep directory: no numbered job directories "
                           "(run dlio_benchmark -m ... and give its hydra.sweep.dir)")
    rows, overrides, failed = [], [], []
    for job in jobs:
        try:
            result = load_result(job)
        except ResultsError as exc:
            failed.append({"job": int(job.name), "overrides": _overrides(job), "reason": _failure(job, exc)})
            continue
        s = result.summary
        row = {"job": int(job.name)}
        for phase in ("save", "load"):
            p = s.get(phase) or {}
            row[f"{phase}_gib_s"] = p.get("throughput_gib_s_mean")
            row[f"{phase}_std"] = p.get("throughput_gib_s_std")
            row[f"{phase}_duration_s"] = p.get("duration_s_mean")
        figures = block_figures(s)
        row.update({column: figures.get(key) for column, key in BLOCK_COLUMNS.items()})
        overrides.append(_overrides(job))
        rows.append(row)
    if not rows:
        raise ResultsError(f"{root}: no job of the sweep completed: "
                           + "; ".join(f"job {f['job']}: {f['reason']}" for f in failed))
    every_job = overrides + [f["overrides"] for f in failed]  # what varies across the sweep as launched
    keys = sorted({k for o in every_job for k in o})
    swept = [k for k in keys if len({o.get(k) for o in every_job}) > 1]
    for row, o in zip(rows, overrides):
        row.update({k: o.get(k) for k in swept})
    return swept, rows, failed


def _failure(job: Path, exc: ResultsError) -> str:
    """Why a job has no result: the error our callback recorded, else what is missing."""
    marker = job / FAILED_FILE
    if marker.exists():
        return marker.read_text().strip()
    return str(exc)


def present_block_columns(rows: list[dict]) -> list[str]:
    """The further blocks' columns some job of the sweep has."""
    return [c for c in BLOCK_COLUMNS if any(r.get(c) is not None for r in rows)]


def write_tables(swept: list[str], rows: list[dict], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = ["job", *swept, *COLUMNS, *present_block_columns(rows)]
    csv_path, md_path = out_dir / "sweep.csv", out_dir / "sweep.md"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")  # a block no job has: no column
        writer.writeheader()
        writer.writerows(rows)
    fmt = lambda v: "-" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path
