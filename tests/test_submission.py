"""dlio-ckpt-submit's submission tree, judged by MLCommons' own submission checker
and report generator (mlcommons/storage at mlpstorage 3.0.26, in a virtual
environment of their own: run_scripts/tool_env.sh mlcommons)."""
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, other_file_system, tool, tool_env
from dlio_ckpt_ext import layouts
from dlio_ckpt_ext.submission.submit import Invocation, gap_violations
from dlio_run import SHRINK
from test_dlio_integration import SMALL_8B, expected_files

ORG, SYSTEM = "testorg", "testsys"
#: two writes and two reads of the 8B preset scaled down
TINY_8B = [*SHRINK, "++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=2",
           "++workload.streaming.verify=True"]
#: idle time that makes each invocation longer than the gap between them (DLIO's
#: start-up and the cache drop, 10-17 s here: the checker's 2.1.24 compares the two)
OUTLAST_THE_GAP = ["++workload.checkpoint.time_between_checkpoints=14"]


@pytest.fixture(scope="session")
def mlcommons_python() -> str:
    """MLCommons' checker and report generator, in their own environment, from
    the user's checkout of mlcommons/storage (no registry serves them)."""
    if not os.environ.get("MLPSTORAGE_SRC"):
        pytest.skip("needs MLCommons' submission checker and report generator: MLPSTORAGE_SRC=<your checkout of "
                    "mlcommons/storage, mlpstorage >= 3.0.26>")
    return str(tool_env("mlcommons") / "python")


def checkpoint_dir(tmp_path: Path) -> Path:
    """Checkpoints on another file system than the results (rule 4.4.2)."""
    folder = other_file_system(tmp_path)
    folder.mkdir()
    return folder


