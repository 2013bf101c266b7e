"""Evaluation: one code path for models and scripted policies, the bare benchmark, resumable."""

import pytest
from conftest import Interrupting

from seal_mini.config import load_config
from seal_mini.engine.policy import load_policy
from seal_mini.envs.splits import load_split, pick
from seal_mini.evaluation.agents import ModelAgent, ScriptedAgent
from seal_mini.evaluation.heldin import evaluate, success_table
from seal_mini.runio import read_json

CFG = load_config(
    overrides=[
        "model.name=tiny-random",
        "device=cpu",
        "rollout.max_new_tokens=8",
        "env.max_calls_per_turn=2",
        "eval.limits=rollout",
    ]
)
TASKS = pick(load_split(CFG)["eval"], 8)


def test_scripted_ground_truth_scores_100_and_empty_0(tmp_path):
    gt = evaluate(ScriptedAgent("ground_truth"), TASKS, CFG, tmp_path, "gt", progress=False)
    empty = evaluate(ScriptedAgent("empty"), TASKS, CFG, tmp_path, "empty", progress=False)
    assert gt["success"] == {"base": 1.0, "miss_func": 1.0, "miss_param": 1.0, "long_context": 1.0, "mean": 1.0}
    assert empty["success"]["mean"] == 0.0 and empty["n_tasks"] == 8
    saved = read_json(tmp_path / "gt.json")
    assert saved["success"] == gt["success"] and saved["passed"]["base"] == 2
    assert (tmp_path / "gt.trajectories.jsonl.gz").exists()


def test_untrained_tiny_model_scores_0_through_the_same_path(tmp_path):
    policy = load_policy(CFG)
    result = evaluate(ModelAgent(policy, CFG, adapter=False), TASKS[:4], CFG, tmp_path, "base", progress=False)
    assert result["success"]["mean"] == 0.0 and result["policy"] == "tiny-random"
    assert sum(result["label_counts"].values()) == sum(len(t.turns) for t in TASKS[:4])


def test_stopped_evaluation_resumes_without_redoing_work(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            Interrupting(ScriptedAgent("ground_truth"), after=2),
            TASKS,
            CFG,
            tmp_path,
            "gt",
            progress=False,
            chunk_size=3,
        )
    again = Interrupting(ScriptedAgent("ground_truth"), after=99)
    result = evaluate(again, TASKS, CFG, tmp_path, "gt", progress=False, chunk_size=3)
    assert again.calls == 1  # 6 of 8 tasks were done; only the last piece ran
    assert result["n_tasks"] == 8 and result["success"]["mean"] == 1.0
    assert not (tmp_path / "gt.partial").exists()


def test_success_table_means_over_categories():
    rows = [{"category": "base", "reward": 1.0}, {"category": "base", "reward": 0.0}]
    rows += [{"category": "miss_func", "reward": 1.0}]
    assert success_table(rows) == {"base": 0.5, "miss_func": 1.0, "mean": 0.75}


def test_the_progress_bar_moves_as_each_episode_finishes(tmp_path, monkeypatch):
    """Not once per piece of work: a model evaluation's bar advances while the other episodes still run."""
    import seal_mini.evaluation.heldin as evaluate_module

    created = []

    class Recorder:
        def __init__(self, *args, total=0, initial=0, **kwargs):
            self.n, self.done_at_update = initial, []
            created.append(self)

        def update(self, n=1):
            self.n += n
            self.done_at_update.append(sum(env.done for env in envs))

        def set_postfix_str(self, *args, **kwargs):
            pass

        def close(self):
            pass

    envs = []
    real_episode = evaluate_module.Episode

    def recorded_episode(*args, **kwargs):
        envs.append(real_episode(*args, **kwargs))
        return envs[-1]

    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    monkeypatch.setattr(evaluate_module, "Episode", recorded_episode)
    policy = load_policy(CFG)
    evaluate(ModelAgent(policy, CFG, adapter=False), TASKS[:4], CFG, tmp_path, "base", chunk_size=4)
    (bar,) = created
    assert bar.n == 4 and len(bar.done_at_update) == 4  # one update per episode, all in one piece of work
    assert bar.done_at_update[0] < 4  # the first came while other episodes were still running


