"""The results room: one module a block of a run's results, each answering the
same questions about its block: what it gathers from the ranks, its summary
for the record, its lines in RESULTS, its warnings, and its panel in the run's
picture (`dlio-ckpt-report run`). `dlio/` keeps DLIO's glue and the run's
lifecycle, and calls these.

The blocks: the save and load phases (phases.py, from what every rank's
window gathers: windows.py), the restore (restore.py), the model load
(model_load.py), async mode (async_saves.py), TIERS, RECOVERY, TRAINING and
GOODPUT; lines.py puts RESULTS in order and run_warnings.py says its warnings.
Each block drawn below the phases' panels has `KEY` (the record key that says
a run has it), `drawn(block)` (whether there is something to draw) and
`panel(record, ax)`: a new one is one module and one line in `BLOCKS`."""
from __future__ import annotations

from typing import Callable

from dlio_ckpt_ext.results import recovery, tiers, training

#: the blocks beyond save and load, in the picture's order
BLOCKS = (tiers, recovery, training)


def panels_of(record: dict) -> list[tuple[str, Callable]]:
    """(record key, panel) of every block the run has something of to draw."""
    return [(b.KEY, b.panel) for b in BLOCKS if record.get(b.KEY) and b.drawn(record[b.KEY])]
