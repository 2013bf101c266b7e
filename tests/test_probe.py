"""The probe: what RL starts from, by hand on made-up episodes and end to end on a small warm start."""

import pytest

from seal_mini.config import load_config
from seal_mini.programs import probe


def test_start_figures_by_hand():
    cfg = load_config(None, ["rollout.group_size=4"])
    # group 1: two successes, two failures with different labels (rho 1.5 and 1.0); group 2: all fail
    labels = [["pass", "pass"], ["pass", "pass"], ["missing_tool_call", "pass"], ["state_mismatch", "pass"]]
    labels += [["missing_tool_call", "pass"]] * 4
    sampled = {"rewards": [1.0, 1.0, 0.0, 0.0] + [0.0] * 4, "labels": labels}
    greedy = {"rewards": [0.0, 1.0], "labels": [["missing_tool_call", "pass"], ["pass", "pass"]]}
    f = probe.start_figures(sampled, greedy, cfg)
    assert f["sampled_success"] == 0.25 and f["greedy_success"] == 0.5 and f["mixed_groups"] == 0.5
    assert f["groups_all_failed"] == 0.5 and f["groups_all_solved"] == 0.0
    assert f["mixed_if_success_were_even"] == pytest.approx(1 - 0.75**4 - 0.25**4, abs=1e-4)  # p = 0.25, G = 4
    assert f["successes_with_a_failure_label"] == 0.0
    assert f["intervals"]["sampled_success"][0] <= 0.25 <= f["intervals"]["sampled_success"][1]
    assert f["labels"]["missing_tool_call"] == pytest.approx(5 / 16, abs=1e-4)
    # weights: 1.0 for the successes, (1.5 + 1) / 2 = 1.25 and (1.0 + 1) / 2 = 1.0 for group 1's failures; the
    # spread of the failed weights: group 1 sd(1.25, 1.0) = 0.125, group 2 (all 1.25) 0
    assert f["failed_weight_sd_within_group"] == pytest.approx(0.0625)
    # advantages of group 1 (Bessel std 0.577): +-0.866; weighted: 0.866, 0.866, -1.0825, -0.866
    plain, weighted = [0.866, 0.866, -0.866, -0.866], [0.866, 0.866, -1.0825, -0.866]
    dot = sum(a * b for a, b in zip(plain, weighted, strict=True))
    norm = (sum(a * a for a in plain) * sum(b * b for b in weighted)) ** 0.5
    assert f["weighted_vs_plain_advantage_cosine"] == pytest.approx(dot / norm, abs=1e-3)


def test_token_level_figures_by_hand():
    """The same episodes with tokens: a prompt of 2, turn 0's message of 2 sampled tokens, one template token,
    turn 1's message of 2. Trajectory-level weights give every token its episode's weight; turn-level ones
    give a failed turn's tokens its rho, scaled so the episode's mean stays its weight."""
    cfg = load_config(None, ["rollout.group_size=4"])
    labels = [["pass", "pass"], ["pass", "pass"], ["missing_tool_call", "pass"], ["state_mismatch", "pass"]]
    labels += [["missing_tool_call", "pass"]] * 4
    sampled = {
        "rewards": [1.0, 1.0, 0.0, 0.0] + [0.0] * 4,
        "labels": labels,
        "turn_starts": [[2, 5]] * 8,
        "loss_masks": [[0, 0, 1, 1, 0, 1, 1]] * 8,
    }
    f = probe.start_figures(sampled, {"rewards": [0.0, 1.0], "labels": labels[:2]}, cfg)["token_level"]
    # trajectory level: group 1's failed tokens 1.25 x 4 and 1.0 x 4 (sd 0.125), group 2's all 1.25 (sd 0)
    assert f["trajectory"]["failed_token_weight_sd_within_group"] == pytest.approx(0.0625)
    # turn level: missing_tool_call's turn 1.5 / 1.25 = 1.2, its passed turn 0.8, times 1.25: tokens 1.5, 1.5, 1,
    # 1; state_mismatch's episode 1 x 4. Group 1 sd of (1.5, 1.5, 1 x 6) = 0.2165, group 2 of (1.5, 1.5, 1, 1) = 0.25
    assert f["turn"]["failed_token_weight_sd_within_group"] == pytest.approx((0.216506 + 0.25) / 2, abs=1e-4)
    plain = [0.866] * 8 + [-0.866] * 8  # group 2's advantages are 0 and add nothing
    for level, ep2 in (("trajectory", [1.25] * 4), ("turn", [1.5, 1.5, 1.0, 1.0])):
        weighted = [0.866] * 8 + [-0.866 * w for w in ep2] + [-0.866] * 4
        dot = sum(a * b for a, b in zip(plain, weighted, strict=True))
        norm = (sum(a * a for a in plain) * sum(b * b for b in weighted)) ** 0.5
        assert f[level]["token_cosine"] == pytest.approx(dot / norm, abs=1e-3), level


