"""Our layouts beside the files the real libraries write (fidelity/manifests,
recorded by fidelity/run.sh): for each manifest our save of the same shape,
parallelism and world size runs on POSIX under strace, and every file name,
size, rename and data-file count must match, or be a difference listed in KEPT
with its reason. fsyncs are printed beside the real ones: we fsync every data
file, as DLIO and MLPerf do (docs/fidelity.md)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fidelity"))
import compare  # noqa: E402
import ours  # noqa: E402
import record  # noqa: E402
from compare import Kept, load, manifests, markdown, run_ours, unexplained  # noqa: E402

#: our settings in the comparison of each layout (the ones the checks assert)
OURS: dict[str, dict] = {
    # DeepSpeed's own files; the default (upstream DLIO's, CLOSED's) is printed beside them
    "deepspeed": {"checkpoint": {"deepspeed_files": "deepspeed"}},
}

FSYNC_EVERY_FILE = "we fsync every file we write, as DLIO and MLPerf require; the framework does not"
#: differences kept on purpose, by layout, each with its reason
KEPT: dict[str, list[Kept]] = {
    "orbax": [Kept("renames", "", "TensorStore commits when its writes' timing forces it: a save makes a commit "
                   "(a manifest rewritten through a rename) more or less than the usual count we make", within=1)],
}


def our_dir(manifest: dict) -> str:
    """The checkpoint folder our layout (with OURS's settings) names for the manifest's step
    (Hugging Face's publish has none: ours is the first)."""
    cfg = ours.config({**manifest, "ours": OURS.get(manifest["layout"], {})}, "unused")
    return cfg.layout.checkpoint_dir(manifest["step"] or 1)


needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (.ci/run installs it)")


@needs_strace
@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.stem)
def test_our_layout_matches_the_real_library(path, tmp_path):
    m = load(path)
    files, ops = run_ours(m, OURS.get(m["layout"], {}), str(tmp_path))
    c = compare.compare(m, files, ops, our_dir(m))
    kept = KEPT.get(m["layout"], [])
    print(markdown(c, kept))
    missing, stale = unexplained(c, kept)
    assert not missing, f"differences from {m['library']} {m['version']} with no reason kept: {missing}"
    assert not stale, f"kept differences that no longer occur (remove them): {stale}"


#: the real files streaming.content=tensors is calibrated against: fp32 (torch's own init,
#: full mantissas) and bf16 weights. DeepSpeed's and Megatron's optimizer files hold fp32
#: state one step away from bf16 values (their low mantissa bits mostly zero): no
#: trained checkpoint's, so not a target (docs/fidelity.md)
TENSOR_TARGETS = {"dcp-fsdp2-w2": "fp32", "safetensors-10MB-w1": "bf16"}


def tensor_ratios(files: list[dict]) -> dict[str, float]:
    """Mean zstd and lz4 ratios of the tensor files (the ones a manifest measured)."""
    measured = [f for f in files if "zstd" in f]
    return {k: sum(f[k] * f["size"] for f in measured) / sum(f["size"] for f in measured) for k in ("zstd", "lz4")}


@pytest.mark.parametrize("name", sorted(TENSOR_TARGETS))
def test_tensors_content_compresses_as_the_real_libraries_files(name, tmp_path):
    """streaming.content=tensors: zstd and lz4 keep the share of our files they keep of
    the real library's files of the same dtype, within 2 %; incompressible stays so."""
    m = load(Path(compare.MANIFESTS) / f"{name}.json")
    real = tensor_ratios(m["files"])
    for content in ("tensors", "incompressible"):
        ours.save({**m, "ours": {**OURS.get(m["layout"], {}), "streaming": {"content": content}}}, str(tmp_path / content))
        got = tensor_ratios(record.files(str(tmp_path / content)))
        print(name, content, {k: round(v, 4) for k, v in got.items()}, "real", {k: round(v, 4) for k, v in real.items()})
        if content == "tensors":
            assert all(abs(got[k] - real[k]) <= 0.02 * real[k] for k in real), (got, real)
        else:
            assert got["zstd"] > 0.999 and got["lz4"] > 0.999


@needs_strace
@pytest.mark.parametrize("name", ["deepspeed-zero3-w2", "deepspeed-zero1-w2"])
def test_deepspeeds_default_files_are_upstream_dlios_and_their_difference_is_shown(name, tmp_path):
    """The default deepspeed layout (upstream DLIO's sizes, CLOSED's) beside DeepSpeed's
    own save: printed; ZeRO-3's model states are where most of it lies."""
    m = load(Path(compare.MANIFESTS) / f"{name}.json")
    files, ops = run_ours(m, {}, str(tmp_path))
    dlio_dir = ours.config({**m, "ours": {}}, "unused").layout.checkpoint_dir(m["step"])
    c = compare.compare(m, files, ops, dlio_dir)
    print(markdown(c, []))
    names = {d.path for d in c.differences() if d.kind == "name"}
    assert {"latest", "zero_to_fp32.py", "zero_to_torch.py"} <= names  # DeepSpeed's own, not DLIO's
    if "zero3" in name:  # DLIO writes the weights' shard there; DeepSpeed 0.19.8 none (11,177 B)
        model = [d for d in c.differences() if d.kind == "size" and d.path.endswith("model_states.pt")]
        assert len(model) == 2 and all(d.real == 11177 and d.ours > 100 * d.real for d in model)


@pytest.mark.parametrize("overrides, key, allowed", [
    ({"checkpoint": {"layout": "dcp", "deepspeed_files": "deepspeed"}}, "checkpoint.deepspeed_files", "dlio with"),
    ({"checkpoint": {"deepspeed_files": "torch"}}, "checkpoint.deepspeed_files", "dlio or deepspeed"),
    ({"checkpoint": {"layout": "dcp", "devices_per_rank": 4}}, "checkpoint.devices_per_rank", "1 with"),
    ({"checkpoint": {"layout": "orbax", "devices_per_rank": 0}}, "checkpoint.devices_per_rank", "a positive integer"),
    ({"checkpoint": {"layout": "megatron", "platform": "gpu"}}, "checkpoint.platform", "tpu (the default)"),
    ({"checkpoint": {"layout": "orbax", "platform": "tpuv5"}}, "checkpoint.platform", "tpu or gpu"),
    ({"checkpoint": {"layout": "dcp"}, "model": {"parallelism": {"overlap_grad_reduce": False}}},
     "model.parallelism.overlap_grad_reduce", "true (the default)"),
    ({"streaming": {"content": "zeros"}}, "streaming.content", "incompressible or tensors"),
    ({"streaming": {"content": "tensors", "compress_ratio": 2}}, "streaming.content", "incompressible with"),
])
def test_the_new_settings_refuse_what_their_framework_does_not_do(overrides, key, allowed):
    from omegaconf import OmegaConf
    from dlio_ckpt_ext.config import load_config
    from dlio_ckpt_ext.errors import ConfigError
    base = {"model": {"num_layers": 2, "parallelism": {"zero_stage": 1},
                      "transformer": {"hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                      "num_attention_heads": 4, "num_kv_heads": 2}}}
    merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))
    with pytest.raises(ConfigError) as err:
        load_config(merged, 2)
    assert err.value.key == f"workload.{key}" and allowed in err.value.allowed


def test_closed_keeps_dlios_files_and_incompressible_bytes():
    """Both settings decide what a run writes: a CLOSED submission must keep the preset's."""
    from dlio_ckpt_ext.submission.submit import written
    cfg = ours.config({"shape": {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                                 "num_attention_heads": 4, "num_kv_heads": 2, "model_datatype": "bf16",
                                 "optimizer_datatype": "fp32"},
                       "parallelism": {"zero_stage": 3}, "layout": "deepspeed", "world_size": 2,
                       "ours": {"checkpoint": {"deepspeed_files": "deepspeed"}, "streaming": {"content": "tensors"}}},
                      "unused")
    assert written(cfg)["checkpoint.deepspeed_files"] == "deepspeed" and written(cfg)["streaming.content"] == "tensors"
    assert not cfg.layout.mlperf_closed


@pytest.mark.parametrize("layout, framework_says", [
    ("deepspeed", "DeepSpeed itself: no fsync, no rename"),
    ("dcp", "torch.distributed.checkpoint itself: each .distcp fsynced, then .metadata.tmp fsynced and renamed"),
    ("orbax", "TensorStore fsyncs each data file"),
])
def test_results_say_what_the_framework_itself_would_wait_for(tmp_path, layout, framework_says):
    """RESULTS (save) has a durability line: our fsync of every file beside the framework's own."""
    from dlio_ckpt_ext.checkpoint.checkpointer import Checkpointer
    from dlio_ckpt_ext.results.phases import results_block
    m = {"shape": {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "vocab_size": 1024,
                   "num_attention_heads": 4, "num_kv_heads": 2, "model_datatype": "fp32", "optimizer_datatype": "fp32"},
         "parallelism": {"zero_stage": 1 if layout == "megatron" else 3}, "layout": layout, "world_size": 2}
    ck = Checkpointer(ours.config({**m, "ours": {}}, str(tmp_path)), 0, 2, 2)
    said = ck.durability()
    assert said.startswith("every file fsynced before the save counts (DLIO's and MLPerf's rule); ") and framework_says in said
    report = {"generation_gib_s_per_rank": 1.0, "fill_s": 1.0, "generation_to_io_ratio": 2.0, "io_gib_s_per_rank": 0.5,
              "io_s": 2.0, "close_s": 0.1, "pipeline_overhead_pct": 1.0, "bottleneck": "io", "chunks_io_bound": 3,
              "chunks_fill_bound": 0}
    assert f"  {'durability':28s} {said}" in results_block("save", report, durability=said)
    unsynced = ours.config({**m, "ours": {"checkpoint": {"fsync": False}}}, str(tmp_path / "b"))
    assert Checkpointer(unsynced, 0, 2, 2).durability().startswith("no fsync (checkpoint.fsync=false)")


def request_manifests() -> list[Path]:
    return sorted((Path(compare.MANIFESTS) / "requests").glob("*.json"))


#: the preset whose layout each request manifest's save writes
PRESETS = {"dcp": "torchtitan_llama3_8b_checkpoint", "megatron": "megatron_llama3_8b_checkpoint",
           "orbax": "maxtext_llama3_8b_checkpoint"}


def overrides(sections: dict, prefix: str = "++workload.") -> list[str]:
    out = []
    for key, value in sections.items():
        out += overrides(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
    return out


def sizes(counted: dict) -> list[int]:
    """{size: count} as the sorted sizes, each as often as counted."""
    return sorted(int(size) for size, n in counted.items() for _ in range(n))


@pytest.mark.e2e
@pytest.mark.parametrize("path", request_manifests(), ids=lambda p: p.stem)
def test_our_run_through_the_frameworks_client_sends_the_real_saves_requests(path, s3, tmp_path):
    """DLIO saves the manifest's shape at its world size through the same client library, behind the
    same recording front (fidelity/request_front.py) as the real save was: the same requests by kind
    on the same objects, the same part and PUT sizes, the same copies and conditional writes. Our
    run's own bookkeeping (its ownership marker, its inventory) is left out; the most in
    flight depends on how fast each side hands its bytes over, so it is printed beside the real one
    and only bounded."""
    import json

    from conftest import BUCKET
    from dlio_run import run_dlio
    from request_front import front_for, summary
    from dlio_ckpt_ext.result_files import OWNER_FILE
    m = load(path)
    want = m["requests"]
    sections = ours.workload({**m, "ours": OURS.get(m["layout"], {})}, "unused")
    sections["checkpoint"].pop("checkpoint_folder")
    if "devices_per_process" in m["parallelism"]:  # the preset's own (MaxText's 8) otherwise
        sections["checkpoint"]["devices_per_rank"] = m["parallelism"]["devices_per_process"]
    front = front_for(s3.endpoint)
    try:
        run = run_dlio(tmp_path, m["world_size"], PRESETS[m["layout"]], *overrides(sections),
                       "++workload.storage.storage_type=s3", f"++workload.storage.storage_root=s3://{BUCKET}/{path.stem}",
                       f"++workload.storage.storage_options.storage_library={m['storage_library']}",
                       env={**s3.env(), "AWS_ENDPOINT_URL": front.endpoint})
    finally:
        front.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    root = json.loads((run.out / "manifest.json").read_text())["storage"]["root"]
    prefix = "/" + root.split("://", 1)[1] + "/"
    # our run's own bookkeeping: its ownership marker, its inventory's listing and its read-back of the
    # save root's tracker (it must name the checkpoint just saved)
    got = summary(front.records, prefix, record.normalise, skip=lambda r, name: name == OWNER_FILE or r["kind"] == "ListObjects" or (
        r["kind"] == "GetObject" and "/" not in name))
    print(f"most in flight: ours {got['max_in_flight']}, the real save's {want['max_in_flight']}")
    assert want["max_in_flight"] / 4 <= got["max_in_flight"] <= want["max_in_flight"] * 4
    if "manifest.ocdbt" in str(want["objects"]):
        return same_ocdbt_commits(got, want)
    for key in ("by_kind", "conditional", "copies", "objects"):
        assert got[key] == want[key], key
    for key in ("upload_part_sizes", "put_sizes"):  # a file's last part: its size, as our files' sizes match
        assert len(sizes(got[key])) == len(sizes(want[key])) and all(
            compare.same_size(a, b) for a, b in zip(sizes(want[key]), sizes(got[key]))), (key, got[key], want[key])


def ocdbt_databases(requests: dict) -> dict[str, dict]:
    """Each OCDBT database (the folder of a manifest.ocdbt) in a request summary: its commits (data
    files PUT), its manifest's PUTs, HEADs and GETs, the manifest's conditional PUTs in order of
    kind, and the bytes of its data files."""
    count = {}
    for line in requests["objects"]:
        kind_name, n = line.rsplit(" x", 1)
        count[kind_name] = int(n)
    out = {}
    for kind_name in count:
        if kind_name.endswith("/manifest.ocdbt"):
            db = kind_name.split(" ", 1)[1][:-len("/manifest.ocdbt")]
            conditional = {line.rsplit(" ", 2)[1]: int(line.rsplit(" x", 1)[1])
                           for line in requests["conditional_writes"] if f" {db}/manifest.ocdbt " in line}
            out[db] = {"commits": count.get(f"PutObject {db}/d/{{hash}}", 0),
                       **{kind: count.get(f"{kind} {db}/manifest.ocdbt", 0)
                          for kind in ("PutObject", "HeadObject", "GetObject")},
                       "conditional": conditional,
                       "data_bytes": requests["written"].get(f"{db}/d/{{hash}}", 0)}
    return out


def same_ocdbt_commits(got: dict, want: dict) -> None:
    """OCDBT's protocol, database by database. How many commits a process makes is TensorStore's
    timing (two real saves of one state made 4 and 5), so the counts are compared as the protocol
    binds them: a commit is one data file, a HEAD of the manifest and its conditional PUT; the
    first PUT If-None-Match: *, every next If-Match; the manifest read before the first. Ours
    leaves out what TensorStore reads back of its own B-tree nodes (ranged GETs of the data files
    it just wrote) and Orbax's epath files, which have no s3:// path in Orbax (save_orbax.py)."""
    ours_dbs, real_dbs = ocdbt_databases(got), ocdbt_databases(want)
    assert sorted(ours_dbs) == sorted(real_dbs)
    assert "UploadPart" not in got["by_kind"] and "UploadPart" not in want["by_kind"]  # one PUT a data file
    for db, real in real_dbs.items():
        mine = ours_dbs[db]
        print(db, "ours", mine, "real", real)
        for side in (mine, real):
            assert side["commits"] >= 1 and side["PutObject"] == side["HeadObject"] == side["commits"], (db, side)
            assert side["conditional"] == {"if_none_match": 1, **({"if_match": side["commits"] - 1}
                                                                  if side["commits"] > 1 else {})}, (db, side)
            assert side["GetObject"] >= 1, (db, side)
        assert real["commits"] / 2 <= mine["commits"] <= real["commits"] * 2, (db, mine, real)
        assert compare.same_size(real["data_bytes"], mine["data_bytes"]), (db, mine, real)
