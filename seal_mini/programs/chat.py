"""`python -m seal_mini chat RUN_DIR [key.sub=value ...]`: play one task with the trained agent, on the bare benchmark.

    python -m seal_mini chat runs/qwen2_5_3b_seal                      # the run's first held-in task
    python -m seal_mini chat runs/qwen2_5_3b_seal --task multi_turn_base_12
    python -m seal_mini chat runs/qwen2_5_3b_seal --backbone            # the same model, adapter off
    python -m seal_mini chat runs/qwen2_5_3b_seal --replay              # no typing: the task's own turns
    python -m seal_mini chat runs/cpu_learn --task multi_turn_base_12 \
        rollout.max_prompt_tokens=8192 rollout.max_total_tokens=16384   # a BFCL task on a practice run

Any task plays: the run's own (BFCL V3 or practice), or any other by id. Overrides change the run's saved
config for this chat only, e.g. the length limits (rollout.max_prompt_tokens, rollout.max_new_tokens,
rollout.max_response_tokens, rollout.max_total_tokens): the run's own limits apply unless raised, and when
one cuts a prompt or a message, a `[cut]` line names it and the override that raises it.

At each user turn you see the task's own text; press Enter to send it, or type something else. The agent's
messages, every tool call and what the back end answered are printed as they happen, and at the end the
official checker's verdict and the diagnoser's label for each turn. The verdict always compares with the
task's ground truth, so it only means something when you sent the task's turns (it says so otherwise).
This is the evaluation setting: the real back ends, no training-time interface, greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from seal_mini.config import ConfigError, RolloutConfig
from seal_mini.core.diagnose import diagnose
from seal_mini.envs.episode import Episode, StepResult
from seal_mini.envs.harness import PROTOCOLS
from seal_mini.envs.scripted import POLICIES, play
from seal_mini.envs.splits import tasks_for
from seal_mini.envs.verifier import check_episode

Ask = Callable[[int, str], str]
"""(turn index, the task's own user text) -> the text to send."""


def replay(turn: int, text: str) -> str:
    """Send the task's own turn (the non-interactive player)."""
    return text


def typed(turn: int, text: str) -> str:
    """Ask on the terminal; Enter sends the task's own text."""
    print(f"\n[task's turn {turn}] {text}")
    answer = input("user (Enter = send the task's turn)> ").strip()
    return answer or text


class Console:
    """An Episode shown on the terminal as it runs, with the user's turns coming from `ask`.

    A wrapper in the Gymnasium sense: it overrides reset and step only, and reads everything else
    through (the rollout engine, the verifier and the diagnoser see the Episode's own records)."""

    def __init__(self, episode: Episode, ask: Ask, out: Callable[[str], None] = print):
        self.env, self.ask, self.out = episode, ask, out
        self.changed_turns: list[int] = []
        """User turns where the text sent was not the task's own."""

    def reset(self) -> tuple[list[dict], list[dict]]:
        messages, tools = self.env.reset()
        self.out(
            f"[task] {self.env.task.id}: {len(tools)} tools offered ({', '.join(t.get('function', t)['name'] for t in tools)})"
        )
        return self._user_turn(messages), tools

    def step(self, text: str) -> StepResult:
        self.out(f"\n[assistant] {text}")
        result = self.env.step(text)
        tool = [m for m in result.observation if m["role"] == "tool"]  # one per executed call, in call order
        calls = [e for e in result.events if e.call is not None]
        for event, message in zip(calls, tool, strict=False):
            self.out(f"  [call] {event.call}")
            self.out(f"  [{'error' if event.error_kind else 'result'}] {message['content'][:2000]}")
        for event in result.events:
            if event.call is None:  # a <tool_call> block BFCL's decoder could not read: never run
                self.out(f"  [not read] {event.error}")
        rest = [m for m in result.observation if m["role"] != "tool"]  # the next user turn, if one began
        if rest:
            result = StepResult(tool + self._user_turn(rest), result.turn_done, result.done, result.events)
        if result.done:
            self.out(f"\n[episode ended: {self.env.ended_by}]")
        return result

    def truncate(self) -> None:
        self.env.truncate()
        self.out("\n[episode ended: truncated by a length limit, see [cut] below]")

    def _user_turn(self, messages: list[dict]) -> list[dict]:
        """The opening messages of a user turn, with the user's text as `ask` decides it."""
        index = len(self.env.turns) - 1
        out = []
        for m in messages:
            m = dict(m)
            if m["role"] == "user" and index in self.env.task.held_out:
                self.out(f"\n[user] (tools revealed: {', '.join(d['name'] for d in self.env.task.held_out[index])})")
            elif m["role"] == "user":
                sent = self.ask(index, m["content"])
                if sent != m["content"]:
                    self.changed_turns.append(index)
                m["content"] = sent
                self.out(f"\n[user] {sent}")
            out.append(m)
        return out

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def verdict_lines(console: Console) -> list[str]:
    """The checker's verdict and the per-turn labels, as printed at the end of a chat."""
    verdict = check_episode(console.env)
    labels = diagnose(console.env, verdict)
    lines = [
        f"[verdict] reward {verdict.reward:.0f}"
        + (f" ({verdict.error_type} at turn {verdict.failed_turn})" if verdict.reward == 0 else " (passed)"),
        "[labels] " + ", ".join(f"turn {i}: {z}" for i, z in enumerate(labels)),
    ]
    if console.changed_turns:
        lines.append(
            f"[note] turns {console.changed_turns} were typed, not the task's own; the verdict still compares "
            "with the task's ground truth"
        )
    return lines


def cut_lines(trajectory, limits: RolloutConfig, prompt_tokens: int) -> list[str]:
    """What the rollout's length limits cut in a played episode (seal_mini.engine.sequences applies them),
    each naming the limit and the override that raises it; `prompt_tokens` is the first prompt's length."""
    r, lines = limits, []
    if trajectory.truncated and not trajectory.input_ids:  # the prompt alone was over a limit: no model call
        limit = f"rollout.max_prompt_tokens={r.max_prompt_tokens}"
        if prompt_tokens <= r.max_prompt_tokens:
            limit = f"the room rollout.max_total_tokens={r.max_total_tokens} leaves"
        room = 1 << prompt_tokens.bit_length()  # the first power of two above the prompt
        lines.append(
            f"[cut] the first prompt is {prompt_tokens} tokens, over {limit}: the model never ran. Raise it, e.g. "
            f"rollout.max_prompt_tokens={room} rollout.max_total_tokens={max(r.max_total_tokens, 2 * room)}"
        )
    elif trajectory.truncated and trajectory.n_sampled >= r.max_response_tokens:
        lines.append(
            f"[cut] the model wrote rollout.max_response_tokens={r.max_response_tokens} tokens in this episode and "
            f"it ended there. Raise it, e.g. rollout.max_response_tokens={2 * r.max_response_tokens} "
            f"rollout.max_total_tokens={r.max_total_tokens + r.max_response_tokens}"
        )
    elif trajectory.truncated:
        lines.append(
            f"[cut] the episode reached rollout.max_total_tokens={r.max_total_tokens} (prompt, messages and tool "
            f"results: {len(trajectory.input_ids) - trajectory.base} tokens) and ended there. Raise it, e.g. "
            f"rollout.max_total_tokens={2 * r.max_total_tokens}"
        )
    if trajectory.n_cut:
        lines.append(
            f"[cut] {trajectory.n_cut} of {trajectory.n_messages} assistant messages reached rollout.max_new_tokens="
            f"{r.max_new_tokens} and went to the environment unfinished. Raise it, e.g. "
            f"rollout.max_new_tokens={2 * r.max_new_tokens}"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m seal_mini chat", description="play one task with an agent")
    parser.add_argument("run_dir", help="runs/<name>, a finished training run")
    parser.add_argument(
        "overrides", nargs="*", help="key.sub=value on the run's config, e.g. rollout.max_new_tokens=256"
    )
    parser.add_argument("--task", help="a task id, the run's own or BFCL V3 (default: the run's first held-in task)")
    parser.add_argument("--backbone", action="store_true", help="the backbone alone (adapter off)")
    parser.add_argument("--replay", action="store_true", help="send the task's own turns without asking")
    parser.add_argument("--scripted", help="a scripted policy instead of the model: ground_truth | empty | ...")
    args = parser.parse_intermixed_args(argv)  # options may come before or after the overrides

    from seal_mini.programs.export import first_held_in, run_config, trained_adapter

    run_dir = Path(args.run_dir)
    cfg = run_config(run_dir, args.overrides)
    task_id = args.task or first_held_in(run_dir, cfg)
    (task,) = tasks_for([task_id], f"--task {task_id}", cfg)
    ask = replay if args.replay or not sys.stdin.isatty() else typed
    console = Console(Episode(task, protocol=PROTOCOLS[cfg.model.protocol]), ask)  # the benchmark's own limits

    if args.scripted:
        if args.scripted not in POLICIES:
            raise ConfigError(f"--scripted {args.scripted}: choose from {sorted(POLICIES)}")
        play(console, POLICIES[args.scripted](console.task))
    else:
        from seal_mini.engine.policy import load_policy
        from seal_mini.engine.rollout import run_rollouts

        cfg.lora.adapter_path = str(trained_adapter(run_dir))
        policy = load_policy(cfg)
        with policy.backbone() if args.backbone else nullcontext():
            (played,) = run_rollouts(policy, [console], cfg.rollout, cfg.eval.temperature, cfg.seed)
        prompt_tokens = played.prompt_len or len(policy.renderer.prompt_ids(played.messages, played.tools))
        for line in cut_lines(played, cfg.rollout, prompt_tokens):
            print(line)
    for line in verdict_lines(console):
        print(line)
    return 0
