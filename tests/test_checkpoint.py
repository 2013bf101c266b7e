"""A run directory cannot be lost or mixed: one writer at a time, no silent restart, every damaged file
named in one line, durable checkpoints, settings that change no result may change when a run continues.

The commands run as a user runs them (`python -m seal_mini ...`, in-process or as real processes) on a
run of a tiny random model whose prompts exceed their limit, so a step costs milliseconds and the
run directory still holds everything a real one does."""

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from seal_mini.__main__ import main
from seal_mini.config import DIGEST_LINE, load_config
from seal_mini.training import checkpoint as checkpoint_module
from seal_mini.training import train as train_module

ROOT = Path(__file__).resolve().parents[1]

# Every prompt is longer than 64 tokens, so each episode ends at once and no update runs: a step is
# milliseconds, and the run still writes metrics, rounds, trajectories and checkpoints.
FAST = {
    "name": "tiny",
    "device": "cpu",
    "model": {"name": "tiny-random", "gradient_checkpointing": False},
    "data": {"max_train_tasks": 2, "max_eval_tasks": 2},
    "rollout": {"group_size": 2, "max_new_tokens": 4, "max_prompt_tokens": 64, "max_total_tokens": 128},
    "eval": {"limits": "rollout"},
    "train": {"steps": 3, "tasks_per_step": 1, "mini_batch_tasks": 1, "eval_every": 0, "print_samples": 0},
}


def write_recipe(path: Path, **sections) -> Path:
    recipe = json.loads(json.dumps(FAST))
    for key, value in sections.items():
        recipe[key] = {**recipe.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(recipe))
    return path


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run `python -m seal_mini ARGV` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> str:
    """The error the command line printed: one or two lines, never a traceback."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert len(lines[0]) < 600, lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder with a hash of its bytes (what "nothing was deleted or changed" means)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def newest_checkpoint(run_dir: Path) -> Path:
    """The folder of the newest checkpoint, whatever the layout: the one whose state.json has the highest step."""
    states = sorted((run_dir / "checkpoint").rglob("state.json"), key=lambda p: json.loads(p.read_text())["step"])
    return states[-1].parent


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 3-step run of the fast recipe (made once; tests work on copies)."""
    root = tmp_path_factory.mktemp("trained")
    recipe = write_recipe(root / "fast.yaml")
    cfg = load_config(recipe, [f"out_dir={root / 'runs'}"])
    train_module.train(cfg)
    return cfg.run_dir


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run in this test's own folder, and the recipe that made it."""
    run_dir = tmp_path / "runs" / "tiny"
    shutil.copytree(trained, run_dir)
    return run_dir, write_recipe(tmp_path / "fast.yaml")


# --- never a silent restart -------------------------------------------------------------------------


def test_an_evaluation_made_before_training_neither_blocks_it_nor_is_cleared(tmp_path, capsys):
    # Measuring the backbone first (eval alone) and drawing a report are not training results: training
    # may start in that directory, and the evaluation is still there afterwards.
    recipe = write_recipe(tmp_path / "fast.yaml")
    out = f"out_dir={tmp_path / 'runs'}"
    assert cli(capsys, "eval", recipe, out, "--scripted", "ground_truth")[0] == 0
    run_dir = tmp_path / "runs" / "tiny"
    evaluations = {p.name: p.read_bytes() for p in (run_dir / "eval").iterdir()}
    assert evaluations
    rc, _, err = cli(capsys, "train", recipe, out)
    assert rc == 0, err[-2000:]
    assert {p.name: p.read_bytes() for p in (run_dir / "eval").iterdir() if p.name in evaluations} == evaluations


