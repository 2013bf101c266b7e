import gc
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

from seal_mini.envs.bfcl import load_tasks
from seal_mini.envs.scripted import ground_truth_call, ground_truth_turns, replay


def test_oracle_command_passes_800_ground_truths_and_fails_both_broken_plans():
    out = subprocess.run(
        [sys.executable, "-m", "seal_mini", "oracle"], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    passed = {p: sum(c["passed"] for c in result[p].values()) for p in ("ground_truth", "empty", "drop_last_call")}
    totals = {p: sum(c["total"] for c in result[p].values()) for p in passed}
    assert passed == {"ground_truth": 800, "empty": 0, "drop_last_call": 0}
    assert totals == {p: 800 for p in passed}


def test_positional_ground_truth_arguments_are_named_from_the_signature():
    task = next(t for t in load_tasks(["base"]) if any("sort('" in c for turn in t.ground_truth for c in turn))
    from seal_mini.envs.episode import new_instances, public_methods

    methods = public_methods(new_instances(task))
    assert ground_truth_call("sort('final_report.pdf')", methods) == ("sort", {"file_name": "final_report.pdf"})


def test_episodes_leave_nothing_alive_behind_them():
    """Python objects still alive after a pass over 400 episodes, compared with after the same pass again:
    anything an episode leaves behind (a back end's class-level state, a growing cache) grows by the pass.
    tracemalloc counts live allocations, so the figure does not move with the allocator or the rest of
    the test session, as the process's resident size did (14 MB over 1800 episodes in one CI run, where
    tracemalloc, run alone, saw 1.23 -> 1.24 MB)."""
    plans = [(t, ground_truth_turns(t)) for t in load_tasks()]
    for plan in plans:  # every task once: caches of bounded size fill here
        replay(*plan)
    alive = []
    tracemalloc.start()
    try:
        for _ in range(2):
            for plan in plans[:400]:
                replay(*plan)
            gc.collect()
            alive.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    print(f"live bytes allocated since the warm pass: {alive[0]} after one pass, {alive[1]} after two")
    assert alive[1] - alive[0] < 64_000  # 160 bytes an episode; measured: 1.5 KB over the 400


def test_the_release_splits_ship_and_compare_as_the_release_files_say(tmp_path):
    """The SEAL release's two splits (recipes/splits/, from its parquet files and bfcl_400_split.json): the
    one exp/SEAL.yaml uses is made by index like the kit's and shares 192 training ids with its seed 0;
    the other is not (173 indices on both sides, 344 held-in tasks with a training twin)."""
    from seal_mini.checks.oracle import compare_splits
    from seal_mini.envs.bfcl import read_split_file

    release = json.loads(Path("recipes/splits/seal_release_400_split.json").read_text())
    (tmp_path / "release_layout.json").write_text(
        json.dumps({"train": release["train"], "test": release["eval"], "seed": 0})
    )
    assert read_split_file(tmp_path / "release_layout.json")["eval"] == release["eval"]  # its "test" is held-in
    figures = compare_splits([str(tmp_path / "release_layout.json")])
    splits, shared = figures["splits"], figures["shared_train"]
    assert splits["kit seed 0"]["indices_on_both_sides"] == splits["seal_release"]["indices_on_both_sides"] == 0
    assert splits["seal_release_400_split"]["indices_on_both_sides"] == 173
    assert splits["seal_release_400_split"]["eval_with_train_twin"] == 344
    assert shared["kit seed 0 / seal_release"] == 192 and shared["seal_release / seal_release_400_split"] == 206
    assert shared["seal_release_400_split / release_layout"] == 400
    assert all(s["train"] == s["eval"] == 400 for s in splits.values())
