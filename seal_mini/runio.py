"""The run directory: every file a report needs, written durably and read back through one place.

<out_dir>/<name>/ holds .lock (who is writing into the run now), config.yaml (the resolved config),
split.json, metrics.jsonl (a line per training step), rounds/ (interface, failure profile and rho per step),
trajectories/ (every training trajectory), eval/ (results and their episodes), checkpoint/ (the two newest
steps), adapter/ and report/; docs/run_dir.md describes each and the guarantees kept here.

Writing: a file goes to a uniquely named temporary sibling, is fsynced, renamed over its target and the
folder fsynced, so a kill or a power cut leaves the old file or the new one, never half of one; a folder
(a checkpoint, the adapter) is written whole under a temporary name the same way. A write that fails
(disk full, permission denied) raises FileError naming the path.
Reading: every file the kit reads back goes through `reading`, so a missing or damaged file raises one
FileError naming the file, what is wrong with it and what to do.
One command at a time writes into a run directory (`run_lock`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

import yaml
from safetensors import SafetensorError, safe_open


class FileError(Exception):
    """A file or folder stops a command: missing, damaged, held by another process or not writable.
    The message names it, says what is wrong and what to do; the command line prints it as one line."""


REDO = "delete it and rerun the command that wrote it"
"""What to do about a damaged file that a command can simply write again."""
WRITE_FIX = (
    "free disk space or fix the folder's permissions, then rerun the same command (it continues where it stopped)"
)


# --- reading ----------------------------------------------------------------------------------------


def _problem(e: Exception) -> str:
    """What is wrong with a file, in a few words, from the error its reader raised."""
    if isinstance(e, EOFError):
        return "ends early (truncated)"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at position {e.start})"
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        return f"not valid YAML (line {e.problem_mark.line + 1} column {e.problem_mark.column + 1}: {e.problem})"
    if isinstance(e, yaml.YAMLError):
        return f"not valid YAML ({' '.join(str(e).split())[:160]})"
    if "file not fully covered" in str(e):  # safetensors: the header names more (or fewer) bytes than there are
        return "not as long as its header says (truncated?)"
    if isinstance(e, OSError) and e.strerror:
        return f"cannot be read ({e.strerror})"
    first_sentence = " ".join(str(e).split()).split(". ")[0][:120]
    return f"cannot be read ({type(e).__name__}: {first_sentence})"


@contextlib.contextmanager
def reading(path: Path, fix: str = REDO) -> Iterator[None]:
    """Turn any failure to read or parse `path` inside this block into one FileError that names it.

    The block holds only the read and the parse of one file, so whatever a parser raises there (json,
    yaml, gzip, pickle, torch, safetensors each have their own errors) means the file is damaged."""
    try:
        yield
    except FileNotFoundError as e:
        raise FileError(f"{path}: missing; {fix}") from e
    except Exception as e:
        raise FileError(f"{path}: {_problem(e)}; {fix}") from e


def read_text(path: Path, fix: str = REDO) -> str:
    with reading(path, fix):
        return Path(path).read_bytes().decode("utf-8")


def read_json(path: Path, fix: str = REDO):
    text = read_text(path, fix)
    with reading(path, fix):
        return json.loads(text)


class YamlLoader(yaml.SafeLoader):
    """YAML as a recipe means it. Numbers as YAML 1.2 reads them: PyYAML's YAML 1.1 takes `1e-5` (no dot, no
    sign in the exponent) for a string. A key given twice in one mapping is an error, not the last one winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges, and its keys may be overridden on purpose
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # SafeLoader names an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def load_yaml(text: str):
    """YAML text through YamlLoader (every recipe, override and saved config is read this way)."""
    return yaml.load(text, Loader=YamlLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path, fix: str = REDO):
    text = read_text(path, fix)
    with reading(path, fix):
        return load_yaml(text)


def read_jsonl_gz(path: Path, fix: str = REDO) -> list[dict]:
    with reading(path, fix):
        text = gzip.decompress(Path(path).read_bytes()).decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_torch(path: Path, fix: str = REDO):
    """A torch.save file of our own (optimizer, RNG states): plain Python objects and tensors."""
    import torch

    with reading(path, fix):
        return torch.load(path, weights_only=False)


