"""Where this rank sits in the job, and how a failure ends the whole job."""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Optional, TextIO


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    ranks_per_node: int  # ranks sharing this rank's node (MPI shared-memory split)
    hosts: tuple[str, ...]  # one entry per node, sorted
    cpu_mask_size: int = 1  # CPUs this rank may run on (its affinity, after mpirun's binding)
    cpu_share: float = 1.0  # of them, its share given the node's other ranks (engine/threads.cpu_share)
    binding: str = "none"   # the node's binding as the masks show it (engine/threads.binding)
    host: str = ""          # this rank's node (MPI's processor name, as in hosts)
    node_cpus: int = 1      # the node's online CPUs

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)


def topology(comm) -> Topology:
    from mpi4py import MPI

    from dlio_ckpt_ext.engine.threads import binding, cpu_mask, cpu_share, online_cpus
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    host = MPI.Get_processor_name()
    hosts = tuple(sorted(set(comm.allgather(host))))
    mine = cpu_mask()
    node = [frozenset(m) for m in local.allgather(sorted(mine))]
    online = online_cpus()
    topo = Topology(comm.rank, comm.size, local.rank, local.size, hosts, len(mine), cpu_share(mine, node),
                    binding(node, online), host, len(online))
    local.Free()
    return topo


def launcher_stream() -> Optional[TextIO]:
    """A stream straight to mpirun's own stderr when it is a pipe or a file on this
    host, else None. After SIGINT or SIGTERM mpirun forwards no more of a rank's
    output (measured: with mpirun's output piped, the interrupt lines never came
    through), so what must be said then is written there directly."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "PMIX_RANK" not in os.environ:
        return None
    path = f"/proc/{os.getppid()}/fd/2"
    try:
        target = os.readlink(path)
        if target.startswith("pipe:") or (target.startswith("/") and not target.startswith("/dev/")):
            return open(path, "a")
    except OSError:
        pass
    return None


#: called before a failure ends the job (the session's release of its folders)
ON_ABORT: list[Callable[[], None]] = []


def abort(comm, message: str, exc: BaseException | None = None, code: int = 1) -> None:
    """Print why, then end every rank: a peer waiting at a barrier must not hang."""
    from dlio_ckpt_ext.redact import redact_text
    detail = "".join(traceback.format_exception(exc)) if exc is not None and not _expected(exc) else ""
    sys.stderr.write(redact_text(f"[ERROR] rank {comm.rank}: {message}\n{detail}"))
    sys.stderr.flush()
    for hook in ON_ABORT:
        try:
            hook()
        except Exception:  # noqa: BLE001 - the job ends whatever a clean-up does
            pass
    comm.Abort(code)


def _expected(exc: BaseException) -> bool:
    """Errors whose message says it all (no traceback needed)."""
    from dlio_ckpt_ext.errors import ConfigError, StorageError
    return isinstance(exc, (ConfigError, StorageError))


def user_terminal() -> Optional[TextIO]:
    """A stream to the person's terminal, or None when output goes to a file or pipe.

    Under mpirun a rank's stdout is Open MPI's forwarding, which hands every
    rank a pseudo-terminal (even when mpirun's own output is piped) and keeps
    only the text after a line's last carriage return, so a redrawn progress
    bar never shows. The launcher's stdout says whether a person is watching;
    when it is a terminal, write there directly.
    """
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "PMIX_RANK" not in os.environ:
        return sys.stdout if sys.stdout.isatty() else None
    try:
        target = os.readlink(f"/proc/{os.getppid()}/fd/1")
        return open(target, "w") if target.startswith(("/dev/pts/", "/dev/tty")) else None
    except OSError:
        return None


class SharingGroups:
    """share=broadcast: the communicator of each group of ranks reading the same
    range, made once (MPI_Comm_create_group: collective over its members only,
    so each rank makes only its own groups, in the order every rank takes them)."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self._made: dict[tuple[int, ...], _GroupBroadcast] = {}

    def __call__(self, members: tuple[int, ...]) -> "_GroupBroadcast":
        if members not in self._made:
            sub = self.comm.Create_group(self.comm.group.Incl(list(members)))
            self._made[members] = _GroupBroadcast(sub)
        return self._made[members]

    def free(self) -> None:
        for group in self._made.values():
            group.comm.Free()
        self._made.clear()


class _GroupBroadcast:
    """engine.share.Broadcast over one MPI communicator (members in rank order)."""

    def __init__(self, comm) -> None:
        self.comm, self.index, self.size = comm, comm.rank, comm.size

    def bcast(self, buf: memoryview, root: int) -> None:
        from mpi4py import MPI
        self.comm.Bcast([buf, MPI.BYTE], root=root)


def sharing_groups(checkpointer, config, comm) -> Optional[SharingGroups]:
    """share=broadcast: every group this rank reads a range with, made now
    (outside the windows) in the order every rank takes them."""
    if not checkpointer.shares() or not config.checkpoint.num_checkpoints_read:
        return None
    groups = SharingGroups(comm)
    for members, _ in checkpointer.share_groups():
        if len(members) > 1:
            groups(members)
    checkpointer.sharer = groups
    return groups
