"""Runs as datasets: every split equals the files training and evaluation wrote, and Parquet round-trips."""

from pathlib import Path

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.envs.splits import pick
from seal_mini.evaluation.agents import ScriptedAgent
from seal_mini.evaluation.heldin import evaluate
from seal_mini.evaluation.suites import SUITES, run_suite
from seal_mini.programs import dataset as runs
from seal_mini.runio import read_json, read_jsonl_gz
from seal_mini.training import train as train_module


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """Two cpu_smoke training steps, a scripted held-in evaluation and a scripted BFCL V4 memory suite."""
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(
        "recipes/cpu_smoke.yaml",
        [f"out_dir={out}", "train.steps=2", "train.eval_every=0", "ood.memory_backends=[kv]", "ood.max_tasks=2"],
    )
    run_dir, _ = train_module.train(cfg)
    tasks = pick(read_json(run_dir / "split.json")["eval"], 4)
    evaluate(ScriptedAgent("ground_truth"), tasks, cfg, run_dir / "eval", "gt", progress=False)
    run_suite("bfcl_v4_memory", SUITES["bfcl_v4_memory"].scripted("answer"), cfg, run_dir / "eval", "memory_gt")
    return run_dir


def test_trajectories_and_turns_equal_the_training_files(run_dir):
    ds = runs.load(run_dir)
    files = [(int(p.name[5:9]), read_jsonl_gz(p)) for p in sorted((run_dir / "trajectories").glob("step_*.jsonl.gz"))]
    raw = [(step, r) for step, rows in files for r in rows]
    assert len(raw) == 2 * 2 * 3  # 2 steps x 2 tasks x G=3
    assert ds["trajectories"].num_rows == len(raw)
    for got, (step, want) in zip(ds["trajectories"], raw, strict=True):
        assert got["step"] == step == want["step"] and got["sample"] == want["sample"]
        for key in ("task_id", "category", "reward", "error_type", "labels", "reasons", "weight", "advantage"):
            assert got[key] == want[key], key
        for key in ("truncated", "n_sampled", "n_tokens"):
            assert got[key] == want[key], key
        assert [(m["role"], m["content"], m["name"]) for m in got["messages"]] == [
            (m["role"], m["content"], m.get("name")) for m in want["messages"]
        ]
    assert [r["sample"] for _, r in raw] == [0, 1, 2] * 4
    turns = ds["turns"]
    assert turns.num_rows == sum(len(r["labels"]) for _, r in raw)
    first = raw[0][1]
    assert turns[: len(first["labels"])]["label"] == first["labels"]
    assert turns[: len(first["labels"])]["turn"] == list(range(len(first["labels"])))


def test_eval_and_suite_rows_equal_the_evaluation_files(run_dir):
    ds = runs.load(run_dir)
    held_in = read_jsonl_gz(run_dir / "eval" / "gt.trajectories.jsonl.gz")
    assert ds["eval"].num_rows == len(held_in) == 4
    for got, want in zip(ds["eval"], held_in, strict=True):
        assert got["tag"] == "gt" and got["reward"] == want["reward"] == 1.0
        for key in ("task_id", "category", "error_type", "failed_turn", "labels"):
            assert got[key] == want[key], key
        assert [m["content"] for m in got["messages"]] == [m["content"] for m in want["messages"]]
    suite = read_jsonl_gz(run_dir / "eval" / "memory_gt.trajectories.jsonl.gz")
    assert ds["suites"].num_rows == len(suite) > 0
    assert set(ds["suites"]["suite"]) == {"bfcl_v4_memory"}
    assert ds["suites"]["reward"] == [r.get("reward") for r in suite]
    assert any(r is None for r in ds["suites"]["reward"]) and any(r == 1.0 for r in ds["suites"]["reward"])


def test_parquet_files_load_with_datasets_alone(run_dir, tmp_path):
    from datasets import load_dataset

    paths = runs.write_parquet(run_dir, tmp_path)
    assert set(paths) == set(runs.SPLITS)
    direct = runs.load(run_dir)
    for split, path in paths.items():  # one split per call: the splits have different columns
        loaded = load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
        assert loaded.to_list() == direct[split].to_list(), split


def test_not_a_run_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        runs.load(tmp_path)