@pytest.mark.parametrize("lost", ["state.json", "checkpoint folder"])
@pytest.mark.parametrize("command", ["train --resume", "pipeline"])
def test_a_lost_checkpoint_is_refused_and_nothing_is_deleted(run, capsys, lost, command):
    run_dir, recipe = run
    if lost == "state.json":
        (newest_checkpoint(run_dir) / "state.json").unlink()
    else:
        shutil.rmtree(run_dir / "checkpoint")
    before = snapshot(run_dir)
    argv = (
        ["train", "--resume", run_dir]
        if command == "train --resume"
        else ["pipeline", recipe, f"out_dir={run_dir.parent}"]
    )
    rc, _, err = cli(capsys, *argv)
    line = one_line_error(err)
    assert rc == 2
    if lost == "state.json":  # named, and the checkpoint before it offered
        assert "step_0003: incomplete (state.json missing)" in line and "continue from" in line
    else:
        assert "no checkpoint" in line and "--restart" in line
    assert snapshot(run_dir) == before


def test_restart_moves_the_old_results_aside(run, capsys):
    run_dir, recipe = run
    shutil.rmtree(run_dir / "checkpoint")
    before = snapshot(run_dir)
    rc, out, _ = cli(capsys, "train", recipe, f"out_dir={run_dir.parent}", "--restart")
    assert rc == 0 and "--restart" in out
    (aside,) = run_dir.parent.glob("tiny.old-*")
    assert snapshot(aside) == before  # every old file, unchanged, in the folder set aside
    assert json.loads((newest_checkpoint(run_dir) / "state.json").read_text())["step"] == 3  # and a new run


def test_a_copied_run_directory_reads_and_writes_its_own_files(trained, run, capsys):
    """`run` is a copy of `trained`, whose config.yaml still names the original's out_dir."""
    run_dir, _ = run
    original = snapshot(trained)
    rc, _, err = cli(capsys, "eval", run_dir / "config.yaml", "--scripted", "empty")
    assert rc == 0, err[-2000:]
    assert (run_dir / "eval" / "empty.json").is_file()
    assert cli(capsys, "report", run_dir)[0] == 0 and cli(capsys, "train", "--resume", run_dir)[0] == 0
    assert snapshot(trained) == original and not (trained / "eval").exists()


def test_the_same_train_command_again_continues_the_run_and_other_settings_are_refused(run, capsys):
    """`train RECIPE` over its own run continues it, as the pipeline does (a finished run: nothing to do);
    other settings are refused by name, never a fresh start over the run."""
    run_dir, recipe = run
    before = snapshot(run_dir / "checkpoint")
    rc, out, _ = cli(capsys, "train", recipe, f"out_dir={run_dir.parent}")
    assert rc == 0 and "checkpoint of step 3: continuing that run" in out
    assert snapshot(run_dir / "checkpoint") == before
    rc, _, err = cli(capsys, "train", recipe, f"out_dir={run_dir.parent}", "train.lr=0.5")
    assert rc == 2 and "other settings (train.lr)" in one_line_error(err)


# --- every damaged file named in one line -----------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("part", ["adapter/adapter_model.safetensors", "optim.pt", "rng.pt", "state.json"])
def test_a_damaged_checkpoint_part_is_named(run, capsys, part):
    run_dir, _ = run
    path = newest_checkpoint(run_dir) / part
    truncate(path)
    before = snapshot(run_dir)
    rc, _, err = cli(capsys, "train", "--resume", run_dir)
    line = one_line_error(err)
    assert rc == 2 and str(path) in line
    assert "to continue from step_0002" in line  # the previous checkpoint, kept, is offered
    assert snapshot(run_dir) == before


def garbage_metrics_line(run_dir: Path) -> Path:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"step": 1, "charts/rew', *lines[2:]]) + "\n")
    return path


def broken_eval_json(run_dir: Path) -> Path:
    path = run_dir / "eval" / "adapter.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text('{"tag": "adapter", "success": {"base": 0.')
    return path


def truncated_trajectories(run_dir: Path) -> Path:
    path = run_dir / "trajectories" / "step_0001.jsonl.gz"
    truncate(path)
    return path


def truncated_round(run_dir: Path) -> Path:
    path = run_dir / "rounds" / "step_0001.json"
    truncate(path)
    return path


