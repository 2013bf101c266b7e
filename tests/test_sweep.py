"""The sweep: ablations as switches on top of any recipe, one table with mean and spread, resumable."""

import json

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.programs import sweep
from seal_mini.programs.placement import Outcome
from seal_mini.runio import write_json


def test_ablations_flip_the_same_switches_on_top_of_the_given_recipe():
    """Each ablation file's own keys (its base and name left out) applied to cpu_learn change exactly
    those keys, and nothing of the 3B recipe it inherits from comes along."""
    base = load_config("recipes/cpu_learn.yaml").to_dict()
    expected = {
        "vanilla_rl": {("train", "diagnose"): False, ("train", "reweight"): False, ("interface", "enabled"): False},
        "no_env_adaptation": {("interface", "enabled"): False},
        "no_reweighting": {("train", "reweight"): False},
        "no_closed_loop": {("interface", "closed_loop"): False},
    }
    for name in sweep.ABLATIONS:
        flipped = load_config("recipes/cpu_learn.yaml", sweep.ablation_overrides(name)).to_dict()
        changed = {
            (section, key): value
            for section, values in flipped.items()
            if isinstance(values, dict)
            for key, value in values.items()
            if base[section][key] != value
        }
        assert changed == expected[name], name
        assert flipped["model"] == base["model"] and flipped["name"] == base["name"]


def test_flatten_writes_overrides_the_command_line_reads_back():
    data = {"train": {"lr": 0.001, "reweight": False}, "ood": {"suites": []}, "sft": {"faults": {"x": 0.5}}}
    overrides = sweep.flatten(data)
    assert overrides == ["train.lr=0.001", "train.reweight=false", "ood.suites=[]", "sft.faults.x=0.5"]
    with pytest.raises(ConfigError, match="no ablation recipe"):
        sweep.ablation_overrides("no_such_ablation")


def test_spread_and_table_by_hand():
    s = sweep.spread([0.10, 0.20, 0.30])
    assert s["mean"] == pytest.approx(20.0) and s["sd"] == pytest.approx(10.0)
    assert (s["min"], s["max"], s["n"]) == (pytest.approx(10.0), pytest.approx(30.0), 3)
    rows = [
        {"variant": v, "seed": k, "base": {"base": b, "mean": b}, "adapter": {"base": a, "mean": a}, "seconds": 60.0}
        for v, pairs in {"seal": [(0.2, 0.5), (0.1, 0.4)], "vanilla_rl": [(0.2, 0.3), (0.1, 0.3)]}.items()
        for k, (b, a) in enumerate(pairs)
    ]
    summary = sweep.summarize(rows)
    assert summary["seal"]["trained"]["mean"] == pytest.approx(45.0)
    assert summary["seal"]["delta"]["mean"] == pytest.approx(30.0)
    assert summary["vanilla_rl"]["delta"]["sd"] == pytest.approx(7.0710678)
    text = sweep.table(summary, 200)
    assert "| seal | 45.0 ± 7.1 [40.0, 50.0] | 30.0 ± 0.0 [30.0, 30.0] | 60, 60 | 40.25 (SEAL) |" in text
    assert "| warm start | 15.0 ± 7.1 [10.0, 20.0] | - | - | 14.00 |" in text
    assert "30.75 (vanilla RL)" in text


class Stopped(Exception):
    """Stands for a stop (Ctrl-C, a lost machine) in the middle of a sweep."""


