"""What a training run writes and shows: the run directory (RunWriter), the metrics row of a step, the
trajectory rows, the samples printed each step, and the live views (TensorBoard, Weights & Biases).

Rank 0 alone writes the run directory; RunWriter's methods do nothing on the other ranks, so the loop
calls them on every rank without asking which one it is. metrics.jsonl is always written
(seal_mini.runio) and is what the report reads. The recipe's `log.backends` may add:
  tensorboard  event files under <run_dir>/tensorboard, offline: every numeric metric of a step as a
               scalar (the label counts `labels/*` among them), the active cues and a few sample
               trajectories as text. `tensorboard --logdir runs/` shows every run side by side.
  wandb        the same scalars, cues and samples sent to Weights & Biases; only where the package is
               installed and configured (WANDB_API_KEY, or WANDB_MODE=offline). Never required.
Both packages are optional extras (requirements-log.txt), imported only when a recipe names them.

A resumed run re-runs the steps after its checkpoint. TensorBoard's folder is then rebuilt from the run's
files (metrics.jsonl and trajectories/ up to the checkpoint), so every step appears once whatever the
interrupted attempt had written. W&B resumes the same run id; its steps only move forward, so a redone
step keeps the values the first attempt sent, which are the same numbers (resume is exact).
"""

from __future__ import annotations

import html
import importlib.util
import os
import shutil
from pathlib import Path

from seal_mini.config import Config, ConfigError, save_config
from seal_mini.core.diagnose import DIAGNOSIS_RAISED
from seal_mini.core.interface import active_cues
from seal_mini.distributed import is_main
from seal_mini.engine.policy import save_adapter
from seal_mini.envs.verifier import CHECKER_RAISED
from seal_mini.runio import FileError, new_dir, read_json, read_jsonl_gz, write_json, write_jsonl_gz, write_metrics
from seal_mini.training import checkpoint


class RunWriter:
    """Everything training writes into its run directory (rank 0 alone: on the other ranks every method does nothing)."""

    def __init__(self, cfg: Config, split: dict, history: list[dict]):
        """`history`: the metrics rows of the steps already done (a resumed run's rows before its checkpoint).
        Called once the checkpoint has loaded, so a resume that fails changes nothing in the run."""
        self.cfg, self.run_dir, self.active = cfg, cfg.run_dir, is_main()
        self.rows = list(history)
        """metrics.jsonl's rows: one per finished step."""
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.run_dir, cfg)
        write_json(self.run_dir / "split.json", split)
        self.tracker = Tracker(cfg, self.run_dir, history=self.rows)

    def round(self, step: int, rows: list[dict], record: dict) -> None:
        """A round's trajectory rows and its record (the interface it used, C_t, rho); prints its samples."""
        if self.active:
            write_jsonl_gz(self.run_dir / "trajectories" / f"step_{step:04d}.jsonl.gz", rows)
            write_json(self.run_dir / "rounds" / f"step_{step:04d}.json", record)
            print_samples(rows, self.cfg.train.print_samples, step)

    def step_done(self, row: dict, rows: list[dict], state, policy, optimizer, scheduler) -> None:
        """A finished step: its metrics row (with any evaluation) to metrics.jsonl and the live views, and a
        checkpoint when one is due (train.save_every, and always after the last step)."""
        self.rows.append(row)
        if not self.active:
            return
        write_metrics(self.run_dir, self.rows)
        self.tracker.log(row, rows)
        if state.step % self.cfg.train.save_every == 0 or state.step == self.cfg.train.steps:
            checkpoint.save_checkpoint(self.run_dir, policy, optimizer, scheduler, state)

    def finish(self, policy) -> None:
        """The trained adapter as <run_dir>/adapter (refused if it holds a NaN or an inf)."""
        if self.active:
            self.tracker.close()
            checkpoint.check_finite_weights(policy, f"{self.run_dir / 'adapter'}")
            with new_dir(self.run_dir / "adapter") as tmp:
                save_adapter(policy, tmp)


