"""The recovery schedule: a load that comes back from a failure as a
restarting job does (docs/recovery.md). Every rank finds the newest whole
checkpoint on the storage under test as the layout's framework finds it; in
a tiered run the ranks' local listings are gathered too (NVRx's find_latest,
decided on rank 0 and broadcast) and the tier chosen as Megatron chooses it. The lost ranks
(workload.recovery.lost_ranks) find their local folders empty; their parts
come from a clique peer over MPI in read_size pieces, or, when a clique lost
every copy, the whole job restores from the persistent tier. Each rank's
record: the tier, why, the requests and seconds of the discovery, the bytes
from each source, and its window from the discovery's start to the last byte."""
from __future__ import annotations

import time
from dlio_ckpt_ext.dlio import progress
from dlio_ckpt_ext.dlio.schedules import conversion
from dlio_ckpt_ext.engine.profile import FileStats
from dlio_ckpt_ext.recovery import discovery
from dlio_ckpt_ext.errors import ConfigError
from dlio_ckpt_ext.recovery.local_choice import LocalChoice, choose_local, choose_tier
from dlio_ckpt_ext.recovery.saved_shape import resumed_job

#: the MPI tag of a part moving from its holder to the rank that lost it
PART_TAG = 0x5ec


def load(session, epoch: int, step: int) -> list[FileStats]:
    from mpi4py import MPI
    comm, ck, tier = session.comm, session.checkpointer, session.tier
    if tier is not None and session.rank in session.config.recovery.lost_ranks:
        with session.abort_on_error("emptying a lost rank's local tier"):
            tier.lose()
    comm.barrier()  # the failure is over: every rank starts back together
    start = time.time()
    with session.abort_on_error("finding the newest whole checkpoint"):
        look = discovery.Look(ck.backend, session.rank, lambda v: comm.allreduce(v, op=MPI.MAX),
                              lambda v: comm.bcast(v, root=0))
        latest = ck.layout.find_latest(look, ck.checkpoint_files)
        latest.saved = discovery.saved_shape(ck.layout, look, latest)
        requests = dict(look.requests)
        choice = None
        if tier is not None:
            held = comm.gather(tier.held(), root=0)
            choice = comm.bcast(choose_local(held, tier.clique) if session.rank == 0 else None, root=0)
            requests["local LIST"] = 1
    found_at = time.time()
    # compared as training iterations (a training run's DLIO names carry the epoch's own step)
    persistent = session.label(*latest.checkpoint) if latest.checkpoint else None
    chosen, why = choose_tier(choice, persistent) if choice is not None else \
        ("persistent", "checkpoint.resume=latest")
    if choice is not None and latest.saved is not None and latest.saved.world != session.size:
        chosen, why = "persistent", (f"the local tier restores only at the world size it was saved at (NVRx's "
                                     f"cliques), and the job was saved by {latest.saved.world} ranks, comes back "
                                     f"with {session.size}")
    if session.rank == 0 and latest.warning():
        progress.say_now(latest.warning())
    if chosen == "persistent" and latest.checkpoint is None:
        session._refuse_together(f"no whole checkpoint to restore in {ck.backend.uri('').rstrip('/')} "
                                 f"({latest.how}){'; ' + why if choice is not None else ''}", gathered=False)
    files: list[FileStats] = []
    local_bytes = moved = 0
    if chosen == "local":
        iteration = choice.iteration
        with session.abort_on_error(f"local recovery of iteration {iteration}"), \
                progress.span(session, "recover", iteration):
            local_bytes, moved = restore_local(session, choice)
    else:
        iteration, found_epoch = latest.checkpoint
        resized = resize(session, latest)
        load = conversion.load_of(session, iteration, found_epoch)
        if load != ck.load and session.rank == 0:
            resized["conversion"] = session.conversions[-1]
        files = session._checkpoint("load", found_epoch, iteration, load)
    session.recoveries.append({
        "tier": chosen, "step": iteration, "reason": why, "checkpoint": latest.name if chosen == "persistent" else
        None, "skipped": latest.skipped, "how": latest.how, "requests": requests, "start": start, "found_at": found_at,
        "end": time.time(), "local_bytes": local_bytes, "moved_bytes": moved,
        "storage_bytes": sum(f.nbytes for f in files), "lost_ranks": list(session.config.recovery.lost_ranks),
        **(resized if chosen == "persistent" else {})})
    return files


def resize(session, latest: discovery.Latest) -> dict:
    """The load of the found checkpoint at the world size its record says it was
    saved at, resharded as its framework reshards (every rank decides alike from
    the shape rank 0 shared); a disagreeing setting stops every rank, naming
    both. What the record says, for RECOVERY."""
    ck, cfg = session.checkpointer, session.config
    where = ck.backend.uri(latest.name)
    job, refusal = resumed_job(ck.job, latest.saved, cfg.checkpoint.saved_ranks, cfg.parallelism, where)
    if refusal is None:
        try:
            ck.layout.validate_job(cfg.shape, cfg.parallelism, job)
        except ConfigError as exc:
            refusal = f"{where} was saved by {job.saved_ranks} ranks: {exc}"
    session._refuse_together(refusal, gathered=False)
    ck.use_job(job)
    saved = latest.saved
    return {"saved_ranks": job.saved_ranks, "restore": job.pattern,
            "saved_shape": saved.record() if saved else None,
            "saved_as": (f"{saved.describe()} ({saved.source})" if saved else
                         f"{job.saved_ranks} ranks (nothing in the checkpoint says: "
                         f"{'checkpoint.saved_ranks' if cfg.checkpoint.saved_ranks else 'this run'})"),
            "restored_as": (f"{job.ranks} ranks through {ck.layout.reshards or ck.layout.framework}" if job.resharded
                            else f"{job.ranks} ranks, as saved")}


def restore_local(session, choice: LocalChoice) -> tuple[int, int]:
    """This rank's part of the chosen iteration, from its own folder or from the
    peer that holds it; the parts moving are taken in one order on every rank,
    so no send waits on a receive that waits on it. Returns (bytes read from
    the local tier, bytes received from a peer)."""
    tier, rank, comm = session.tier, session.rank, session.comm
    iteration, bar = choice.iteration, progress.ticking(session, None)
    local = moved = 0
    if rank not in {owner for owner, _ in choice.moved}:
        local += tier.read_part(iteration, rank, bar).nbytes
    for owner, holder in choice.moved:
        if rank == holder:
            local += tier.send_part(iteration, owner, lambda piece, o=owner: comm.Send(piece, dest=o, tag=PART_TAG),
                                    bar).nbytes
        elif rank == owner:
            moved += tier.receive_part(iteration, lambda piece, h=holder: comm.Recv(piece, source=h, tag=PART_TAG),
                                       bar).nbytes
    return local, moved
