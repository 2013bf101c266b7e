"""The sweep: ablations as switches on top of any recipe, one table with mean and spread, resumable."""

import json

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.programs import sweep
from seal_mini.programs.placement import Outcome
from seal_mini.runio import read_json, write_json

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`


def test_ablations_flip_the_same_switches_on_top_of_the_given_recipe():
    """Each ablation file's own keys (its base and name left out) applied to cpu_learn change exactly
    those keys, and nothing of the 3B recipe it inherits from comes along."""
    base = load_config("recipes/cpu_learn.yaml").to_dict()
    expected = {
        "vanilla_rl": {("train", "diagnose"): False, ("train", "reweight"): False, ("interface", "enabled"): False},
        "no_env_adaptation": {("interface", "enabled"): False},
        "no_reweighting": {("train", "reweight"): False},
        "no_closed_loop": {("interface", "closed_loop"): False},
        "shuffled_weights": {("diagnosis", "shuffle_weights"): True},
        "turn_weights": {("diagnosis", "weight_level"): "turn"},
        "missing_call_rho_1": {("diagnosis", "rho"): {**base["diagnosis"]["rho"], "missing_tool_call": 1.0}},
    }
    for name in sweep.ABLATIONS + sweep.CONTROLS:
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
    labels = {"base": {"missing_tool_call": 0.5, "pass": 0.5}, "trained": {"missing_tool_call": 0.1, "pass": 0.9}}
    # training rounds: SEAL's cues on from step 1; the gap counts those rounds only (step 0's 0.5 is left out)
    rounds = {
        "seal": [{"success": [0.5, 0.3, 0.5], "cues_on": [False, True, True]}] * 2,
        "vanilla_rl": [
            {"success": [0.0, 0.2, 0.2], "cues_on": [False] * 3},  # gaps 0.1, 0.3: 20 points
            {"success": [0.0, 0.3, 0.3, 0.9], "cues_on": [False] * 4},  # gaps 0.0, 0.2 (its step 3 has no pair): 10
        ],
    }
    rows = [
        {
            "variant": v,
            "seed": k,
            "base": {"base": b, "mean": b},
            "score": {"base": a, "mean": a, "evaluations": 3},
            "rounds": rounds[v][k],
            "labels": labels,
            "seconds": 60.0,
        }
        for v, pairs in {"seal": [(0.2, 0.5), (0.1, 0.4)], "vanilla_rl": [(0.2, 0.3), (0.1, 0.3)]}.items()
        for k, (b, a) in enumerate(pairs)
    ]
    summary = sweep.summarize(rows)
    assert summary["seal"]["trained"]["mean"] == pytest.approx(45.0)
    assert summary["seal"]["delta"]["mean"] == pytest.approx(30.0)
    assert summary["vanilla_rl"]["delta"]["sd"] == pytest.approx(7.0710678)
    # SEAL - vanilla per seed: 20 and 10 points; mean 15, sd 7.07, t(0.975, 1) = 12.706: 15 +- 63.5
    d = summary["vanilla_rl"]["seal_minus"]["mean"]
    assert d["mean"] == pytest.approx(15.0) and d["sd"] == pytest.approx(7.0710678)
    assert d["t95"] == pytest.approx([15 - 63.53, 15 + 63.53], abs=0.02)
    assert d["boot95"] == pytest.approx([10.0, 20.0])  # the mean of a resample of two differences lies in [10, 20]
    assert d["seeds_for_5"] == 16  # ceil(((1.960 + 0.842) * 7.07 / 5) ** 2) = ceil(15.7)
    text = sweep.table(summary, 200, 3)
    assert "| seal | 45.0 ± 7.1 [40.0, 50.0] | 30.0 ± 0.0 [30.0, 30.0] | - | - | 60, 60 | 40.25 (SEAL) |" in text
    assert (
        "| vanilla_rl | 30.0 ± 0.0 [30.0, 30.0] | 15.0 ± 7.1 [10.0, 20.0] | +15.0 [t -48.5, +78.5] [boot +10.0, +20.0] | 16 |"
        in text
    )
    assert "| warm start | 15.0 ± 7.1 [10.0, 20.0] | - | - | - | - | 14.00 |" in text
    assert summary["vanilla_rl"]["cue_round_gap"]["mean"] == pytest.approx(15.0)
    assert "trained with cues on in 2/2 of 3 rounds (per seed)" in text
    assert "in the rounds SEAL trained with cues on (same step, same tasks): +15.0 [t -48.5, +78.5]" in text
    assert "missing_tool_call 50.0 -> 10.0%" in text
    assert "mean of its last 3 evaluations" in text


def test_t_quantiles_and_paired_intervals_by_hand():
    for df, want in ((1, 12.7062), (4, 2.7764), (10, 2.2281), (30, 2.0423)):  # printed t tables
        assert sweep.t_quantile(0.975, df) == pytest.approx(want, abs=2e-4)
    d = sweep.paired([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd 1.291, t(0.975, 3) = 3.182: half-width 2.054
    assert d["t95"] == pytest.approx([0.446, 4.554], abs=1e-3)
    assert 1.0 <= d["boot95"][0] < 2.5 < d["boot95"][1] <= 4.0
    assert sweep.paired([3.0])["t95"] is None


def test_a_run_scores_the_mean_of_its_last_evaluations(tmp_path):
    for tag, mean in (("step_0005", 0.1), ("step_0010", 0.2), ("step_0015", 0.4), ("adapter", 0.6)):
        write_json(tmp_path / "eval" / f"{tag}.json", {"success": {"base": mean, "mean": mean}})
    write_json(
        tmp_path / "eval" / "base.json", {"success": {"base": 0.0, "mean": 0.0}}
    )  # the warm start: not the run's
    assert sweep.run_score(tmp_path, 3) == {"base": pytest.approx(0.4), "mean": pytest.approx(0.4), "evaluations": 3}
    assert sweep.run_score(tmp_path, 1)["mean"] == pytest.approx(0.6)
    assert sweep.run_score(tmp_path, 9)["evaluations"] == 4


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
    assert sweep.chosen_ablations("turn_weights,no_reweighting") == ["no_reweighting", "turn_weights"]
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


def test_a_sweep_copies_a_warm_start_built_beside_it_instead_of_building_another(tmp_path, monkeypatch):
    """`probe` (or a run) builds <out_dir>/<name>/warm_start; the sweep's runs sit one folder deeper, in
    <out_dir>/<name>_sweep/, and would build the same warm start again (ten minutes on the CPU)."""
    from seal_mini.engine.policy import warm_start_dir
    from seal_mini.training import sft

    overrides = [f"out_dir={tmp_path}", "sft.cue_compliance=0"]
    probed = load_config("recipes/cpu_learn.yaml", [*overrides, "name=cpu_learn_c0"])
    write_json(warm_start_dir(probed) / "identity.json", sft.identity(probed))  # a finished build, as reuse sees it
    other = load_config("recipes/cpu_learn.yaml", [*overrides, "name=elsewhere", "sft.cue_compliance=0.5"])
    write_json(warm_start_dir(other) / "identity.json", sft.identity(other))  # another warm start: not copied
    seen = []

    def fake_run_placed(jobs, gpus, per_run=1):
        for job in jobs:
            cfg = load_config(job.command[4], job.command[5:])
            copied = warm_start_dir(cfg) / "identity.json"
            seen.append(copied.exists() and read_json(copied) == sft.identity(cfg))
            write_json(cfg.run_dir / "eval" / "base.json", {"success": {"base": 0.1, "mean": 0.1}, "n_tasks": 8})
            write_json(cfg.run_dir / "eval" / "adapter.json", {"success": {"base": 0.1, "mean": 0.1}, "n_tasks": 8})
        return [Outcome(job, [], 0, 1.0) for job in jobs]

    monkeypatch.setattr(sweep, "run_placed", fake_run_placed)
    assert sweep.main(["recipes/cpu_learn.yaml", *overrides, "--seeds", "2", "--ablations", "vanilla_rl"]) == 0
    assert seen == [True] * 4
    assert sweep.main(["recipes/cpu_learn.yaml", f"out_dir={tmp_path / 'bare'}", "--seeds", "1"]) == 0
    assert seen[4:] == [False]  # nothing built beside that sweep: its first run builds (or copies the shipped one)


def test_a_finished_run_made_with_other_settings_is_refused_not_reused(tmp_path, monkeypatch):
    """A sweep with an override, under the name of an earlier sweep without it, would otherwise report the
    earlier runs as its own: it stops and names the setting."""
    from seal_mini.runio import write_yaml

    def fake_run_placed(jobs, gpus, per_run=1):
        outcomes = []
        for job in jobs:
            cfg = load_config(job.command[4], job.command[5:])
            write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())  # what a pipeline run saves
            write_json(cfg.run_dir / "eval" / "base.json", {"success": {"base": 0.1, "mean": 0.1}, "n_tasks": 8})
            write_json(cfg.run_dir / "eval" / "adapter.json", {"success": {"base": 0.2, "mean": 0.2}, "n_tasks": 8})
            outcomes.append(Outcome(job, [], 0, 12.0))
        return outcomes

    monkeypatch.setattr(sweep, "run_placed", fake_run_placed)
    argv = ["recipes/cpu_learn.yaml", f"out_dir={tmp_path}", "--seeds", "1"]
    assert sweep.main(argv) == 0
    assert sweep.main(argv) == 0  # the same settings: the finished run is reused
    with pytest.raises(ConfigError, match=r"interface.bare_share: 0.0 there, 0.5 here.*name=\.\.\."):
        sweep.main([*argv, "interface.bare_share=0.5"])
    assert sweep.main([*argv, "interface.bare_share=0.5", "name=bare"]) == 0
