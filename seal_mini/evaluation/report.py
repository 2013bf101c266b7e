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
    "Qwen/Qwen2.5-3B-Instruct": {"backbone": 5.75, "vanilla RL": 9.25, "SEAL": 14.00},
    "Qwen/Qwen2.5-7B-Instruct": {"backbone": 14.00, "vanilla RL": 30.75, "SEAL": 40.25},
    "Team-ACE/ToolACE-2-Llama-3.1-8B": {"backbone": 32.00, "vanilla RL": 38.50, "SEAL": 46.75},
}
"""The paper's Table 1 (BFCL V3 multi-turn, mean of the four categories, %) for each backbone."""
PAPER_SPLIT = "recipes/splits/seal_release.json, which data.split_file names in the recipes that reproduce a row"


def load_run(run_dir: Path) -> dict:
    """Everything the report reads from one run directory."""
    run_dir, model = Path(run_dir), ""
    config = run_dir / "config.yaml"
    if not config.exists() and not (run_dir / "eval").exists():
        raise ConfigError(f"report: {run_dir} is not a run directory (no config.yaml or eval/)")
    if config.exists():
        text = check_config_file(config)  # a damaged one: the run is not what its files say
        with reading(config, REMOVE):
            settings = load_yaml(text)
        section = settings.get("model") if isinstance(settings, dict) else None
        model = str(section.get("name", "")) if isinstance(section, dict) else ""  # the backbone it trained
    rerun = "restore it, or delete it and rerun the evaluation that wrote it"
    evals = {p.stem: read_json(p, fix=rerun) for p in sorted((run_dir / "eval").glob("*.json"))}
    rounds = [read_json(p, fix=REMOVE) for p in sorted((run_dir / "rounds").glob("step_*.json"))]
    trajectories = sorted((run_dir / "trajectories").glob("step_*.jsonl.gz"))
    weights = [r["weight"] for p in trajectories for r in read_jsonl_gz(p, fix=REMOVE)]
    missing = missing_outputs(run_dir)
    if missing:
        print(f"[report] warning: {run_dir} lacks {names(missing)}; the report leaves them out", file=sys.stderr)
    return {
        "name": run_dir.name,
        "dir": run_dir,
        "model": model,
        "metrics": read_metrics(run_dir),
        "evals": evals,
        "rounds": rounds,
        "weights": weights,
        "missing": missing,
        "writer": None if (held := writer(run_dir)) and held.get("pid") == os.getpid() else held,  # not our own
    }


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


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header, its rule, one line per row."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, *rows]]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines) + "\n"


def listing(counts: dict) -> str:
    """{"a": 1, "b": 2} as "a 1, b 2"."""
    return ", ".join(f"{k} {n}" for k, n in counts.items())


