"""Independent runs side by side: one GPU set each, as many at once as there are sets, failures named."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seal_mini.config import ConfigError
from seal_mini.programs.placement import Job, failure_report, gpu_sets, launch_command, run_placed, visible_gpus

ROOT = Path(__file__).resolve().parents[1]

# A stand-in run: records its GPUs and when it ran, then exits with the code it is given.
FAKE_RUN = """
import json, os, sys, time
start = time.time()
time.sleep(float(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    json.dump({"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}, f)
print("line one\\nthe last words of", sys.argv[1])
sys.exit(int(sys.argv[3]))
"""


def fake_job(folder: Path, name: str, seconds: float = 0.6, code: int = 0) -> Job:
    command = [sys.executable, "-c", FAKE_RUN, str(folder / f"{name}.json"), str(seconds), str(code)]
    return Job(name, command, folder / "logs" / f"{name}.log")


def test_gpu_sets_are_disjoint_and_refuse_what_cannot_fit():
    assert gpu_sets(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]
    assert gpu_sets([], 2) == []  # no GPU: the caller runs one job at a time
    with pytest.raises(ConfigError, match="4 GPUs per run, but only 2 are visible"):
        gpu_sets(["0", "1"], 4)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_launch_command_uses_torchrun_for_several_ranks():
    assert launch_command(["pipeline", "r.yaml"]) == [sys.executable, "-m", "seal_mini", "pipeline", "r.yaml"]
    several = launch_command(["pipeline", "r.yaml"], ranks=2)
    assert several[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert several[5:] == ["-m", "seal_mini", "pipeline", "r.yaml"]


def test_runs_go_side_by_side_each_on_its_own_gpus(tmp_path):
    jobs = [fake_job(tmp_path, f"run{i}") for i in range(5)]
    outcomes = run_placed(jobs, ["0", "1", "2", "3"], per_run=2, poll_s=0.05, echo=lambda _: None)
    records = [json.loads((tmp_path / f"run{i}.json").read_text()) for i in range(5)]
    assert all(o.returncode == 0 for o in outcomes)
    assert [",".join(o.gpus) for o in outcomes] == [r["gpus"] for r in records]
    assert {r["gpus"] for r in records} == {"0,1", "2,3"}
    for a in records:  # two runs that overlap in time never share a GPU, and at most two run at once
        overlapping = [b for b in records if b["start"] < a["end"] and a["start"] < b["end"]]
        assert len(overlapping) <= 2
        assert len({b["gpus"] for b in overlapping}) == len(overlapping)
    # two sets: the first two runs start together (from their own clocks, not the test's wall time)
    assert records[1]["start"] < records[0]["end"] and records[0]["start"] < records[1]["end"]


def test_a_failed_run_is_named_and_the_others_go_on(tmp_path):
    jobs = [fake_job(tmp_path, "good"), fake_job(tmp_path, "bad", code=3), fake_job(tmp_path, "also_good")]
    lines = []
    outcomes = run_placed(jobs, ["0", "1"], per_run=1, poll_s=0.05, echo=lines.append)
    assert [o.returncode for o in outcomes] == [0, 3, 0]
    report = failure_report(outcomes)
    assert report.startswith("[runs] 1 of 3 runs failed")
    assert "bad failed with exit code 3 after" in report and "on GPU " in report
    assert str(tmp_path / "logs" / "bad.log") in report and "the last words of" in report
    assert any("bad: FAILED (exit code 3)" in line for line in lines)
    assert failure_report([outcomes[0], outcomes[2]]) == ""


def test_without_gpus_runs_go_one_after_another(tmp_path):
    jobs = [fake_job(tmp_path, f"cpu{i}", seconds=0.3) for i in range(2)]
    run_placed(jobs, [], per_run=1, poll_s=0.05, echo=lambda _: None)
    first, second = (json.loads((tmp_path / f"cpu{i}.json").read_text()) for i in range(2))
    assert first["gpus"] is None or first["gpus"] == second["gpus"]  # CUDA_VISIBLE_DEVICES left as it was
    assert second["start"] >= first["end"]


TINY = {
    "device": "cpu",
    "model": {"name": "tiny-random", "gradient_checkpointing": False},
    "data": {"max_train_tasks": 1, "max_eval_tasks": 1},
    # every prompt is over its limit: an episode ends at once, so a whole pipeline takes seconds
    "rollout": {"group_size": 2, "max_new_tokens": 4, "max_prompt_tokens": 64, "max_total_tokens": 128},
    "eval": {"limits": "rollout"},
    "train": {"steps": 1, "tasks_per_step": 1, "mini_batch_tasks": 1, "eval_every": 0, "print_samples": 0},
}


def test_pipeline_with_several_recipes_runs_each(tmp_path):
    recipes = []
    for name in ("first", "second"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**TINY, "name": name}))
        recipes.append(str(path))
    command = [sys.executable, "-m", "seal_mini", "pipeline", *recipes, f"out_dir={tmp_path / 'runs'}"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["runs"]
    assert set(summary) == {"first", "second"} and all(r["exit_code"] == 0 for r in summary.values())
    for name in ("first", "second"):
        assert (tmp_path / "runs" / name / "report" / "report.md").is_file()
        assert "[pipeline] report:" in (tmp_path / "runs" / f"{name}.log").read_text()


def test_pipeline_refuses_two_recipes_in_one_run_directory(tmp_path):
    from seal_mini.programs.pipeline import main

    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump({**TINY, "name": "same"}))
    with pytest.raises(ConfigError, match="both run in"):
        main([str(path), str(path), f"out_dir={tmp_path}"])