def submit(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dlio-ckpt-submit"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def checker_errors(output: str) -> dict[str, list[str]]:
    """[ERROR] [<rule> <name>] ... lines of the checker, by rule (4.6.1, CHECK-01, ...)."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^\[ERROR\] \[(\d+(?:\.\d+)+|[A-Z]+-\d+) (\w+)\] (.*)$", output, re.M):
        out.setdefault(m[1], []).append(m[3])
    return out


def fill_placeholders(path: Path) -> None:
    """What the submitter writes over our system description's placeholders."""
    values = {"the storage solution, in a sentence": "a local disk", "remote | local | remote_and_local": "local",
              "file | object | block": "file",
              "file | object (what the benchmark used: local_fs/direct_fs or s3)": "file", "open_source | closed_source | n/a": "open_source",
              "in_box | installable | n/a": "in_box", "true | false": "true",
              "seconds from writing to reading (int)": "0", "onprem | cloud": "onprem",
              "chassis or cloud instance type": "test VM", "sockets (int)": "1",
              "rack units per client (int); delete this line for a cloud deployment": "1",
              "power supplies needed (int)": "1", "power supplies per client (int)": "2", "volts (int)": "240",
              "watts (int)": "1800", "Standard | Bronze | Silver | Gold | Platinum | Titanium | Ruby | Unrated":
              "Platinum", "sum of the storage nodes' and switches' rack units (int); delete for cloud": "0"}
    text = path.read_text()
    for what, value in values.items():
        text = text.replace(f'"FILL IN: {what}"', value)
    assert '"FILL IN:' not in text, text
    path.write_text(text)


#: dlio-ckpt-submit with a pause before the read invocation (a drop_caches that sleeps)
LATE_READ = """
import sys, time
from dlio_ckpt_ext.submission import submit
dropped = submit.drop_caches
def slow(*a):
    time.sleep(2)
    return dropped(*a)
submit.drop_caches = slow
sys.exit(submit.main(sys.argv[1:]))
"""


def tiny(tmp_path_factory, *options: str, overrides: tuple = (), late_read: bool = False):
    """A write-then-read submission of the 8B preset scaled down, as OPEN (it
    breaks CLOSED rules), with its system description."""
    tmp = tmp_path_factory.mktemp("submission")
    results, ckpt = tmp / "results", checkpoint_dir(tmp)
    args = ["--model", "llama3-8b", "--num-processes", "2", "--open", "--accelerator-type", "b200", *options,
            "--org", ORG, "--system", SYSTEM, "--results-dir", str(results), "--checkpoint-folder", str(ckpt),
            "--", *TINY_8B, *overrides]
    res = subprocess.run([sys.executable, "-c", LATE_READ, *args], cwd=tmp, capture_output=True, text=True,
                         timeout=600) if late_read else submit(*args, cwd=tmp)
    yaml_res = submit("system-yaml", "--hosts", "localhost", "--open", "--org", ORG, "--system", SYSTEM,
                      "--results-dir", str(results), cwd=tmp)
    assert yaml_res.returncode == 0, yaml_res.stderr
    return results, ckpt, res


@pytest.fixture(scope="module")
def tiny_submission(tmp_path_factory):
    """In the current layout (version 3: code-image pool, provenance, manifest),
    its read invocation started late: after a pause longer than these tiny
    invocations, so the gap rule 2.1.24 fails it (the tree is written all the same)."""
    results, ckpt, res = tiny(tmp_path_factory, late_read=True)
    yield results, ckpt, res
    shutil.rmtree(ckpt, ignore_errors=True)


@pytest.fixture(scope="session")
def checker_reads_the_pool(mlcommons_python) -> bool:
    """Whether the user's checkout is a checker of the code-image pool and
    provenance (rules edition 3.0 as Rules.md states it now) or mlpstorage
    3.0.26's, which knows neither."""
    return subprocess.run([mlcommons_python, "-c", "import mlpstorage_py.provenance"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def tiny_submission_v2(mlcommons_python, checker_reads_the_pool, tmp_path_factory):
    """In mlpstorage 3.0.26's layout, for its own checker and report generator:
    a valid submission, each invocation outlasting the gap between them."""
    if checker_reads_the_pool:
        pytest.skip("MLPSTORAGE_SRC's checker reads the code-image pool: the layout-3 test judges with it "
                    "(these expect mlpstorage 3.0.26's)")
    results, ckpt, res = tiny(tmp_path_factory, "--layout-version", "2", overrides=tuple(OUTLAST_THE_GAP))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    yield results, ckpt, res
    shutil.rmtree(ckpt, ignore_errors=True)


def model_folder(results: Path, division: str) -> Path:
    return results / division / ORG / "results" / SYSTEM / "checkpointing" / "llama3-8b"


@pytest.mark.e2e
@pytest.mark.install_check
def test_the_tree_holds_each_invocations_files_and_the_gap(tiny_submission):
    results, ckpt, res = tiny_submission
    folder = model_folder(results, "open")
    stamps = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert len(stamps) == 2 and all(re.fullmatch(r"\d{8}_\d{6}", s) for s in stamps)
    for stamp in stamps:
        run = folder / stamp
        names = {p.name for p in run.iterdir()}
        assert {"summary.json", "0_output.json", "1_output.json", "0_per_epoch_stats.json", "dlio.log",
                "checkpointing_run.stdout.log", "checkpointing_run.stderr.log", f"checkpointing_{stamp}_metadata.json",
                "ckpt_ext_summary.json", "manifest.json", "rank_stats", "effective_config.yaml"} <= names
        assert [n for n in names if "metadata" in n] == [f"checkpointing_{stamp}_metadata.json"]
        assert {p.name for p in (run / "dlio_config").iterdir()} == {"config.yaml", "hydra.yaml", "overrides.yaml"}
        meta = json.loads((run / f"checkpointing_{stamp}_metadata.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        assert meta["benchmark_type"] == "checkpointing" and meta["model"] == "llama3-8b"
        assert meta["verification"] == "open" and meta["num_processes"] == 2 and meta["command"] == "run"
        assert meta["metrics"] == summary["metric"]
        assert meta["parameters"]["checkpoint"]["fsync"] is True
        assert meta["restore"] == {"pattern": "own", "share": "none", "saved_ranks": 2}  # what the loads read
        assert meta["override_parameters"]["model.num_layers"] == 2
        assert meta["args"]["checkpoint_folder"] == str(ckpt) and meta["args"]["results_dir"] == str(results)
        stdout = (run / "checkpointing_run.stdout.log").read_text()
        assert "[INFO] inventory:" in stdout and re.search(r"^Filesystem\s+1K-blocks\s+Used\s+Avail", stdout, re.M)
    records = [json.loads((folder / s / "ckpt_ext_summary.json").read_text()) for s in stamps]
    assert (records[0]["save"]["checkpoints"], records[0]["load"]["checkpoints"]) == (2, 0)
    assert (records[1]["save"]["checkpoints"], records[1]["load"]["checkpoints"]) == (0, 2)
    assert records[1]["inventory"]["ok"]  # the read invocation found every file the write one left
    write, read = (json.loads((folder / s / f"checkpointing_{s}_metadata.json").read_text())["args"] for s in stamps)
    assert (write["num_checkpoints_write"], write["num_checkpoints_read"]) == (2, 0)
    assert (read["num_checkpoints_write"], read["num_checkpoints_read"]) == (0, 2)
    assert {str(p.relative_to(ckpt)): p.stat().st_size for p in ckpt.rglob("*.pt")} == \
        expected_files((1, 2), 2, SMALL_8B)
    report = json.loads((folder / "results.json").read_text())
    assert f"the read invocation started {report['read_start_after_write_s']:.1f} s after the write" in res.stdout
    # the late read: the gap between DLIO's windows outlasted the invocations (a loaded
    # machine's slow start-up may break 4.7.1, over 30 s, as well)
    assert res.returncode == 1 and report["division"] == "open" and not report["valid"]
    assert "[submit] timing rule broken: 2.1.24 checkpointingTimestampGap: the gap between the invocations" \
        in res.stderr
    assert any(v.startswith("2.1.24 ") for v in report["timing_rule_violations"])
    assert all(v.startswith(("2.1.24 ", "4.7.1 ")) for v in report["timing_rule_violations"])
    assert "OPEN (INVALID: timing rules broken)" in res.stdout


def tree_hash_as_the_rules_define_it(root: Path) -> str:
    """Rules 2.1.6, written out again here apart from the package's code: MD5 of
    each file's POSIX relative path then its bytes, files in UTF-8 order of
    their paths, without the excluded folders, files and links."""
    skip_dirs = {".git", ".idea", ".vscode", ".claude", ".agent", ".agents", ".roo", ".planning", ".gsd-tmp",
                 "__pycache__", ".pytest_cache", ".venv", "node_modules", "build", "dist", ".tox", "test", "tests"}
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
             and not any(part in skip_dirs or part.endswith(".egg-info") for part in p.relative_to(root).parts[:-1])
             and p.name not in (".code-hash.json", ".DS_Store", "Thumbs.db") and p.suffix not in (".pyc", ".pyo")]
    md5 = hashlib.md5()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix().encode()):
        md5.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return md5.hexdigest()


@pytest.mark.e2e
@pytest.mark.install_check
def test_the_edition_3_tree_carries_accelerator_times_evidence_code_image_provenance_and_manifest(tiny_submission):
    results, ckpt, res = tiny_submission
    folder = model_folder(results, "open")
    stamps = sorted(p.name for p in folder.iterdir() if p.is_dir())
    # 2.1.6: the pool, its marker, one image of the code that ran, re-hashing to its record
    pool = results / "code-images"
    assert (pool / ".mlps-image-pool").is_file() and sorted(results.iterdir()) == sorted(
        [pool, results / "open", results / "mlperf-results.yaml"])
    [image] = [p for p in pool.iterdir() if p.is_dir()]
    record = json.loads((image / ".code-hash.json").read_text())
    digest = tree_hash_as_the_rules_define_it(image)
    assert record["hash"] == digest and image.name == f"code-{digest[:8]}" and record["algorithm"] == "md5-tree-v2"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["captured_at"])
    assert record["git_sha"] is None or re.fullmatch(r"[0-9a-f]{40}", record["git_sha"])
    assert isinstance(record["mlpstorage_version"], str)
    # the image is the package that ran, file for file
    source = REPO / "dlio_ckpt_ext" / "submission" / "submit.py"
    assert (image / "dlio_ckpt_ext" / "submission" / "submit.py").read_bytes() == source.read_bytes()
    assert (image / "configs" / "dlio" / "workload" / "llama3_8b_checkpoint.yaml").is_file()
    assert not list(image.rglob("__pycache__")) and not list(image.rglob("*.pyc"))
    manifest = yaml.safe_load((results / "open" / ORG / "submission.yaml").read_text())
    metas = {}
    for stamp in stamps:
        run = folder / stamp
        assert (run / ".mlps-code-image").read_text().strip() == f"md5-tree-v2:{digest}"
        meta = metas[stamp] = json.loads((run / f"checkpointing_{stamp}_metadata.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        # 4.3.4: the accelerator, and 2 b200 hold the checkpoint
        assert meta["accelerator"] == "b200" and meta["args"]["accelerator_type"] == "b200"
        assert 2 * 180 >= summary["metric"]["checkpoint_size_GB"]
        # 4.7.1: the invocation's own times, around DLIO's run
        start, end = (datetime.datetime.fromisoformat(meta[k]) for k in ("invocation_start_time", "invocation_end_time"))
        assert start < datetime.datetime.fromisoformat(summary["start"]) < \
            datetime.datetime.fromisoformat(summary["end"]) < end
        # 4.4.2: the hard-link probe found two file systems
        fs = json.loads((run / "fs_separation.json").read_text())
        assert fs["same_filesystem"] is False and fs["method"] == "link_exdev" and fs["version"] == 1
        assert (fs["data_or_chkpt_path"], fs["results_path"]) == (str(ckpt), str(results))
        assert os.stat(ckpt).st_dev != os.stat(results).st_dev
        # provenance.json, declared by the metadata, pointing at the same image
        assert meta["provenance_file"] == "provenance.json"
        stamp_data = json.loads((run / "provenance.json").read_text())
        assert set(stamp_data) == {"schema", "rules_edition", "layout_version", "tool", "dlio", "storage_library",
                                   "core_config", "stamped_at", "stamped_by", "provenance"}
        assert (stamp_data["schema"], stamp_data["rules_edition"], stamp_data["layout_version"]) == \
            ("mlps-run-provenance/1", "3.0", 3)
        assert stamp_data["tool"]["code_image"] == f"md5-tree-v2:{digest}"
        assert set(stamp_data["tool"]) == {"name", "version", "git_sha", "code_image"}
        assert stamp_data["dlio"]["version"] == importlib.metadata.version("dlio_benchmark")
        assert stamp_data["storage_library"] == {"name": "none"}
        assert set(stamp_data["provenance"]) == {"rules_edition", "layout_version", "tool", "dlio", "storage_library",
                                                 "core_config"}
        assert "null" not in json.dumps(stamp_data)
        # core-config-v1 recomputed from the metadata's parameters with the allowlist checkpointing@1
        flat = dict(flatten_dotted(meta["parameters"]))
        keys = sorted(k for k in flat if (k == "framework" or k.startswith(("model.", "workflow.", "checkpoint.")))
                      and k not in ("checkpoint.checkpoint_folder", "checkpoint.num_checkpoints_write",
                                    "checkpoint.num_checkpoints_read"))
        assert stamp_data["core_config"]["keys"] == keys and "model.num_layers" in keys
        canonical = json.dumps({k: same_spelling(flat[k]) for k in keys}, sort_keys=True, separators=(",", ":"))
        assert stamp_data["core_config"]["hash"] == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    # the write and read phases are one workload: one core-config hash
    assert len({json.loads((folder / s / "provenance.json").read_text())["core_config"]["hash"] for s in stamps}) == 1
    # 4.7.1's failover gap from the invocation times, as results.json and the console say
    write, read = (metas[s] for s in stamps)
    gap = (datetime.datetime.fromisoformat(read["invocation_start_time"])
           - datetime.datetime.fromisoformat(write["invocation_end_time"])).total_seconds()
    report = json.loads((folder / "results.json").read_text())
    assert report["read_start_after_write_s"] == pytest.approx(gap) and gap >= 2  # the late read's pause is in it
    assert (report["rules_edition"], report["layout_version"], report["accelerator"]) == ("3.0", 3, "b200")
    # submission.yaml: exactly the tree's run folders, each with its stamp
    assert (manifest["schema"], manifest["orgname"], manifest["mode"], manifest["rules_edition"]) == \
        ("mlps-submission-manifest/1", ORG, "open", "3.0")
    walked = {p.relative_to(results / "open" / ORG).as_posix() for p in (results / "open" / ORG).rglob("*")
              if p.is_dir() and re.fullmatch(r"\d{8}_\d{6}", p.name)}
    assert {r["leaf"] for r in manifest["runs"]} == walked and len(walked) == 2
    for run in manifest["runs"]:
        assert (run["benchmark"], run["model"], run["command"], run["accelerator"], run["system"]) == \
            ("checkpointing", "llama3-8b", "run", "b200", SYSTEM)
        assert run["code_image"] == f"md5-tree-v2:{digest}" and run["provenance"] == run["leaf"] + "/provenance.json"
        assert run["core_config"] == json.loads((results / "open" / ORG / run["provenance"]).read_text())[
            "core_config"]["hash"]
    assert manifest["code_images"] == [f"md5-tree-v2:{digest}"]
    assert manifest["systems"] == [{"name": SYSTEM, "description": f"systems/{SYSTEM}.yaml", "pdf": "missing"}]


def same_spelling(value):
    """core-config-v1 hashes 7, 7.0 and "7" (and "true" and true) alike."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value.strip()
    return int(value) if isinstance(value, float) and value.is_integer() else value


def flatten_dotted(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flatten_dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.e2e
@pytest.mark.install_check
def test_the_manifest_command_lists_what_the_tree_holds_now(tiny_submission, tmp_path):
    results = tmp_path / "copy"
    shutil.copytree(tiny_submission[0], results)
    org = results / "open" / ORG
    (org / "systems" / f"{SYSTEM}.pdf").write_bytes(b"%PDF-1.4\n")
    [first, second] = sorted(p for p in model_folder(results, "open").iterdir() if p.is_dir())
    shutil.rmtree(first)
    res = submit("manifest", "--open", "--org", ORG, "--system", SYSTEM, "--results-dir", str(results), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    manifest = yaml.safe_load((org / "submission.yaml").read_text())
    assert [r["leaf"] for r in manifest["runs"]] == [second.relative_to(org).as_posix()]
    assert manifest["systems"][0]["pdf"] == f"systems/{SYSTEM}.pdf"
    assert res.stderr == ""  # the image is still pointed at by the second folder
    shutil.rmtree(second)
    res = submit("manifest", "--open", "--org", ORG, "--system", SYSTEM, "--results-dir", str(results), cwd=tmp_path)
    assert yaml.safe_load((org / "submission.yaml").read_text())["runs"] == []
    [image] = (results / "code-images").glob("code-*")
    assert res.stderr.splitlines() == [f"[submit] {image} is a code image no run folder points at (the checker "
                                       "fails it, CHECK-03): remove it"]


def place_as_closed(results: Path) -> None:
    """Move the OPEN submission to closed/ as a CLOSED run would be placed."""
    shutil.move(results / "open", results / "closed")
    for meta in (results / "closed").rglob("*_metadata.json"):
        data = json.loads(meta.read_text())
        data["verification"] = "closed"
        meta.write_text(json.dumps(data))


@pytest.mark.e2e
def test_mlcommons_checker_finds_only_the_tiny_runs_real_violations(mlcommons_python, tiny_submission_v2, tmp_path):
    results = tmp_path / "placed"
    shutil.copytree(tiny_submission_v2[0], results)
    place_as_closed(results)
    fill_placeholders(results / "closed" / ORG / "systems" / f"{SYSTEM}.yaml")
    (results / "closed" / ORG / "systems" / f"{SYSTEM}.pdf").write_bytes(b"%PDF-1.4\n")
    subprocess.run([mlcommons_python, "-c", "import logging, sys; from pathlib import Path; "
                    "from mlpstorage_py.submission_checker.tools.code_image import capture_code_image; "
                    "capture_code_image(Path(sys.argv[1]), Path(sys.argv[2]), logging.getLogger())",
                    str(REPO / "dlio_ckpt_ext"), str(results / "closed" / ORG)], check=True)
    res = subprocess.run([mlcommons_python, "-m", "mlpstorage_py.submission_checker", "--input", str(results),
                          "--skip-output-file", "--csv", str(tmp_path / "summary.csv")], capture_output=True,
                         text=True, timeout=300)
    output = res.stdout + res.stderr
    errors = checker_errors(output)
    # the tiny run's real violations, and nothing else: 2 processes, not 8 (4.6.1); 2 ranks on the
    # host, not more than 4 (4.6.2); 2 writes and 2 reads, not 10 (4.7.1)
    assert set(errors) == {"4.6.1", "4.6.2", "4.7.1"}, output[-6000:]
    assert any("requires 8 processes, got 2" in e for e in errors["4.6.1"])
    assert any("must be write-phase (10/0) followed by read-phase (0/10)" in e for e in errors["4.7.1"])
    assert res.returncode == 1 and "SUMMARY: submission has errors" in output


#: the rules the edition-3.0 evidence answers: structure and pool, the pointer, provenance and
#: manifest, the accelerator, file-system separation, the failover gap, the edition
EVIDENCE_RULES = {"2.1.2", "2.1.5", "2.1.6", "2.1.25", "4.3.4", "4.4.2", "4.7.1", "CHECK-01", "CHECK-02", "CHECK-03",
                  "CHECK-04", "PROV-01", "PROV-02", "EDN-01", "EDN-04"}


@pytest.mark.e2e
def test_the_current_checker_finds_no_fault_in_the_edition_3_evidence(mlcommons_python, checker_reads_the_pool,
                                                                      tiny_submission, tmp_path):
    """MLCommons' checker of the pool and provenance, on our layout-3 OPEN tree as
    submitted (the system description filled in, its PDF, the manifest refreshed):
    whatever else it says of a two-rank late-read run, nothing of the rules the
    evidence answers."""
    if not checker_reads_the_pool:
        pytest.skip("MLPSTORAGE_SRC's checker predates the code-image pool (mlpstorage 3.0.26): the layout-2 "
                    "tests judge with it")
    results = tmp_path / "placed"
    shutil.copytree(tiny_submission[0], results)
    systems = results / "open" / ORG / "systems"
    fill_placeholders(systems / f"{SYSTEM}.yaml")
    (systems / f"{SYSTEM}.pdf").write_bytes(b"%PDF-1.4\n")
    assert submit("manifest", "--open", "--org", ORG, "--system", SYSTEM, "--results-dir", str(results),
                  cwd=tmp_path).returncode == 0
    res = subprocess.run([mlcommons_python, "-m", "mlpstorage_py.submission_checker", "--input", str(results)],
                         capture_output=True, text=True, timeout=300)
    output = res.stdout + res.stderr
    assert "Traceback" not in output, output[-6000:]
    assert not set(checker_errors(output)) & EVIDENCE_RULES, output[-6000:]


@pytest.mark.e2e
def test_mlcommons_report_generator_finds_both_invocations_with_their_metrics(mlcommons_python,
                                                                              tiny_submission_v2, tmp_path):
    results = tiny_submission_v2[0]
    out = tmp_path / "report"
    res = subprocess.run([mlcommons_python, "-m", "mlpstorage_py.main", "reports", "reportgen", "--results-dir",
                          str(results), "--systemname", SYSTEM, "--output-dir", str(out)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    runs = json.loads((out / "results.json").read_text())
    folder = model_folder(results, "open")
    expected = {s.name: json.loads((s / "summary.json").read_text())["metric"] for s in folder.iterdir() if s.is_dir()}
    found = {r["run_id"]: r for r in runs if r.get("benchmark_type") == "checkpointing"}
    assert len(found) == 2, runs
    assert sorted(json.dumps(r["metrics"], sort_keys=True) for r in found.values()) == \
        sorted(json.dumps(m, sort_keys=True) for m in expected.values())


def invocation(start: str, end: str, **meta: str) -> Invocation:
    return Invocation(Path("x"), {}, {"start": f"2026-01-01T{start}", "end": f"2026-01-01T{end}"},
                      {k: f"2026-01-01T{v}" for k, v in meta.items()})


@pytest.mark.parametrize("write, read, broken, gap", [
    # DLIO's windows (summary.json) only: the rules' fallbacks
    (invocation("10:00:00", "10:05:00"), invocation("10:05:20", "10:10:00"), [], 20),
    (invocation("10:00:00", "10:05:00"), invocation("10:05:31", "10:10:00"), ["4.7.1"], 31),
    (invocation("10:00:00", "10:00:10"), invocation("10:00:22", "10:00:30"), ["2.1.24"], 12),
    (invocation("10:00:00", "10:05:00"), invocation("10:04:59", "10:10:00"), ["4.7.1"], -1),
    # the invocations' own times come first: DLIO's windows 20 s apart, the invocations 31 s
    (invocation("10:00:00", "10:05:00", invocation_end_time="10:05:05"),
     invocation("10:05:20", "10:10:00", invocation_start_time="10:05:36"), ["4.7.1"], 31),
    (invocation("10:00:00", "10:05:00", invocation_end_time="10:05:05"),
     invocation("10:05:20", "10:10:00", invocation_start_time="10:05:10"), [], 5),
    # an older folder without the write's end time: summary.json's end
    (invocation("10:00:00", "10:05:00"), invocation("10:05:20", "10:10:00", invocation_start_time="10:05:40"),
     ["4.7.1"], 40),
])
def test_gap_rules_are_the_rules_edition_3(write, read, broken, gap):
    measured, violations = gap_violations(write, read)
    assert [v.split()[0] for v in violations] == broken and measured == gap


@pytest.mark.parametrize("args, message", [
    (["--hosts", "a,a"], "invalid config: --hosts='a,a'; allowed: each host once (listed more than once: a); ranks per host go in --ranks-per-host or --num-processes"),
    (["--hosts", ","], "invalid config: --hosts=','; allowed: comma-separated host names, none empty (entry 1 "
                       "is empty)"),
    (["--hosts", "a,,b"], "invalid config: --hosts='a,,b'; allowed: comma-separated host names, none empty "
                          "(entry 2 is empty)"),
    (["--num-processes", "3", "--hosts", "a,b"], "invalid config: --num-processes=3; allowed: a positive multiple "
                                                 "of the 2 host(s) in --hosts"),
])
def test_bad_hosts_and_process_counts_are_refused_in_one_line(tmp_path, args, message):
    base = ["--workload", "llama3_8b_checkpoint", "--dry-run"]
    res = submit(*base, *(args if "--num-processes" in args else [*args, "--ranks-per-host", "4"]), cwd=tmp_path,
                 timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [f"[submit] {message}"]


def test_a_dry_run_that_passes_says_what_it_checked_and_would_run(tmp_path, apart):
    res = submit("--model", "llama3-8b", "--hosts", "n1", "--num-processes", "8", "--dry-run", "--accelerator-type",
                 "b200", "--host-ram-gib", "16", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder",
                 str(apart / "ckpt"), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "no CLOSED rule broken" in res.stdout and "8 on each of n1" in res.stdout
    assert "8 x b200's memory against the checkpoint, the file systems of the checkpoints and the results" in res.stdout
    assert res.stdout.count("[submit] would run: ") == 2 and "--host n1:8 -np 8" in res.stdout
    # unbound by default: each rank's generator share is its node's CPUs / its ranks
    assert res.stdout.count(" --bind-to none ") == 2
    assert "would place it as CLOSED under " + str(tmp_path / "r" / "closed" / "my_org" / "results") in res.stdout
    assert not (tmp_path / "r").exists() and not apart.exists()  # a dry run makes no folder


CLOSED_8B = ["--model", "llama3-8b", "--hosts", "n1", "--num-processes", "8", "--accelerator-type", "b200",
             "--host-ram-gib", "1"]


@pytest.mark.parametrize("args, line", [
    (["--model", "llama3-70b", "--hosts", "n1", "--num-processes", "64", "--subset-data", "8"],
     "4.3.5 subset mode exists only for llama3_8b on 8 processes; this is llama3_70b on 64"),
    (["--model", "llama3-70b", "--hosts", "n1", "--num-processes", "8"],
     "4.6.1 8 processes; CLOSED llama3_70b requires 64 (Table 2)"),
    (["--model", "llama3-405b", "--hosts", "n1", "--num-processes", "256"],
     "4.6.1 256 processes; CLOSED llama3_405b requires 512 (Table 2)"),
    (["--model", "llama3-8b", "--hosts", "n1,n2", "--num-processes", "8"],
     "4.6.2 4 processes on a host; CLOSED requires more than 4 per host"),
    (["--num-checkpoints-write", "12"], "4.7.1 checkpoint.num_checkpoints_write is 12; CLOSED requires 10 (run as "
                                        "the write/read split)"),
    (["--num-checkpoints-read", "0"], "4.7.1 checkpoint.num_checkpoints_read is 0; CLOSED requires 10 (run as the "
                                      "write/read split)"),
    (["--", "++workload.checkpoint.fsync=False"], "4.3.2 checkpoint.fsync is off; it must be on"),
    (["--", "++workload.checkpoint.restore=framework"],
     "4.6.3 checkpoint.restore=framework, share=none, saved_ranks=0: CLOSED reads back each rank's own files "
     "(restore=own, share=none, saved at the same ranks); other restores are OPEN"),
])
def test_each_closed_rule_of_edition_3_is_refused_in_one_line_naming_it(tmp_path, apart, args, line):
    named = set(a for a in args if a.startswith("--") and a != "--")
    base = [a for i, a in enumerate(CLOSED_8B) if not (a in named or (i and CLOSED_8B[i - 1] in named))]
    res = submit(*base, "--dry-run", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", str(apart),
                 *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert [l for l in res.stdout.splitlines() if l.startswith("[submit] CLOSED rule: ")] == \
        [f"[submit] CLOSED rule: {line}"], res.stdout
    assert res.stderr.strip().splitlines() == [
        "[submit] not a valid CLOSED run; fix the above or pass --open to run it as OPEN"]


@pytest.mark.parametrize("workload, layout, framework", [
    ("megatron_llama3_8b_checkpoint", "megatron", "Megatron-core dist_checkpointing (torch_dist)"),
    ("torchtitan_llama3_8b_checkpoint", "dcp", "torch.distributed.checkpoint")])
def test_another_frameworks_layout_is_refused_for_closed_even_under_the_closed_models_name(
        tmp_path, apart, workload, layout, framework):
    res = submit("--workload", workload, "--hosts", "n1", "--num-processes", "8", "--accelerator-type", "b200",
                 "--host-ram-gib", "1", "--dry-run", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder",
                 str(apart), "--", "++workload.model.name=llama3_8b", cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"[submit] CLOSED rule: 4.6.3 checkpoint.layout={layout}: CLOSED writes the reference layout " \
           f"(DeepSpeed's, as DLIO does); {framework}'s is OPEN" in res.stdout.splitlines()


def test_a_model_load_is_refused_by_name_as_no_mlperf_workload(tmp_path, apart):
    res = submit("--workload", "llama3_8b_model_load", "--ranks-per-host", "8", "--accelerator-type", "b200",
                 "--open", "--dry-run", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", str(apart),
                 cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "[submit] invalid config: --workload='llama3_8b_model_load'; allowed: a checkpointing preset: a model load "
        "(published safetensors read by serving replicas) is no MLPerf Storage workload; run it with dlio_benchmark"]


def test_a_refused_run_makes_no_folder(tmp_path, apart):
    res = submit("--workload", "llama3_tiny_checkpoint", "--ranks-per-host", "2", "--accelerator-type", "b200",
                 "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", str(apart), cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "[submit] CLOSED rule: 4.3.3 model 'llama3_tiny' is not a CLOSED model" in res.stdout
    assert not (tmp_path / "r").exists() and not apart.exists()


def test_the_one_closed_subset_form_passes(tmp_path, apart):
    res = submit(*CLOSED_8B, "--subset-data", "8", "--dry-run", "--results-dir", str(tmp_path / "r"),
                 "--checkpoint-folder", str(apart), cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "no CLOSED rule broken" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("args, line", [
    ([], "4.3.4 no accelerator type recorded: pass --accelerator-type, one of b200 (180 GB), mi355 (288 GB)"),
    (["--accelerator-type", "h100"], "4.3.4 accelerator h100 is not in Table 3 for CLOSED or OPEN (edition 3.0): "
                                     "one of b200 (180 GB), mi355 (288 GB)"),
    # an OPEN model of 1600 layers (a 5 TB checkpoint) on 8 simulated b200s
    (["--accelerator-type", "b200", "--", "++workload.model.num_layers=1600"],
     "4.3.4 8 x b200 (180 GB each) hold 1440 GB, less than the checkpoint's {gib:.2f} GB"),
])
def test_accelerators_that_cannot_hold_the_checkpoint_refuse_the_run_even_as_open(tmp_path, apart, args, line):
    from dlio_ckpt_ext.submission.submit import Submission, effective_config
    overrides = args[args.index("--") + 1:] if "--" in args else []
    cfg = effective_config(Submission("llama3_8b_checkpoint", ["n1"], 8, overrides))
    line = line.format(gib=layouts.checkpoint_bytes(cfg.shape, cfg.parallelism, 8) / 2**30)
    options = args[:args.index("--")] if "--" in args else args
    res = submit("--model", "llama3-8b", "--hosts", "n1", "--num-processes", "8", "--open", "--dry-run", *options,
                 "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", str(apart), "--", *overrides,
                 cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [f"[submit] rule for CLOSED and OPEN: {line}",
                                               "[submit] not a valid run in any division; fix the above"]


def test_checkpoints_on_the_results_file_system_are_refused_unless_the_gate_is_skipped(tmp_path):
    args = [*CLOSED_8B, "--dry-run", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", str(tmp_path / "c")]
    res = submit(*args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"[submit] rule for CLOSED and OPEN: 4.4.2 the checkpoint folder {tmp_path / 'c'} and the results folder "
        f"{tmp_path / 'r'} are on the same file system (a hard link between them succeeded)",
        "[submit] not a valid run in any division; fix the above (--skip-fs-separation-gate runs a development "
        "run anyway)"]
    skipped = submit(*args, "--skip-fs-separation-gate", cwd=tmp_path, timeout=120)
    assert skipped.returncode == 0, skipped.stderr
    assert "[submit] rule for CLOSED and OPEN: 4.4.2 " in skipped.stdout
    assert "would place it as OPEN" in skipped.stdout  # never CLOSED with the evidence against it


def test_datasize_matches_the_plans_exact_bytes(tmp_path):
    res = submit("datasize", "--model", "llama3-8b", "--num-processes", "8", "--hosts", "n1,n2",
                 "--client-host-memory-in-gb", "64", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    from dlio_ckpt_ext.submission.submit import Submission, effective_config
    cfg = effective_config(Submission("llama3_8b_checkpoint", ["n1", "n2"], 4))
    per_rank = [layouts.rank_plan(cfg.shape, cfg.parallelism, 8, r).total_bytes for r in range(8)]
    for r, n in enumerate(per_rank):
        assert f"  rank {r}: {n} bytes" in res.stdout
    assert f"  host n1: {sum(per_rank[:4])} bytes" in res.stdout and f"{sum(per_rank[:4]) * 10} bytes" in res.stdout
    assert f"  per checkpoint: {sum(per_rank)} bytes" in res.stdout
    assert f"  capacity for 10 checkpoints: {sum(per_rank) * 10} bytes" in res.stdout
    assert "at least 3x its memory (192.00 GiB)" in res.stdout


@pytest.mark.parametrize("library, line", [
    ("msc", "4.6.3 storage.storage_options.storage_library=msc: CLOSED moves the bytes through a client the "
            "reference (MLCommons' DLIO fork) offers, s3dlio, minio, s3torchconnector; msc is OPEN"),
    ("minio", None), ("s3torchconnector", None), ("s3dlio", None)])
def test_closed_takes_the_object_clients_the_fork_offers_and_refuses_the_others_by_rule(tmp_path, library, line):
    res = submit(*CLOSED_8B, "--dry-run", "--results-dir", str(tmp_path / "r"), "--checkpoint-folder", "ckpt8b",
                 "--", "++workload.storage.storage_type=s3", "++workload.storage.storage_root=s3://bucket/mlperf",
                 f"++workload.storage.storage_options.storage_library={library}", cwd=tmp_path, timeout=120)
    assert "Traceback" not in res.stderr
    rules = [l for l in res.stdout.splitlines() if l.startswith("[submit] CLOSED rule: ")]
    assert rules == ([f"[submit] CLOSED rule: {line}"] if line else []), res.stdout + res.stderr
    assert res.returncode == (2 if line else 0)