def read_safetensors(path: Path, fix: str = REDO) -> dict:
    from safetensors.torch import load_file

    with reading(path, fix):
        return load_file(str(path))


def check_model_folder(folder: Path, required: tuple[str, ...], fix: str = REDO) -> None:
    """A saved model or adapter folder, checked before a library loads it (which would fail deep inside,
    or quietly load a tokenizer without its vocabulary): each required file there, every JSON file valid,
    every safetensors file whole. A safetensors header says how long the file is, so this reads only the
    headers; a weights folder names its files in model.safetensors.index.json or holds model.safetensors."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileError(f"{folder}: missing; {fix}")
    weights = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # sharded weights: the shards the index names stand for model.safetensors
        shards = sorted(set(read_json(index, fix).get("weight_map", {}).values()))
        required = tuple(r for r in required if r != "model.safetensors") + tuple(shards)
    for name in required:
        if not (folder / name).is_file():
            raise FileError(f"{folder / name}: missing; {fix}")
    for path in sorted(folder.glob("*.json")):
        read_json(path, fix)
    for path in weights:
        with reading(path, fix), safe_open(str(path), framework="pt"):
            pass  # opening it checks the header and that the file is as long as the header says


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl, one row per training step; a damaged line is named by its number."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fix = "repair or delete that line (the report then lacks that step)"
            raise FileError(f"{path}: line {n} is not valid JSON ({e.msg}); {fix}") from e
    return rows


def missing_outputs(run_dir: Path) -> list[str]:
    """Files a run's own records say it wrote that are not there (paths relative to run_dir): the round and
    the trajectories of every step in metrics.jsonl (written last in a step), the held-in evaluation a step
    records, the trajectories of every finished evaluation (written before its result) and the result of
    every evaluation whose trajectories are there and whose pieces (`<tag>.partial`, removed last) are not.
    `report` and `dataset` name them rather than leave those steps out without a word."""
    run_dir = Path(run_dir)
    missing = []
    for row in read_metrics(run_dir):
        step = row["step"]
        expected = [f"rounds/step_{step:04d}.json", f"trajectories/step_{step:04d}.jsonl.gz"]
        if any(key.startswith("eval/") for key in row):  # an evaluation after the step, tagged by the next step
            expected.append(f"eval/step_{step + 1:04d}.json")
        missing += [name for name in expected if not (run_dir / name).exists()]
    for result in sorted((run_dir / "eval").glob("*.json")):
        episodes = result.with_name(f"{result.stem}.trajectories.jsonl.gz")
        if not episodes.exists():
            missing.append(str(episodes.relative_to(run_dir)))
    for episodes in sorted((run_dir / "eval").glob("*.trajectories.jsonl.gz")):
        tag = episodes.name.removesuffix(".trajectories.jsonl.gz")
        if not episodes.with_name(f"{tag}.json").exists() and not episodes.with_name(f"{tag}.partial").exists():
            missing.append(f"eval/{tag}.json")
    return list(dict.fromkeys(missing))  # a step evaluation gone whole is named once


def names(paths: list[str], shown: int = 6) -> str:
    """A list of paths for one line: the first few, then how many more."""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


# --- writing ----------------------------------------------------------------------------------------


def _write_problem(e: BaseException, folder: Path) -> str:
    """Why a write failed, in plain words. torch and safetensors report a full disk in their own terms
    (torch.save: "[enforce fail at inline_container.cc:672] . unexpected pos 896 vs 790")."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    with contextlib.suppress(OSError):
        if "os error 28" in text or shutil.disk_usage(folder).free < 2**24:  # under 16 MB left: it is the disk
            return "No space left on device (the disk is full)"
    if "unexpected pos" in text or "file write failed" in text:  # torch's stream writer wrote short
        return "the write came up short (is the disk full, or a file size limit reached?)"
    return text[:200]


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failure while writing `path` (disk full, permission denied; torch and safetensors report
    those as their own errors) into a FileError naming it."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:
        raise FileError(f"cannot write {path}: {_write_problem(e, Path(path).parent)}; {WRITE_FIX}") from e