def test_intervals_are_over_tasks_and_the_verdict_reads_them():
    # 10 tasks of 2 episodes: tasks alike give a point interval; tasks that differ give one around the figure
    alike = {"rewards": [1.0, 0.0] * 10, "labels": [["pass"], ["missing_tool_call"]] * 10}
    greedy = {"rewards": [1.0] * 5 + [0.0] * 5}
    iv = probe.task_intervals(alike, greedy, 2)
    assert iv["sampled_success"] == [0.5, 0.5] and iv["mixed_groups"] == [1.0, 1.0]
    assert iv["successes_with_a_failure_label"] == [0.0, 0.0]
    low, high = iv["greedy_success"]
    assert 0.1 <= low < 0.5 < high <= 0.9  # 5 of 10 tasks: sd 0.16
    differ = {"rewards": [1.0, 1.0] * 5 + [0.0, 0.0] * 5, "labels": [["pass"]] * 20}
    low, high = probe.task_intervals(differ, greedy, 2)["sampled_success"]
    assert low < 0.5 < high and probe.task_intervals(differ, greedy, 2)["mixed_groups"] == [0.0, 0.0]
    assert probe._verdict("mixed_groups", [0.61, 0.7]) == "ok"
    assert probe._verdict("mixed_groups", [0.3, 0.59]).startswith("outside")
    assert probe._verdict("mixed_groups", [0.55, 0.65]).startswith("undecided")
    assert probe._verdict("successes_with_a_failure_label", None) == "-"


def test_each_cue_alone_and_its_target_labels():
    states = probe.cue_states()
    assert states["error_feedback"].parse_retry and not states["schema_cues"].guidelines
    assert probe.cue_targets("guidelines:act_when_a_tool_fits") == ("missing_tool_call",)
    assert probe.cue_targets("schema_cues") == ("argument_mismatch", "invalid_tool_call")
    assert all(s.active for s in states.values())


def test_probe_command_on_a_small_warm_start(tmp_path, capsys):
    from seal_mini.runio import read_json

    overrides = [f"out_dir={tmp_path}", "data.max_train_tasks=8", "data.max_eval_tasks=4", "sft.tasks_per_category=0"]
    overrides += ["sft.epochs=1", "model.scratch.hidden=32", "model.scratch.layers=1", "model.scratch.vocab=600"]
    overrides += ["rollout.group_size=2", "rollout.max_new_tokens=24"]
    assert probe.main(["recipes/cpu_learn.yaml", *overrides, "--tasks", "3"]) == 0
    result = read_json(tmp_path / "cpu_learn" / "probe.json")
    assert result["tasks"] == 3 and result["episodes"] == 6
    assert set(result["cues"]) == set(probe.cue_states())
    for figures in result["cues"].values():
        assert 0.0 <= figures["target_rate_on"] <= 1.0 and figures["success_off"] == result["sampled_success"]
    out = capsys.readouterr().out
    assert "sampled_success" in out and "guidelines:cautious_call" in out
    # --skip plays epoch 0's tasks from the K-th on: 3 of the 8 from the 5th; none from the 8th is an error
    assert probe.main(["recipes/cpu_learn.yaml", *overrides, "--tasks", "9", "--skip", "5", "--no-cues"]) == 0
    result = read_json(tmp_path / "cpu_learn" / "probe.json")
    assert result["tasks"] == 3 and result["skip"] == 5 and result["episodes"] == 6 and "cues" not in result
    with pytest.raises(SystemExit, match="leaves none of the 8 training tasks"):
        probe.main(["recipes/cpu_learn.yaml", *overrides, "--skip", "8", "--no-cues"])


def test_select_keeps_the_first_build_inside_the_targets(monkeypatch, capsys):
    """--select builds with sft.seed, +1, ... and stops at the first whose four figures lie in TARGETS (edges
    included); a figure missing (no success to look at) is not inside."""
    inside = {
        "sampled_success": 0.10,
        "greedy_success": 0.10,
        "mixed_groups": 0.60,
        "successes_with_a_failure_label": 0.0,
    }
    figures = {0: inside | {"greedy_success": 0.11}, 1: inside | {"successes_with_a_failure_label": None}, 2: inside}
    figures |= {3: inside, 5: inside | {"mixed_groups": 0.59}, 6: inside | {"sampled_success": 0.26}}
    played = []

    def fake_probe(cfg, n_tasks, cues, skip):
        played.append((cfg.sft.seed, n_tasks, cues, skip))
        return dict(figures[cfg.sft.seed])

    monkeypatch.setattr(probe, "probe", fake_probe)
    with pytest.raises(SystemExit):  # no warm start to build: nothing to choose among
        probe.main(["recipes/cpu_smoke.yaml", "--select", "2"])  # sft.enabled: false
    assert played == [] and "--select chooses among warm-start builds" in capsys.readouterr().err
    result = probe.select(load_config(None, []), 5, 7, 4)  # sft.seed -1: the run's seed (0) first
    assert played == [(0, 5, False, 7), (1, 5, False, 7), (2, 5, False, 7)]
    assert result["selected"] == 2 and [t["sft.seed"] for t in result["select"]] == [0, 1, 2]
    assert result["select"][0]["greedy_success"] == 0.11 and result["mixed_groups"] == 0.60
    played.clear()
    result = probe.select(load_config(None, ["sft.seed=5"]), 5, 0, 2)  # none inside: the last build's figures
    assert [p[0] for p in played] == [5, 6] and result["selected"] is None and result["sampled_success"] == 0.26