def test_parquet_goes_only_into_a_folder_of_its_own(run_dir, tmp_path):
    (tmp_path / "other.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files other than"):
        runs.write_parquet(run_dir, tmp_path)
    assert (tmp_path / "other.txt").read_text() == "mine"
    first = runs.write_parquet(run_dir, tmp_path / "d")
    assert runs.write_parquet(run_dir, tmp_path / "d") == first  # its own earlier output is replaced


def test_missing_steps_and_pieces_are_named_not_dropped(run_dir, tmp_path, capsys):
    """Report and dataset say which of the run's files are gone, instead of quietly leaving them out."""
    import shutil

    from seal_mini.__main__ import main

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    gone = [
        "trajectories/step_0000.jsonl.gz",
        "rounds/step_0001.json",
        "eval/gt.trajectories.jsonl.gz",
        "eval/memory_gt.json",  # its episodes stay: the suite row would be gone without a word
    ]
    for name in gone:
        (copy / name).unlink()
    for argv in (["dataset", str(copy)], ["report", str(copy)]):
        capsys.readouterr()
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert f"{copy} lacks {', '.join(gone)}; the" in err, (argv, err)
    assert f"`copy` lacks {', '.join(gone)}; the sections" in (copy / "report" / "report.md").read_text()


def test_parquet_never_replaces_a_file(run_dir, tmp_path):
    mine = tmp_path / "mine.parquet"
    mine.write_text("my own notes")
    with pytest.raises(ConfigError, match="is a file"):
        runs.write_parquet(run_dir, mine)
    assert mine.read_text() == "my own notes" and [p.name for p in tmp_path.iterdir()] == ["mine.parquet"]


# A run with held-in evaluations during training (eval/step_0001.json, eval/step_0002.json): tests damage copies.
EVALUATED = {
    "name": "tiny",
    "device": "cpu",
    "model": {"name": "tiny-random", "gradient_checkpointing": False},
    "data": {"max_train_tasks": 2, "max_eval_tasks": 2},
    "rollout": {"group_size": 2, "max_new_tokens": 4, "max_prompt_tokens": 64, "max_total_tokens": 128},
    "eval": {"limits": "rollout"},
    "train": {"steps": 3, "tasks_per_step": 1, "mini_batch_tasks": 1, "eval_every": 1, "print_samples": 0},
}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    import yaml

    root = tmp_path_factory.mktemp("evaluated")
    (root / "fast.yaml").write_text(yaml.safe_dump(EVALUATED))
    run_dir, _ = train_module.train(load_config(root / "fast.yaml", [f"out_dir={root / 'runs'}"]))
    return run_dir


def _damaged_copy(run_dir: Path, tmp_path: Path, *gone: str) -> Path:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    for name in gone:
        path = copy / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return copy


def _warnings(argv: list[str], capsys) -> str:
    from seal_mini.__main__ import main

    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().err


def test_a_deleted_folder_is_named_not_dropped(evaluated, tmp_path, capsys):
    """With trajectories/ and rounds/ gone, report and dataset name every step's file."""
    copy = _damaged_copy(evaluated, tmp_path, "trajectories", "rounds")
    want = [f"trajectories/step_{s:04d}.jsonl.gz" for s in range(3)] + [f"rounds/step_{s:04d}.json" for s in range(3)]
    for argv in (["dataset", str(copy)], ["report", str(copy)]):
        err = _warnings(argv, capsys)
        assert f"{copy} lacks" in err and all(name in err for name in want), (argv, err[-2000:])
    assert "`copy` lacks" in (copy / "report" / "report.md").read_text()


def test_a_deleted_evaluation_made_during_training_is_named_not_dropped(evaluated, tmp_path, capsys):
    assert (evaluated / "eval" / "step_0001.json").is_file()
    copy = _damaged_copy(evaluated, tmp_path, "eval/step_0001.json")
    for argv in (["dataset", str(copy)], ["report", str(copy)]):
        assert f"{copy} lacks eval/step_0001.json" in _warnings(argv, capsys), argv


def test_dataset_out_never_hides_a_users_file(evaluated, tmp_path, capsys):
    """`dataset RUN --out FILE`: the user's file stays as it was, where it was, with nothing beside it."""
    from seal_mini.__main__ import main

    mine = tmp_path / "mine.parquet"
    mine.write_text("my own notes")
    assert main(["dataset", str(evaluated), "--out", str(mine)]) == 2
    assert "mine.parquet" in capsys.readouterr().err
    assert mine.is_file() and mine.read_text() == "my own notes"
    assert [p.name for p in tmp_path.iterdir()] == ["mine.parquet"]
