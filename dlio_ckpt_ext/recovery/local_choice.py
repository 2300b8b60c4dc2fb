"""Which tier a tiered job restores from, decided as Megatron-LM decides with
NVIDIA's local checkpoints (docs/recovery.md).

NVRx's find_latest: every rank lists its local folder and the listings are
all-gathered; an iteration is usable when every rank's part of it is held by
the rank or by a peer of its replication clique. Here the listings are
gathered on rank 0, which decides for all: the same decision at O(1) a rank
(an all-gather hands every rank all the listings). Megatron then restores from
the local tier when that iteration is at least the persistent tier's newest,
else from the persistent tier: a clique that lost every copy of a part sends
the whole job there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass
class LocalChoice:
    """The newest iteration every rank can get from the local tier (None: none),
    (owner, holder) of every part that must cross between ranks (every other
    rank reads its own), and why no newer iteration was usable."""
    iteration: Optional[int]
    moved: list[tuple[int, int]] = field(default_factory=list)
    reason: str = ""


def choose_local(held: list[set[tuple[int, int]]], clique: Callable[[int], tuple[int, ...]]) -> LocalChoice:
    """held[h]: the (iteration, owner) parts rank h holds whole; clique(r): the
    ranks that keep r's part, r first. O(ranks x clique x iterations held)."""
    size = len(held)
    reason = ""
    for iteration in sorted({it for parts in held for it, _ in parts}, reverse=True):
        moved, lost = [], []
        for owner in range(size):
            holders = [h for h in clique(owner) if (iteration, owner) in held[h]]
            if not holders:
                lost.append(owner)
            elif holders[0] != owner:
                moved.append((owner, holders[0]))
        if not lost:
            return LocalChoice(iteration, moved, reason)
        reason = reason or (f"clique {list(sorted(clique(lost[0])))} lost every copy of rank {lost[0]}'s part of "
                            f"iteration {iteration}")
    return LocalChoice(None, [], reason or "no local checkpoint on any rank")


def choose_tier(local: LocalChoice, persistent: Optional[int]) -> tuple[str, str]:
    """("local" or "persistent", why), as Megatron chooses between them."""
    if local.iteration is not None and (persistent is None or local.iteration >= persistent):
        how = f"every part held locally ({len(local.moved)} from a peer)"
        return "local", how + (f"; {local.reason}" if local.reason else "")
    if local.iteration is None:
        return "persistent", local.reason
    return "persistent", (f"the local tier's newest whole iteration {local.iteration} is older than the persistent "
                          f"tier's {persistent}" + (f" ({local.reason})" if local.reason else ""))
