"""A markdown report with PNG plots, drawn from run directories' files alone (build_report; the command
is seal_mini/programs/pipeline.py).

Sections: the Table-1-style result (backbone -> trained, per category and average, with deltas), the
Table-2-style out-of-distribution result (BFCL V4 memory / web search, tau2 domains), the Table-3-style ablation table when several runs are given, held-in success over training steps,
the training curves of metrics.jsonl (reward with a moving average, KL, clip fraction, loss, gradient norm,
entropy, tokens per episode, time per step), the failure-label profile over steps, which interface cues were
active when, and the distribution of diagnostic weights. Every number comes from eval/*.json,
metrics.jsonl, rounds/*.json or trajectories/*.jsonl.gz; a section with no data says so.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from seal_mini.config import CATEGORIES, LABELS, ConfigError, check_config_file
from seal_mini.core.interface import active_cues
from seal_mini.evaluation.suites import SUITES
from seal_mini.runio import (
    atomic_write_bytes,
    atomic_write_text,
    load_yaml,
    missing_outputs,
    names,
    read_json,
    read_jsonl_gz,
    read_metrics,
    reading,
    run_lock,
    writer,
)

COLUMNS = [*CATEGORIES, "mean"]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def delta(after: float | None, before: float | None) -> str:
    if after is None or before is None:
        return "-"
    return f"{100 * (after - before):+.2f}"


REMOVE = "restore it, or delete it (the report then leaves it out)"
"""What to do about a damaged file the report reads; the run itself never reads these back."""


PAPER_TABLE1 = {
    "Qwen/Qwen2.5-3B-Instruct": (5.75, 9.25, 14.00),
    "Qwen/Qwen2.5-7B-Instruct": (14.00, 30.75, 40.25),
    "Team-ACE/ToolACE-2-Llama-3.1-8B": (32.00, 38.50, 46.75),
}
"""The paper's Table 1 (BFCL V3 multi-turn, mean of the four categories, %): backbone, vanilla RL, SEAL."""
PAPER_SPLIT = "recipes/splits/seal_release.json, which data.split_file names in the recipes that reproduce a row"


def check_run_dir(run_dir: Path) -> None:
    if not (run_dir / "config.yaml").exists() and not (run_dir / "eval").exists():
        raise ConfigError(f"report: {run_dir} is not a run directory (no config.yaml or eval/)")
    if (run_dir / "config.yaml").exists():
        check_config_file(run_dir / "config.yaml")  # a damaged one: the run is not what its files say


def load_run(run_dir: Path) -> dict:
    """Everything the report reads from one run directory."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    evals = {}
    for path in sorted((run_dir / "eval").glob("*.json")):
        evals[path.stem] = read_json(path, fix="restore it, or delete it and rerun the evaluation that wrote it")
    rounds = [read_json(p, fix=REMOVE) for p in sorted((run_dir / "rounds").glob("step_*.json"))]
    weights = []
    for path in sorted((run_dir / "trajectories").glob("step_*.jsonl.gz")):
        weights += [r["weight"] for r in read_jsonl_gz(path, fix=REMOVE)]
    missing = missing_outputs(run_dir)
    if missing:
        print(f"[report] warning: {run_dir} lacks {names(missing)}; the report leaves them out", file=sys.stderr)
    return {
        "name": run_dir.name,
        "dir": run_dir,
        "model": _model_name(run_dir),
        "metrics": read_metrics(run_dir),
        "evals": evals,
        "rounds": rounds,
        "weights": weights,
        "missing": missing,
        "writer": None if (held := writer(run_dir)) and held.get("pid") == os.getpid() else held,  # not our own
    }


def _model_name(run_dir: Path) -> str:
    """The backbone a run trained (its config.yaml), "" where it has none."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return ""
    text = check_config_file(path)
    with reading(path, REMOVE):
        settings = load_yaml(text)
    model = settings.get("model") if isinstance(settings, dict) else None
    return str(model.get("name", "")) if isinstance(model, dict) else ""


def caveats(runs: list[dict]) -> str:
    """What the report could not show: files a run's records name but that are gone, a run still training."""
    lines = []
    for run in runs:
        if run["missing"]:
            lines.append(f"- `{run['name']}` lacks {names(run['missing'])}; the sections below leave them out.")
        if run["writer"]:
            lines.append(
                f"- `{run['name']}` was being written by `{run['writer'].get('command')}` (since "
                f"{run['writer'].get('started')}): this report is a snapshot of it."
            )
    return "\n".join(lines) + "\n" if lines else ""


# --- tables -----------------------------------------------------------------------------------------


