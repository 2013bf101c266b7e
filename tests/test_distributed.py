"""Data parallel: N ranks (torchrun, gloo on the CPU) compute what one process computes.

Three tiers: the helpers in one process (where each is the identity); the collectives and the update on
two processes started with torch.multiprocessing, against a one-process reference; and the real command
line under torchrun against `python -m seal_mini` alone: training, held-in and suite evaluation, a rank
killed mid-step, mismatched settings. Every comparison runs both sides with one thread per process, so
what differs is the split over ranks and nothing else (thread counts change matrix rounding)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from seal_mini import distributed
from seal_mini.config import ConfigError, load_config
from seal_mini.engine.sequences import Trajectory, sample_numbers
from seal_mini.runio import read_json, read_jsonl_gz, read_metrics

ROOT = Path(__file__).resolve().parents[1]
ENTRY = str(ROOT / "tests" / "torchrun_entry.py")

# --- one process: every helper is the identity ---------------------------------------------------------------


def test_one_process_has_no_distributed_path():
    assert not dist.is_initialized()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert distributed.rank_positions(5) == [0, 1, 2, 3, 4]
    items = ["a", "b", "c"]
    assert distributed.gather_in_order(items, [0, 1, 2]) == items
    assert distributed.split_work(items, lambda part: [x.upper() for x in part]) == ["A", "B", "C"]
    assert distributed.all_reduce_sum(7) == 7 and distributed.all_reduce_sums({"x": 1.5}) == {"x": 1.5}
    assert distributed.from_rank0(lambda a, b: a + b, 2, 3) == 5
    distributed.check_same("settings", {"anything": 1})  # nothing to compare with


def test_sample_numbers_count_earlier_episodes_of_the_same_task():
    # a step that straddles two epochs holds a task twice: its second group continues the sample numbers
    assert sample_numbers(["a", "a", "b", "b", "a", "a"]) == [0, 1, 0, 1, 2, 3]


def test_rank_prefixed_stream_marks_every_line():
    import io

    out = io.StringIO()
    stream = distributed.RankPrefixed(out, "[rank 1] ")
    stream.write("one\ntw")
    stream.write("o\nthree\n")
    assert out.getvalue() == "[rank 1] one\n[rank 1] two\n[rank 1] three\n"


# --- two processes, torch.multiprocessing -------------------------------------------------------------------


def _join(rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)


def _collectives(rank: int, folder: str) -> None:
    _join(rank, folder)
    try:
        assert distributed.rank_positions(5) == ([0, 2, 4] if rank == 0 else [1, 3])
        local = distributed.rank_positions(5)
        assert distributed.gather_in_order([f"item{p}" for p in local], local) == [f"item{p}" for p in range(5)]
        assert distributed.split_work(list("abcde"), lambda part: [x * 2 for x in part]) == [
            "aa",
            "bb",
            "cc",
            "dd",
            "ee",
        ]
        assert distributed.all_reduce_sum(rank + 1) == 3
        assert distributed.all_reduce_sums({"x": 1.0, f"only{rank}": 2.0}) == {"x": 2.0, "only0": 2.0, "only1": 2.0}
        # gradients: a rank with no data in the mini-batch has no .grad at all and adds zeros
        a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))
        if rank == 0:
            a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), torch.ones(2, 2)
        distributed.all_reduce_gradients([a, b])
        assert torch.equal(a.grad, torch.tensor([1.0, 2.0, 3.0])) and torch.equal(b.grad, torch.ones(2, 2))
        # rank 0 decides, every rank gets its result, or its error
        assert distributed.from_rank0(lambda: f"decided by {distributed.rank()}") == "decided by 0"
        with pytest.raises(ConfigError, match="only rank 0 saw this"):
            distributed.from_rank0(_fail_on_rank0)
        distributed.check_same("settings", {"train": {"lr": 0.01}})
        with pytest.raises(ConfigError, match=r"rank 1 runs with other settings than rank 0 \(train\.lr: 0\.02"):
            distributed.check_same("settings", {"train": {"lr": 0.01 if rank == 0 else 0.02}})
        dist.barrier()  # leave together: tearing down while the other rank still talks can abort it
    finally:
        dist.destroy_process_group()


def _fail_on_rank0():
    raise ConfigError("only rank 0 saw this")


def test_collectives_on_two_processes(tmp_path):
    mp.spawn(_collectives, args=(str(tmp_path),), nprocs=2, join=True)


class Recorder:
    """An optimizer that records the gradient each step would apply (and applies nothing)."""

    def __init__(self, params):
        self.params, self.grads = params, []

    def step(self):
        self.grads.append([p.grad.clone() for p in self.params])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


class NoSchedule:
    """A learning-rate schedule that never moves."""

    def step(self):
        pass

    def get_last_lr(self):
        return [0.0]


UPDATE = [
    "model.name=tiny-random",
    "device=cpu",
    "model.gradient_checkpointing=false",
    "rollout.group_size=2",
    "train.tasks_per_step=4",
    "train.mini_batch_tasks=2",
    "train.micro_batch=1",
    "train.kl_coef=0.01",
]


def _round(policy, n_tasks: int, group_size: int) -> tuple[list[Trajectory], torch.Tensor]:
    """A round of made-up trajectories (random ids, one that sampled nothing) and advantages, from a seed."""
    g = torch.Generator().manual_seed(1)
    trajs = []
    for i in range(n_tasks * group_size):
        n = 20 + 7 * i
        mask = [0] * 6 + [int(x) for x in (torch.rand(n - 6, generator=g) < 0.6)]
        if i == 3:
            mask = [0] * n  # a prompt over the limit: no sampled token, no loss
        old = [float(-8 + torch.randn(1, generator=g)) if m else 0.0 for m in mask]
        ids = torch.randint(0, len(policy.tokenizer), (n,), generator=g).tolist()
        trajs.append(Trajectory(f"t{i // group_size}", None, ids, mask, old, 6, False, [], []))
    return trajs, torch.randn(len(trajs), generator=g)


def _update_on_rank(rank: int, folder: str, nan_on_rank_1: bool = False) -> None:
    """One update of the made-up round on this rank's share; its gradients and metrics go to rank{rank}.pt.
    nan_on_rank_1: episode 7, rank 1's and in mini-batch 1 (episodes 4-7), gets a NaN advantage there alone."""
    from seal_mini.engine.policy import load_policy
    from seal_mini.training.update import update

    _join(rank, folder)
    try:
        cfg = load_config(overrides=UPDATE)
        policy = load_policy(cfg, banner=False)
        perturb(policy)
        trajs, adv = _round(policy, cfg.train.tasks_per_step, cfg.rollout.group_size)
        G = cfg.rollout.group_size
        local = [k * G + s for k in distributed.rank_positions(cfg.train.tasks_per_step) for s in range(G)]
        if nan_on_rank_1 and rank == 1:
            adv[7] = float("nan")
        recorder = Recorder(policy.trainable_parameters())
        metrics = update(policy, recorder, NoSchedule(), [trajs[i] for i in local], adv[local], cfg, positions=local)
        torch.save({"grads": recorder.grads, "metrics": metrics}, f"{folder}/rank{rank}.pt")
        dist.barrier()  # leave together: tearing down while the other rank still talks can abort it
    finally:
        dist.destroy_process_group()