def invalid_config(run_dir: Path) -> Path:
    path = run_dir / "config.yaml"
    path.write_text(path.read_text() + "  steps: [\n")
    return path


def config_with_a_bad_value(run_dir: Path) -> Path:
    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    saved["train"]["steps"] = -1
    path.write_text(yaml.safe_dump(saved))
    return path


@pytest.mark.parametrize(
    "damage, command",
    [
        (garbage_metrics_line, "train --resume"),
        (garbage_metrics_line, "report"),
        (broken_eval_json, "report"),
        (truncated_trajectories, "report"),
        (truncated_round, "report"),
        (invalid_config, "train --resume"),
        (config_with_a_bad_value, "train --resume"),
    ],
)
def test_a_damaged_run_file_is_named_in_one_line(run, capsys, damage, command):
    run_dir, _ = run
    path = damage(run_dir)
    rc, _, err = cli(capsys, *(["train", "--resume"] if command == "train --resume" else ["report"]), run_dir)
    line = one_line_error(err)
    assert rc == 2 and str(path) in line
    if damage is garbage_metrics_line:
        assert "line 2" in line


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--resume", "{run}"],
        ["eval", "{run}/config.yaml", "--scripted", "empty"],
        ["dataset", "{run}", "--out", "{tmp}/data"],
        ["export", "{run}", "--out", "{tmp}/export"],
        ["chat", "{run}", "--scripted", "empty"],
        ["report", "{run}"],
        ["pipeline", "{run}/config.yaml"],
    ],
    ids=lambda c: c[0],
)
def test_a_config_cut_short_or_edited_is_refused_by_every_command_and_nothing_changes(run, tmp_path, capsys, command):
    """A run's config.yaml carries the digest of its settings: cut in half (the keys it lost would come back
    as defaults: another run) or edited, every command that reads the run refuses it in one line."""
    run_dir, _ = run
    path = run_dir / "config.yaml"
    text = path.read_text()
    assert text.startswith(DIGEST_LINE)
    cut, edited = text[: len(text) // 2].rsplit("\n", 1)[0] + "\n", text.replace("lr: 1.0e-05", "lr: 0.001")
    for damaged in (cut, edited, text[:20] + text[text.index("\n") :]):  # the digest line itself cut too
        assert damaged != text
        path.write_text(damaged)
        before = snapshot(run_dir)
        argv = [a.format(run=run_dir, tmp=tmp_path) for a in command]
        rc, _, err = cli(capsys, *argv)
        line = one_line_error(err)
        assert rc == 2 and f"{path}: damaged" in line and "--restart" in line, line
        assert snapshot(run_dir) == before and not (tmp_path / "data").exists() and not (tmp_path / "export").exists()


def test_a_zero_filled_checkpoint_file_is_refused_naming_it(run, capsys):
    run_dir, _ = run
    path = newest_checkpoint(run_dir) / "adapter" / "adapter_config.json"
    path.write_bytes(bytes(len(path.read_bytes())))
    before = snapshot(run_dir)
    rc, _, err = cli(capsys, "train", "--resume", run_dir)
    line = one_line_error(err)
    assert rc == 2 and f"{path}: changed since written" in line and "step_0002" in line
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    "content, problem", [(b"name: caf\xe9\n", "not UTF-8"), (b"", "empty"), (b"# only a comment\n", "empty")]
)
def test_a_bad_recipe_is_named(tmp_path, capsys, content, problem):
    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes(content)
    rc, _, err = cli(capsys, "train", recipe, f"out_dir={tmp_path}")
    line = one_line_error(err)
    assert rc == 2 and str(recipe) in line and problem in line
    assert not (tmp_path / "run").exists()  # nothing started