def _temporary(path: Path) -> Path:
    """A sibling name no other writer uses: hidden, with this process's id and a random part."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_path(path: Path) -> None:
    """Make a file's contents durable, or a folder's entries (new names, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # some file systems cannot sync a folder; they have nothing to sync
            raise
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (libraries such as peft and torch write without)."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def make_dirs(folder: Path) -> None:
    """mkdir -p, each new folder's name made durable in its parent (a synced file in a lost folder is lost)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        fsync_path(new.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a uniquely named temporary sibling, fsync it, rename it over the target, fsync the folder."""
    path = Path(path)
    with writing(path):
        make_dirs(path.parent)
        tmp = _temporary(path)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_path(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")


def write_yaml(path: Path, obj) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0))


def write_torch(obj, path: Path) -> None:
    """torch.save of our own objects (optimizer, RNG states), a failure named by the file (read_torch reads it)."""
    import torch

    with writing(path):
        torch.save(obj, path)


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    """Rewrite metrics.jsonl whole (atomically); the loop keeps it short enough for that to be cheap."""
    atomic_write_text(Path(run_dir) / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


@contextlib.contextmanager
def new_dir(final: Path) -> Iterator[Path]:
    """A folder written whole: yields a temporary folder to fill; on success it is made durable and
    renamed to `final` (replacing an older one), on failure removed, leaving what was there before. A
    failed write (as `writing` sees one) raises FileError naming the file under `final` being written."""
    final = Path(final)
    if final.exists() and not final.is_dir():  # it would be renamed aside and lost under a temporary name
        raise FileError(f"{final} is a file, not a folder; name a folder to write into (the file is left as it is)")
    tmp = _temporary(final)
    try:
        with writing(tmp):
            make_dirs(tmp)
        yield tmp
        with writing(final):
            fsync_tree(tmp)
            old = None
            if final.exists():
                old = _temporary(final)
                os.rename(final, old)
            os.rename(tmp, final)
            fsync_path(final.parent)
            if old is not None:
                shutil.rmtree(old)
    except FileError as e:  # a writer inside named its file under the temporary name: name it under final
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileError(str(e).replace(str(tmp), str(final))) from e
    except (OSError, RuntimeError, SafetensorError) as e:  # a library (peft, transformers) writing its files
        name = getattr(e, "filename", None)
        target = str(name).replace(str(tmp), str(final)) if name else str(final)
        target += " (its safetensors weights)" if isinstance(e, SafetensorError) else ""
        problem = _write_problem(e, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileError(f"cannot write {target}: {problem}; {WRITE_FIX}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


TEMPORARY = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp")
"""The names `_temporary` gives."""


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files and folders that writers stopped mid-write left under `folder`.
    Only safe while holding the folder's lock: then no living writer owns any of them."""
    found = sorted(p for p in Path(folder).rglob(".*.tmp") if TEMPORARY.fullmatch(p.name))
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


def move_aside(run_dir: Path) -> Path | None:
    """Move everything in run_dir (but its lock) into a new sibling <name>.old-<time>; returns it."""
    entries = [p for p in Path(run_dir).iterdir() if p.name != LOCK] if Path(run_dir).is_dir() else []
    if not entries:
        return None
    aside = Path(run_dir).with_name(f"{Path(run_dir).name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    with writing(aside):
        aside.mkdir()
        for entry in entries:
            os.rename(entry, aside / entry.name)
        fsync_path(aside)
        fsync_path(Path(run_dir))
    return aside


# --- one writer per run directory -------------------------------------------------------------------

LOCK = ".lock"


def holder_text(holder: dict) -> str:
    pid, host, command, started = (holder.get(k) for k in ("pid", "host", "command", "started"))
    return f"pid {pid} on {host} running `{command}` since {started}"


def _read_holder(fd: int) -> dict | None:
    raw = os.pread(fd, 65536, 0)
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"pid": "?", "host": "?", "command": raw[:80].decode("utf-8", "replace"), "started": "?"}


def writer(run_dir: Path) -> dict | None:
    """The lock record of the command writing into run_dir now, if one is (read only, never locked). A
    record whose process on this host has ended was left by a kill: then no one writes."""
    try:
        holder = json.loads((Path(run_dir) / LOCK).read_text() or "null")
    except (OSError, ValueError):
        return None
    if isinstance(holder, dict) and holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder.get("pid")), 0)
        except ProcessLookupError:
            return None
        except (OSError, TypeError, ValueError):
            pass  # alive under another user, or a record we cannot read a pid from
    return holder if isinstance(holder, dict) else None


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str) -> Iterator[None]:
    """Hold run_dir for one command that writes into it.

    The lock is an flock on run_dir/.lock, which the OS releases when its process ends, however it ends; the
    file records who holds it. A second writer stops at once with a message naming the holder. A record left
    by a process that ended without releasing (kill -9, power cut) is taken over with a warning, and the
    temporary files that process left half-written are removed."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK
    made = not run_dir.exists()
    with writing(path):
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not path.exists() or os.stat(path).st_ino != os.fstat(fd).st_ino:
                # its last holder removed the file (a command refused before writing): lock the one there now
                os.close(fd)
                with writing(path):
                    run_dir.mkdir(parents=True, exist_ok=True)
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for _ in range(50):  # its holder took the lock a moment ago and may still be writing who it is
                holder = _read_holder(fd)
                if holder:
                    break
                time.sleep(0.05)
            holder = holder or {}
            raise FileError(
                f"{run_dir} is in use by {holder_text(holder)}; wait for it to end or stop it "
                f"(kill {holder.get('pid')}), or give this run another name (name=...)"
            ) from None
        except OSError as e:  # a file system without locks (some network ones): say so and carry on
            print(
                f"[lock] cannot lock {path} ({e.strerror}): do not start a second command on this run", file=sys.stderr
            )
        previous = _read_holder(fd)
        if previous is not None:  # its writer was killed: what it left half-written is no one's now
            print(
                f"[lock] {run_dir}: taking over from {holder_text(previous)}, which ended without releasing it",
                file=sys.stderr,
            )
            remove_temporaries(run_dir)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        holder = dict(pid=os.getpid(), host=socket.gethostname(), command=command, started=started)
        with writing(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)
            os.fsync(fd)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # released: an empty record tells the next writer all ended well
            if made and [p.name for p in run_dir.iterdir()] == [LOCK]:  # a command refused before writing
                with contextlib.suppress(OSError):
                    path.unlink()
                    run_dir.rmdir()
    finally:
        os.close(fd)


# --- resumable jobs ---------------------------------------------------------------------------------


def open_partial(partial: Path, identity: dict) -> bool:
    """The folder of a resumable job's finished pieces: kept if this very job made them (same identity: policy,
    adapter, tasks, settings), emptied otherwise, saying why. Returns whether pieces were kept."""
    partial = Path(partial)
    marker = partial / "identity.json"
    identity = json.loads(json.dumps(identity, default=str))  # as it reads back from the file
    if marker.exists():
        saved, why = None, "their identity.json is damaged"
        with contextlib.suppress(FileError):
            saved = read_json(marker)
        if saved == identity:
            return True
        if isinstance(saved, dict):
            differ = sorted(k for k in {*saved, *identity} if saved.get(k) != identity.get(k))
            why = f"what made them differs in {', '.join(differ)}"
        print(f"[eval] redoing the pieces in {partial}: {why}", file=sys.stderr)
    shutil.rmtree(partial, ignore_errors=True)
    write_json(marker, identity)
    return False


def read_pieces(partial: Path, pattern: str = "*.jsonl.gz") -> list[dict]:
    """Rows of a job's finished pieces, in the order they were written (names sort that way).

    A damaged piece is redone, not fatal: it and the pieces written after it are removed, so what is
    kept is always a prefix of the work and new pieces never collide with old names."""
    rows: list[dict] = []
    pieces = sorted(Path(partial).glob(pattern))
    for i, piece in enumerate(pieces):
        try:
            rows += read_jsonl_gz(piece)
        except FileError as e:
            for later in pieces[i:]:
                later.unlink()
            print(
                f"[eval] {str(e).split(';')[0]}: redoing it and the {len(pieces) - i - 1} pieces after it",
                file=sys.stderr,
            )
            break
    return rows


def resume_pieces(partial: Path, identity: dict) -> list[dict]:
    """The rows of a stopped job's finished pieces if this very job made them (open_partial), else none."""
    open_partial(partial, identity)
    return read_pieces(partial)