def perturb(policy) -> None:
    """LoRA B starts at zero, which makes half the gradients zero; give every weight a value."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_two_ranks_sum_to_the_one_process_gradient(tmp_path):
    """Four tasks, two per mini-batch, over two ranks: each mini-batch's gradient is rank 0's part plus rank 1's,
    and one episode sampled nothing. Every optimizer step sees the gradient one process computes."""
    from seal_mini.engine.policy import load_policy
    from seal_mini.training.update import update

    mp.spawn(_update_on_rank, args=(str(tmp_path),), nprocs=2, join=True)
    two = torch.load(tmp_path / "rank0.pt")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config(overrides=UPDATE)
        policy = load_policy(cfg, banner=False)
        perturb(policy)
        trajs, adv = _round(policy, cfg.train.tasks_per_step, cfg.rollout.group_size)
        recorder = Recorder(policy.trainable_parameters())
        metrics = update(policy, recorder, NoSchedule(), trajs, adv, cfg)
    finally:
        torch.set_num_threads(threads)

    assert len(recorder.grads) == len(two["grads"]) == 2  # two mini-batches, two optimizer steps
    worst = 0.0
    for ours, theirs in zip(recorder.grads, two["grads"], strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.abs().max() > 0
            worst = max(worst, float((a - b).abs().max() / a.abs().max()))
    print(f"largest gradient difference, relative to the tensor's largest entry: {worst:.2e}")
    assert worst < 1e-5
    assert metrics.keys() == two["metrics"].keys()
    for k, v in metrics.items():
        assert math.isclose(v, two["metrics"][k], rel_tol=1e-5, abs_tol=1e-9), k


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """Rank 1 alone has a NaN advantage in mini-batch 1: both ranks skip that step and take mini-batch 0's,
    with the same gradient."""
    mp.spawn(_update_on_rank, args=(str(tmp_path), True), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for r in ranks:
        assert r["metrics"]["losses/optimizer_steps"] == 1 and r["metrics"]["losses/skipped_steps"] == 1
        assert len(r["grads"]) == 1
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["grads"][0], ranks[1]["grads"][0], strict=True))
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


# --- the command line under torchrun ---------------------------------------------------------------------------

RECIPE = {
    "device": "cpu",
    "model": {"name": "tiny-random", "gradient_checkpointing": False},
    # five tasks, at most four a step: an epoch is two steps, of 2 and 3 tasks, so the steps differ in size
    # and the ranks' shares too (1 + 1, then 2 + 1); step 2 starts the next epoch, in its own order
    "data": {"max_train_tasks": 5, "max_eval_tasks": 6},
    # one episode per forward pass, on one rank as on two: the sampling-time log-probs then do not depend on
    # how many episodes a rank generates together (matrix kernels round differently for other batch sizes,
    # and Adam turns that rounding into weight differences of 1e-4 where a gradient is near zero), so the
    # runs can be compared bit for bit
    "rollout": {"group_size": 2, "max_new_tokens": 8, "max_concurrent": 1},
    "eval": {"limits": "rollout"},
    "train": {
        "steps": 3,
        "tasks_per_step": 4,
        "mini_batch_tasks": 2,
        "micro_batch": 2,
        "lr": 0.01,
        "kl_coef": 0.01,
        "eval_every": 2,
        "print_samples": 0,
    },
    "interface": {"min_count": 1, "min_prevalence": 0.0},
    "diagnosis": {"rho_update": "ema"},  # rho moves every step, so it is compared at every step
}


def seal(args: list[str], ranks: int, **env) -> subprocess.CompletedProcess:
    """`python -m seal_mini ARGS` (through the test entry), alone or under torchrun with `ranks` processes."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    command = (launcher if ranks > 1 else [sys.executable]) + [ENTRY, *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)


