"""Finding the newest whole checkpoint as each framework finds it on restart,
on a real directory, no DLIO: a killed save's half-written newest passed
over and named, every request counted."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
from dlio_ckpt_ext.config import load_config
from dlio_ckpt_ext.recovery import discovery

SHAPE = {"num_layers": 2, "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                          "num_attention_heads": 4, "num_kv_heads": 2}}
#: each layout as its preset sets it, with the requests its framework makes at 1 rank over 3 checkpoints
LAYOUTS = {
    "deepspeed": ({}, {}),
    "deepspeed_files": ({"deepspeed_files": "deepspeed"}, {}),
    "dcp": ({}, {}),
    "megatron": ({}, {"zero_stage": 1}),
    "orbax": ({}, {}),
    "safetensors": ({}, {}),
}


def checkpointer(folder: Path, layout: str, **checkpoint) -> Checkpointer:
    extra, parallelism = LAYOUTS[layout]
    cfg = load_config(OmegaConf.create({
        "model": {**SHAPE, "parallelism": parallelism},
        "streaming": {"chunk_size": "1MiB", "read_size": "1MiB"},
        "checkpoint": {"checkpoint_folder": str(folder), "layout": layout.split("_")[0], **extra, **checkpoint}}), 1)
    ck = Checkpointer(cfg, 0, 1, 1)
    ck.prepare()
    return ck


def killed_during(folder: Path, ck: Checkpointer, step: int) -> str:
    """What a save killed before its commit leaves: no commit file (or, where a
    layout has none, a data file missing), the tracker still naming the step
    before, the folder under its temporary name where the commit renames it."""
    name = ck.directory(step)
    d = folder / name
    plan = ck.rank_plan(0)
    for f in plan.commit_files:
        (d / f.name).unlink(missing_ok=True)
    if not plan.commit_files:
        (d / plan.files[-1].name).unlink()
    for root, content in ck.layout.root_files(step - 1):
        (folder / root).write_bytes(content)
    staged = ck.layout.staging_dir(step)
    if staged:
        d.rename(folder / staged)
        return staged
    return name


def saved(tmp_path: Path, layout: str, steps: int = 3) -> tuple[Path, Checkpointer]:
    folder = tmp_path / "ckpt"
    ck = checkpointer(folder, layout, num_checkpoints_write=steps, num_checkpoints_read=0)
    for step in range(1, steps + 1):
        ck.save(step)
    ck.close()
    return folder, checkpointer(folder, layout, num_checkpoints_write=0, num_checkpoints_read=1, resume="latest")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_newest_whole_checkpoint_is_found(tmp_path, layout):
    folder, ck = saved(tmp_path, layout)
    look = discovery.Look(ck.backend, 0)
    latest = ck.layout.find_latest(look, ck.checkpoint_files)
    assert (latest.checkpoint, latest.name, latest.skipped) == ((3, 1), ck.directory(3), [])
    assert latest.warning() is None
    assert sum(look.requests.values()) >= 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_half_written_newest_checkpoint_is_passed_over_and_named(tmp_path, layout):
    folder, ck = saved(tmp_path, layout)
    left = killed_during(folder, ck, 3)
    latest = ck.layout.find_latest(discovery.Look(ck.backend, 0), ck.checkpoint_files)
    assert (latest.checkpoint, latest.name, latest.skipped) == ((2, 1), ck.directory(2), [left])
    assert latest.warning() == (f"[WARNING] half-written checkpoint {left} skipped (no commit, or files missing or "
                                f"short): restoring {ck.directory(2)}")
    # what is restored is whole: every planned file of it at its size
    assert all((folder / ck.directory(2) / f).stat().st_size == n for f, n in ck.checkpoint_files().items())


#: requests one rank makes finding the newest of 3 whole checkpoints (LIST, GET, HEAD)
REQUESTS = {
    "deepspeed": {"LIST": 2},                           # ours: the folder, then the newest candidate's files
    "deepspeed_files": {"HEAD": 1, "GET": 1, "LIST": 2},  # `latest`, its tag globbed; rank 0's listing (ours)
    "dcp": {"LIST": 1, "HEAD": 6},                      # the folder, two markers probed in every step folder
    "megatron": {"HEAD": 2, "GET": 2, "LIST": 2},       # the tracker, the folder, metadata.json; rank 0's listing
    "orbax": {"LIST": 1, "GET": 3},                     # the step folders, each one's _CHECKPOINT_METADATA
    "safetensors": {"LIST": 2},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_framework_makes_its_own_requests(tmp_path, layout):
    folder, ck = saved(tmp_path, layout)
    look = discovery.Look(ck.backend, 0)
    ck.layout.find_latest(look, ck.checkpoint_files)
    assert look.requests == REQUESTS[layout]


def test_without_any_whole_checkpoint_nothing_is_found_and_the_half_written_one_is_named(tmp_path):
    folder, ck = saved(tmp_path, "dcp", steps=1)
    left = killed_during(folder, ck, 1)
    latest = ck.layout.find_latest(discovery.Look(ck.backend, 0), ck.checkpoint_files)
    assert (latest.checkpoint, latest.skipped) == (None, [left])
    assert latest.warning().endswith(": no whole checkpoint found")


def test_a_part_crosses_in_pieces_and_every_byte_is_verified(tmp_path):
    """The holder's file read and sent in read_size pieces, the receiver comparing
    each with the regenerated content; a changed byte is named by its offset."""
    from collections import deque

    from dlio_ckpt_ext.engine import BufferPool, ContentSpec, send_file
    from dlio_ckpt_ext.engine.buffers import allocate
    from dlio_ckpt_ext.engine.transfer import receive_part, send_part
    from dlio_ckpt_ext.errors import VerificationError
    from dlio_ckpt_ext.storage import open_backend

    backend = open_backend("local_fs", str(tmp_path), {}, False)
    size, piece_size, content = 5 * (1 << 20) + 4096 + 7, 1 << 20, ContentSpec(1234)
    pool = BufferPool(3, piece_size)
    send_file(backend, "part", size, content, pool, 1)
    link = deque()
    sent = send_part(backend, "part", size, pool, piece_size, lambda piece: link.append(bytes(piece)))
    assert sent.nbytes == size and [len(p) for p in link] == [piece_size] * 5 + [4096 + 7]
    buffers = memoryview(allocate(2 * piece_size))
    take = lambda piece: piece.__setitem__(slice(None), link.popleft())  # noqa: E731
    got = receive_part("part", size, piece_size, take, buffers[:piece_size], content, buffers[piece_size:], 1)
    assert got.nbytes == size and not link
    send_part(backend, "part", size, pool, piece_size, lambda piece: link.append(bytes(piece)))
    link[3] = link[3][:100] + bytes([link[3][100] ^ 1]) + link[3][101:]
    with pytest.raises(VerificationError, match=rf"part differs from the written data at byte offset "
                                                rf"{3 * piece_size + 100} \(received from its holder\)"):
        receive_part("part", size, piece_size, take, buffers[:piece_size], content, buffers[piece_size:], 1)
    pool.close()


def test_the_local_tier_is_chosen_as_megatron_chooses_it():
    from dlio_ckpt_ext.recovery.local_choice import choose_local, choose_tier
    from dlio_ckpt_ext.shared_plans import tier_plan
    clique = lambda r: tier_plan.group(r, 2, 1)  # noqa: E731  (0, 1) and (2, 3)
    whole = lambda it: [{(it, r) for r in clique(h)} for h in range(4)]  # noqa: E731
    nothing_lost = choose_local(whole(4), clique)
    assert (nothing_lost.iteration, nothing_lost.moved) == (4, [])
    assert choose_tier(nothing_lost, 4) == ("local", "every part held locally (0 from a peer)")
    one_lost = whole(4)
    one_lost[1] = set()
    choice = choose_local(one_lost, clique)
    assert (choice.iteration, choice.moved) == (4, [(1, 0)])
    # an older local iteration loses to a newer persistent step; a whole clique lost sends every rank there
    assert choose_tier(choice, 6)[0] == "persistent"
    clique_lost = whole(4)
    clique_lost[0] = clique_lost[1] = set()
    assert choose_tier(choose_local(clique_lost, clique), 4) == (
        "persistent", "clique [0, 1] lost every copy of rank 0's part of iteration 4")
    # the newest iteration a clique lost, an older one whole everywhere: the older is the local one
    both = [parts | {(2, r) for r in clique(h)} for h, parts in enumerate(clique_lost)]
    older = choose_local(both, clique)
    assert older.iteration == 2 and older.reason.startswith("clique [0, 1] lost every copy")
    assert choose_tier(older, 4)[0] == "persistent"


@pytest.mark.parametrize("settings, key, allowed", [
    ({"checkpoint": {"resume": "newest"}}, "workload.checkpoint.resume='newest'", '"" (the steps in turn) or latest'),
    ({"checkpoint": {"resume": "latest", "num_checkpoints_read": 2}}, "workload.checkpoint.num_checkpoints_read=2",
     "1 with resume=latest"),
    ({"recovery": {"lost_ranks": [1]}}, "workload.recovery.lost_ranks=[1]", "[] unless a tiered run"),
    ({"recovery": {"lost_ranks": [4]}}, "workload.recovery.lost_ranks=[4]", "a list of distinct ranks from 0 to 3"),
    ({"recovery": {"lost_ranks": [1, 1]}}, "workload.recovery.lost_ranks=[1, 1]", "a list of distinct ranks"),
])
def test_impossible_recoveries_are_refused_naming_the_key(tmp_path, settings, key, allowed):
    from dlio_ckpt_ext.errors import ConfigError
    given = {"model": SHAPE, "checkpoint": {"checkpoint_folder": str(tmp_path), "num_checkpoints_write": 0,
                                            "num_checkpoints_read": 1}}
    for section, values in settings.items():
        given[section] = {**given.get(section, {}), **values}
    with pytest.raises(ConfigError) as refused:
        load_config(OmegaConf.create(given), 4)
    assert str(refused.value).startswith(f"invalid config: {key}; allowed: {allowed}")


def test_a_listing_of_many_objects_counts_a_request_a_page():
    class Bucket:  # what a discovery asks of an object store, with 2,500 objects below one checkpoint
        has_directories = False

        def list_sizes(self, directory):
            return {f"{directory}/f{i}": 1 for i in range(2500)}

        def children(self, directory):
            return ["step-1"]

    look = discovery.Look(Bucket(), 0)
    assert len(look.sizes("step-1")) == 2500 and look.list() == ["step-1"]
    assert look.requests == {"LIST": 3 + 1}  # ListObjectsV2 answers 1,000 keys a page