def table_main(run: dict) -> str:
    base, trained = run["evals"].get("base"), run["evals"].get("adapter")
    if not base and not trained:
        return "_No final evaluation in this run (eval/base.json, eval/adapter.json)._\n"
    head = "| policy | " + " | ".join(COLUMNS) + " |\n|---|" + "---|" * len(COLUMNS) + "\n"
    lines = []
    if base:
        lines.append(f"| backbone ({base['policy']}) | " + " | ".join(pct(base["success"].get(c)) for c in COLUMNS))
    if trained:
        lines.append(f"| + SEAL ({run['name']}) | " + " | ".join(pct(trained["success"].get(c)) for c in COLUMNS))
    if base and trained:
        lines.append(
            "| delta | " + " | ".join(delta(trained["success"].get(c), base["success"].get(c)) for c in COLUMNS)
        )
    model = run["model"]
    if model in PAPER_TABLE1:  # the paper's Table 1 row for this backbone: its mean only
        for row, value in zip(
            ("paper: backbone", "paper: vanilla RL", "paper: SEAL"), PAPER_TABLE1[model], strict=True
        ):
            lines.append(f"| {row} | " + " | ".join(f"{value:.2f}" if c == "mean" else "" for c in COLUMNS))
    result = trained or base
    n, split, limits = result["n_tasks"], result.get("split", "not recorded"), result.get("limits")
    cut = {c: k for c, k in result.get("cut", {}).items() if k}
    notes = [f"Success rate (%), {n} held-in tasks ({split}), bare benchmark, greedy."]
    if limits:
        notes.append(
            f"Token limits: prompt {limits['max_prompt_tokens']}, message {limits['max_new_tokens']}, "
            f"response {limits['max_response_tokens']}, episode {limits['max_total_tokens']}; "
            + (
                f"episodes a limit cut (scored 0): {', '.join(f'{c} {k}' for c, k in cut.items())}."
                if cut
                else "none cut."
            )
        )
    if model in PAPER_TABLE1:
        notes.append(f"Paper rows: its Table 1, on the authors' split ({PAPER_SPLIT}).")
    return head + " |\n".join(lines) + " |\n\n" + " ".join(notes) + "\n"


def table_ood(run: dict) -> str:
    """Table 2 layout: each out-of-distribution column (memory back end, web search set, tau2 domain)
    and their average, backbone vs trained, from eval/<suite>_{base,adapter}.json."""
    evals, whiches = run["evals"], ("base", "adapter")
    results = {w: {s: evals[f"{s}_{w}"] for s in SUITES if f"{s}_{w}" in evals} for w in whiches}
    suites = [s for s in SUITES if any(s in results[w] for w in whiches)]
    if not suites:
        return "_No out-of-distribution evaluation in this run (ood.suites in the recipe)._\n"
    columns = list(
        dict.fromkeys((s, c) for s in suites for w in whiches for c in results[w].get(s, {}).get("total", {}))
    )
    scores = {w: {(s, c): v for s, r in results[w].items() for c, v in r["scores"].items()} for w in whiches}

    def average(row: dict) -> float | None:
        values = [row[k] for k in columns if k in row]
        return sum(values) / len(values) if values else None

    def line(name: str, cells: list[str]) -> str:
        return f"| {name} | " + " | ".join(cells) + " |"

    names = [f"{SUITES[s].prefix} {c}".strip() for s, c in columns]
    lines = [line("policy", [*names, "average"]), "|---|" + "---|" * (len(columns) + 1)]
    base, trained = scores["base"], scores["adapter"]
    if results["base"]:
        model = next(iter(results["base"].values()))["policy"]
        lines.append(line(f"backbone ({model})", [pct(base.get(k)) for k in columns] + [pct(average(base))]))
    if results["adapter"]:
        cells = [pct(trained.get(k)) for k in columns] + [pct(average(trained))]
        lines.append(line(f"+ SEAL ({run['name']})", cells))
    if results["base"] and results["adapter"]:
        cells = [delta(trained.get(k), base.get(k)) for k in columns]
        lines.append(line("delta", cells + [delta(average(trained), average(base))]))

    notes = ["", "Success rate (%), each suite scored by its own package."]
    for suite in suites:
        result = results["adapter"].get(suite) or results["base"][suite]
        counts = ", ".join(f"{c} {n}" for c, n in result["total"].items())
        notes.append(f"- {suite}: tasks per column: {counts or 'none'}.")
        if result.get("user_simulator"):
            notes.append(f"  User simulator: {result['user_simulator']}.")
        for which, label in (("base", "backbone"), ("adapter", "trained")):
            cut = {c: n for c, n in results[which].get(suite, {}).get("truncated", {}).items() if n}
            if cut:
                counts = ", ".join(f"{c} {n}" for c, n in cut.items())
                notes.append(f"  Ended by a token limit (scored 0), {label}: {counts}.")
        for column, reason in result["skipped"].items():
            notes.append(f"  {column} not run: {reason}.")
    return "\n".join(lines + notes) + "\n"


