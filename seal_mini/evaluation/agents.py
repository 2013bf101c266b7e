"""Who plays an evaluation: a model policy (ModelAgent) or a scripted one (ScriptedAgent), the identity
of a piece of evaluation work, how the pieces are played and saved (play_in_pieces) and how the result is
written (save_result). Held-in BFCL V3 and every suite run their episodes through these.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from seal_mini import __version__
from seal_mini.config import Config, ConfigError
from seal_mini.distributed import is_main, split_work, world_size
from seal_mini.envs.scripted import POLICIES, play
from seal_mini.runio import write_json, write_jsonl_gz


class ModelAgent:
    """A model policy: batched rollouts with the adapter on, or off (the backbone row).

    Agents share one method, run(envs, progress=None) -> one record per env; `progress` (a tqdm bar)
    advances once per finished episode."""

    def __init__(self, policy, cfg: Config, adapter: bool = True, temperature: float | None = None):
        self.policy, self.cfg, self.adapter = policy, cfg, adapter
        self.temperature = cfg.eval.temperature if temperature is None else temperature
        self.name = f"{cfg.model.name}{' + adapter' if adapter else ''}"
        self._adapter_hash = None

    def with_config(self, cfg: Config) -> ModelAgent:
        """The same agent (adapter, temperature, kind) playing under another config's limits."""
        agent = copy.copy(self)
        agent.cfg = cfg
        return agent

    @property
    def adapter_hash(self) -> str | None:
        """sha256 of the adapter weights this agent runs with (None for the backbone): two evaluations
        of differently trained adapters never share pieces, whatever their source says."""
        if self.adapter and self._adapter_hash is None:
            digest = hashlib.sha256()
            active = getattr(self.policy.model, "active_adapter", "default")  # not a frozen reference copy
            for name, lora in sorted(getattr(self.policy.model, "peft_config", {}).items()):
                if name == active:
                    digest.update(f"{name}: r={lora.r} alpha={lora.lora_alpha}".encode())  # the scale of the weights
            for name, p in sorted(self.policy.model.named_parameters()):
                if "lora_" in name and f".{active}." in name:
                    digest.update(name.encode())
                    digest.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            self._adapter_hash = digest.hexdigest()
        return self._adapter_hash

    def run(self, envs: list, progress=None) -> list[dict]:
        from seal_mini.engine.rollout import run_rollouts

        with nullcontext() if self.adapter else self.policy.backbone():
            trajs = run_rollouts(self.policy, envs, self.cfg.rollout, self.temperature, self.cfg.seed, progress)
        return [
            {"messages": t.messages, "truncated": t.truncated, "n_cut": t.n_cut, "n_sampled": t.n_sampled}
            for t in trajs
        ]


def sending(policy: Callable) -> Callable[[object], list[dict]]:
    """play(env) -> the conversation, for a policy(env, send) that writes one assistant message at a time:
    send(text) steps the env and returns the step's result."""

    def play_(env) -> list[dict]:
        messages, _ = env.reset()

        def send(text: str):
            # one assistant message, recorded as the model engine records a conversation
            messages.append({"role": "assistant", "content": text})
            result = env.step(text)
            messages.extend(result.observation)
            return result

        policy(env, send)
        return messages

    return play_


SCRIPTED = {name: lambda env, turns=turns: play(env, turns(env.task)) for name, turns in sorted(POLICIES.items())}
"""Held-in BFCL V3's scripted policies (seal_mini.envs.scripted.POLICIES), each play(env) -> conversation."""


class ScriptedAgent:
    """A scripted policy from a table of play(env) -> conversation: held-in BFCL V3's (SCRIPTED: ground_truth,
    empty, drop_last_call) or a suite's (each suite module has its SCRIPTED)."""

    def __init__(self, mode: str, plays: dict[str, Callable] = SCRIPTED, known: str = "choose from"):
        if mode not in plays:  # `known` words the refusal: "--scripted x: choose from [...]"
            raise ConfigError(f"--scripted {mode}: {known} {list(plays)}")
        self.mode, self.name, self.play = mode, f"scripted:{mode}", plays[mode]

    def run(self, envs: list, progress=None) -> list[dict]:
        records = []
        for env in envs:
            records.append({"messages": self.play(env), "truncated": False, "n_sampled": 0})
            if progress is not None:
                progress.update(1)
        return records


def eval_identity(agent, cfg: Config, source: str, task_ids: list[str] | None, **extra) -> dict:
    """What produced a piece of evaluation work: policy, adapter, source, tasks, generation settings, token
    limits, kit version (and what a suite adds). A piece is reused only by an evaluation with the same."""
    r = cfg.rollout
    return {
        "policy": agent.name,
        # everything that shapes the model's forward pass (gradient checkpointing only acts in the update)
        "model": {k: v for k, v in cfg.to_dict()["model"].items() if k != "gradient_checkpointing"},
        "adapter": getattr(agent, "adapter_hash", None),
        "source": source,
        "task_ids": task_ids,
        "generation": {
            "temperature": getattr(agent, "temperature", None),
            "top_p": r.top_p,
            "max_new_tokens": r.max_new_tokens,
            "seed": cfg.seed,
        },
        "limits": {k: getattr(r, k) for k in ("max_prompt_tokens", "max_response_tokens", "max_total_tokens")},
        "kit": __version__,
        **extra,
    }


def play_in_pieces(todo: list, chunk: int, play: Callable, done: list, piece_path, desc: str, progress: bool) -> list:
    """Play `todo` a piece at a time, each rank its share (split_work); rank 0 saves every finished piece at
    piece_path(rows done before it), so a stopped evaluation resumes after its last piece. Returns `done`
    with the new rows appended, in order. play(share, bar) plays a share, one row per item; `bar` (tqdm,
    shown on rank 0 when `progress`) starts at the rows already done and moves as episodes finish."""
    from tqdm import tqdm  # looked up at each call: a test stands its own bar in for tqdm's

    piece = chunk * world_size()  # under torchrun each rank plays `chunk` items of a piece at once
    bar = tqdm(total=len(done) + len(todo), initial=len(done), desc=desc, disable=not progress or not is_main())
    for start in range(0, len(todo), piece):
        rows = split_work(todo[start : start + piece], lambda share: play(share, bar))
        if is_main():
            write_jsonl_gz(Path(piece_path(len(done))), rows)
        done += rows
        if bar.n < len(done):  # the other ranks' share of the piece
            bar.update(len(done) - bar.n)
    bar.close()
    return done


def save_result(out_dir: Path, tag: str, rows: list[dict], result: dict) -> dict:
    """Rank 0 writes <tag>.json and <tag>.trajectories.jsonl.gz, then drops the finished pieces; returns `result`."""
    if is_main():
        write_jsonl_gz(out_dir / f"{tag}.trajectories.jsonl.gz", rows)
        write_json(out_dir / f"{tag}.json", result)
        shutil.rmtree(out_dir / f"{tag}.partial")
    return result
