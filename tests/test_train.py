"""The training loop (seal_mini.training.train): which tasks a step plays, resume is exact, the loop wires its
switches, guards and out-of-memory retries."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from seal_mini.config import ConfigError, load_config
from seal_mini.core.grpo import ema_rho
from seal_mini.engine.policy import load_policy
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.verifier import Verdict
from seal_mini.runio import read_json, read_jsonl_gz, read_metrics
from seal_mini.training import checkpoint as checkpoint_module
from seal_mini.training import train as train_module
from seal_mini.training import update as update_module

TINY = ["model.name=tiny-random", "device=cpu", "model.gradient_checkpointing=false"]


def test_tasks_for_step_walks_seeded_epochs():
    tasks = list(tasks_by_id(["base"]).values())[:10]
    steps = [train_module.tasks_for_step(tasks, s, 5, seed=3) for s in range(4)]
    assert sorted(t.id for t in steps[0] + steps[1]) == sorted(t.id for t in tasks)  # epoch 0 covers all once
    assert sorted(t.id for t in steps[2] + steps[3]) == sorted(t.id for t in tasks)
    assert [t.id for t in steps[0] + steps[1]] != [t.id for t in steps[2] + steps[3]]  # a new order per epoch
    assert train_module.tasks_for_step(tasks, 3, 5, seed=3) == steps[3]  # a function of (seed, step) alone


@pytest.mark.parametrize("n_tasks, per_step", [(10, 4), (10, 3), (7, 7), (5, 8), (400, 32)])
def test_every_step_lies_in_one_epoch_and_every_epoch_is_whole(n_tasks, per_step):
    tasks = [SimpleNamespace(id=f"t{i}") for i in range(n_tasks)]
    per_epoch = train_module.epoch_steps(n_tasks, per_step)
    assert per_epoch == -(-n_tasks // per_step)  # ceil(N / B): 400 tasks at most 32 a step -> 13 steps
    for epoch in range(3):
        steps = [train_module.tasks_for_step(tasks, epoch * per_epoch + k, per_step, seed=5) for k in range(per_epoch)]
        for step in steps:
            assert len({t.id for t in step}) == len(step) <= per_step  # no task twice, never more than B
        assert max(map(len, steps)) - min(map(len, steps)) <= 1  # near-equal steps
        assert sorted(t.id for step in steps for t in step) == sorted(t.id for t in tasks)  # each task once


def test_the_main_recipe_runs_six_whole_epochs():
    cfg = load_config("recipes/qwen2_5_3b.yaml")
    n_tasks = len(cfg.data.categories) * cfg.data.train_per_category
    per_epoch = train_module.epoch_steps(n_tasks, cfg.train.tasks_per_step)
    assert (n_tasks, per_epoch, cfg.train.steps) == (400, 13, 6 * 13)
    assert cfg.train.eval_every == per_epoch  # held-in evaluation after every epoch


def test_pick_spreads_a_limit_over_categories():
    split = load_split(load_config())
    picked = pick(split["train"], 8)
    assert [t.category for t in picked] == ["base", "miss_func", "miss_param", "long_context"] * 2


def fake_score(envs):
    """A deterministic stand-in reward from what the model wrote, so updates are non-trivial."""
    out = []
    for env in envs:
        text = env.turn_records()[0].final_text or "".join(e.call or "" for e in env.turn_records()[0].events)
        out.append(Verdict(float(len(text) % 2 == 0), "" if len(text) % 2 == 0 else "fake:odd"))
    return out


RESUME = TINY + [
    "data.max_train_tasks=4",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "train.tasks_per_step=2",
    "train.mini_batch_tasks=1",
    "train.micro_batch=2",
    "train.steps=4",
    "train.lr=0.01",
    "train.kl_coef=0.01",
    "train.eval_every=0",
    "train.print_samples=0",
    "interface.min_count=1",
    "interface.min_prevalence=0.0",
]


@pytest.mark.parametrize("model", ["tiny-random", "qwen3", "qwen3_5"])
def test_resume_is_exact(tmp_path, monkeypatch, tiny_backbone, model):
    """Four steps straight, and the same run stopped after step 2's checkpoint and resumed: the same adapter
    and metrics, bit for bit. Also on a tiny Qwen3 and a tiny Qwen3.5 (tests/test_backbones.py), whose steps
    train them (LoRA on the linear layers' projections as recipes/qwen3_5_4b.yaml puts it)."""
    monkeypatch.setattr(train_module, "score", fake_score)
    run = RESUME + [f"out_dir={tmp_path}"]
    if model != "tiny-random":
        run += [f"model.name={tiny_backbone(model)}", "model.tool_format=bfcl"]
    if model == "qwen3_5":
        run.append(f"lora.target_modules={load_config('recipes/qwen3_5_4b.yaml').lora.target_modules}")
    straight = load_config(overrides=run + ["name=straight"])
    train_module.train(straight)

    # the same run, interrupted right after the checkpoint of step 2, then resumed
    broken = load_config(overrides=run + ["name=resumed"])
    real_save = checkpoint_module.save_checkpoint

    def save_then_stop(run_dir, policy, optimizer, scheduler, state):
        real_save(run_dir, policy, optimizer, scheduler, state)
        if state.step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(broken)
    assert len(read_metrics(broken.run_dir)) == 2
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", real_save)
    with pytest.raises(ConfigError, match="--resume"):
        train_module.train(broken)  # a fresh start over an existing run is refused
    train_module.train(broken, resume=True)

    a = load_file(str(straight.run_dir / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(broken.run_dir / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    if model == "qwen3_5":  # the linear layers' projections trained too
        assert any("linear_attn.in_proj_qkv.lora_B" in k and a[k].abs().sum() > 0 for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    rows_a, rows_b = untimed(read_metrics(straight.run_dir)), untimed(read_metrics(broken.run_dir))
    assert len(rows_a) == 4 and rows_a == rows_b
    assert any(r["charts/reward"] not in (0.0, 1.0) for r in rows_a)  # updates had something to learn from
    assert any(abs(r["losses/grad_norm"]) > 0 for r in rows_a)
    base = load_file(str(straight.run_dir / "checkpoint" / "step_0004" / "adapter" / "adapter_model.safetensors"))
    assert any(not torch.equal(base[k], torch.zeros_like(base[k])) for k in base if "lora_B" in k)


def stopped_after_the_first_checkpoint(cfg, monkeypatch) -> Path:
    """Run `cfg` until its first checkpoint is written, then stop as a Ctrl-C would; its state.json."""
    real_save = checkpoint_module.save_checkpoint

    def save_then_stop(run_dir, policy, optimizer, scheduler, state):
        real_save(run_dir, policy, optimizer, scheduler, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(cfg)
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", real_save)
    return cfg.run_dir / "checkpoint" / "step_0001" / "state.json"


def test_a_checkpoint_older_than_a_label_resumes_with_the_labels_configured_rho(tmp_path, monkeypatch):
    """A run checkpointed before a label was added (here instance_mismatch) resumes; the new label starts
    from its configured rho instead of failing the first weight that needs it."""
    from seal_mini.runio import read_json, write_json

    monkeypatch.setattr(train_module, "score", fake_score)
    cfg = load_config(
        overrides=RESUME + [f"out_dir={tmp_path}", "name=old", "train.steps=2", "diagnosis.rho_update=ema"]
    )
    saved = stopped_after_the_first_checkpoint(cfg, monkeypatch)
    state = read_json(saved)
    del state["rho"]["instance_mismatch"]  # what a checkpoint written before the label existed holds
    write_json(saved, state)
    (saved.parent / "digests.json").unlink()  # nor had checkpoints of that age digests
    train_module.train(cfg, resume=True)
    # round 1's rho moved from the checkpoint's, with the new label starting at its configured value
    round1 = read_json(cfg.run_dir / "rounds" / "step_0001.json")
    start = {**state["rho"], "instance_mismatch": cfg.diagnosis.rho["instance_mismatch"]}
    expected, _ = ema_rho(start, round1["profile"], cfg.diagnosis)
    assert round1["rho"] == pytest.approx(expected)


def test_a_checkpoint_of_another_loop_version_is_refused_not_continued(tmp_path, monkeypatch):
    """A checkpoint written before the whole-epoch schedule and the rho timing (no "loop" key: version 1)
    would continue as a different run: resume refuses it and names --restart."""
    from seal_mini.runio import read_json, write_json

    monkeypatch.setattr(train_module, "score", fake_score)
    cfg = load_config(overrides=RESUME + [f"out_dir={tmp_path}", "name=v1", "train.steps=2"])
    saved = stopped_after_the_first_checkpoint(cfg, monkeypatch)
    state = read_json(saved)
    assert state.pop("loop") == checkpoint_module.LOOP_VERSION
    write_json(saved, state)
    (saved.parent / "digests.json").unlink()  # nor had checkpoints of that age digests
    with pytest.raises(ConfigError, match="loop version 1 .* --restart"):
        train_module.train(cfg, resume=True)
    train_module.train(cfg, restart=True)  # what the message offers works
    assert read_json(cfg.run_dir / "checkpoint" / "step_0002" / "state.json")["loop"] == checkpoint_module.LOOP_VERSION


def test_moving_rho_weighs_each_round_with_the_rho_its_own_profile_gives(tmp_path, monkeypatch):
    """diagnosis.rho_update=ema: step t diagnoses, profiles C_t, moves rho_{t-1} to rho_t with C_t, and only then
    weighs its trajectories, with rho_t (rounds/step_t.json records the rho the round weighed with)."""
    from seal_mini.core.diagnose import trajectory_profile
    from seal_mini.core.grpo import diagnostic_weights
    from seal_mini.runio import read_json, read_jsonl_gz

    monkeypatch.setattr(train_module, "score", fake_score)
    # count_scale 1: every label seen moves its rho fully, so a lag of one round would show in the weights
    cfg = load_config(
        overrides=RESUME
        + [f"out_dir={tmp_path}", "name=ema", "train.steps=2", "diagnosis.rho_update=ema"]
        + ["diagnosis.rho_ema_count_scale=1", "diagnosis.rho_ema_decay=0.5"]
    )
    train_module.train(cfg)
    d = cfg.diagnosis
    previous, lagged = dict(d.rho), 0
    for step in range(2):
        saved = read_json(cfg.run_dir / "rounds" / f"step_{step:04d}.json")
        rho, _ = ema_rho(previous, saved["profile"], d)
        assert saved["rho"] == rho  # rho_t comes from this round's profile C_t
        rows = read_jsonl_gz(cfg.run_dir / "trajectories" / f"step_{step:04d}.jsonl.gz")
        shares = [trajectory_profile(r["labels"]) for r in rows]
        now, _ = diagnostic_weights(shares, rho, d.w_min, d.w_max)
        before, _ = diagnostic_weights(shares, previous, d.w_min, d.w_max)
        assert [r["weight"] for r in rows] == pytest.approx(now.tolist(), abs=1e-6)
        lagged += int(not torch.allclose(now, before))
        previous = rho
    assert lagged  # the weights of rho_{t-1} differ: the check above tells the two apart
    assert rho["pass"] == d.rho["pass"] and rho["not_reached"] == d.rho["not_reached"]


def test_a_run_from_a_starting_adapter_starts_at_zero_kl(tmp_path, monkeypatch):
    """lora.adapter_path: the KL reference is the starting adapter, so the first optimizer step (one mini-batch
    per step here) sees a KL of exactly 0, where the bare backbone as reference would not."""
    from seal_mini.engine.policy import save_adapter

    monkeypatch.setattr(train_module, "score", fake_score)
    start = load_policy(load_config(overrides=TINY), banner=False)
    with torch.no_grad():
        for n, p in start.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    path = save_adapter(start, tmp_path / "start")
    cfg = load_config(
        overrides=RESUME
        + [f"out_dir={tmp_path}", "name=from_adapter", f"lora.adapter_path={path}", "train.steps=1"]
        + ["train.mini_batch_tasks=2", "train.kl_coef=0.5"]
    )
    train_module.train(cfg)
    (row,) = read_metrics(cfg.run_dir)
    assert row["losses/kl_ref"] == 0.0 and row["losses/tokens"] > 0 and row["losses/grad_norm"] > 0


def test_out_of_memory_in_rollouts_and_update_gives_the_round_of_the_smaller_setting(tmp_path, monkeypatch, capsys):
    """A card that fits one sequence per forward: the round at 4 episodes at once and micro-batches of 2
    shrinks to 1 and 1 (rollout wave and update micro-batch, the KL reference pass first), and comes out
    exactly as a run configured that small from the start; nothing is lost."""
    from test_rollout import OutOfMemoryAbove

    monkeypatch.setattr(train_module, "score", fake_score)
    one_step = [*RESUME, "train.steps=2", "rollout.max_concurrent=4", f"out_dir={tmp_path}"]
    small = load_config(overrides=[*one_step, "name=small", "rollout.max_concurrent=1", "train.micro_batch=1"])
    train_module.train(small)

    real_load = train_module.load_policy
    injected = []

    def load_a_small_card(cfg):
        policy = real_load(cfg)
        injected.append(OutOfMemoryAbove(policy.model, rows=1))
        return policy

    monkeypatch.setattr(train_module, "load_policy", load_a_small_card)
    shrunk = load_config(overrides=[*one_step, "name=shrunk"])
    _, policy = train_module.train(shrunk)
    warnings = capsys.readouterr().err
    assert "4 -> 2 episodes at once" in warnings and "train.micro_batch 2 -> 1" in warnings
    assert policy.limits.max_concurrent == 1 and policy.limits.micro_batch == 1
    assert injected[0].raised >= 3  # two rollout retries, one update retry; step 2 started small

    a = load_file(str(small.run_dir / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(shrunk.run_dir / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert untimed(read_metrics(small.run_dir)) == untimed(read_metrics(shrunk.run_dir))
    assert len(read_metrics(shrunk.run_dir)) == 2 and any(
        r["losses/grad_norm"] > 0 for r in read_metrics(shrunk.run_dir)
    )


def test_update_switched_off_leaves_the_adapter_as_it_started(tmp_path, monkeypatch):
    """train.update=false (a control run): rollouts, diagnosis and interface go on, the adapter never moves;
    the same run with the update on moves it (fake rewards that give the groups a spread)."""
    monkeypatch.setattr(train_module, "score", fake_score)
    adapters = {}
    for update in (True, False):
        cfg = load_config(overrides=RESUME + [f"out_dir={tmp_path}", f"name=u{update}", f"train.update={update}"])
        cfg.train.steps = 2
        train_module.train(cfg)
        adapters[update] = load_file(str(cfg.run_dir / "adapter" / "adapter_model.safetensors"))
        assert len(read_metrics(cfg.run_dir)) == 2
    lora_b = [k for k in adapters[False] if "lora_B" in k]
    assert lora_b and all(torch.equal(adapters[False][k], torch.zeros_like(adapters[False][k])) for k in lora_b)
    assert any(not torch.equal(adapters[True][k], torch.zeros_like(adapters[True][k])) for k in lora_b)


def test_the_loop_logs_a_skipped_step_and_wires_the_switches(tmp_path, monkeypatch, capsys):
    """A run whose step 1 has a NaN loss: the step is logged with its skips and its weights do not move (the
    checkpoints of steps 1 and 2 hold the same adapter). The same run uses rloo advantages, recomputed old
    log-probs and the seq_mean_token_sum aggregation, and its rows show the first two."""
    monkeypatch.setattr(train_module, "score", fake_score)
    updates = []
    real_update, real_loss = train_module.update, update_module.policy_loss

    def count_updates(*args, **kwargs):
        updates.append(1)
        return real_update(*args, **kwargs)

    def nan_in_step_1(*args):
        loss, metrics = real_loss(*args)
        if len(updates) == 2:
            return loss * float("nan"), {**metrics, "losses/loss": float("nan")}
        return loss, metrics

    monkeypatch.setattr(train_module, "update", count_updates)
    monkeypatch.setattr(update_module, "policy_loss", nan_in_step_1)
    switches = ["train.adv_estimator=rloo", "train.old_logprobs=recompute", "train.loss_agg=seq_mean_token_sum"]
    cfg = load_config(overrides=RESUME + switches + [f"out_dir={tmp_path}", "name=nan", "train.steps=2"])
    train_module.train(cfg)

    rows = read_metrics(cfg.run_dir)
    assert [r["losses/skipped_steps"] for r in rows] == [0, 2]
    assert [r["losses/optimizer_steps"] for r in rows] == [2, 0]
    assert "losses/loss" in rows[0] and "losses/loss" not in rows[1]  # the averages leave skipped steps out
    assert all(math.isfinite(v) for r in rows for k, v in r.items() if k.startswith("losses/"))
    assert "mini-batch 0 has a non-finite loss (nan)" in capsys.readouterr().err
    adapter = "adapter/adapter_model.safetensors"
    one, two = (load_file(str(cfg.run_dir / "checkpoint" / f"step_000{s}" / adapter)) for s in (1, 2))
    assert all(torch.equal(one[k], two[k]) for k in one)
    final = load_file(str(cfg.run_dir / adapter))
    assert all(torch.equal(one[k], final[k]) for k in one)

    # recomputed old log-probs: the first mini-batch (one micro-batch of 2 sequences) has ratio exactly 1
    assert rows[0]["losses/first_ratio_mean"] == 1.0 and rows[0]["losses/first_approx_kl"] == 0.0
    # rloo with groups of 2: A_j = r_j - r_other, times the diagnostic weight
    for step in range(2):
        traj = read_jsonl_gz(cfg.run_dir / "trajectories" / f"step_{step:04d}.jsonl.gz")
        for a, b in zip(traj[::2], traj[1::2], strict=True):
            assert a["advantage"] == pytest.approx(a["weight"] * (a["reward"] - b["reward"]), abs=1e-6)
            assert b["advantage"] == pytest.approx(b["weight"] * (b["reward"] - a["reward"]), abs=1e-6)
    assert any(r["reward"] != 0 for r in traj)


def test_bare_share_plays_that_share_of_each_steps_groups_without_the_interface(tmp_path, monkeypatch):
    """interface.bare_share=0.5 with every cue on from step 0 (open loop): each step one of its two tasks
    plays the bare benchmark, both of its episodes, and the round record names it; the pick is a function
    of (seed, step)."""
    assert train_module.bare_tasks(8, 0.25, 0, 3) == {5, 7}  # a function of (seed, step), in any process
    assert len(train_module.bare_tasks(8, 0.25, 0, 3)) == 2 and train_module.bare_tasks(8, 0.0, 0, 3) == set()
    assert len({frozenset(train_module.bare_tasks(8, 0.5, 0, s)) for s in range(6)}) > 1  # steps differ
    monkeypatch.setattr(train_module, "score", fake_score)
    played, real_make_env = [], train_module.make_env

    def spy(task, cfg, interface):
        played.append((task.id, interface is not None))
        return real_make_env(task, cfg, interface)

    monkeypatch.setattr(train_module, "make_env", spy)
    cfg = load_config(
        overrides=RESUME
        + [
            f"out_dir={tmp_path}",
            "name=bare",
            "train.steps=2",
            "interface.closed_loop=false",
            "interface.bare_share=0.5",
        ]
    )
    train_module.train(cfg)
    for step in range(2):
        episodes = played[4 * step : 4 * step + 4]
        bare = {task for task, cued in episodes if not cued}
        assert len(bare) == 1 and sum(not cued for _, cued in episodes) == 2
        record = read_json(cfg.run_dir / "rounds" / f"step_{step:04d}.json")
        assert record["bare_tasks"] == sorted(bare)
    plain = load_config(overrides=RESUME + [f"out_dir={tmp_path}", "name=plain", "train.steps=1"])
    train_module.train(plain)
    assert "bare_tasks" not in read_json(plain.run_dir / "rounds" / "step_0000.json")


def test_a_checker_and_a_diagnoser_that_raise_cost_their_episodes_not_the_run(tmp_path, monkeypatch):
    """Scoring never ends a run: each episode whose check raises fails, each whose diagnosis raises is
    labelled not_reached, the metrics count both, and the run trains on."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker

    from seal_mini.core import diagnose as diagnose_module

    def broken(*args, **kwargs):
        raise KeyError("a back end's bug")

    monkeypatch.setattr(multi_turn_checker, "multi_turn_checker", broken)
    monkeypatch.setattr(diagnose_module, "_walk", broken)
    cfg = load_config(overrides=RESUME + [f"out_dir={tmp_path}", "name=raising", "train.steps=2"])
    train_module.train(cfg)
    rows = read_metrics(cfg.run_dir)
    assert [r["charts/checker_raised"] for r in rows] == [4, 4]
    assert [r["charts/diagnosis_raised"] for r in rows] == [4, 4]
    assert all(r["charts/reward"] == 0.0 for r in rows)


def test_the_turn_level_weights_and_the_shuffled_control_reach_the_update(tmp_path, monkeypatch):
    """diagnosis.shuffle_weights: the weights are those of the labels the control hands back (its shuffle is
    tested in test_grpo.py; here a stand-in relabels, so that wiring shows). diagnosis.weight_level=turn: the
    update gets, per trajectory, grpo.turn_scales of those labels, whose mean over its sampled tokens is 1."""
    from seal_mini.core.diagnose import trajectory_profile
    from seal_mini.core.grpo import diagnostic_weights, turn_scales

    monkeypatch.setattr(train_module, "score", fake_score)
    calls, updates = [], []

    def alternate(labels):
        return [[("pass" if (i + k) % 2 else "missing_tool_call") for k in range(len(z))] for i, z in enumerate(labels)]

    def relabel(labels, rewards, group_size, stream):
        calls.append((labels, rewards, group_size))
        return alternate(labels)

    real_update = train_module.update

    def record(*args):
        updates.append((args[3], args[-1]))
        return real_update(*args)

    monkeypatch.setattr(train_module, "shuffled_among_failures", relabel)
    monkeypatch.setattr(train_module, "update", record)
    switches = ["diagnosis.weight_level=turn", "diagnosis.shuffle_weights=true", "train.steps=2"]
    cfg = load_config(overrides=RESUME + switches + [f"out_dir={tmp_path}", "name=turn"])
    train_module.train(cfg)
    d, varied = cfg.diagnosis, 0
    assert len(calls) == len(updates) == 2
    for step, ((labels, rewards, group_size), (trajs, scales)) in enumerate(zip(calls, updates, strict=True)):
        rows = read_jsonl_gz(cfg.run_dir / "trajectories" / f"step_{step:04d}.jsonl.gz")
        assert labels == [r["labels"] for r in rows] and rewards == [r["reward"] for r in rows] and group_size == 2
        weighed = alternate(labels)
        weights, _ = diagnostic_weights([trajectory_profile(z) for z in weighed], d.rho, d.w_min, d.w_max)
        assert [r["weight"] for r in rows] == pytest.approx(weights.tolist(), abs=1e-6)
        assert len(set(weights.tolist())) > 1  # the relabelling shows in the weights
        for t, s, z in zip(trajs, scales, weighed, strict=True):
            assert torch.equal(s, turn_scales("turn", z, t.turn_starts, t.loss_mask, d.rho, d.w_min, d.w_max))
            sampled = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert float(s[sampled].mean()) == pytest.approx(1.0, abs=1e-6)
            varied += len(set(s[sampled].tolist())) > 1
    assert varied  # some trajectory's turns weigh differently
