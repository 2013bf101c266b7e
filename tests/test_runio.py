"""The run directory's input and output: atomic and durable writes, one reading place that names a
damaged file, one writer at a time, resumable pieces."""

import errno
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seal_mini.runio import (
    FileError,
    atomic_write_text,
    open_partial,
    read_json,
    read_jsonl_gz,
    read_metrics,
    read_pieces,
    read_yaml,
    run_lock,
    write_json,
    write_jsonl_gz,
    write_metrics,
)

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

ROOT = Path(__file__).resolve().parents[1]


def test_atomic_write_leaves_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    write_json(path, {"x": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(FileError):
        atomic_write_text(path, "half")
    monkeypatch.undo()
    assert path.read_text().strip().replace(" ", "").replace("\n", "") == '{"x":1}'


def test_jsonl_gz_and_metrics_round_trip(tmp_path):
    rows = [{"a": 1, "b": [1, 2]}, {"a": 2, "b": "é"}]
    write_jsonl_gz(tmp_path / "t.jsonl.gz", rows)
    assert read_jsonl_gz(tmp_path / "t.jsonl.gz") == rows
    write_metrics(tmp_path, [{"step": 0, "r": 0.5}])
    assert read_metrics(tmp_path) == [{"step": 0, "r": 0.5}]


def test_concurrent_writers_of_one_file_never_trip_over_each_others_temporary(tmp_path):
    path, errors = tmp_path / "shared.json", []

    def writer(k):
        try:
            for i in range(200):
                write_json(path, {"writer": k, "i": i})
        except Exception as e:  # noqa: BLE001 - any failure of any writer fails the test
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert json.loads(path.read_text())["i"] == 199
    assert [p.name for p in tmp_path.iterdir()] == ["shared.json"]  # no temporary left behind


FULL_DISK = """
import resource, signal, sys
from seal_mini.runio import FileError, write_json
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_json(sys.argv[1], {"big": "x" * 100_000})
except FileError as e:
    print(e)
"""


def test_a_write_the_disk_refuses_names_the_path_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    write_json(path, {"old": True})
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"cannot write {path}: File too large; free disk space")
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_a_refused_write_is_one_line_from_the_command_line(tmp_path, capsys, monkeypatch):
    from seal_mini.__main__ import main

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("name: run\n")

    def no_permission(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", no_permission)
    assert main(["report", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {tmp_path / 'run' / 'report'}") and "Permission denied" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("a.json", b'{"a": [1, 2', "not valid JSON (Expecting"),
        ("a.json", b'{"a": "caf\xe9"}', "not UTF-8 text (byte 0xe9 at position 10)"),
        ("a.jsonl.gz", gzip.compress(b'{"a": 1}\n' * 50)[:30], "ends early (truncated)"),
        ("a.jsonl.gz", b"not gzip at all", "cannot be read (BadGzipFile"),
        ("a.yaml", b"a: [1, 2\n", "not valid YAML"),
    ],
)
def test_a_damaged_file_is_named_with_what_is_wrong_and_what_to_do(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    reader = {"json": read_json, "gz": read_jsonl_gz, "yaml": read_yaml}[name.rsplit(".", 1)[1]]
    with pytest.raises(FileError) as e:
        reader(path, fix="do this")
    assert str(e.value).startswith(f"{path}: {problem}") and str(e.value).endswith("; do this")
    with pytest.raises(FileError, match="missing; do this"):
        reader(tmp_path / "gone" / name, fix="do this")


def test_a_garbage_metrics_line_is_named_by_its_number(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "charts/rew\n{"step": 2}\n')
    with pytest.raises(FileError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        read_metrics(tmp_path)


# --- the lock ---------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    with run_lock(tmp_path / "run", "python -m seal_mini train recipes/x.yaml"):
        holder = json.loads((tmp_path / "run" / ".lock").read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        (tmp_path / "run" / "written.json").write_text("{}")  # a command that wrote (else the folder goes)
        with pytest.raises(FileError) as e, run_lock(tmp_path / "run", "python -m seal_mini report runs/run"):
            pass
    message = str(e.value)
    assert f"in use by pid {os.getpid()} on {socket.gethostname()}" in message
    assert f"running `python -m seal_mini train recipes/x.yaml` since {holder['started']}" in message
    assert (tmp_path / "run" / ".lock").read_text() == ""  # released on the way out
    with run_lock(tmp_path / "run", "again"):  # and free to take
        pass


HOLD_AND_WAIT = """
import sys, time
from seal_mini.runio import run_lock
with run_lock(sys.argv[1], "python -m seal_mini train recipes/x.yaml"):
    open(sys.argv[1] + "/.half.json.1.0123abcd.tmp", "w").write("{")  # a write the kill interrupts
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_warning(tmp_path, capsys):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    with pytest.raises(FileError, match=f"in use by pid {proc.pid}"), run_lock(run_dir, "second"):
        pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with run_lock(run_dir, "third"):
        assert json.loads((run_dir / ".lock").read_text())["command"] == "third"
        assert not (run_dir / ".half.json.1.0123abcd.tmp").exists()  # the killed writer's temporary is gone
    err = capsys.readouterr().err
    assert f"taking over from pid {proc.pid} on {socket.gethostname()}" in err and "ended without releasing" in err


# --- resumable jobs ---------------------------------------------------------------------------------


def test_pieces_of_another_job_are_redone_and_it_says_why(tmp_path, capsys):
    partial = tmp_path / "x.partial"
    identity = {"policy": "p", "generation": {"max_new_tokens": 8}, "task_ids": ["a", "b"]}
    assert open_partial(partial, identity) is False
    write_jsonl_gz(partial / "000000.jsonl.gz", [{"task_id": "a"}])
    assert open_partial(partial, identity) is True
    assert read_pieces(partial) == [{"task_id": "a"}]
    assert open_partial(partial, {**identity, "generation": {"max_new_tokens": 9}}) is False
    assert "what made them differs in generation" in capsys.readouterr().err
    assert read_pieces(partial) == []
    (partial / "identity.json").write_text("{")
    assert open_partial(partial, identity) is False
    assert "their identity.json is damaged" in capsys.readouterr().err


def test_a_damaged_piece_is_redone_with_the_pieces_after_it(tmp_path, capsys):
    for start in (0, 2, 4):
        write_jsonl_gz(tmp_path / f"{start:06d}.jsonl.gz", [{"task_id": start}, {"task_id": start + 1}])
    damaged = tmp_path / "000002.jsonl.gz"
    damaged.write_bytes(damaged.read_bytes()[:20])
    assert read_pieces(tmp_path) == [{"task_id": 0}, {"task_id": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000.jsonl.gz"]
    assert f"{damaged}: ends early (truncated): redoing it and the 1 pieces after it" in capsys.readouterr().err