def table_ablation(runs: list[dict]) -> str:
    head = "| run | " + " | ".join(COLUMNS) + " | delta mean vs backbone |\n|---|" + "---|" * (len(COLUMNS) + 1) + "\n"
    lines = []
    for run in runs:
        trained, base = run["evals"].get("adapter"), run["evals"].get("base")
        if not trained:
            lines.append(f"| {run['name']} | " + " | ".join("-" for _ in COLUMNS) + " | - |")
            continue
        cells = " | ".join(pct(trained["success"].get(c)) for c in COLUMNS)
        d = delta(trained["success"].get("mean"), base["success"].get("mean") if base else None)
        lines.append(f"| {run['name']} | {cells} | {d} |")
    return head + "\n".join(lines) + "\n"


def table_training(run: dict) -> str:
    rows = run["metrics"]
    if not rows:
        return "_No training metrics (metrics.jsonl)._\n"
    keys = ["charts/reward", "losses/kl_ref", "losses/clipfrac", "weights/mean", "adv/zero_frac"]
    keys = [k for k in keys if any(k in r for r in rows)]
    head = "| step | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys) + "\n"
    body = "\n".join(
        f"| {r['step']} | " + " | ".join(f"{r[k]:.4f}" if k in r else "-" for k in keys) + " |" for r in rows
    )
    return head + body + "\n"


