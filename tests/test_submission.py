"""dlio-ckpt-submit's submission tree, judged by MLCommons' own submission checker
and report generator (mlcommons/storage at mlpstorage 3.0.26, in a virtual
environment of their own: run_scripts/tool_env.sh mlcommons)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tool, tool_env
from dlio_ckpt_ext import plan
from dlio_ckpt_ext.submission.submit import Invocation, gap_violations
from test_dlio_integration import SHRINK, SMALL_8B, expected_files

ORG, SYSTEM = "testorg", "testsys"
#: two writes and two reads, each invocation longer than the gap between them
#: (DLIO's start-up and the cache drop: the checker's 2.1.24 compares the two)
TINY_8B = [*SHRINK, "++workload.checkpoint.num_checkpoints_write=2", "++workload.checkpoint.num_checkpoints_read=2",
           "++workload.checkpoint.time_between_checkpoints=14", "++workload.streaming.verify=True"]


@pytest.fixture(scope="session")
def mlcommons_python() -> str:
    """MLCommons' checker and report generator, in their own environment, from
    the user's checkout of mlcommons/storage (no registry serves them)."""
    if not os.environ.get("MLPSTORAGE_SRC"):
        pytest.skip("needs MLCommons' submission checker and report generator: MLPSTORAGE_SRC=<your checkout of "
                    "mlcommons/storage, mlpstorage >= 3.0.26>")
    return str(tool_env("mlcommons") / "python")


def checkpoint_dir(tmp_path: Path) -> Path:
    """Checkpoints on another file system than the results (the checker's 4.4.2)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shm.stat().st_dev != tmp_path.stat().st_dev:
        folder = shm / f"dlio-ckpt-test-{tmp_path.name}"
        folder.mkdir(exist_ok=True)
        return folder
    pytest.skip("no second file system (/dev/shm) for the checkpoints")


def submit(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dlio-ckpt-submit"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def checker_errors(output: str) -> dict[str, list[str]]:
    """[ERROR] [<rule> <name>] ... lines of the checker, by rule number."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^\[ERROR\] \[(\d+(?:\.\d+)+) (\w+)\] (.*)$", output, re.M):
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