def stopped_by_a_full_disk_at_step_2(tmp_path, capsys, monkeypatch) -> tuple[Path, Path, str]:
    """`train` of a fast recipe whose disk fills while step 2's checkpoint is written: (recipe, run dir, its
    one-line error), the error named and the last whole checkpoint kept."""
    recipe = write_recipe(tmp_path / "fast.yaml")
    real_save = train_module.torch.save

    def disk_full_at_step_2(obj, path, *args, **kwargs):
        if "step_0002" in str(path) and str(path).endswith("optim.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(train_module.torch, "save", disk_full_at_step_2)
    rc, _, err = cli(capsys, "train", recipe, f"out_dir={tmp_path / 'runs'}")
    line = one_line_error(err)
    run_dir = tmp_path / "runs" / "tiny"
    assert rc == 2 and "step_0002" in line and "No space left on device" in line
    assert newest_checkpoint(run_dir).name == "step_0001"
    assert not list(run_dir.rglob(".*.tmp"))  # the half-written checkpoint is gone, the last one kept
    monkeypatch.undo()
    return recipe, run_dir, line


def test_a_full_disk_while_checkpointing_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    _, run_dir, _ = stopped_by_a_full_disk_at_step_2(tmp_path, capsys, monkeypatch)
    rc, out, _ = cli(capsys, "train", "--resume", run_dir)
    assert rc == 0 and "checkpoint of step 1" in out
    assert newest_checkpoint(run_dir).name == "step_0003"


def test_after_a_full_disk_the_command_the_message_names_continues_the_run(tmp_path, capsys, monkeypatch):
    recipe, run_dir, line = stopped_by_a_full_disk_at_step_2(tmp_path, capsys, monkeypatch)
    assert "rerun the same command" in line
    rc, out, _ = cli(capsys, "train", recipe, f"out_dir={tmp_path / 'runs'}")  # what the message says
    assert rc == 0 and "checkpoint of step 1" in out
    assert newest_checkpoint(run_dir).name == "step_0003"


@pytest.mark.skipif(
    not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)),
    reason="needs /dev/full, the device every write to fails with ENOSPC (without it torch.save would create a file)",
)
def test_a_full_disk_says_so_and_names_the_file_not_torch_internals(tmp_path, capsys, monkeypatch):
    """torch.save really writing into a full device (/dev/full), which torch reports as its own RuntimeError
    ("[enforce fail at inline_container.cc:672] ..."); the disk's free space reads as it does when full."""
    import seal_mini.runio as runio

    recipe = write_recipe(tmp_path / "fast.yaml")
    real_save = train_module.torch.save

    def onto_a_full_disk(obj, path, *args, **kwargs):
        return real_save(obj, "/dev/full" if str(path).endswith("optim.pt") else path, *args, **kwargs)

    monkeypatch.setattr(train_module.torch, "save", onto_a_full_disk)
    monkeypatch.setattr(runio.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 4096))
    rc, _, err = cli(capsys, "train", recipe, f"out_dir={tmp_path / 'runs'}")
    line = one_line_error(err)
    assert rc == 2 and "enforce fail" not in line and ".tmp" not in line, line
    assert f"cannot write {tmp_path / 'runs' / 'tiny' / 'checkpoint' / 'step_0001' / 'optim.pt'}: No space left" in line


# --- durable checkpoints ----------------------------------------------------------------------------


def test_checkpoints_are_fsynced_and_the_last_two_kept(tmp_path, monkeypatch):
    synced = set()  # (device, inode) of every file and folder fsynced: a rename keeps the inode
    real_fsync = os.fsync

    def recording_fsync(fd):
        stat = os.fstat(fd)
        synced.add((stat.st_dev, stat.st_ino))
        return real_fsync(fd)

    def was_synced(path: Path) -> bool:
        return (path.stat().st_dev, path.stat().st_ino) in synced

    monkeypatch.setattr(os, "fsync", recording_fsync)
    cfg = load_config(write_recipe(tmp_path / "fast.yaml"), [f"out_dir={tmp_path / 'runs'}"])
    train_module.train(cfg)
    checkpoint = cfg.run_dir / "checkpoint"
    assert sorted(json.loads(p.read_text())["step"] for p in checkpoint.rglob("state.json")) == [2, 3]
    unsynced = [p for p in [checkpoint, *checkpoint.rglob("*")] if not was_synced(p)]
    assert not unsynced  # every file, every folder, and checkpoint/ itself after each rename
    for name in [
        "config.yaml",
        "metrics.jsonl",
        "rounds",
        "rounds/step_0002.json",
        "adapter/adapter_model.safetensors",
    ]:
        assert was_synced(cfg.run_dir / name), name


