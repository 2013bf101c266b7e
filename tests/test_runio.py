import os

import pytest

from seal_mini.runio import (
    atomic_write_text,
    latest_checkpoint,
    read_jsonl_gz,
    read_metrics,
    swap_in_dir,
    write_json,
    write_jsonl_gz,
    write_metrics,
)


def test_atomic_write_leaves_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    write_json(path, {"x": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(path, "half")
    monkeypatch.undo()
    assert path.read_text().strip().replace(" ", "").replace("\n", "") == '{"x":1}'


def test_jsonl_gz_and_metrics_round_trip(tmp_path):
    rows = [{"a": 1, "b": [1, 2]}, {"a": 2, "b": "é"}]
    write_jsonl_gz(tmp_path / "t.jsonl.gz", rows)
    assert read_jsonl_gz(tmp_path / "t.jsonl.gz") == rows
    write_metrics(tmp_path, [{"step": 0, "r": 0.5}])
    assert read_metrics(tmp_path) == [{"step": 0, "r": 0.5}]


def test_checkpoint_swap_keeps_a_complete_copy(tmp_path):
    for version in (1, 2):
        tmp = tmp_path / "checkpoint.tmp"
        tmp.mkdir()
        write_json(tmp / "state.json", {"step": version})
        swap_in_dir(tmp, tmp_path / "checkpoint")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint"
    assert (tmp_path / "checkpoint" / "state.json").read_text().count("2") == 1
    # a crash between the two renames leaves only checkpoint.old: it is found
    os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.old")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