@pytest.fixture(scope="module")
def tiny_submission(tmp_path_factory):
    """A write-then-read submission of the 8B preset scaled down, as OPEN (it breaks CLOSED rules)."""
    tmp = tmp_path_factory.mktemp("submission")
    results, ckpt = tmp / "results", checkpoint_dir(tmp)
    res = submit("--model", "llama3-8b", "--num-processes", "2", "--open", "--org", ORG, "--system", SYSTEM,
                 "--results-dir", str(results), "--checkpoint-folder", str(ckpt), "--", *TINY_8B, cwd=tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    yaml_res = submit("system-yaml", "--hosts", "localhost", "--open", "--org", ORG, "--system", SYSTEM,
                      "--results-dir", str(results), cwd=tmp)
    assert yaml_res.returncode == 0, yaml_res.stderr
    yield results, ckpt, res
    shutil.rmtree(ckpt, ignore_errors=True)


def model_folder(results: Path, division: str) -> Path:
    return results / division / ORG / "results" / SYSTEM / "checkpointing" / "llama3-8b"


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
    assert report["valid"] and report["division"] == "open" and report["timing_rule_violations"] == []
    assert 0 < report["read_start_after_write_s"] < min(30, max(report["invocation_seconds"].values()))
    assert f"the read invocation started {report['read_start_after_write_s']:.1f} s after the write" in res.stdout


def place_as_closed(results: Path) -> None:
    """Move the OPEN submission to closed/ as a CLOSED run would be placed."""
    shutil.move(results / "open", results / "closed")
    for meta in (results / "closed").rglob("*_metadata.json"):
        data = json.loads(meta.read_text())
        data["verification"] = "closed"
        meta.write_text(json.dumps(data))


def test_mlcommons_checker_finds_only_the_tiny_runs_real_violations(tiny_submission, mlcommons_python, tmp_path):
    results = tmp_path / "placed"
    shutil.copytree(tiny_submission[0], results)
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


def test_mlcommons_report_generator_finds_both_invocations_with_their_metrics(tiny_submission, mlcommons_python,
                                                                              tmp_path):
    results = tiny_submission[0]
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


def invocation(start: str, end: str) -> Invocation:
    return Invocation(Path("x"), {}, {"start": start, "end": end})


@pytest.mark.parametrize("write, read, broken", [
    (("2026-01-01T10:00:00", "2026-01-01T10:05:00"), ("2026-01-01T10:05:20", "2026-01-01T10:10:00"), []),
    (("2026-01-01T10:00:00", "2026-01-01T10:05:00"), ("2026-01-01T10:05:31", "2026-01-01T10:10:00"), ["4.7.1"]),
    (("2026-01-01T10:00:00", "2026-01-01T10:00:10"), ("2026-01-01T10:00:22", "2026-01-01T10:00:30"), ["2.1.24"]),
    (("2026-01-01T10:00:00", "2026-01-01T10:05:00"), ("2026-01-01T10:04:59", "2026-01-01T10:10:00"), ["4.7.1"]),
])
def test_gap_rules_are_the_checkers(write, read, broken):
    gap, violations = gap_violations(invocation(*write), invocation(*read))
    assert [v.split()[0] for v in violations] == broken


def test_a_read_invocation_that_starts_too_late_fails_the_submission_naming_the_rule(tmp_path):
    """A pause injected before the read invocation (a drop_caches that sleeps),
    longer than the tiny invocations themselves (0.1 s each)."""
    results, ckpt = tmp_path / "results", tmp_path / "ckpt"
    script = (
        "import sys, time\n"
        "from dlio_ckpt_ext.submission import submit\n"
        "dropped = submit.drop_caches\n"
        "def slow(*a):\n"
        "    time.sleep(2)\n"
        "    return dropped(*a)\n"
        "submit.drop_caches = slow\n"
        "sys.exit(submit.main(sys.argv[1:]))\n")
    res = subprocess.run([sys.executable, "-c", script, "--workload", "llama3_tiny_checkpoint", "--ranks-per-host", "2",
                          "--open", "--results-dir", str(results), "--checkpoint-folder", str(ckpt), "--",
                          "++workload.checkpoint.num_checkpoints_write=1",
                          "++workload.checkpoint.num_checkpoints_read=1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "[submit] timing rule broken: 2.1.24 checkpointingTimestampGap: the gap between the invocations" \
        in res.stderr
    [report] = results.glob("open/*/results/*/checkpointing/*/results.json")
    data = json.loads(report.read_text())
    # a loaded machine's slow start-up may break 4.7.1 (over 30 s) as well
    assert not data["valid"] and any(v.startswith("2.1.24") for v in data["timing_rule_violations"])
    assert "INVALID: timing rules broken" in res.stdout


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


def test_a_dry_run_that_passes_says_what_it_checked_and_would_run(tmp_path):
    res = submit("--model", "llama3-8b", "--hosts", "n1,n2", "--num-processes", "8", "--dry-run",
                 "--host-ram-gib", "16", "--results-dir", str(tmp_path / "r"), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "no CLOSED rule broken" in res.stdout and "4 on each of n1, n2" in res.stdout
    assert res.stdout.count("[submit] would run: ") == 2 and "--host n1:4,n2:4 -np 8" in res.stdout
    # unbound by default: each rank's generator share is its node's CPUs / its ranks
    assert res.stdout.count(" --bind-to none ") == 2
    assert "would place it as CLOSED under " + str(tmp_path / "r" / "closed" / "my_org" / "results") in res.stdout


def test_datasize_matches_the_plans_exact_bytes(tmp_path):
    res = submit("datasize", "--model", "llama3-8b", "--num-processes", "8", "--hosts", "n1,n2",
                 "--client-host-memory-in-gb", "64", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    from dlio_ckpt_ext.submission.submit import Submission, effective_config
    cfg = effective_config(Submission("llama3_8b_checkpoint", ["n1", "n2"], 4))
    per_rank = [plan.rank_plan(cfg.shape, cfg.parallelism, 8, r).total_bytes for r in range(8)]
    for r, n in enumerate(per_rank):
        assert f"  rank {r}: {n} bytes" in res.stdout
    assert f"  host n1: {sum(per_rank[:4])} bytes" in res.stdout and f"{sum(per_rank[:4]) * 10} bytes" in res.stdout
    assert f"  per checkpoint: {sum(per_rank)} bytes" in res.stdout
    assert f"  capacity for 10 checkpoints: {sum(per_rank) * 10} bytes" in res.stdout
    assert "at least 3x its memory (192.00 GiB)" in res.stdout
