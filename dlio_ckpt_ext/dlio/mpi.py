"""Where this rank sits in the job, and how a failure ends the whole job."""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    ranks_per_node: int  # ranks sharing this rank's node (MPI shared-memory split)
    hosts: tuple[str, ...]  # one entry per node, sorted

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)


def topology(comm) -> Topology:
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hosts = tuple(sorted(set(comm.allgather(MPI.Get_processor_name()))))
    topo = Topology(comm.rank, comm.size, local.rank, local.size, hosts)
    local.Free()
    return topo


def abort(comm, message: str, exc: BaseException | None = None, code: int = 1) -> None:
    """Print why, then end every rank: a peer waiting at a barrier must not hang."""
    detail = "".join(traceback.format_exception(exc)) if exc is not None and not _expected(exc) else ""
    sys.stderr.write(f"[ERROR] rank {comm.rank}: {message}\n{detail}")
    sys.stderr.flush()
    comm.Abort(code)


def _expected(exc: BaseException) -> bool:
    """Errors whose message says it all (no traceback needed)."""
    from dlio_ckpt_ext.errors import ConfigError, StorageError
    return isinstance(exc, (ConfigError, StorageError))


def stdout_is_terminal() -> bool:
    """Whether what this rank prints reaches a person's terminal.

    Open MPI gives every rank a pseudo-terminal even when mpirun's own output
    goes to a pipe or a file, so under mpirun the launcher's stdout decides.
    """
    if not sys.stdout.isatty():
        return False
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMIX_RANK" in os.environ:
        try:
            return os.readlink(f"/proc/{os.getppid()}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
        except OSError:
            return False
    return True
