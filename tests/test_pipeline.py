"""cpu_smoke end to end: train -> evaluate -> report, and the report's numbers are the files' numbers."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seal_mini.core.interface import active_cues
from seal_mini.runio import read_json, read_jsonl_gz, read_metrics

ROOT = Path(__file__).resolve().parents[1]


def run_smoke(out_dir: Path) -> subprocess.CompletedProcess:
    """`python -m seal_mini pipeline recipes/cpu_smoke.yaml` into out_dir, as run.sh runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "seal_mini", "pipeline", "recipes/cpu_smoke.yaml", f"out_dir={out_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    proc = run_smoke(tmp_path_factory.mktemp("runs"))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return Path(summary["run_dir"]), Path(summary["report"]), proc.stdout


def table_rows(markdown: str, header_start: str) -> list[list[str]]:
    """Rows of the markdown table whose header line starts with `header_start`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_every_section_is_filled(smoke_run):
    run_dir, report, _ = smoke_run
    text = report.read_text()
    for section in [
        "## Result (Table 1 style)",
        "## Out of distribution (Table 2 style)",
        "## Held-in success over training",
        "## Training curves",
        "## Failure-label profile",
        "## Interface cues",
        "## Diagnostic weights",
    ]:
        assert section in text
    assert "_No" not in text  # no section fell back to "no data"
    for png in ["eval_over_steps.png", "curves.png", "labels.png", "cues.png", "weights.png"]:
        assert (report.parent / png).stat().st_size > 5000
        assert f"]({png})" in text


def test_report_numbers_equal_the_run_files(smoke_run):
    run_dir, report, _ = smoke_run
    text = report.read_text()
    base, adapter = read_json(run_dir / "eval" / "base.json"), read_json(run_dir / "eval" / "adapter.json")
    result = table_rows(text, "| policy |")
    assert [float(c) for c in result[0][1:]] == [round(100 * base["success"][c], 2) for c in base["success"]]
    assert [float(c) for c in result[1][1:]] == [round(100 * adapter["success"][c], 2) for c in adapter["success"]]

    # Table 2: each suite's columns and the average over all of them, backbone and trained, as in the files
    ood = table_rows(text, "| policy | memory_kv | memory_rec_sum | tau2 retail | tau2 airline | tau2 telecom |")
    for row, which in zip(ood[:2], ["base", "adapter"], strict=True):
        memory = read_json(run_dir / "eval" / f"bfcl_v4_memory_{which}.json")
        tau2 = read_json(run_dir / "eval" / f"tau2_{which}.json")
        assert memory["total"] == {"memory_kv": 2, "memory_rec_sum": 2}
        assert tau2["total"] == {"retail": 2, "airline": 2, "telecom": 2}
        assert tau2["user_simulator"] == "in-process: tiny-random (adapter disabled)"
        scores = [*memory["scores"].values(), *tau2["scores"].values()]
        expected = [*scores, sum(scores) / len(scores)]
        assert [float(c) for c in row[1:]] == [round(100 * v, 2) for v in expected]
    assert "User simulator: in-process: tiny-random (adapter disabled)." in text

    metrics = read_metrics(run_dir)
    assert len(metrics) == 4  # cpu_smoke trains 4 steps
    training = table_rows(text, "| step | charts/reward")
    assert [int(r[0]) for r in training] == [m["step"] for m in metrics]
    assert [float(r[1]) for r in training] == [round(m["charts/reward"], 4) for m in metrics]
    assert [float(r[4]) for r in training] == [round(m["weights/mean"], 4) for m in metrics]

    rounds = [read_json(p) for p in sorted((run_dir / "rounds").glob("step_*.json"))]
    cues = table_rows(text, "| step | active cues |")
    assert [r[1] for r in cues] == [", ".join(active_cues(r["interface_used"])) or "none" for r in rounds]
    label_rows = table_rows(text, "| step | " + re.search(r"\| step \| ([a-z_]+) \|", text.split("## Failure")[1])[1])
    assert sum(int(c) for r in label_rows for c in r[1:]) == sum(
        p["count"] for r in rounds for p in r["profile"].values()
    )

    weights = [row["weight"] for p in sorted((run_dir / "trajectories").glob("*.jsonl.gz")) for row in read_jsonl_gz(p)]
    assert f"{len(weights)} trajectories: mean {sum(weights) / len(weights):.3f}" in text


def test_run_directory_holds_what_a_report_needs(smoke_run):
    run_dir, _, stdout = smoke_run
    for name in ["config.yaml", "split.json", "metrics.jsonl", "checkpoint/step_0004/state.json", "adapter"]:
        assert (run_dir / name).exists(), name
    assert (run_dir / "eval" / "step_0002.json").exists()  # the periodic held-in evaluation
    assert "[pipeline] report:" in stdout
    suite_file = run_dir / "eval" / "bfcl_v4_memory_adapter.json"
    assert (run_dir / "eval" / "bfcl_v4_memory_adapter.memory").is_dir()  # the back ends' snapshots stay in the run
    written = suite_file.stat().st_mtime_ns
    # rerunning the same command finds the finished run and redoes no training step and no evaluation
    proc = run_smoke(run_dir.parent)
    assert "continuing that run" in proc.stdout and "[train] step" not in proc.stdout
    assert suite_file.stat().st_mtime_ns == written
