"""The report's figures are drawn from the run's files: every training curve from its metrics.jsonl key."""

import pytest

from seal_mini.evaluation import report

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

KEYS = [key for _, _, keys, _ in report.CURVES for key in keys]


def metrics(steps: int = 6, **constant) -> list[dict]:
    """Made-up rows: every curve's key with its own values (key number k at step s: 10 k + s), some overridden."""
    return [{"step": s, **{key: 10.0 * k + s for k, key in enumerate(KEYS)}, **constant} for s in range(steps)]


def drawn(monkeypatch, runs: list[dict], plot=report.plot_curves, **kwargs):
    """The figure a plot function draws (what it would save), its visible axes."""
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig))
    assert plot(runs, None, **kwargs)
    return figures[0], [ax for ax in figures[0].axes if ax.get_visible()]


def test_every_curve_is_drawn_from_its_metrics_key_with_a_y_label(monkeypatch):
    rows = metrics()
    _, axes = drawn(monkeypatch, [{"name": "run", "metrics": rows}])
    assert [ax.get_title() for ax in axes] == [title for title, *_ in report.CURVES]
    for ax, (title, ylabel, keys, smoothed) in zip(axes, report.CURVES, strict=True):
        assert ax.get_ylabel() == ylabel
        lines = [list(line.get_ydata()) for line in ax.get_lines()]
        raw = [[r[key] for r in rows] for key in keys]
        if smoothed:  # the raw points, then their moving average
            assert lines == [raw[0], report.moving_average(raw[0], 1)], title
        else:
            assert lines == raw, title


def test_a_curve_missing_from_the_metrics_or_0_at_every_step_is_left_out_and_said(monkeypatch):
    rows = metrics(**{"losses/clipfrac": 0.0})
    for r in rows:
        del r["losses/grad_norm"]
    run = {"name": "run", "metrics": rows}
    _, axes = drawn(monkeypatch, [run])
    titles = [ax.get_title() for ax in axes]
    assert "gradient norm" not in titles and "clip fraction" not in titles and "loss" in titles
    assert report.curves_note([run]).startswith("Not drawn, 0 at every step: clip fraction.")
    rows[3]["losses/clipfrac"] = 0.01  # one step clipped: drawn
    assert "clip fraction" in [ax.get_title() for ax in drawn(monkeypatch, [run])[1]]
    assert report.curves_note([run]) == ""


def test_moving_average_by_hand():
    assert report.moving_average([1.0, 2.0, 3.0, 10.0], 1) == [1.5, 2.0, 5.0, 6.5]
    assert report.moving_average([4.0, 0.0, 2.0], 5) == [2.0, 2.0, 2.0]


def test_the_label_legend_stands_beside_the_bars(monkeypatch):
    rounds = [
        {"step": s, "profile": {"pass": {"prevalence": 0.6}, "state_mismatch": {"prevalence": 0.4}}} for s in range(3)
    ]
    fig, (ax,) = drawn(monkeypatch, {"rounds": rounds}, plot=report.plot_labels)
    fig.canvas.draw()
    legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= box.x1  # right of the axes, over no bar
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["state_mismatch", "pass"]  # top of the stack first


def test_the_result_table_shows_the_papers_row_the_split_and_what_a_limit_cut():
    def result(mean, cut):
        success = {"base": mean, "miss_func": mean, "miss_param": mean, "long_context": mean, "mean": mean}
        limits = {"max_prompt_tokens": 8192, "max_new_tokens": 4096, "max_response_tokens": 4096}
        return {"policy": "p", "success": success, "n_tasks": 400, "split": "split file x.json", "cut": cut,
                "limits": {**limits, "max_total_tokens": 16384}}  # fmt: skip

    cut = {"base": 0, "miss_func": 3, "miss_param": 0, "long_context": 7}
    run = {
        "name": "r",
        "model": "Qwen/Qwen2.5-3B-Instruct",
        "evals": {"base": result(0.05, cut), "adapter": result(0.1, cut)},
    }
    table = report.table_main(run)
    assert "| paper: SEAL |  |  |  |  | 14.00 |" in table and "| paper: backbone |  |  |  |  | 5.75 |" in table
    assert "400 held-in tasks (split file x.json)" in table and "scored 0): miss_func 3, long_context 7." in table
    assert "Paper rows: its Table 1, on the authors' split" in table
    run["model"] = "tiny-random"  # no paper row for a backbone the paper did not train
    assert "paper:" not in report.table_main(run) and "Paper rows" not in report.table_main(run)