# every prompt is over its limit: a model episode ends at once, so the pieces cost nothing
FAST_OVERRIDES = [
    "model.name=tiny-random",
    "device=cpu",
    "eval.limits=rollout",
    "rollout.max_prompt_tokens=64",
    "rollout.max_total_tokens=128",
]
FAST = load_config(overrides=FAST_OVERRIDES)


def stop_after_one_piece(agent, cfg, out_dir, tag="x"):
    with pytest.raises(KeyboardInterrupt):
        evaluate(Interrupting(agent, after=1), TASKS, cfg, out_dir, tag, progress=False, chunk_size=3)


@pytest.mark.parametrize(
    "change",
    [
        "rollout.max_new_tokens=9",
        "rollout.max_total_tokens=256",
        "eval.temperature=0.7",
        "rollout.max_response_tokens=300",
    ],
)
def test_an_evaluation_with_other_settings_redoes_the_pieces_and_says_so(tmp_path, capsys, change):
    policy = load_policy(FAST)
    stop_after_one_piece(ModelAgent(policy, FAST, adapter=False), FAST, tmp_path)
    changed = load_config(overrides=[*FAST_OVERRIDES, change])
    again = Interrupting(ModelAgent(policy, changed, adapter=False), after=99)
    evaluate(again, TASKS, changed, tmp_path, "x", progress=False, chunk_size=3)
    assert again.calls == 3  # all three pieces of 8 tasks, none reused
    section = {"rollout.max_new_tokens": "generation", "eval.temperature": "generation"}.get(
        change.split("=")[0], "limits"
    )
    assert (
        f"redoing the pieces in {tmp_path / 'x.partial'}: what made them differs in {section}"
        in capsys.readouterr().err
    )


def test_an_evaluation_of_a_differently_trained_adapter_redoes_the_pieces(tmp_path, capsys):
    import torch

    policy = load_policy(FAST)
    stop_after_one_piece(ModelAgent(policy, FAST, adapter=True), FAST, tmp_path)
    with torch.no_grad():
        next(p for n, p in policy.model.named_parameters() if "lora_B" in n).add_(0.01)  # another training
    again = Interrupting(ModelAgent(policy, FAST, adapter=True), after=99)
    evaluate(again, TASKS, FAST, tmp_path, "x", progress=False, chunk_size=3)
    assert again.calls == 3 and "what made them differs in adapter" in capsys.readouterr().err
    stop_after_one_piece(ModelAgent(policy, FAST, adapter=True), FAST, tmp_path, "y")
    resumed = Interrupting(ModelAgent(policy, FAST, adapter=True), after=99)
    evaluate(resumed, TASKS, FAST, tmp_path, "y", progress=False, chunk_size=3)
    assert resumed.calls == 2  # the same adapter: its finished piece is kept


def test_a_damaged_piece_is_redone_not_fatal(tmp_path, capsys):
    stop_after_one_piece(ScriptedAgent("ground_truth"), CFG, tmp_path, "gt")
    (piece,) = (tmp_path / "gt.partial").glob("*.jsonl.gz")
    piece.write_bytes(piece.read_bytes()[:25])
    again = Interrupting(ScriptedAgent("ground_truth"), after=99)
    result = evaluate(again, TASKS, CFG, tmp_path, "gt", progress=False, chunk_size=3)
    assert again.calls == 3 and result["success"]["mean"] == 1.0 and result["n_tasks"] == 8
    assert f"{piece}: ends early (truncated): redoing it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "ids, message", [([], "expected a JSON list of one or more task ids"), (["nope"], "no such BFCL V3 task")]
)
def test_eval_ids_name_what_is_wrong(tmp_path, ids, message):
    from seal_mini.config import ConfigError
    from seal_mini.programs.eval import main
    from seal_mini.runio import write_json

    write_json(tmp_path / "ids.json", ids)
    with pytest.raises(ConfigError, match=message):
        main([f"out_dir={tmp_path}", "--scripted", "ground_truth", "--ids", str(tmp_path / "ids.json")])


