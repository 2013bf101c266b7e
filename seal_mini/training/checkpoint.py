"""Checkpoints of a training run, and how a run starts or continues from them.

A checkpoint (checkpoint/step_NNNN) holds the adapter, the optimizer and scheduler, the RNG states and the
loop state; it is written whole under a temporary name and only then renamed, so a run stopped at any
moment continues from its newest complete checkpoint exactly as if it had never stopped. The loop calls
three things: open_run (before the model loads: what to continue from, or refuse), restore (after: the
loop state and the metrics of the steps already done) and save_checkpoint.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seal_mini.config import RESUME_MAY_CHANGE, Config, ConfigError, changed_settings, saved_config
from seal_mini.core.interface import InterfaceState, initial_state
from seal_mini.distributed import is_main
from seal_mini.engine.policy import save_adapter
from seal_mini.runio import (
    FileError,
    move_aside,
    new_dir,
    read_json,
    read_metrics,
    read_safetensors,
    read_torch,
    write_json,
    write_torch,
)


@dataclass
class LoopState:
    """What the loop carries from one round to the next (saved in every checkpoint)."""

    step: int = 0
    """The next step to run."""
    interface: InterfaceState | None = None
    """Omega_t: the cues the next round trains with."""
    rho: dict[str, float] = field(default_factory=dict)
    """The utility table the last round weighed with (moves only with diagnosis.rho_update: ema)."""
    profile: dict = field(default_factory=dict)
    """C_t of the last finished round (what Omega_t and rho were last evolved from)."""


CHECKPOINT_PARTS = (
    "adapter/adapter_model.safetensors",
    "adapter/adapter_config.json",
    "optim.pt",
    "rng.pt",
    "state.json",
)
DIGESTS = "digests.json"
"""{part: sha256} of a checkpoint's parts, written last: resume trusts a part only if it still has its digest
(a checkpoint written before digests existed is trusted as its files are)."""
KEEP_CHECKPOINTS = 2
"""The newest checkpoint, and the one before it as a spare until the next one is on disk."""


def checkpoints(run_dir: Path) -> list[Path]:
    """The saved checkpoints, checkpoint/step_NNNN, newest first (a half-written one has a temporary name)."""
    folder = Path(run_dir) / "checkpoint"
    found = [p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors that hold a NaN or an inf."""
    return [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]


def check_finite_weights(policy, what: str) -> None:
    """Refuse to save weights that hold a NaN or an inf: a run must never continue from them."""
    bad = nonfinite_tensors({n: p.detach() for n, p in policy.model.named_parameters() if p.requires_grad})
    if bad:
        raise ConfigError(
            f"{what}: not saved, {len(bad)} trained tensors hold NaN or inf (first: {bad[0]}); the checkpoints "
            "already on disk are kept. The run diverged: start it again (--restart) with a lower train.lr or "
            "train.max_grad_norm"
        )


LOOP_VERSION = 3
"""What a checkpoint's loop is. A change that would make a resumed run differ from the one that wrote the
checkpoint (which tasks a step draws, which rho weighs a round, what the prompts say) raises it, and a
checkpoint of another version is refused rather than continued as a different run. 2: whole epochs, rho_t
from the round's own profile, the interface's note after the template's default system text. 3: log-probs
of the rollouts' temperature (logits / T), calls on a turn that needs none labelled spurious_tool_call, an
unreadable message the interface let the model retry out of the loss."""


