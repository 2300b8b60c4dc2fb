"""The generated pages of docs/ against what they are generated from."""
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_configuration_reference_is_current_and_says_what_every_key_means():
    check = subprocess.run([sys.executable, str(REPO / "run_scripts" / "config_reference.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    rows = re.findall(r"^\| `(workload\.[\w.]+)` \| `[^`]+` \| `[^`]*` \| (.*) \|$",
                      (REPO / "docs" / "configuration.md").read_text(), re.M)
    assert len(rows) > 50
    assert [key for key, meaning in rows if not meaning.strip()] == []
    for key in ("workload.streaming.chunk_size", "workload.model.parallelism.zero_stage",
                "workload.storage.storage_options.part_size", "workload.storage.storage_options.write_mode"):
        assert key in dict(rows)


def test_a_changed_declaration_makes_the_reference_stale(tmp_path):
    """The staleness check can fail: the page rendered against a changed default differs."""
    sys.path.insert(0, str(REPO / "run_scripts"))
    try:
        import config_reference
    finally:
        sys.path.pop(0)
    page = config_reference.render()
    config_reference.PKG = tmp_path
    (tmp_path / "storage").mkdir()
    for f in ("config.py", "storage/posix.py", "storage/objstore.py", "storage/cloud.py"):
        (tmp_path / f).write_text((REPO / "dlio_ckpt_ext" / f).read_text())
    config = tmp_path / "config.py"
    config.write_text(config.read_text().replace('pool_depth: int = 4', 'pool_depth: int = 5'))
    changed = config_reference.render()
    assert changed != page and "| `workload.streaming.pool_depth` | `int` | `5` |" in changed


def test_every_link_between_the_pages_leads_somewhere():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_benchmark_page_is_rendered_from_the_benches_result_files():
    check = subprocess.run([sys.executable, str(REPO / "run_scripts" / "bench_docs.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    results = sorted((REPO / "bench" / "results").glob("*.json"))
    assert results, "no bench result recorded"
    page = (REPO / "docs" / "benchmarks.md").read_text()
    for path in results:
        data = json.loads(path.read_text())
        assert data["date"] and data["machine"] and data["command"].startswith("python bench/")
        assert f"`{data['command']}`, {data['date']}, {data['machine']}." in page
        assert all(f"| {' | '.join(row)} |" in page.replace("\\|", "|") for row in data["rows"])


def test_the_readmes_preset_bytes_are_the_plans():
    """Each preset row's bytes per checkpoint at the ranks it names, against the
    preset composed by hydra as dlio_benchmark composes it, planned at those ranks."""
    from dlio_ckpt_ext import layouts
    from dlio_ckpt_ext.submission.submit import Submission, effective_config, presets
    rows = re.findall(r"^\| `(\w+_(?:checkpoint|model_load))` \|.*\| ([\d,]+) \(at (\d+) ranks?(?:; ([\d,]+) at (\d+))?\) \|$",
                      (REPO / "README.md").read_text(), re.M)
    assert sorted(r[0] for r in rows) == presets()  # checkpointing and model-load presets alike
    for workload, total, ranks, other_total, other_ranks in rows:
        for text, n in ((total, ranks), (other_total, other_ranks)):
            if text:
                cfg = effective_config(Submission(workload, ["host"], int(n)))
                assert int(text.replace(",", "")) == layouts.checkpoint_bytes(cfg.shape, cfg.parallelism, int(n)), \
                    (workload, n)
