"""`gpu-check --dry-run`: the GPU check's stages on the CPU at tiny shapes, so the check itself cannot rot
before a card is at hand. Every stage must run and write the keys the card's run will write."""

import json

from seal_mini.__main__ import main
from seal_mini.checks import gpu_check


def test_the_dry_run_runs_every_stage_and_writes_the_cards_keys(tmp_path, capsys):
    assert main(["gpu-check", "--out", str(tmp_path), "--dry-run"]) == 0, capsys.readouterr().err[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = result["stages"]
    assert list(stages) == [name for name, _, _ in gpu_check.STAGES]
    assert all(s["status"] == "ok" for s in stages.values()), {n: s.get("error") for n, s in stages.items()}
    assert {"gpu", "capability", "bf16", "driver", "bitsandbytes", "versions"} <= set(stages["environment"])
    assert [k for k in stages["preflight"] if "@" in k] == [
        "qwen2_5_3b@24gb",
        "qwen2_5_3b@16gb",
        "qwen2_5_7b@24gb",
        "toolace2_llama3_1_8b@24gb",
        "qwen3_5_4b@24gb",
    ]
    assert all(stages["preflight"][k]["fits"] for k in stages["preflight"] if "@" in k)
    phases = stages["train_steps"]["phases"]
    assert set(phases) == {"run_rollouts", "score", "diagnose_turns", "update", "save_checkpoint"}
    assert phases["update"]["calls"] == phases["save_checkpoint"]["calls"] == 2
    assert all(stages["engine_vs_generate"][kind]["same_tokens"] == "3/3" for kind in ("bf16", "4bit"))
    oom = stages["out_of_memory"]
    assert oom["finished"] == oom["episodes"] == 32 and 0 < oom["max_concurrent_after"] <= 2
    assert stages["resume"]["bit_exact"] and stages["resume"]["killed"] == "after its first checkpoint"
    assert (tmp_path / "gpu_check.log").read_text().count("[gpu-check]") == 2 * len(gpu_check.STAGES)


def test_without_a_card_the_check_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert main(["gpu-check", "--out", str(tmp_path)]) == 2
    assert "no CUDA GPU is visible here" in capsys.readouterr().err


def test_a_stage_that_fails_or_runs_past_its_cap_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    import time

    def broken(check):
        check.partial["measured"] = 1  # what it had measured before it broke is kept
        raise RuntimeError("a broken stage")

    def slow(check):
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001 - code under test that catches everything must not swallow the cap
            pass
        time.sleep(5)
        return {}

    stages = (("first", broken, 5), ("second", slow, 1), ("third", lambda check: {"fine": True}, 5))
    monkeypatch.setattr(gpu_check, "STAGES", stages)
    result = gpu_check.run_check(tmp_path, dry=False)  # no stage here needs a card
    got = {n: s["status"] for n, s in result["stages"].items()}
    assert got == {"first": "failed", "second": "timed out", "third": "ok"}
    assert "a broken stage" in result["stages"]["first"]["traceback"] and result["stages"]["first"]["measured"] == 1
    assert "measured" not in result["stages"]["second"]
