"""Live logging: TensorBoard event files carry exactly metrics.jsonl's numbers; W&B is optional and faked here."""

import sys
from types import SimpleNamespace

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.runio import read_metrics
from seal_mini.training import checkpoint as checkpoint_module
from seal_mini.training import tracking
from seal_mini.training import train as train_module
from seal_mini.training.tracking import Tracker, check_backends, numeric

SMOKE = ["train.steps=3", "train.eval_every=0", "train.print_samples=1"]


def read_back(log_dir, plugin: str) -> dict[str, list[tuple[int, object]]]:
    """Every series of one kind (scalars, text) in a TensorBoard folder, read as the TensorBoard server does."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    tags = [t for t in events.Tags()["tensors"] if events.SummaryMetadata(t).plugin_data.plugin_name == plugin]
    return {t: [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(t)] for t in tags}


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(step, float(v)) for step, v in points] for tag, points in read_back(log_dir, "scalars").items()}


def texts(log_dir) -> dict[str, list[int]]:
    return {tag: [step for step, _ in points] for tag, points in read_back(log_dir, "text").items()}


def assert_same_as_metrics(run_dir):
    rows = read_metrics(run_dir)
    series = scalars(run_dir / "tensorboard")
    expected_tags = {k for row in rows for k in numeric(row) if k != "step"}
    assert set(series) == expected_tags
    for tag, points in series.items():
        want = [(row["step"], numeric(row)[tag]) for row in rows if tag in numeric(row)]
        assert [s for s, _ in points] == [s for s, _ in want], tag  # each step exactly once, in order
        for (_, got), (_, value) in zip(points, want, strict=True):
            assert got == pytest.approx(value, rel=1e-6, abs=1e-6), tag  # event files store float32


def test_tensorboard_scalars_equal_metrics_jsonl_across_a_resume(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the optional extra requirements-log.txt is not installed")
    # Stop after step 2 was logged but before its checkpoint: the resumed run redoes step 2, and TensorBoard
    # must drop the first attempt's events for it, so every step appears once with metrics.jsonl's numbers.
    cfg = load_config("recipes/cpu_smoke.yaml", SMOKE + [f"out_dir={tmp_path}", "log.backends=[jsonl,tensorboard]"])
    real_save = checkpoint_module.save_checkpoint

    def stop_before_third_checkpoint(run_dir, policy, optimizer, scheduler, state):
        if state.step == 3:
            raise KeyboardInterrupt
        real_save(run_dir, policy, optimizer, scheduler, state)

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", stop_before_third_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(cfg)
    assert [s for s, _ in scalars(cfg.run_dir / "tensorboard")["charts/reward"]] == [0, 1, 2]
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", real_save)
    run_dir, _ = train_module.train(cfg, resume=True)

    assert len(read_metrics(run_dir)) == 3
    assert_same_as_metrics(run_dir)
    logged = scalars(run_dir / "tensorboard")
    assert {"labels/missing_tool_call", "charts/reward", "losses/loss", "weights/mean"} <= set(logged)
    assert texts(run_dir / "tensorboard") == {
        "interface/cues/text_summary": [0, 1, 2],
        "samples/text_summary": [0, 1, 2],
    }


def test_wandb_gets_the_same_numbers_through_its_api(tmp_path, monkeypatch):
    # W&B is never reached in tests: a stand-in module records what the tracker sends.
    sent = SimpleNamespace(init=None, logs=[], finished=False)

    class Run:
        def log(self, data, step):
            sent.logs.append((step, data))

        def finish(self):
            sent.finished = True

    def init(**kwargs):
        sent.init = kwargs
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=init, Html=lambda text: ("html", text)))
    monkeypatch.setattr(tracking, "installed", lambda module: True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_config(overrides=["log.backends=[jsonl,wandb]", f"out_dir={tmp_path}", "name=w"])
    tracker = Tracker(cfg, tmp_path / "w", history=[])
    row = {"step": 0, "charts/reward": 0.25, "labels/pass": 3, "interface/cues": ["schema_cues"], "flag": True}
    tracker.log(
        row, [{"task_id": "t", "reward": 1.0, "labels": ["pass"], "messages": [{"role": "user", "content": "hi"}]}]
    )
    tracker.close()
    assert sent.init["project"] == "seal_mini" and sent.init["resume"] == "allow"
    first_id = sent.init["id"]
    Tracker(cfg, tmp_path / "w", history=[])
    assert sent.init["id"] == first_id  # a resumed run continues the same W&B run
    ((step, data),) = sent.logs
    assert step == 0 and data["charts/reward"] == 0.25 and data["labels/pass"] == 3.0 and "flag" not in data
    assert data["interface/cues"] == ("html", "<pre>schema_cues</pre>") and "[user] hi" in data["samples"][1]
    assert sent.finished


def test_missing_or_unconfigured_backends_are_named(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(ConfigError, match="log.backends: unknown backend 'csv'"):
        load_config(overrides=["log.backends=[jsonl,csv]"])
    monkeypatch.setattr(tracking, "installed", lambda module: module != "wandb")
    with pytest.raises(ConfigError, match="wandb is not installed; pip install wandb "):
        check_backends(load_config(overrides=["log.backends=[wandb]"]))
    monkeypatch.setattr(tracking, "installed", lambda module: True)
    with pytest.raises(ConfigError, match="WANDB_API_KEY"):
        check_backends(load_config(overrides=["log.backends=[wandb]"]))