def recipe(folder: Path, **sections) -> Path:
    data = {**RECIPE, "out_dir": str(folder / "runs"), **sections}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dp")
    path = recipe(folder)
    proc = seal(["train", str(path), "name=one"], 1, SEAL_TEST_FAKE_SCORE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder, path


def compare_runs(a: Path, b: Path, steps: int) -> float:
    """Assert two run directories hold the same run; returns the adapters' largest difference."""
    rows_a, rows_b = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == list(range(steps))
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            if k.startswith("time/"):
                continue
            if k.startswith("losses/") or k == "policy/entropy_estimate":  # sums in another order
                assert math.isclose(ra[k], rb[k], rel_tol=1e-4, abs_tol=1e-7), (ra["step"], k, ra[k], rb[k])
            else:  # rewards, advantages, weights, label counts, rho, cues, eval: exactly
                assert ra[k] == rb[k], (ra["step"], k)
    assert any(r["losses/grad_norm"] > 0 for r in rows_a) and any(0 < r["charts/reward"] < 1 for r in rows_a)
    for step in range(steps):  # the interface, C_t and rho of every round; every trajectory
        name = f"step_{step:04d}"
        assert read_json(a / "rounds" / f"{name}.json") == read_json(b / "rounds" / f"{name}.json")
        assert read_jsonl_gz(a / "trajectories" / f"{name}.jsonl.gz") == read_jsonl_gz(
            b / "trajectories" / f"{name}.jsonl.gz"
        )
    assert read_jsonl_gz(a / "eval" / "step_0002.trajectories.jsonl.gz") == read_jsonl_gz(
        b / "eval" / "step_0002.trajectories.jsonl.gz"
    )
    wa, wb = (load_file(str(r / "adapter" / "adapter_model.safetensors")) for r in (a, b))
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def test_two_ranks_train_as_one_process(one_process_run):
    folder, path = one_process_run
    proc = seal(
        ["train", str(path), "name=two"], 2, SEAL_TEST_FAKE_SCORE="1", SEAL_TEST_GUARD=str(folder / "runs" / "two")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[ranks] 2 processes (gloo, CPU)" in proc.stdout
    diff = compare_runs(folder / "runs" / "one", folder / "runs" / "two", 3)
    print(f"adapter max abs difference, 2 ranks vs 1 process: {diff:.2e}")
    assert diff < 2e-5


def test_a_killed_rank_stops_the_job_and_a_rerun_continues(one_process_run):
    folder, path = one_process_run
    run = folder / "runs" / "killed"
    proc = seal(["train", str(path), "name=killed"], 2, SEAL_TEST_FAKE_SCORE="1", SEAL_TEST_KILL="1:2")
    assert proc.returncode != 0
    # torchrun's failure summary names the killed rank (as the root cause, or beside rank 0's own error when
    # rank 0 stopped first: which one it observes first is a race)
    summary = proc.stderr[proc.stderr.index("Failures:") :]
    killed = [f for f in summary.split("\n[")[1:] if "rank      : 1 (local_rank: 1)" in f]
    assert killed and "SIGKILL" in killed[0], summary
    assert [p.name for p in sorted((run / "checkpoint").iterdir())] == ["step_0001", "step_0002"]
    assert [r["step"] for r in read_metrics(run)] == [0, 1]

    # the rerun continues from the last checkpoint, here in one process (any number of ranks will do)
    proc = seal(["train", "--resume", str(run)], 1, SEAL_TEST_FAKE_SCORE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has a checkpoint of step 2: continuing that run" in proc.stdout
    diff = compare_runs(folder / "runs" / "one", run, 3)
    assert diff < 2e-5


def test_mismatched_settings_are_refused(one_process_run):
    folder, path = one_process_run
    proc = seal(["train", str(path), "name=mixed"], 2, SEAL_TEST_OVERRIDE="1:train.lr=0.02")
    assert proc.returncode != 0
    assert "rank 1 runs with other settings than rank 0 (config.train.lr: 0.02 (rank 0: 0.01))" in proc.stderr
    assert not (folder / "runs" / "mixed" / "checkpoint").exists()


def test_two_ranks_evaluate_as_one_process(tmp_path):
    """Held-in evaluation of the backbone, and the suites with their scripted policies (BFCL V4 memory, whose
    prerequisite conversations rank 0 plays alone, and tau2): the same rows in the same order."""
    path = recipe(tmp_path, ood={"memory_backends": ["kv"], "memory_scenarios": ["notetaker"], "max_tasks": 3})
    commands = {
        "held_in": [],
        "memory": ["--suite", "bfcl_v4_memory", "--scripted", "memorize", "--tag", "memory"],
        "tau2": ["--suite", "tau2", "--scripted", "replay", "--tag", "tau2"],
    }
    for ranks in (1, 2):
        name = f"eval{ranks}"
        for what, options in commands.items():
            guard = {"SEAL_TEST_GUARD": str(tmp_path / "runs" / name)} if ranks > 1 else {}
            proc = seal(["eval", *options, str(path), f"name={name}"], ranks, **guard)
            assert proc.returncode == 0, (what, proc.stderr[-3000:])
    one, two = tmp_path / "runs" / "eval1" / "eval", tmp_path / "runs" / "eval2" / "eval"
    for tag in ("base", "memory", "tau2"):
        assert read_json(one / f"{tag}.json") == read_json(two / f"{tag}.json"), tag
        rows = untimed(read_jsonl_gz(one / f"{tag}.trajectories.jsonl.gz"))
        assert rows == untimed(read_jsonl_gz(two / f"{tag}.trajectories.jsonl.gz")), tag
    assert read_json(one / "base.json")["n_tasks"] == 6
    assert read_json(one / "memory.json")["scores"]["memory_kv"] > 0  # answers from the memory rank 0 built
    assert read_json(one / "tau2.json")["mean"] == 1.0


def test_the_write_guard_of_these_tests_catches_a_write(tmp_path):
    """The guard the torchrun tests put on ranks 1.. (SEAL_TEST_GUARD) does refuse writes, reads pass."""
    (tmp_path / "old.txt").write_text("x")
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'tests'); import torchrun_entry as e; "
        f"folder = Path({str(tmp_path)!r}); e.guard_writes(folder); (folder / 'old.txt').read_text(); "
        "(folder / 'new.txt').write_text('y')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "PermissionError: rank 0 wrote into the run directory" in proc.stderr
    assert not (tmp_path / "new.txt").exists()


def untimed(value):
    """`value` without tau2's wall-clock message timestamps (two runs on one rank differ in them too)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value
