"""A live run owns its output folder and its checkpoint folder.

Rank 0 claims each with a marker (OWNER_FILE: run id, host, pid, start time and
a heartbeat it renews every HEARTBEAT_S) before any checkpoint I/O. A folder
whose marker is another live run's is refused in one line naming the folder and
that run. A marker is stale, and taken over with a warning, when its pid is not
running on this host or its heartbeat is older than STALE_AFTER_S (a crashed
run, on any host). A file system creates a marker only where there is none in
one step (a hard link to its name), so of two runs claiming at once the first
goes on. Object stores have no create-if-absent every server honours, so there
(and where a stale marker is taken over) a claim is written, left to settle,
then read back: of two runs claiming at once, only the last writer reads its
own id and goes on.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.result_files import OWNER_FILE
from dlio_ckpt_ext.storage.posix import create_marker_file, read_marker_file, write_marker_file

HEARTBEAT_S = 10.0
STALE_AFTER_S = 3 * HEARTBEAT_S
SETTLE_S = 0.5
#: how long the end of a run waits for a heartbeat write in flight before removing the marker
RELEASE_WAIT_S = 30.0


@dataclass
class Folder:
    """Where a marker lives: the config key and value naming the folder, and its I/O."""
    key: str
    value: str
    write: Callable[[bytes], None]
    read: Callable[[], Optional[bytes]]
    remove: Callable[[], object]
    #: create-if-absent in one step: True created, False one was there, None no such step here
    create: Callable[[bytes], Optional[bool]] = lambda data: None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def stale_reason(owner: dict, now: float, host: str) -> Optional[str]:
    """Why a marker no longer means a live run, or None when it does."""
    if owner.get("host") == host and not _pid_alive(int(owner.get("pid", 0))):
        return f"pid {owner.get('pid')} is not running on {host}"
    age = now - float(owner.get("heartbeat", 0))
    if age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f} s"
    return None


def _who(owner: dict, now: float) -> str:
    return (f"the run started {owner.get('start_time_utc')} by pid {owner.get('pid')} on host {owner.get('host')} "
            f"(heartbeat {now - float(owner.get('heartbeat', 0)):.0f} s ago)")


class Lease:
    """Rank 0's claim on its folders, renewed until released."""

    def __init__(self, start_time: float) -> None:
        self.me = {"run_id": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                   "start_time_utc": _utc(start_time), "heartbeat": time.time()}
        self.folders: list[Folder] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _payload(self) -> bytes:
        return json.dumps({**self.me, "heartbeat": time.time()}).encode()

    def claim(self, folder: Folder) -> list[str]:
        """Own `folder` or raise ConfigError naming it and its live owner; the
        warnings of a stale marker taken over."""
        warnings = []
        now = time.time()
        current = _parse(folder.read())
        if current and current.get("run_id") != self.me["run_id"]:
            reason = stale_reason(current, now, self.me["host"])
            if reason is None:
                raise ConfigError(folder.key, folder.value, f"a folder no live run uses ({_who(current, now)} is "
                                                            "using it; wait for it, or choose another folder)")
            warnings.append(f"[WARNING] {folder.key}={folder.value!r}: taking over from {_who(current, now)}: "
                            f"its marker is stale ({reason}; a run that did not finish, see dlio-ckpt-report status)")
        created = None if current else folder.create(self._payload())
        # False: another run created it since we looked (refused below), unless what is there is unreadable
        if created is None or (created is False and not _parse(folder.read())):
            folder.write(self._payload())  # no atomic create here, or a stale marker: write, settle, read back
            time.sleep(SETTLE_S)
        back = _parse(folder.read())
        if back.get("run_id") != self.me["run_id"]:
            raise ConfigError(folder.key, folder.value, f"a folder no live run uses ({_who(back, time.time())} "
                                                        "claimed it at the same moment)")
        with self._lock:
            self.folders.append(folder)
        self._start()
        return warnings

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="owner-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                folders = list(self.folders)
            for folder in folders:
                try:
                    folder.write(self._payload())
                except Exception:  # noqa: BLE001 - a failed beat shows as staleness, the run goes on
                    pass

    def release(self) -> None:
        """The run ended: its markers go, where they are still its own. A beat
        still writing is waited for first (on a loaded machine its write landed
        after the removal and left the marker behind, seen on GCS)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RELEASE_WAIT_S)
        with self._lock:
            folders, self.folders = self.folders, []
        for folder in folders:
            try:
                if _parse(folder.read()).get("run_id") == self.me["run_id"]:
                    folder.remove()
            except Exception:  # noqa: BLE001 - a marker left behind goes stale
                pass


def _parse(data: Optional[bytes]) -> dict:
    if not data:
        return {}
    try:
        out = json.loads(data)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _folder(session, which: str) -> Folder:
    """The output folder's marker (on rank 0's host) or the checkpoint folder's (on the storage)."""
    if which == "output":
        marker = os.path.join(session.output_folder, OWNER_FILE)
        return Folder("workload.output.folder", session.output_folder, lambda d: write_marker_file(marker, d),
                      lambda: read_marker_file(marker), lambda: os.unlink(marker),
                      lambda d: create_marker_file(marker, d))
    backend = session.checkpointer.backend
    return Folder("workload.checkpoint.checkpoint_folder", backend.uri("").rstrip("/"),
                  lambda d: backend.write_marker(OWNER_FILE, d), lambda: backend.read_marker(OWNER_FILE),
                  lambda: backend.delete_file(OWNER_FILE), lambda d: backend.create_marker(OWNER_FILE, d))


def claim_folders(session, which: str) -> None:
    """Rank 0 claims the output folder (before any checkpoint I/O) or the
    checkpoint folder (once the storage answered) for this run
    (dlio/ownership.py); another live run's folder stops every rank. Every
    rank learns the run's id, so whichever rank fails can release the claims."""
    refusal, notes = None, []
    if session.rank == 0:
        if session.lease is None:
            session.lease = Lease(session.start_time)
        try:
            notes = session.lease.claim(_folder(session, which))
        except ConfigError as exc:
            refusal = str(exc)
            session.lease.release()
    session._refuse_together(refusal, gathered=False)
    run_id = session.comm.bcast(session.lease.me["run_id"] if session.rank == 0 else None, root=0)
    session.claims = (run_id, *dict.fromkeys((*session.claims[1:], which)))
    for line in notes:
        print(line, flush=True)


def release_claims(session) -> None:
    """A run that ends with an error releases its folders, from whichever rank
    failed (rank 0: its lease, the heartbeat stopped; another rank: each marker
    still naming this run, as far as that rank reaches it). Only a killed run
    leaves its marker, to be found stale."""
    if session.lease is not None:
        session.lease.release()
        return
    run_id, *which = session.claims
    for folder in (_folder(session, w) for w in which):
        with contextlib.suppress(Exception):  # a marker this rank cannot reach is left to go stale
            if _parse(folder.read()).get("run_id") == run_id:
                folder.remove()