def test_sweep_runs_each_variant_and_seed_once_and_resumes(tmp_path, monkeypatch):
    """A stopped sweep runs only what is missing; finished runs keep their recorded wall times."""
    calls, stopped = [], []

    def fake_run_placed(jobs, gpus, per_run=1):  # what each pipeline run leaves behind, without running it
        outcomes = []
        for job in jobs:
            assert job.command[3:5] == ["pipeline", "recipes/cpu_learn.yaml"]
            cfg = load_config(job.command[4], job.command[5:])
            calls.append(cfg.name)
            if cfg.name == "cpu_learn_no_reweighting_seed1" and not stopped:
                stopped.append(True)
                raise Stopped  # the first sweep is stopped here
            success = {"base": 0.1, "mean": 0.1 + 0.01 * cfg.seed}
            write_json(cfg.run_dir / "eval" / "base.json", {"success": {"base": 0.1, "mean": 0.1}, "n_tasks": 8})
            write_json(cfg.run_dir / "eval" / "adapter.json", {"success": success, "n_tasks": 8})
            outcomes.append(Outcome(job, [], 0, 12.0))
        return outcomes

    monkeypatch.setattr(sweep, "run_placed", fake_run_placed)
    argv = ["recipes/cpu_learn.yaml", f"out_dir={tmp_path}", "--seeds", "2", "--ablations"]
    with pytest.raises(Stopped):
        sweep.main(argv)
    first = list(calls)
    assert first[-1] == "cpu_learn_no_reweighting_seed1" and len(first) == 9
    calls.clear()
    assert sweep.main(argv) == 0
    assert calls == ["cpu_learn_no_reweighting_seed1", "cpu_learn_no_closed_loop_seed1"]
    record = json.loads((tmp_path / "cpu_learn_sweep" / "sweep.json").read_text())
    assert len(record["rows"]) == 10 and all(r["seconds"] == 12.0 for r in record["rows"])
    text = (tmp_path / "cpu_learn_sweep" / "sweep.md").read_text()
    for variant in ["seal", *sweep.ABLATIONS]:
        assert f"| {variant} | 10.5 ± 0.7 [10.0, 11.0] |" in text


def test_a_second_sweep_of_the_same_recipe_stops_naming_the_first(tmp_path, monkeypatch):
    """Two sweeps of one recipe would race for sweep.json and start each other's runs twice."""
    from seal_mini.runio import FileError, run_lock

    monkeypatch.setattr(sweep, "run_placed", lambda jobs, gpus, per_run=1: pytest.fail("a run started"))
    argv = ["recipes/cpu_learn.yaml", f"out_dir={tmp_path}", "--seeds", "1"]
    with run_lock(tmp_path / "cpu_learn_sweep", "sweep"):
        with pytest.raises(FileError, match="cpu_learn_sweep is in use by"):
            sweep.main(argv)


def test_seeds_must_be_given(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep, "run_sweep", lambda *a: pytest.fail("a sweep started without --seeds"))
    with pytest.raises(SystemExit):
        sweep.main(["recipes/cpu_learn.yaml", f"out_dir={tmp_path}"])
    assert "the following arguments are required: --seeds" in capsys.readouterr().err


def test_ablations_alone_mean_all_four_and_named_ones_only_those(tmp_path, monkeypatch):
    assert sweep.chosen_ablations(None) == [] and sweep.chosen_ablations("all") == list(sweep.ABLATIONS)
    assert sweep.chosen_ablations("no_closed_loop, vanilla_rl") == ["vanilla_rl", "no_closed_loop"]  # table order
    for bad in ("vanila_rl", ","):
        with pytest.raises(ConfigError, match="--ablations .*vanilla_rl, no_env_adaptation"):
            sweep.chosen_ablations(bad)
    with pytest.raises(ConfigError, match="took the override 'out_dir=x' .* put key=value overrides before"):
        sweep.chosen_ablations("out_dir=x")

    names = []
    monkeypatch.setattr(sweep, "run_sweep", lambda args, base, sweep_dir: names.append(list(args.ablations)) or 0)
    for flags, want in (
        ([], []),
        (["--ablations"], list(sweep.ABLATIONS)),
        (["--ablations", "vanilla_rl"], ["vanilla_rl"]),
    ):
        assert sweep.main(["recipes/cpu_learn.yaml", f"out_dir={tmp_path}", "--seeds", "1", *flags]) == 0
        assert names.pop() == want