def table_main(run: dict) -> str:
    base, trained = run["evals"].get("base"), run["evals"].get("adapter")
    if not base and not trained:
        return "_No final evaluation in this run (eval/base.json, eval/adapter.json)._\n"
    rows = []
    if base:
        rows.append([f"backbone ({base['policy']})", *(pct(base["success"].get(c)) for c in COLUMNS)])
    if trained:
        rows.append([f"+ SEAL ({run['name']})", *(pct(trained["success"].get(c)) for c in COLUMNS)])
    if base and trained:
        rows.append(["delta", *(delta(trained["success"].get(c), base["success"].get(c)) for c in COLUMNS)])
    model = run["model"]
    for row, value in PAPER_TABLE1.get(model, {}).items():  # the paper's Table 1 rows for this backbone: mean only
        rows.append([f"paper: {row}", *(f"{value:.2f}" if c == "mean" else "" for c in COLUMNS)])
    result = trained or base
    n, split, limits = result["n_tasks"], result.get("split", "not recorded"), result.get("limits")
    cut = listing({c: k for c, k in result.get("cut", {}).items() if k})
    notes = [f"Success rate (%), {n} held-in tasks ({split}), bare benchmark, greedy."]
    if limits:
        notes.append(
            f"Token limits: prompt {limits['max_prompt_tokens']}, message {limits['max_new_tokens']}, "
            f"response {limits['max_response_tokens']}, episode {limits['max_total_tokens']}; "
            + (f"episodes a limit cut (scored 0): {cut}." if cut else "none cut.")
        )
    if model in PAPER_TABLE1:
        notes.append(f"Paper rows: its Table 1, on the authors' split ({PAPER_SPLIT}).")
    return markdown_table(["policy", *COLUMNS], rows) + "\n" + " ".join(notes) + "\n"


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

    base, trained, rows = scores["base"], scores["adapter"], []
    if results["base"]:
        model = next(iter(results["base"].values()))["policy"]
        rows.append([f"backbone ({model})", *(pct(base.get(k)) for k in columns), pct(average(base))])
    if results["adapter"]:
        rows.append([f"+ SEAL ({run['name']})", *(pct(trained.get(k)) for k in columns), pct(average(trained))])
    if results["base"] and results["adapter"]:
        cells = [delta(trained.get(k), base.get(k)) for k in columns]
        rows.append(["delta", *cells, delta(average(trained), average(base))])
    header = ["policy", *(f"{SUITES[s].prefix} {c}".strip() for s, c in columns), "average"]

    notes = ["", "Success rate (%), each suite scored by its own package."]
    for suite in suites:
        result = results["adapter"].get(suite) or results["base"][suite]
        notes.append(f"- {suite}: tasks per column: {listing(result['total']) or 'none'}.")
        if result.get("user_simulator"):
            notes.append(f"  User simulator: {result['user_simulator']}.")
        for which, label in (("base", "backbone"), ("adapter", "trained")):
            cut = listing({c: n for c, n in results[which].get(suite, {}).get("truncated", {}).items() if n})
            if cut:
                notes.append(f"  Ended by a token limit (scored 0), {label}: {cut}.")
        for column, reason in result["skipped"].items():
            notes.append(f"  {column} not run: {reason}.")
    return markdown_table(header, rows) + "\n".join(notes) + "\n"


def table_ablation(runs: list[dict]) -> str:
    rows = []
    for run in runs:  # a run with no final evaluation shows "-" throughout
        trained = (run["evals"].get("adapter") or {}).get("success", {})
        base = (run["evals"].get("base") or {}).get("success", {})
        rows.append(
            [run["name"], *(pct(trained.get(c)) for c in COLUMNS), delta(trained.get("mean"), base.get("mean"))]
        )
    return markdown_table(["run", *COLUMNS, "delta mean vs backbone"], rows)


def table_training(run: dict) -> str:
    rows = run["metrics"]
    if not rows:
        return "_No training metrics (metrics.jsonl)._\n"
    keys = ["charts/reward", "losses/kl_ref", "losses/clipfrac", "weights/mean", "adv/zero_frac"]
    keys = [k for k in keys if any(k in r for r in rows)]
    cells = [[str(r["step"]), *(f"{r[k]:.4f}" if k in r else "-" for k in keys)] for r in rows]
    return markdown_table(["step", *keys], cells)