def metrics_row(
    step: int, episodes: list[dict], profile: dict, interface_used: dict, seconds: dict[str, float], *parts: dict
) -> dict:
    """One line of metrics.jsonl: the round's episodes summed up, the metric dicts of the loop's math
    (`parts`: advantages, weights, loss, rho), the label counts of C_t, the cues the round trained with and
    the time each phase took."""
    n = len(episodes)
    row = {
        "step": step,
        "charts/reward": sum(e["reward"] for e in episodes) / n,
        "charts/truncated_frac": sum(e["truncated"] for e in episodes) / n,
        # episodes whose check or diagnosis raised (a back end's bug): failed, or labelled not_reached
        "charts/checker_raised": sum(e["error_type"] == CHECKER_RAISED for e in episodes),
        "charts/diagnosis_raised": sum(any(r.startswith(DIAGNOSIS_RAISED) for r in e["reasons"]) for e in episodes),
        "charts/sampled_tokens_mean": sum(e["n_sampled"] for e in episodes) / n,
        "charts/episode_tokens_mean": sum(e["n_tokens"] for e in episodes) / n,
        # -mean log p of the sampled tokens: a Monte Carlo estimate of the sampling policy's entropy
        "policy/entropy_estimate": sum(e["surprisal"] for e in episodes)
        / max(sum(e["n_sampled"] for e in episodes), 1),
    }
    for part in parts:
        row.update(part)
    row.update({f"labels/{z}": p["count"] for z, p in profile.items()})
    row["interface/cues"] = active_cues(interface_used)
    row.update({f"time/{k}": round(v, 2) for k, v in seconds.items()})
    return row


def trajectory_rows(step: int, group_size: int, episodes: list[dict], weights, advantages) -> list[dict]:
    """One row per trajectory of a round (the schema of trajectories/*.jsonl.gz; see seal_mini.programs.dataset)."""
    return [
        {
            "task_id": e["task_id"],
            "category": e["category"],
            "step": step,
            "sample": i % group_size,
            "reward": e["reward"],
            "error_type": e["error_type"],
            "labels": e["labels"],
            "reasons": e["reasons"],
            "weight": float(w),
            "advantage": float(a),
            "truncated": e["truncated"],
            "n_sampled": e["n_sampled"],
            "n_tokens": e["n_tokens"],
            "messages": e["messages"],
        }
        for i, (e, w, a) in enumerate(zip(episodes, weights, advantages, strict=True))
    ]


def print_samples(rows: list[dict], n: int, step: int) -> None:
    """Show what the model does: the first success and the first failure of the round."""
    picks = [r for r in rows if r["reward"] > 0][:1] + [r for r in rows if r["reward"] == 0][:1]
    for row in picks[:n]:
        print(f"\n--- step {step} sample: {row['task_id']} reward={row['reward']} labels={row['labels']}")
        for m in row["messages"]:
            # the model's own words in full, the long prompt parts short
            shown = 2000 if m["role"] == "assistant" else 160 if m["role"] == "system" else 300
            text = str(m.get("content", ""))
            print(f"[{m['role']}] {text[:shown]}{f' ... ({len(text)} chars)' if len(text) > shown else ''}")


# --- live views ---------------------------------------------------------------------------------------