# --- settings that change no result may change when a run continues ---------------------------------


def test_resume_takes_settings_that_change_no_result_and_refuses_the_others(run, capsys):
    run_dir, _ = run
    rc, out, _ = cli(capsys, "train", "--resume", run_dir, "rollout.max_concurrent=3", "train.micro_batch=4")
    assert rc == 0 and "rollout.max_concurrent: 0 -> 3" in out and "train.micro_batch: 1 -> 4" in out
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rollout"]["max_concurrent"] == 3 and saved["train"]["micro_batch"] == 4

    before = snapshot(run_dir)
    rc, _, err = cli(capsys, "train", "--resume", run_dir, "train.lr=0.5", "seed=3", "rollout.max_concurrent=2")
    line = one_line_error(err)
    refused = line.split("other settings (")[1].split(")")[0]
    assert rc == 2 and refused.split(", ") == ["seed", "train.lr"]  # max_concurrent may change
    assert snapshot(run_dir) == before


def test_pipeline_continues_a_run_named_by_another_path(tmp_path, capsys, monkeypatch):
    """`train --resume /abs/path`, then the same pipeline command with a relative out_dir; then the run
    directory moved to another folder: the same run each time."""
    monkeypatch.chdir(tmp_path)
    recipe = write_recipe(tmp_path / "fast.yaml")
    assert cli(capsys, "train", recipe, "out_dir=runs")[0] == 0
    rc, out, err = cli(capsys, "train", "--resume", (tmp_path / "runs" / "tiny").resolve())
    assert rc == 0, err
    rc, out, err = cli(capsys, "pipeline", recipe, "out_dir=runs")
    assert rc == 0, err[-2000:]
    assert "continuing that run" in out and "[train] step" not in out
    shutil.move(tmp_path / "runs", tmp_path / "moved")
    rc, out, err = cli(capsys, "pipeline", recipe, "out_dir=moved", "rollout.prefill_tokens=4096")
    assert rc == 0, err[-2000:]
    assert "continuing that run" in out and "rollout.prefill_tokens: 16384 -> 4096" in out
    result = tmp_path / "moved" / "tiny" / "eval" / "adapter.json"
    truncate(result)  # a damaged final result is evaluated again, not fatal
    rc, out, err = cli(capsys, "pipeline", recipe, "out_dir=moved")
    assert rc == 0 and f"{result.relative_to(tmp_path)}: not valid JSON" in out and "evaluating again" in out
    assert json.loads(result.read_text())["tag"] == "adapter"
    # renamed too: the finished evaluations are the same policy's and are kept, not made again
    shutil.move(tmp_path / "moved" / "tiny", tmp_path / "moved" / "renamed")
    finished = snapshot(tmp_path / "moved" / "renamed" / "eval")
    rc, out, err = cli(capsys, "pipeline", recipe, "out_dir=moved", "name=renamed")
    assert rc == 0, err[-2000:]
    assert snapshot(tmp_path / "moved" / "renamed" / "eval") == finished


# --- one writer per run directory -------------------------------------------------------------------


def start(*argv) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seal_mini", *map(str, argv)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def wait_for_holder(run_dir: Path, proc: subprocess.Popen, timeout: float = 120) -> dict:
    """The lock record of `proc` once it holds run_dir and trains."""
    lock, deadline = run_dir / ".lock", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_text().strip() and (run_dir / "metrics.jsonl").exists():
            holder = json.loads(lock.read_text())
            if holder["pid"] == proc.pid:
                return holder
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"{proc.pid} never took the lock of {run_dir}")