def test_eval_takes_practice_ids(tmp_path):
    from seal_mini.config import CATEGORIES
    from seal_mini.envs import practice
    from seal_mini.programs.eval import main
    from seal_mini.runio import write_json

    write_json(tmp_path / "ids.json", [practice.task_id(0, "heldin", c, 0) for c in CATEGORIES])
    assert main([f"out_dir={tmp_path}", "--scripted", "ground_truth", "--ids", str(tmp_path / "ids.json")]) == 0
    result = read_json(tmp_path / "run" / "eval" / "ground_truth.json")
    assert result["n_tasks"] == 4 and result["success"]["mean"] == 1.0


def test_eval_results_are_what_the_report_and_the_model_card_read(tmp_path):
    """train -> eval -> report by hand: the report and the model card show the held-in rows eval wrote."""
    from seal_mini.engine.policy import save_adapter
    from seal_mini.programs.eval import main as eval_main
    from seal_mini.programs.export import model_card
    from seal_mini.programs.pipeline import report_command as report_main
    from seal_mini.runio import write_json, write_yaml

    overrides = ["model.name=tiny-random", "device=cpu", "rollout.max_new_tokens=8", f"out_dir={tmp_path}", "name=r"]
    cfg = load_config(overrides=overrides)
    save_adapter(load_policy(cfg), cfg.run_dir / "adapter")
    write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())
    write_json(tmp_path / "ids.json", [TASKS[0].id])
    adapter = str(cfg.run_dir / "adapter")
    assert eval_main([*overrides, "--adapter", adapter, "--ids", str(tmp_path / "ids.json")]) == 0
    assert report_main([str(cfg.run_dir)]) == 0
    text = (cfg.run_dir / "report" / "report.md").read_text()
    assert "| backbone (tiny-random) |" in text and "| + SEAL (r) |" in text
    card = model_card(cfg.run_dir, cfg, "tiny-random")
    assert "| backbone | 0.00 |" in card and "| trained adapter | 0.00 |" in card


class Prolix(ModelAgent):
    """The model made to write each turn's ground-truth calls after `prose` tokens of text, then "Done."."""

    prose = 520

    def run(self, envs, progress=None):
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from test_rollout import Script, message

        from seal_mini.engine.rollout import run_rollouts
        from seal_mini.envs.scripted import ground_truth_turns, scripted_messages

        words = self.policy.renderer.encode("lorem ipsum " * self.prose)[: self.prose]
        scripts = {
            k: [
                (words if "<tool_call>" in text else []) + message(self.policy, text)
                for turn in ground_truth_turns(env.task)
                for text in scripted_messages(turn)
            ]
            for k, env in enumerate(envs)
        }
        trajs = run_rollouts(self.policy, envs, self.cfg.rollout, 0.0, logits_hook=Script(scripts))
        return [{"messages": t.messages, "truncated": t.truncated, "n_cut": t.n_cut, "n_sampled": 0} for t in trajs]


def test_held_in_evaluation_plays_at_the_papers_limits_and_counts_what_a_limit_cut(tmp_path):
    """Messages of 520 tokens of prose before their calls: training's 512-token message cut them (the
    episodes scored 0 and nothing said so); the paper's limits play them to the end."""
    tasks = [t for t in TASKS if t.category == "base"][:1]
    cut_short = load_config(overrides=["model.name=tiny-random", "device=cpu", "eval.limits=rollout"])
    paper = load_config(overrides=["model.name=tiny-random", "device=cpu"])
    assert cut_short.rollout.max_new_tokens == paper.rollout.max_new_tokens == 512 and paper.eval.limits == "paper"
    policy = load_policy(paper)
    before = evaluate(Prolix(policy, cut_short), tasks, cut_short, tmp_path, "before", progress=False)
    after = evaluate(Prolix(policy, paper), tasks, paper, tmp_path, "after", progress=False)
    assert before["cut"]["base"] == 1 and before["success"]["base"] == 0.0
    assert after["cut"]["base"] == 0 and after["success"]["base"] == 1.0
    assert after["limits"] == {
        "max_prompt_tokens": 8192,
        "max_new_tokens": 4096,
        "max_response_tokens": 4096,
        "max_total_tokens": 16384,
    }
    assert "seed 0" in after["split"]