INSTALL = {
    "tensorboard": "pip install -r requirements-log.txt (bash run.sh installs it when a recipe names tensorboard)",
    "wandb": "pip install wandb (the kit does not install it: W&B needs an account and the network)",
}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_backends(cfg: Config) -> None:
    """Fail before training, with the fix, if a named backend cannot run here."""
    for backend in cfg.log.backends:  # each optional backend is the package of its name (jsonl needs none)
        if backend in INSTALL and not installed(backend):
            raise ConfigError(
                f"log.backends: {backend} is not installed; {INSTALL[backend]}, or remove it from log.backends"
            )
    if "wandb" in cfg.log.backends and not (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE")):
        raise ConfigError(
            "log.backends: wandb is named but not configured; set WANDB_API_KEY (or WANDB_MODE=offline to keep "
            "the logs local), or remove wandb from log.backends"
        )


def numeric(row: dict) -> dict[str, float]:
    """The metrics of a row that are plain numbers (bools and lists, such as the cue names, are not)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def sample_text(rows: list[dict], n: int, chars: int = 2000) -> str:
    """The first success and the first failure of a round as markdown, for the text panes."""
    picks = [r for r in rows if r["reward"] > 0][:1] + [r for r in rows if r["reward"] == 0][:1]
    blocks = []
    for row in picks[:n]:
        lines = [f"**{row['task_id']}** reward {row['reward']}, labels {row['labels']}", ""]
        for m in row["messages"]:
            if m["role"] == "system":
                continue  # the tool schemas: thousands of characters, the same every step
            text = str(m.get("content", ""))
            lines.append(f"    [{m['role']}] {text[:chars]}".replace("\n", "\n    "))
        blocks.append("\n".join(lines))
    return "\n\n---\n\n".join(blocks)


class Tracker:
    """Sends each finished step to the live backends the recipe names (jsonl is written elsewhere)."""

    def __init__(self, cfg: Config, run_dir: Path, history: list[dict]):
        check_backends(cfg)
        self.samples = cfg.train.print_samples
        self.tensorboard = self.wandb = None
        if "tensorboard" in cfg.log.backends:
            from torch.utils.tensorboard import SummaryWriter

            folder = run_dir / "tensorboard"
            shutil.rmtree(folder, ignore_errors=True)  # rebuilt from the run's files: each step once
            self.tensorboard = SummaryWriter(str(folder))
            for row in history:
                path = run_dir / "trajectories" / f"step_{row['step']:04d}.jsonl.gz"
                self._to_tensorboard(row, read_jsonl_gz(path) if path.exists() else [])
        if "wandb" in cfg.log.backends:
            import wandb

            self.wandb_module = wandb
            self.wandb = wandb.init(
                project=cfg.log.wandb_project,
                name=cfg.name,
                id=_wandb_id(run_dir),
                resume="allow",
                dir=str(run_dir),
                config=cfg.to_dict(),
            )

    def log(self, row: dict, trajectories: list[dict]) -> None:
        """One training step: its metrics row (as in metrics.jsonl) and its trajectory rows."""
        if self.tensorboard is not None:
            self._to_tensorboard(row, trajectories)
        if self.wandb is not None:
            scalars, cues, samples = self._content(row, trajectories)
            text = {
                "interface/cues": self.wandb_module.Html(f"<pre>{html.escape(cues)}</pre>"),
                "samples": self.wandb_module.Html(f"<pre>{html.escape(samples)}</pre>"),
            }
            self.wandb.log({**scalars, **text}, step=row["step"])

    def _content(self, row: dict, trajectories: list[dict]) -> tuple[dict[str, float], str, str]:
        """(scalars, active cues, sample text) of one step."""
        scalars = {k: v for k, v in numeric(row).items() if k != "step"}
        cues = ", ".join(row.get("interface/cues", [])) or "(none)"
        return scalars, cues, sample_text(trajectories, self.samples)

    def _to_tensorboard(self, row: dict, trajectories: list[dict]) -> None:
        scalars, cues, samples = self._content(row, trajectories)
        for key, value in scalars.items():
            self.tensorboard.add_scalar(key, value, row["step"])
        self.tensorboard.add_text("interface/cues", cues, row["step"])
        if samples:
            self.tensorboard.add_text("samples", samples, row["step"])
        self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_id(run_dir: Path) -> str:
    """A W&B run id kept in the run directory, so a resumed run continues the same W&B run."""
    path = run_dir / "wandb_id.json"
    if path.exists():
        saved = read_json(path, "delete it to start a new W&B run for this training run")
        if isinstance(saved, dict) and isinstance(saved.get("id"), str):
            return saved["id"]
        raise FileError(f"{path}: holds no W&B run id; delete it to start a new W&B run for this training run")
    run_id = os.urandom(6).hex()
    write_json(path, {"id": run_id})
    return run_id