def save_checkpoint(run_dir: Path, policy, optimizer, scheduler, state: LoopState) -> None:
    """Adapter, optimizer, scheduler, RNG states and loop state as checkpoint/step_NNNN: written whole
    under a temporary name and made durable before it gets its name; only then does the oldest go.
    Weights that hold a NaN or an inf are refused (check_finite_weights)."""
    check_finite_weights(policy, f"checkpoint of step {state.step}")
    with new_dir(run_dir / "checkpoint" / f"step_{state.step:04d}") as tmp:
        save_adapter(policy, tmp / "adapter")
        write_torch({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        write_torch({"python": random.getstate(), "torch": torch.get_rng_state()}, tmp / "rng.pt")
        write_json(
            tmp / "state.json",
            {
                "loop": LOOP_VERSION,
                "step": state.step,
                "interface": state.interface.to_dict() if state.interface else None,
                "rho": state.rho,
                "profile": state.profile,
            },
        )
        write_json(tmp / DIGESTS, {part: file_digest(tmp / part) for part in CHECKPOINT_PARTS})
    for old in checkpoints(run_dir)[KEEP_CHECKPOINTS:]:
        shutil.rmtree(old)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_problem(checkpoint: Path, fix: str) -> str:
    """What is wrong with a checkpoint ("" if nothing): parts missing, or no longer what was written."""
    missing = [part for part in CHECKPOINT_PARTS if not (checkpoint / part).is_file()]
    if missing:
        return f"{checkpoint}: incomplete ({', '.join(missing)} missing); {fix}"
    if not (checkpoint / DIGESTS).is_file():
        return ""
    digests = read_json(checkpoint / DIGESTS, fix)
    if not isinstance(digests, dict):
        return f"{checkpoint / DIGESTS}: not a mapping of part -> digest; {fix}"
    changed = [part for part in CHECKPOINT_PARTS if digests.get(part) != file_digest(checkpoint / part)]
    if changed:
        named = ", ".join(str(checkpoint / part) for part in changed)
        return f"{named}: changed since written (not the digest in {DIGESTS}); {fix}"
    return ""


def checkpoint_fix(found: list[Path]) -> str:
    """What to do when the newest checkpoint cannot be loaded."""
    if len(found) > 1:
        newest, previous = found[0].name, found[1].name
        return f"restore the file, or rename {newest} (e.g. to {newest}.broken) to continue from {previous}"
    return "restore the file, or start the run again with --restart (moves its results aside)"


def load_checkpoint(path: Path, policy, optimizer, scheduler, fix: str = "restore the file") -> LoopState:
    from peft import set_peft_model_state_dict

    saved = read_json(path / "state.json", fix)
    if saved.get("loop", 1) != LOOP_VERSION:  # checkpoints before versions were written are version 1
        raise ConfigError(
            f"{path} was written by loop version {saved.get('loop', 1)} and this kit runs version {LOOP_VERSION} "
            "(see LOOP_VERSION in seal_mini/training/checkpoint.py): continued, it would not be the run it started as. "
            "Start it again with --restart (its results are moved aside), or finish it with the kit that began it"
        )
    weights = read_safetensors(path / "adapter" / "adapter_model.safetensors", fix)
    bad = nonfinite_tensors(weights)
    if bad:  # never continue from a diverged step (save_checkpoint refuses them; this file got them anyway)
        raise FileError(
            f"{path / 'adapter' / 'adapter_model.safetensors'}: {len(bad)} tensors hold NaN or inf "
            f"(first: {bad[0]}); {fix}"
        )
    set_peft_model_state_dict(policy.model, weights)
    optim = read_torch(path / "optim.pt", fix)
    optimizer.load_state_dict(optim["optimizer"])
    scheduler.load_state_dict(optim["scheduler"])
    rng = read_torch(path / "rng.pt", fix)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    interface = InterfaceState.from_dict(saved["interface"]) if saved["interface"] else None
    return LoopState(step=saved["step"], interface=interface, rho=saved["rho"], profile=saved["profile"])


# --- starting or continuing a run -------------------------------------------------------------------

ATTEMPT_OUTPUTS = ("metrics.jsonl", "rounds", "trajectories", "adapter", "report", "checkpoint")
"""What a training attempt writes into its run directory besides config.yaml, split.json and its held-in
evaluations (eval/step_NNNN*). eval/ also holds evaluations made by `eval` alone (the backbone measured
before training, say): those are not training's to clear or to count."""


def _step_of(path: Path) -> int | None:
    """N of a training output named step_NNNN[.json|.jsonl.gz|.partial|...], else None."""
    return int(path.name[5:9]) if path.name.startswith("step_") and path.name[5:9].isdigit() else None


def results_past_first_checkpoint(run_dir: Path, cfg: Config) -> list[str]:
    """What in run_dir only a run that got to its first checkpoint writes. An attempt stopped before it
    leaves outputs of its first steps alone; those are run again anyway, so they may be cleared."""
    tc = (saved_config(run_dir) if (run_dir / "config.yaml").exists() else cfg).train
    first = min(tc.save_every, tc.steps)  # LoopState.step of the first checkpoint: steps 0..first-1 precede it
    past = ["metrics.jsonl"] if any(r.get("step", first) >= first for r in read_metrics(run_dir)) else []
    for folder in ("rounds", "trajectories", "eval"):
        # held-in evaluations during training are tagged with the LoopState.step they follow, hence the +1
        last = first + (folder == "eval") - 1
        if any((_step_of(p) or 0) > last for p in (run_dir / folder).glob("step_*")):
            past.append(f"{folder}/")
    return past + ["adapter/"] * (run_dir / "adapter").exists()


def open_run(cfg: Config, resume: bool, restart: bool) -> Path | None:
    """The checkpoint a run continues from, or None to start at step 0. Refuses whatever would lose or
    mix work: a fresh start over a run, results without a checkpoint to continue them, other settings."""
    run_dir = cfg.run_dir
    if restart and (aside := move_aside(run_dir)) is not None:
        print(f"[train] --restart: what {run_dir} held is now in {aside}")
    found = checkpoints(run_dir)
    if found:
        problem = checkpoint_problem(found[0], checkpoint_fix(found))
        if problem:
            raise FileError(problem)
        if not resume:
            raise ConfigError(
                f"{run_dir} already holds a training run; continue it with `train --resume {run_dir}`, start it "
                "over with --restart (the old run is moved aside), or pick another name (name=...)"
            )
        free, other = changed_settings(saved_config(run_dir), cfg)
        if other:
            raise ConfigError(
                f"{run_dir} was made with other settings ({', '.join(other)}); a run that continues may change "
                f"only {', '.join(RESUME_MAY_CHANGE)}. Use the run's own settings, or give this run another name (name=...)"
            )
        for key, (old, new) in free.items():
            print(f"[train] {key}: {old} -> {new} ({RESUME_MAY_CHANGE[key]})")
        return found[0]
    past = results_past_first_checkpoint(run_dir, cfg)
    if past:
        raise FileError(
            f"{run_dir} holds results ({', '.join(past)}) but no checkpoint to continue them from "
            f"({run_dir / 'checkpoint'} is missing or empty); restore it, or start again with --restart "
            "(moves these results aside, deletes nothing)"
        )
    # an attempt stopped before its first checkpoint: its steps are run again
    leftovers = [run_dir / name for name in ATTEMPT_OUTPUTS] + list((run_dir / "eval").glob("step_*"))
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return None


def restore(checkpoint: Path | None, cfg: Config, policy, optimizer, scheduler) -> tuple[LoopState, list[dict]]:
    """The loop state a run starts from and the metrics rows of the steps already done: step 0 with the
    recipe's Omega_0 and rho, or the checkpoint's state (open_run chose it) loaded into policy, optimizer
    and scheduler, with the metrics rows of the steps before it."""
    if checkpoint is None:
        interface = initial_state(cfg.interface) if cfg.interface.enabled else None
        return LoopState(step=0, interface=interface, rho=dict(cfg.diagnosis.rho)), []
    state = load_checkpoint(checkpoint, policy, optimizer, scheduler, checkpoint_fix(checkpoints(cfg.run_dir)))
    # a label the kit gained after this checkpoint was written starts from its configured rho
    state.rho = {**cfg.diagnosis.rho, **state.rho}
    # steps after the checkpoint are run again, so their old metric lines go
    history = [r for r in read_metrics(cfg.run_dir) if r["step"] < state.step]
    lost = sorted(set(range(state.step)) - {r["step"] for r in history})
    if lost and is_main():
        print(f"[train] warning: metrics.jsonl has no row for steps {lost}; the report will lack them", file=sys.stderr)
    print(f"[train] {cfg.run_dir} has a checkpoint of step {state.step}: continuing that run")
    return state, history
