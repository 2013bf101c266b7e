import gc
import json
import subprocess
import sys

from seal_mini.envs.bfcl import load_tasks
from seal_mini.envs.scripted import ground_truth_call, ground_truth_turns, replay


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def test_oracle_command_800_0_0_under_a_minute():
    out = subprocess.run(
        [sys.executable, "-m", "seal_mini", "oracle"], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    passed = {p: sum(c["passed"] for c in result[p].values()) for p in ("ground_truth", "empty", "drop_last_call")}
    totals = {p: sum(c["total"] for c in result[p].values()) for p in passed}
    assert passed == {"ground_truth": 800, "empty": 0, "drop_last_call": 0}
    assert totals == {p: 800 for p in passed}
    assert result["seconds"] < 60


def test_positional_ground_truth_arguments_are_named_from_the_signature():
    task = next(t for t in load_tasks(["base"]) if any("sort('" in c for turn in t.ground_truth for c in turn))
    from seal_mini.envs.episode import new_instances, public_methods

    methods = public_methods(new_instances(task))
    assert ground_truth_call("sort('final_report.pdf')", methods) == ("sort", {"file_name": "final_report.pdf"})


def test_memory_stays_flat_over_2000_episodes():
    tasks = load_tasks()
    plans = [(t, ground_truth_turns(t)) for t in tasks]
    for i in range(200):
        replay(*plans[i % len(plans)])
    gc.collect()
    after_200 = rss_mb()
    for i in range(200, 2000):
        replay(*plans[i % len(plans)])
    gc.collect()
    after_2000 = rss_mb()
    print(f"RSS after 200 episodes {after_200:.1f} MB, after 2000 {after_2000:.1f} MB")
    assert after_2000 - after_200 < 8.0