def test_every_writing_command_stops_while_another_holds_the_run_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    recipe = write_recipe(tmp_path / "fast.yaml", train={"steps": 100000})
    run_dir = tmp_path / "runs" / "tiny"
    holder = start("train", recipe, f"out_dir={run_dir.parent}")
    try:
        record = wait_for_holder(run_dir, holder)
        assert record["host"] == socket.gethostname() and record["command"].startswith("python -m seal_mini train")
        for argv in [
            ["train", "--resume", run_dir],
            ["pipeline", recipe, f"out_dir={run_dir.parent}"],
            ["eval", recipe, f"out_dir={run_dir.parent}", "--scripted", "empty"],
            ["sft", recipe, f"out_dir={run_dir.parent}"],
        ]:
            rc, _, err = cli(capsys, *argv)
            line = one_line_error(err)
            assert rc == 2 and f"pid {holder.pid} on {socket.gethostname()}" in line, argv
            assert "python -m seal_mini train" in line and record["started"] in line
        # the report writes only into report/ and reads files that are replaced whole: a snapshot
        rc, _, err = cli(capsys, "report", run_dir)
        assert rc == 0, err[-2000:]
        assert "this report is a snapshot" in (run_dir / "report" / "report.md").read_text()
    finally:
        holder.send_signal(signal.SIGKILL)  # a kill -9: the lock record stays behind
        holder.wait()
    assert json.loads((run_dir / ".lock").read_text())["pid"] == holder.pid
    rc, _, err = cli(capsys, "eval", recipe, f"out_dir={run_dir.parent}", "--scripted", "empty")
    assert rc == 0 and f"taking over from pid {holder.pid}" in err
    assert (run_dir / ".lock").read_text() == ""  # released
    assert not list(run_dir.rglob(".*.tmp"))  # whatever the killed writer left half-written is gone


