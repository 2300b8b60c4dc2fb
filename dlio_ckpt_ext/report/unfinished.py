"""What a run that did not finish left on the storage.

A rank that fails or is interrupted removes its own partial file or open
upload, but a rank that is killed outright, or a whole host that is lost,
cleans nothing, and mpirun may even exit 0 then. Rank 0 writes RUNNING_FILE
before the first checkpoint and removes it after the result files, so its
presence says the run did not finish, and it names every file the run was
to write: comparing that plan with one listing of the storage tells the
complete checkpoints from the half-written ones.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dlio_ckpt_ext.errors import ConfigError, StorageError
from dlio_ckpt_ext.redact import REDACTED
from dlio_ckpt_ext.report.results import ResultsError, read_json
from dlio_ckpt_ext.result_files import RECORD_FILE, RUNNING_FILE, WINDOWS_FILE
from dlio_ckpt_ext.storage import Backend, open_backend


@dataclass
class CheckpointState:
    step: int
    directory: str
    #: path -> bytes, of every file the plan puts in this checkpoint
    planned: dict[str, int]
    #: path -> bytes, of the planned files the storage holds
    found: dict[str, int]
    #: uploads left unfinished below the checkpoint's directory (S3's open
    #: multipart uploads, Azure's uncommitted blocks)
    uploads: int = 0

    @property
    def wrong(self) -> dict[str, tuple[int | None, int]]:
        """Planned files absent or of another size: path -> (bytes found or None, bytes planned)."""
        return {p: (self.found.get(p), n) for p, n in self.planned.items() if self.found.get(p) != n}

    @property
    def present(self) -> int:
        return len(self.planned) - len(self.wrong)

    @property
    def complete(self) -> bool:
        return not self.wrong

    @property
    def started(self) -> bool:
        return bool(self.found) or self.uploads > 0


@dataclass
class RunState:
    folder: Path
    marker: dict
    checkpoints: list[CheckpointState]
    open_uploads: list[dict]

    @property
    def incomplete(self) -> list[CheckpointState]:
        return [c for c in self.checkpoints if not c.complete and c.started]


def _backend(marker: dict) -> Backend:
    ck = marker["checkpoints"]
    # options the marker could not keep (credentials, redacted) come from the environment again
    options = {k: v for k, v in ck["storage_options"].items() if v != REDACTED}
    try:
        return open_backend(ck["storage_type"], ck["root"], options, fsync=False)
    except (ConfigError, StorageError) as exc:
        raise ResultsError(f"cannot open the run's storage {ck['root']}: {exc}") from None


def run_state(folder: str | Path) -> RunState | None:
    """None when the run in `folder` finished; else what it left."""
    folder = Path(folder)
    marker_path = folder / RUNNING_FILE
    if not marker_path.exists():
        if (folder / RECORD_FILE).exists():
            return None
        raise ResultsError(f"{folder}: neither {RECORD_FILE} (a finished run) nor {RUNNING_FILE} (a run that "
                           "started its checkpoints) is there")
    marker = read_json(marker_path, ("checkpoints", "start_time_utc"))
    ck = marker["checkpoints"]
    backend = _backend(marker)
    states = []
    for step, directory in sorted(ck["directories"].items(), key=lambda kv: int(kv[0])):
        try:
            found = backend.list_sizes(directory)
        except (ConfigError, StorageError) as exc:
            raise ResultsError(f"cannot list {directory} below {ck['root']}: {exc}") from None
        planned = {f"{directory}/{name}": size for name, size in ck["files"].items()}
        state = CheckpointState(int(step), directory, planned, {p: found[p] for p in planned if p in found})
        states.append(state)
    try:
        uploads = backend.open_uploads()
    except StorageError as exc:
        raise ResultsError(str(exc)) from None
    # keys are the bucket's or container's: the root's own prefix first
    prefix = ck["root"].rstrip("/").split("://", 1)[-1].partition("/")[2]
    for state in states:
        below = f"{prefix}/{state.directory}/" if prefix else f"{state.directory}/"
        state.uploads = sum(u["key"].startswith(below) for u in uploads)
    return RunState(folder, marker, states, uploads)


def remove_incomplete(state: RunState) -> tuple[int, int]:
    """Delete exactly the planned files of the half-written checkpoints (never
    a complete one, never anything the plan does not name) and abort the open
    uploads under the run's root. Returns (files deleted, uploads aborted)."""
    backend = _backend(state.marker)
    removed = 0
    for c in state.incomplete:
        removed += backend.delete_files(list(c.found))
        backend.remove_empty_dir(c.directory)
    return removed, backend.abort_uploads(state.open_uploads) if state.open_uploads else 0


def finished_windows(folder: Path) -> dict[str, list[dict]]:
    """The global windows of the checkpoints every rank finished (WINDOWS_FILE),
    by phase; a line the run was writing when it broke is left out."""
    out: dict[str, list[dict]] = {}
    path = Path(folder) / WINDOWS_FILE
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            window = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.setdefault(window["phase"], []).append(window)
    return out


def measured_lines(folder: Path) -> list[str]:
    """What an unfinished run measured: each checkpoint every rank finished, as
    the run said it, and the [METRIC]-style figures of those alone."""
    from dlio_ckpt_ext.results.windows import metric_lines, window_line
    windows = finished_windows(folder)
    if not windows:
        return ["  measured: no checkpoint finished on every rank (or the run did not keep windows: "
                "checkpoint.rank_sync=False)"]
    lines = ["  measured before it broke (checkpoints every rank finished; not a result of a finished run):"]
    for phase in ("save", "load"):
        for w in windows.get(phase, []):
            lines.append(f"    {window_line(phase, w)}")
        lines += [f"    {line}" for line in metric_lines(phase, windows.get(phase, []),
                                                                  "[METRIC, unfinished run]")
                  if windows.get(phase)]
    return lines


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]}-{steps[-1]} ({len(steps)})"


def describe(state: RunState, shown: int = 20) -> list[str]:
    m, ck = state.marker, state.marker["checkpoints"]
    hosts = ", ".join(m.get("hosts") or [])
    lines = [f"[ERROR] {state.folder}: the run did not finish (started {m['start_time_utc']}, {m.get('ranks')} "
             f"ranks on {hosts}); it wrote no result. Checkpoints below {ck['root']}:"]
    done = [c.step for c in state.checkpoints if c.complete]
    lines.append(f"  complete (every file at its planned size): {_steps(done) if done else 'none'}")
    for c in state.incomplete:
        open_note = f" ({c.uploads} open upload{'s' if c.uploads != 1 else ''})" if c.uploads else ""
        lines.append(f"  checkpoint {c.step} incomplete{open_note}: {c.present} of {c.present + len(c.wrong)} files "
                     "complete")
        for path, (found, size) in sorted(c.wrong.items())[:shown]:
            lines.append(f"    {'missing' if found is None else 'partial'}: {path}"
                         + ("" if found is None else f" ({found} of {size} bytes)"))
        if len(c.wrong) > shown:
            lines.append(f"    ... and {len(c.wrong) - shown} more")
    never = [c.step for c in state.checkpoints if not c.started]
    if never:
        lines.append(f"  not started: {_steps(never)}")
    for u in state.open_uploads:
        lines.append(f"  open upload: {u['key']} ({u['upload_id']})" if u["upload_id"] == "uncommitted blocks"
                     else f"  open multipart upload: {u['key']} (id {u['upload_id']})")
    if state.incomplete or state.open_uploads:
        lines.append("  --remove-incomplete deletes the incomplete checkpoints' files and aborts the open uploads")
    return lines + measured_lines(state.folder)
