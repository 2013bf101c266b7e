"""chat: one task played on the bare benchmark, shown turn by turn, ending in the checker's verdict."""

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.engine.policy import load_policy, save_adapter
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import POLICIES, play
from seal_mini.evaluation.agents import ModelAgent
from seal_mini.evaluation.heldin import evaluate
from seal_mini.programs.chat import Console, main, verdict_lines
from seal_mini.runio import write_json, write_yaml

TINY = [
    "model.name=tiny-random",
    "device=cpu",
    "model.gradient_checkpointing=false",
    "rollout.max_new_tokens=24",
    "eval.limits=rollout",
]
TASK = "multi_turn_base_3"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(overrides=TINY + [f"out_dir={out}", "name=tiny"])
    policy = load_policy(cfg)
    save_adapter(policy, cfg.run_dir / "adapter")
    write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())
    write_json(cfg.run_dir / "split.json", {"train": [], "eval": [TASK]})
    return cfg.run_dir


def test_scripted_ground_truth_shows_calls_and_passes(run_dir, capsys):
    assert main([str(run_dir), "--scripted", "ground_truth", "--replay"]) == 0
    out = capsys.readouterr().out
    task = tasks_by_id()[TASK]
    assert f"[task] {TASK}" in out
    assert out.count("[user] ") == len(task.turns)
    first_call = task.ground_truth[0][0].split("(")[0]
    assert f"[call] {first_call}(" in out and "[result] " in out
    assert "[verdict] reward 1 (passed)" in out


def test_model_chat_gives_the_evaluation_verdict(run_dir, tmp_path, capsys):
    # The same model, task and greedy decoding through `eval` must end with the same verdict and labels.
    assert main([str(run_dir), "--task", TASK]) == 0
    out = capsys.readouterr().out
    cfg = load_config(overrides=TINY + [f"lora.adapter_path={run_dir / 'adapter'}"])
    result = evaluate(ModelAgent(load_policy(cfg), cfg), [tasks_by_id()[TASK]], cfg, tmp_path, "x", progress=False)
    assert f"[verdict] reward {result['success']['mean']:.0f}" in out
    labels = ", ".join(f"turn {i}: {z}" for i, z in enumerate(_labels(tmp_path)))
    assert f"[labels] {labels}" in out
    assert "[assistant] " in out


def _labels(folder):
    from seal_mini.runio import read_jsonl_gz

    return read_jsonl_gz(folder / "x.trajectories.jsonl.gz")[0]["labels"]


def test_typed_turns_are_sent_and_flagged():
    task = tasks_by_id()[TASK]
    sent = []

    def ask(turn, text):
        sent.append(turn)
        return "something else entirely" if turn == 1 else text

    shown = []
    console = Console(Episode(task), ask, out=shown.append)
    messages = play(console, POLICIES["ground_truth"](task))
    assert sent == list(range(len(task.turns)))
    assert "something else entirely" in [m["content"] for m in messages if m["role"] == "user"]
    lines = verdict_lines(console)
    assert lines[0] == "[verdict] reward 1 (passed)"  # the scripted calls still match the ground truth
    assert "turns [1] were typed" in lines[-1]


def test_an_unknown_task_is_named(run_dir):
    with pytest.raises(ConfigError, match="--task nope: no such BFCL V3 task"):
        main([str(run_dir), "--task", "nope"])


def test_a_practice_task_plays_too(run_dir, capsys):
    from seal_mini.envs import practice

    task = practice.task_id(0, "heldin", "miss_param", 3)
    assert main([str(run_dir), "--task", task, "--scripted", "ground_truth", "--replay"]) == 0
    out = capsys.readouterr().out
    assert f"[task] {task}" in out and "[verdict] reward 1 (passed)" in out


def test_overrides_raise_the_limits_and_a_cut_prompt_is_named(run_dir, capsys):
    from seal_mini.engine.render import ChatRenderer
    from seal_mini.engine.tiny import tiny_tokenizer

    messages, tools = Episode(tasks_by_id()[TASK]).reset()
    prompt = len(ChatRenderer(tiny_tokenizer(), "template").prompt_ids(messages, tools))
    assert main([str(run_dir), "rollout.max_prompt_tokens=64", "--task", TASK, "rollout.max_total_tokens=128"]) == 0
    out = capsys.readouterr().out
    assert f"[cut] the first prompt is {prompt} tokens, over rollout.max_prompt_tokens=64: the model never ran" in out
    assert "rollout.max_prompt_tokens=" in out.split("Raise it")[1] and "[assistant]" not in out
    assert main([str(run_dir), "--task", TASK, f"rollout.max_prompt_tokens={prompt}"]) == 0  # now it fits
    out = capsys.readouterr().out
    assert "[assistant] " in out and "the first prompt is" not in out
    # the random model never stops by itself: its messages run to max_new_tokens (24) and are named
    assert "assistant messages reached rollout.max_new_tokens=24 and went to the environment unfinished" in out
    with pytest.raises(ConfigError, match="rollout.nope"):
        main([str(run_dir), "rollout.nope=1"])


@pytest.mark.unit
def test_cut_lines_name_the_limit_that_ended_an_episode():
    from types import SimpleNamespace

    from seal_mini.config import RolloutConfig
    from seal_mini.programs.chat import cut_lines

    r = RolloutConfig(max_new_tokens=64, max_prompt_tokens=1024, max_response_tokens=512, max_total_tokens=2048)

    def traj(ids: int, truncated: bool, sampled: int = 0, cut: int = 0):
        return SimpleNamespace(
            input_ids=[0] * ids, base=0, truncated=truncated, n_sampled=sampled, n_cut=cut, n_messages=3
        )

    assert cut_lines(traj(900, False, 100), r, 700) == []
    (prompt,) = cut_lines(traj(0, True), r, 4356)
    assert "4356 tokens, over rollout.max_prompt_tokens=1024" in prompt
    assert prompt.endswith("rollout.max_prompt_tokens=8192 rollout.max_total_tokens=16384")
    tight = RolloutConfig(max_prompt_tokens=2040, max_total_tokens=2048)  # room for a prompt: 2048 - 1 - closing
    (room,) = cut_lines(traj(0, True), tight, 2040)
    assert "over the room rollout.max_total_tokens=2048 leaves" in room
    (response,) = cut_lines(traj(1500, True, 512), r, 300)
    assert "rollout.max_response_tokens=512" in response and response.endswith("rollout.max_total_tokens=2560")
    total, message = cut_lines(traj(2040, True, 300, cut=2), r, 300)
    assert "reached rollout.max_total_tokens=2048 (prompt, messages and tool results: 2040 tokens)" in total
    assert message.startswith("[cut] 2 of 3 assistant messages reached rollout.max_new_tokens=64")


def test_the_default_task_follows_the_runs_config_without_a_split_file(tmp_path, capsys):
    from seal_mini.envs.splits import load_split

    cfg = load_config(overrides=TINY + [f"out_dir={tmp_path}", "name=practice", "data.source=practice"])
    write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())  # no split.json: the config's split decides
    assert main([str(cfg.run_dir), "--scripted", "ground_truth", "--replay"]) == 0
    out = capsys.readouterr().out
    assert f"[task] {load_split(cfg)['eval'][0]}:" in out and "[verdict] reward 1 (passed)" in out