def test_two_runs_started_together_into_one_directory_one_is_refused(tmp_path):
    recipe = write_recipe(tmp_path / "fast.yaml", train={"steps": 100000})
    procs = [start("train", recipe, f"out_dir={tmp_path / 'runs'}", f"seed={seed}") for seed in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = [p for p in procs if p.poll() is not None]
        assert len(refused) == 1, "neither run was refused"
        (other,) = [p for p in procs if p is not refused[0]]
        assert other.poll() is None  # the first one keeps running
        _, err = refused[0].communicate()
        assert refused[0].returncode == 2 and f"in use by pid {other.pid}" in err
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


# --- report images ----------------------------------------------------------------------------------

KILLED_WHILE_WRITING_THE_SECOND_IMAGE = """
import os, signal, sys
from PIL import Image

real_save, count = Image.Image.save, [0]

def save_half_then_die(self, fp, *args, **kwargs):
    import io
    count[0] += 1
    if count[0] < 2:
        return real_save(self, fp, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(self, buffer, *args, **kwargs)
    half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    if isinstance(fp, (str, os.PathLike)):
        with open(fp, "wb") as f:
            f.write(half)
    else:
        fp.write(half)
        fp.flush()
    os.kill(os.getpid(), signal.SIGKILL)

Image.Image.save = save_half_then_die
from seal_mini.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def complete_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")


def test_a_kill_during_the_report_leaves_no_half_image_and_a_rerun_finishes_it(run, tmp_path, capsys):
    run_dir, _ = run
    straight = tmp_path / "straight" / "tiny"  # the same name: the report's title is the run's name
    shutil.copytree(run_dir, straight)
    assert cli(capsys, "report", straight)[0] == 0

    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_WRITING_THE_SECOND_IMAGE, "report", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    images = list((run_dir / "report").glob("*.png"))
    assert len(images) == 1 and all(complete_png(p) for p in images)  # the first image only, whole
    assert not (run_dir / "report" / "report.md").exists()

    rc, _, _ = cli(capsys, "report", run_dir)
    assert rc == 0
    assert (run_dir / "report" / "report.md").read_text() == (straight / "report" / "report.md").read_text()
    names = sorted(p.name for p in (run_dir / "report").iterdir())
    assert names == sorted(p.name for p in (straight / "report").iterdir())
    assert all(complete_png(p) for p in (run_dir / "report").glob("*.png"))


def test_non_finite_weights_are_never_saved_nor_resumed_from(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file
    from test_update import _no_schedule, _update_policy

    from seal_mini.config import ConfigError
    from seal_mini.runio import FileError

    cfg, policy = _update_policy()
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.train.lr)
    scheduler = _no_schedule(optimizer)
    checkpoint_module.save_checkpoint(tmp_path, policy, optimizer, scheduler, checkpoint_module.LoopState(step=1))
    saved = tmp_path / "checkpoint" / "step_0001" / "adapter" / "adapter_model.safetensors"
    weights = load_file(str(saved))
    name = sorted(weights)[0]
    weights[name][0, 0] = float("inf")
    save_file(weights, str(saved))  # a checkpoint that got a non-finite tensor anyway
    with pytest.raises(FileError, match=f"{saved}: 1 tensors hold NaN or inf \\(first: {name}\\)"):
        checkpoint_module.load_checkpoint(saved.parents[1], policy, optimizer, scheduler)

    with torch.no_grad():
        policy.trainable_parameters()[3][0, 0] = float("nan")
    with pytest.raises(ConfigError, match="checkpoint of step 2: not saved, 1 trained tensors hold NaN or inf"):
        checkpoint_module.save_checkpoint(tmp_path, policy, optimizer, scheduler, checkpoint_module.LoopState(step=2))
    assert [p.name for p in checkpoint_module.checkpoints(tmp_path)] == ["step_0001"]
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step_0001"]  # no half-written one


def test_chat_while_training_runs_says_to_wait_not_to_resume(run, capsys):
    """Before training ends there is no adapter; while a command holds the run, `train --resume` would be
    refused by its lock, so the message says who writes the run and to wait."""
    run_dir, _ = run
    shutil.rmtree(run_dir / "adapter")
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live other process
    try:
        holder = {"pid": training.pid, "host": socket.gethostname(), "command": "seal_mini train", "started": "now"}
        (run_dir / ".lock").write_text(json.dumps(holder))
        rc, _, err = cli(capsys, "chat", run_dir)
    finally:
        training.kill()
        training.wait()
    line = one_line_error(err)
    assert rc == 2 and "no trained adapter" in line and "wait for it to end" in line and "--resume" not in line
    (run_dir / ".lock").unlink()
    rc, _, err = cli(capsys, "chat", run_dir)
    assert rc == 2 and f"train --resume {run_dir}" in one_line_error(err)


def test_a_refused_command_leaves_no_run_folder_and_report_out_on_a_file_says_so(tmp_path, capsys):
    ids = tmp_path / "ids.json"
    ids.write_text('["no_such_task"]')
    recipe = write_recipe(tmp_path / "fast.yaml")
    rc, _, err = cli(capsys, "eval", recipe, f"out_dir={tmp_path / 'runs'}", "--ids", ids, "--scripted", "empty")
    assert rc == 2 and "no_such_task" in one_line_error(err)
    assert not (tmp_path / "runs" / "tiny").exists()  # not a folder holding only .lock
    (tmp_path / "runs" / "tiny").mkdir()
    rc, _, err = cli(capsys, "eval", recipe, f"out_dir={tmp_path / 'runs'}", "--ids", ids, "--scripted", "empty")
    assert rc == 2 and (tmp_path / "runs" / "tiny").is_dir()  # a folder that was there stays
    (tmp_path / "a_file").write_text("x")
    rc, _, err = cli(capsys, "report", tmp_path / "runs" / "tiny", "--out", tmp_path / "a_file")
    assert rc == 2 and "that is a file; name a folder" in one_line_error(err)
