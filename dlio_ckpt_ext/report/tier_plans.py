"""dlio-ckpt-report plan, for a tiered run: what each rank and node keeps on
its local tier and sends to the storage under test, and the rate a
persistent save needs to fit in its interval, at any rank count."""
from __future__ import annotations

from dlio_ckpt_ext.shared_plans import tier_plan
from dlio_ckpt_ext.config import RunConfig

GiB = 1 << 30


def tier_summary(cfg: RunConfig, ranks: int, ranks_per_node: int) -> dict:
    """Bytes per rank and per node of both tiers at `ranks` ranks, ranks_per_node a node."""
    t = cfg.tiers
    apart = tier_plan.jump(t.replication_jump, ranks_per_node)
    tier_plan.check_replication(ranks, t.replication, apart)
    part = [cfg.layout.rank_plan(cfg.shape, cfg.parallelism, ranks, r).total_bytes for r in range(ranks)]
    local = [tier_plan.local_bytes(r, t.replication, apart, part.__getitem__) for r in range(ranks)]
    nodes = -(-ranks // ranks_per_node)
    node_local = [tier_plan.node_bytes(n, ranks_per_node, ranks, local.__getitem__) for n in range(nodes)]
    node_persistent = [tier_plan.node_bytes(n, ranks_per_node, ranks, part.__getitem__) for n in range(nodes)]
    interval = cfg.persistent_interval_s
    return {"ranks": ranks, "ranks_per_node": ranks_per_node, "nodes": nodes, "replication": t.replication,
            "replication_jump": apart, "persistent_every": t.persistent_every, "interval_s": interval,
            "persistent_bytes": sum(part), "persistent_rank_bytes_max": max(part),
            "persistent_rank_bytes_min": min(part), "persistent_node_bytes_max": max(node_persistent),
            "local_rank_bytes_max": max(local), "local_rank_bytes_min": min(local),
            "local_node_bytes_max": max(node_local),
            "local_room_node_bytes": tier_plan.room_needed(max(node_local)),
            "persistent_gib_s_to_fit": sum(part) / GiB / interval,
            "persistent_node_gib_s_to_fit": max(node_persistent) / GiB / interval}


def tier_lines(s: dict) -> list[str]:
    gib = lambda n: f"{n / GiB:.3f} GiB"  # noqa: E731
    return [f"tiers plan: {s['ranks']} ranks, {s['ranks_per_node']} a node ({s['nodes']} nodes), every checkpoint "
            f"local (replication {s['replication']}, peers {s['replication_jump']} ranks apart), every "
            f"{s['persistent_every']} also persistent",
            f"  persistent save      {s['persistent_bytes']} bytes ({gib(s['persistent_bytes'])}); per rank "
            f"{gib(s['persistent_rank_bytes_min'])} to {gib(s['persistent_rank_bytes_max'])}, per node up to "
            f"{gib(s['persistent_node_bytes_max'])}",
            f"  local save           per rank {gib(s['local_rank_bytes_min'])} to {gib(s['local_rank_bytes_max'])} "
            f"({s['replication']} parts), per node up to {gib(s['local_node_bytes_max'])}; room on a node's "
            f"local_root: {gib(s['local_room_node_bytes'])} ({tier_plan.ITERATIONS_KEPT} iterations)",
            f"  to fit its interval  {s['interval_s']:g} s: the storage under test must take "
            f"{s['persistent_gib_s_to_fit']:.3f} GiB/s ({s['persistent_node_gib_s_to_fit']:.3f} GiB/s from the "
            "busiest node) while the foreground goes on"]