# --- plots ------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Lay out, render to memory, then write atomically like every other file: a stopped report never
    leaves half an image under its real name."""
    fig.tight_layout()
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


def plot_eval_over_steps(runs: list[dict], path: Path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    drew, axis = False, []
    for run in runs:
        evals = run["evals"]
        points = sorted((int(tag.split("_")[1]), e) for tag, e in evals.items() if tag.startswith("step_"))
        final_step = [run["metrics"][-1]["step"] + 1] if run["metrics"] else []
        axis += [0, *(s for s, _ in points), *final_step]  # from step 0 to the end, evaluated there or not
        if "adapter" in evals and final_step:
            points.append((final_step[0], evals["adapter"]))
        if "base" in evals:
            points.insert(0, (0, evals["base"]))
        if not points:
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
    _step_axis(ax, axis)
    ax.set_ylim(-3, 103)
    ax.set_ylabel("held-in success (%)")
    ax.set_title("Held-in success over training (bare benchmark)")
    ax.legend(fontsize=8)
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
    rows = -(-len(panels) // 4)
    fig, axes = _plt().subplots(rows, 4, figsize=(16, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, ylabel, keys, smoothed) in zip(axes.flat, panels, strict=False):
        for i, run in enumerate(runs):
            for j, (key, what) in enumerate(keys.items()):
                color, style = f"C{i * len(keys) + j}", ("-", "--", ":")[j]  # a colour per line, a dash per key
                xs = [r["step"] for r in run["metrics"] if key in r]
                ys = [r[key] for r in run["metrics"] if key in r]
                name = ", ".join(x for x in (run["name"] if len(runs) > 1 else "", what) if x)
                if smoothed and len(ys) > 2:  # the raw points faint, a centred moving average over them
                    half = max(1, len(ys) // 20)
                    prefix = f"{name}, " if name else ""
                    ax.plot(xs, ys, "-o", ms=2.5, lw=0.7, alpha=0.35, color=color, label=f"{prefix}each step")
                    mean = moving_average(ys, half)
                    ax.plot(xs, mean, style, lw=2, color=color, label=f"{prefix}mean of {2 * half + 1} steps")
                elif ys:
                    ax.plot(xs, ys, style, marker="o", ms=3, color=color, label=name or None)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        _step_axis(ax, [r["step"] for run in runs for r in run["metrics"]])
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7)
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
    steps = [r["step"] for r in rounds]
    fig, ax = _plt().subplots(figsize=(8.5, 4))
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
    save_figure(fig, path)
    return True


def plot_cues(run: dict, path: Path) -> bool:
    rounds = run["rounds"]
    cues = sorted({c for r in rounds for c in active_cues(r.get("interface_used"))})
    if not rounds or not cues:
        return False
    fig, ax = _plt().subplots(figsize=(7, 1.6 + 0.45 * len(cues)))
    for i, cue in enumerate(cues):
        on = [r["step"] for r in rounds if cue in active_cues(r.get("interface_used"))]
        ax.scatter(on, [i] * len(on), marker="s", s=60)
    ax.set_ylim(-0.5, len(cues) - 0.5)  # one row per cue, even when there is a single cue
    ax.set_yticks(range(len(cues)))
    ax.set_yticklabels(cues, fontsize=8)
    _step_axis(ax, [r["step"] for r in rounds])
    ax.set_title("Interface cues active per round")
    save_figure(fig, path)
    return True


def plot_weights(run: dict, path: Path) -> bool:
    if not run["weights"]:
        return False
    fig, ax = _plt().subplots(figsize=(6, 3.5))
    ax.hist(run["weights"], bins=30)
    ax.set_xlabel("diagnostic weight w_j")
    ax.set_ylabel("trajectories")
    ax.set_title("Distribution of diagnostic weights (all rounds)")
    save_figure(fig, path)
    return True


# --- the report -------------------------------------------------------------------------------------


def table_labels(run: dict) -> str:
    rounds = [r for r in run["rounds"] if r.get("profile")]
    if not rounds:
        return "_No diagnosis recorded (train.diagnose off)._\n"
    labels = [z for z in LABELS if any(z in r["profile"] for r in rounds)]
    cells = [[str(r["step"]), *(str(r["profile"].get(z, {}).get("count", 0)) for z in labels)] for r in rounds]
    return markdown_table(["step", *labels], cells) + "\nTurns per label in each round's training rollouts.\n"


def cue_table(run: dict) -> str:
    if not run["rounds"]:
        return "_No rounds recorded._\n"
    cells = [[str(r["step"]), ", ".join(active_cues(r.get("interface_used"))) or "none"] for r in run["rounds"]]
    return markdown_table(["step", "active cues"], cells)


def warm_start_summary(run_dir: Path) -> str:
    """What the warm start learned from (warm_start/sft.json): demonstrations, faults, labels, loss."""
    path = Path(run_dir) / "warm_start" / "sft.json"
    if not path.exists():
        return ""
    sft = read_json(path)
    stats, log = sft["stats"], sft["log"]
    faults = listing(dict(sorted(stats["faulted_turns"].items()))) or "none"
    labels = listing(dict(sorted(stats["labels"].items(), key=lambda kv: -kv[1])))
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
    return f"{len(w)} trajectories: mean {sum(w) / len(w):.3f}, min {min(w):.3f}, max {max(w):.3f}.\n"


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
        warm = warm_start_summary(main["dir"])  # the backbone row is a warm start built by seal_mini/training/sft.py
        if warm:
            parts += ["## Warm start\n", warm]
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
