"""The generator thread budget: fixed when asked, else the fewest threads that
keep generation at least twice as fast as I/O, within the node's share."""
import pytest

from dlio_ckpt_ext.engine.threads import TARGET_MARGIN, ThreadBudget, binding, cpu_share


def test_adaptive_budget_starts_at_one_and_adds_threads_while_generation_lags():
    budget = ThreadBudget(share=4)
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
    budget = ThreadBudget(share=2.5)
    for _ in range(5):
        budget.observe(fill_s=1.0, io_s=1.0)
    assert budget.current == 2 and budget.limit == 2
    # at its limit with generation still under the target (not slower than I/O: no limit)
    assert budget.starved_files == 4 and not budget.starved


def test_generation_limits_a_checkpoint_only_where_it_was_slower_than_io_for_most_bytes():
    """The quickstart's case: one thread allowed, generation 3x I/O on 19 files of
    20 and slower than I/O on one: that checkpoint's figure is the storage's. A
    file merely under the target margin (1.5x) is no limit either."""
    budget = ThreadBudget(share=1)
    for i in range(20):
        budget.observe(fill_s=1.2 if i == 7 else 0.3, io_s=1.0, nbytes=100, step=1)
    budget.observe(fill_s=1.0, io_s=1.5, nbytes=100, step=2)
    assert budget.starved_files == 2 and budget.generation_limited_steps == [] and not budget.starved
    # step 3: the big file's generation took longer than its write; step 4: only the small one's
    budget.observe(fill_s=2.0, io_s=1.0, nbytes=600, step=3)
    budget.observe(fill_s=0.1, io_s=1.0, nbytes=400, step=3)
    budget.observe(fill_s=0.1, io_s=1.0, nbytes=600, step=4)
    budget.observe(fill_s=2.0, io_s=1.0, nbytes=400, step=4)
    assert budget.generation_limited_steps == [3] and budget.starved
    assert budget.describe()["generation_limited_steps"] == [3]


def test_below_the_thread_limit_slow_generation_adds_a_thread_rather_than_limiting():
    budget = ThreadBudget(share=4)
    budget.observe(fill_s=2.0, io_s=1.0, nbytes=100, step=1)
    assert budget.current == 2 and budget.generation_limited_steps == []


def test_a_fixed_budget_stays_fixed():
    budget = ThreadBudget(share=1, override=3)
    budget.observe(fill_s=1.0, io_s=100.0)
    budget.observe(fill_s=1.0, io_s=0.1)
    assert budget.current == 3 and budget.describe()["mode"] == "fixed"
    assert not budget.starved


SOCKETS = [frozenset(range(0, 96)), frozenset(range(96, 192))]
TOPOLOGY = {"core": {frozenset({c}) for c in range(192)}, "numa": set(SOCKETS), "package": set(SOCKETS)}


@pytest.mark.parametrize("masks, share, bound", [
    # 4 unbound ranks on a 2 x 96 CPU node: every CPU shared by 4
    ([frozenset(range(192))] * 4, 48.0, "none"),
    # Open MPI's default above 2 processes: bound to a NUMA domain, here a socket, 2 ranks on each
    ([SOCKETS[0], SOCKETS[0], SOCKETS[1], SOCKETS[1]], 48.0, "numa"),
    # --bind-to core: one CPU each
    ([frozenset({0}), frozenset({1}), frozenset({2}), frozenset({3})], 1.0, "core"),
    # --map-by ppr:4:node:PE=48: 48 CPUs of its own each
    ([frozenset(range(i * 48, (i + 1) * 48)) for i in range(4)], 48.0, "cpuset"),
])
def test_a_ranks_share_counts_each_cpu_once_across_the_node(masks, share, bound):
    assert [cpu_share(m, masks) for m in masks] == [share] * 4
    assert binding(masks, online=range(192), topology=TOPOLOGY) == bound
    # the rule before: the rank's own mask divided by the ranks on the node again
    assert len(masks[0]) // 4 != share or bound == "none"


def test_budget_is_the_share_rounded_down_and_at_least_one():
    assert ThreadBudget(share=48.0).limit == 48 and ThreadBudget(share=0.5).limit == 1
    assert ThreadBudget(share=2.5).limit == 2
    assert ThreadBudget(share=sum([1 / 3] * 144)).limit == 48  # a float sum just under 48 is 48