# --- plots ------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Render to memory, then write atomically like every other file: a stopped report never leaves
    half an image under its real name."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    _plt().close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _step_axis(ax, steps: list[int]) -> None:
    """Whole-number training steps, the full range shown."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.set_xlabel("training step")


def _eval_steps(run: dict) -> list[int]:
    steps = [int(tag.split("_")[1]) for tag in run["evals"] if tag.startswith("step_")]
    if run["metrics"]:
        steps.append(run["metrics"][-1]["step"] + 1)
    return [0, *steps]


def plot_eval_over_steps(runs: list[dict], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    drew = False
    for run in runs:
        points = sorted((int(tag.split("_")[1]), e) for tag, e in run["evals"].items() if tag.startswith("step_"))
        final_step = run["metrics"][-1]["step"] + 1 if run["metrics"] else None
        if "adapter" in run["evals"] and final_step is not None:
            points.append((final_step, run["evals"]["adapter"]))
        if "base" in run["evals"]:
            points.insert(0, (0, run["evals"]["base"]))
        if len(points) < 1:
            continue
        steps = [s for s, _ in points]
        for c in COLUMNS if len(runs) == 1 else ["mean"]:
            ys = [100 * e["success"].get(c, 0.0) for _, e in points]
            style = "-o" if c == "mean" else "--."
            ax.plot(steps, ys, style, label=c if len(runs) == 1 else f"{run['name']} mean")
            drew = True
    if not drew:
        plt.close(fig)
        return False
    _step_axis(ax, [s for run in runs for s in _eval_steps(run)])
    ax.set_ylim(-3, 103)
    ax.set_ylabel("held-in success (%)")
    ax.set_title("Held-in success over training (bare benchmark)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    return True


CURVES = [  # (title, y label, {metrics key: line label}, smoothed): one panel each, from metrics.jsonl
    ("reward (training rollouts)", "mean reward (0/1 per episode)", {"charts/reward": ""}, True),
    ("KL to the reference", "KL per sampled token", {"losses/kl_ref": ""}, False),
    ("clip fraction", "share of sampled tokens", {"losses/clipfrac": ""}, False),
    ("loss", "policy loss", {"losses/loss": ""}, True),
    ("gradient norm", "L2 norm before clipping", {"losses/grad_norm": ""}, True),
    ("entropy (estimate)", "nats per sampled token", {"policy/entropy_estimate": ""}, True),
    (
        "tokens per episode",
        "tokens",
        {"charts/episode_tokens_mean": "whole", "charts/sampled_tokens_mean": "sampled"},
        False,
    ),
    (
        "time per step",
        "seconds",
        {"time/step_s": "step", "time/rollout_s": "rollouts", "time/update_s": "update"},
        False,
    ),
]


def curve_panels(runs: list[dict]) -> tuple[list[tuple], list[str]]:
    """The CURVES panels some run has values for, and the titles of those left out for being 0 at every step."""
    drawn, flat = [], []
    for panel in CURVES:
        values = [r[k] for run in runs for r in run["metrics"] for k in panel[2] if k in r]
        if values:
            (drawn if any(values) else flat).append(panel)
    return drawn, [panel[0] for panel in flat]


def moving_average(ys: list[float], half: int) -> list[float]:
    """Each point the mean of the points within `half` steps of it (fewer at the ends)."""
    return [sum(ys[max(0, i - half) : i + half + 1]) / len(ys[max(0, i - half) : i + half + 1]) for i in range(len(ys))]


def plot_curves(runs: list[dict], path: Path) -> bool:
    panels, _ = curve_panels(runs)
    if not panels:
        return False
    plt = _plt()
    rows = -(-len(panels) // 4)
    fig, axes = plt.subplots(rows, 4, figsize=(16, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, ylabel, keys, smoothed) in zip(axes.flat, panels, strict=False):
        for i, run in enumerate(runs):
            for j, (key, what) in enumerate(keys.items()):
                color, style = f"C{i * len(keys) + j}", ("-", "--", ":")[j]  # a colour per line, a dash per key
                pts = [(r["step"], r[key]) for r in run["metrics"] if key in r]
                name = ", ".join(x for x in (run["name"] if len(runs) > 1 else "", what) if x)
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                if smoothed and len(ys) > 2:  # the raw points faint, a centred moving average over them
                    half = max(1, len(ys) // 20)
                    prefix = f"{name}, " if name else ""
                    ax.plot(xs, ys, "-o", ms=2.5, lw=0.7, alpha=0.35, color=color, label=f"{prefix}each step")
                    ax.plot(
                        xs,
                        moving_average(ys, half),
                        style,
                        lw=2,
                        color=color,
                        label=f"{prefix}mean of {2 * half + 1} steps",
                    )
                elif pts:
                    ax.plot(xs, ys, style, marker="o", ms=3, color=color, label=name or None)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        _step_axis(ax, [r["step"] for run in runs for r in run["metrics"]])
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def curves_note(runs: list[dict]) -> str:
    """Why a training curve is missing from the figure: 0 at every step (the clip fraction, typically)."""
    _, flat = curve_panels(runs)
    if not flat:
        return ""
    note = f"Not drawn, 0 at every step: {', '.join(flat)}."
    if "clip fraction" in flat:
        steps = max((r.get("losses/optimizer_steps", 0) for run in runs for r in run["metrics"]), default=0)
        note += (
            " A round's first optimizer step scores the tokens under the policy that sampled them (ratio 1), so "
            f"nothing clips there; only its later steps can clip, and this run's rounds took {steps} optimizer "
            "step(s) at most (train.tasks_per_step / train.mini_batch_tasks)."
        )
    return note + "\n"


def plot_labels(run: dict, path: Path) -> bool:
    rounds = [r for r in run["rounds"] if r.get("profile")]
    if not rounds:
        return False
    plt = _plt()
    steps = [r["step"] for r in rounds]
    fig, ax = plt.subplots(figsize=(8.5, 4))
    bottom = [0.0] * len(rounds)
    for z in LABELS:
        ys = [r["profile"].get(z, {}).get("prevalence", 0.0) for r in rounds]
        if any(ys):
            ax.bar(steps, ys, bottom=bottom, label=z)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    _step_axis(ax, steps)
    ax.set_ylabel("share of turns")
    ax.set_title("Failure-label profile per round")
    handles, names = ax.get_legend_handles_labels()  # beside the bars, in the order they stack (top first)
    ax.legend(handles[::-1], names[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_cues(run: dict, path: Path) -> bool:
    rounds = run["rounds"]
    cues = sorted({c for r in rounds for c in active_cues(r.get("interface_used"))})
    if not rounds or not cues:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.45 * len(cues)))
    for i, cue in enumerate(cues):
        on = [r["step"] for r in rounds if cue in active_cues(r.get("interface_used"))]
        ax.scatter(on, [i] * len(on), marker="s", s=60)
    ax.set_ylim(-0.5, len(cues) - 0.5)  # one row per cue, even when there is a single cue
    ax.set_yticks(range(len(cues)))
    ax.set_yticklabels(cues, fontsize=8)
    _step_axis(ax, [r["step"] for r in rounds])
    ax.set_title("Interface cues active per round")
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_weights(run: dict, path: Path) -> bool:
    if not run["weights"]:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(run["weights"], bins=30)
    ax.set_xlabel("diagnostic weight w_j")
    ax.set_ylabel("trajectories")
    ax.set_title("Distribution of diagnostic weights (all rounds)")
    fig.tight_layout()
    save_figure(fig, path)
    return True


# --- the report -------------------------------------------------------------------------------------


def table_labels(run: dict) -> str:
    rounds = [r for r in run["rounds"] if r.get("profile")]
    if not rounds:
        return "_No diagnosis recorded (train.diagnose off)._\n"
    labels = [z for z in LABELS if any(z in r["profile"] for r in rounds)]
    head = "| step | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels) + "\n"
    body = "\n".join(
        f"| {r['step']} | " + " | ".join(str(r["profile"].get(z, {}).get("count", 0)) for z in labels) + " |"
        for r in rounds
    )
    return head + body + "\n\nTurns per label in each round's training rollouts.\n"


def cue_table(run: dict) -> str:
    if not run["rounds"]:
        return "_No rounds recorded._\n"
    lines = [f"| {r['step']} | {', '.join(active_cues(r.get('interface_used'))) or 'none'} |" for r in run["rounds"]]
    return "| step | active cues |\n|---|---|\n" + "\n".join(lines) + "\n"


def warm_start_summary(run_dir: Path) -> str:
    """What the warm start learned from (warm_start/sft.json): demonstrations, faults, labels, loss."""
    path = Path(run_dir) / "warm_start" / "sft.json"
    if not path.exists():
        return ""
    sft = read_json(path)
    stats, log = sft["stats"], sft["log"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(stats["faulted_turns"].items())) or "none"
    labels = ", ".join(f"{k} {v}" for k, v in sorted(stats["labels"].items(), key=lambda kv: -kv[1]))
    return (
        f"Supervised fine-tuning on {stats['demonstrations']} demonstrations ({stats['with_a_fault']} carry a "
        f"fault) in {len(log)} steps, {sft['seconds']:.0f} s; loss {log[0]['sft/loss']:.3f} -> "
        f"{log[-1]['sft/loss']:.3f}.\n\n- Faulted turns: {faults} (of {stats['turns']} turns).\n"
        f"- The diagnoser's labels on the demonstrations: {labels}.\n"
    )


def weights_summary(run: dict) -> str:
    w = run["weights"]
    if not w:
        return "_No trajectories recorded._\n"
    mean = sum(w) / len(w)
    return f"{len(w)} trajectories: mean {mean:.3f}, min {min(w):.3f}, max {max(w):.3f}.\n"


def build_report(run_dirs: list[Path], out_dir: Path, command: str = "report") -> Path:
    """Write report.md and its plots into out_dir; returns the markdown path.

    It holds out_dir alone, not the runs: every file it reads is only ever replaced whole, so it reads a
    run that is still training as a snapshot (and says so)."""
    with run_lock(out_dir, command):
        runs = [load_run(Path(d)) for d in run_dirs]
        main = runs[0]
        figure = {
            "eval_over_steps.png": plot_eval_over_steps(runs, out_dir / "eval_over_steps.png"),
            "curves.png": plot_curves(runs, out_dir / "curves.png"),
            "labels.png": plot_labels(main, out_dir / "labels.png"),
            "cues.png": plot_cues(main, out_dir / "cues.png"),
            "weights.png": plot_weights(main, out_dir / "weights.png"),
        }

        def img(name: str, alt: str) -> str:
            return f"![{alt}]({name})\n" if figure[name] else "_No data for this plot._\n"

        notes = caveats(runs)
        parts = [f"# seal_mini report: {', '.join(r['name'] for r in runs)}\n", *([notes] if notes else [])]
        parts += ["## Result (Table 1 style)\n", table_main(main)]
        if warm_start_summary(main["dir"]):  # the backbone row is a warm start built by seal_mini/training/sft.py
            parts += ["## Warm start\n", warm_start_summary(main["dir"])]
        parts += ["## Out of distribution (Table 2 style)\n", table_ood(main)]
        if len(runs) > 1:
            parts += ["## Ablations (Table 3 style)\n", table_ablation(runs)]
        parts += ["## Held-in success over training\n", img("eval_over_steps.png", "held-in success")]
        parts += ["## Training curves\n", img("curves.png", "training curves"), curves_note(runs), table_training(main)]
        parts += ["## Failure-label profile\n", img("labels.png", "label profile"), table_labels(main)]
        parts += ["## Interface cues\n", img("cues.png", "active cues"), cue_table(main)]
        parts += ["## Diagnostic weights\n", img("weights.png", "weights"), weights_summary(main)]
        path = out_dir / "report.md"
        atomic_write_text(path, "\n".join(parts))
        return path
