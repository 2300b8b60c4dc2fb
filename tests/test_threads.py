"""The generator thread budget: fixed when asked, else the fewest threads that
keep generation at least twice as fast as I/O, within the node's share."""
from dlio_ckpt_ext.engine.threads import TARGET_MARGIN, ThreadBudget


def test_adaptive_budget_starts_at_one_and_adds_threads_while_generation_lags():
    budget = ThreadBudget(ranks_on_node=1)
    budget.limit = 4
    assert budget.current == 1
    budget.observe(fill_s=1.0, io_s=1.5)   # generation only 1.5x I/O: below the target
    assert budget.current == 2
    budget.observe(fill_s=0.5, io_s=0.9)   # 1.8x: still below
    assert budget.current == 3
    budget.observe(fill_s=0.3, io_s=0.9)   # 3x: enough, and two threads would give 2x: keep 3
    assert budget.current == 3
    budget.observe(fill_s=0.1, io_s=0.9)   # 9x: one fewer would still give 6x
    assert budget.current == 2
    assert budget.used == [1, 2, 3, 3]
    assert budget.describe()["target_margin"] == TARGET_MARGIN


def test_adaptive_budget_never_exceeds_the_node_share():
    budget = ThreadBudget(ranks_on_node=1)
    budget.limit = 2
    for _ in range(5):
        budget.observe(fill_s=1.0, io_s=1.0)
    assert budget.current == 2


def test_a_fixed_budget_stays_fixed():
    budget = ThreadBudget(ranks_on_node=4, override=3)
    budget.observe(fill_s=1.0, io_s=100.0)
    budget.observe(fill_s=1.0, io_s=0.1)
    assert budget.current == 3 and budget.describe()["mode"] == "fixed"
