"""Supervised fine-tuning: the warm start that RL begins from. `python -m seal_mini sft RECIPE`.

Demonstrations are episodes of the training tasks played through the real environment: the ground truth,
one call per message (an agent reads each result before its next call), then a short final answer;
turns whose ground truth makes no call get a short reply instead (ask for the missing value, say the
tool is missing). A controlled share of the turns carries a fault instead (sft.faults: kind -> share),
built by the same fault builders `diagnose-check` proves the diagnoser on, so the warm start fails in
ways the diagnoser names. Every demonstration is diagnosed, and the label counts are saved with it.
A share of the demonstrations (sft.cue_share) is played through the training interface in a random
state, so the model has seen the texts the interface may add before RL switches them on.

Token path. A demonstration's tokens are laid down the way the rollout engine lays down an episode:
the chat template's prompt, each assistant message as its tokens plus the end-of-turn token (loss on
these: what the model must learn to sample), then whatever the template puts next (tool results, the
next user turn, the next generation prompt; no loss). So the masks and templates are the ones RL uses.

The loss is the mean negative log-likelihood of the assistant tokens (seal_mini.engine.logprobs: the LM head
only runs where the mask is 1). A model built from scratch trains all its weights (sft.full); a
pretrained one can train a LoRA adapter that is merged in at the end. The warm start is saved as a
plain model folder with its tokenizer in <run_dir>/warm_start, with identity.json (what built it) and
sft.json (its numbers); a run whose identical warm start already exists there, or in a sibling run
directory, reuses it. An interrupted build starts over (it takes minutes).
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from seal_mini.config import FAULT_KINDS, Config, ConfigError, SftConfig
from seal_mini.core.diagnose import diagnose
from seal_mini.core.faults import BUILDERS, FAULTS, plan, turn_messages
from seal_mini.core.interface import COMPONENTS, GUIDELINES, SCHEMA_TRIGGERS, Interface, InterfaceState, shown_texts
from seal_mini.distributed import is_main
from seal_mini.engine.logprobs import right_pad, token_logprobs
from seal_mini.engine.policy import SCRATCH, WARM_START, add_lora, load_backbone, warm_start_dir
from seal_mini.engine.scratch import task_corpus
from seal_mini.envs import practice, world
from seal_mini.envs.bfcl import Task
from seal_mini.envs.episode import Episode
from seal_mini.envs.scripted import DONE_TEXT
from seal_mini.envs.splits import load_split, pick
from seal_mini.envs.toolcalls import format_call
from seal_mini.labels import REGISTRY
from seal_mini.runio import new_dir, read_json, write_json

assert set(FAULT_KINDS) <= set(BUILDERS), (
    "config.FAULT_KINDS must be fault kinds seal_mini.core.faults builds (BUILDERS)"
)

ABSTAIN_TEXT = "I need more details or another tool to do that."
"""The demonstrations' reply on a turn whose ground truth makes no call."""
FORMAT = 3
"""Version of how demonstrations are made; part of a warm start's identity (bump it when they change).
3: cues drawn from their own stream before the faults, which follow them with sft.cue_compliance."""


# --- demonstrations ---------------------------------------------------------------------------------


def cue_shares(
    faults: dict[str, float],
    cues: InterfaceState | None,
    compliance: float,
    side_effect: float = SftConfig.cue_side_effect,
) -> dict[str, float]:
    """The share of each fault kind in a demonstration shown `cues`, for a backbone that follows cues to degree
    c = compliance (sft.cue_compliance): a fault whose label a shown cue addresses (the label's guideline, or
    the schema cues for argument and format failures) is (1 - c) times as likely; one a shown guideline
    raises (its side effect) is 1 + side_effect * c times as likely (sft.cue_side_effect). c = 0, or no cue
    shown: the shares as given, so cues predict nothing."""
    if cues is None or not cues.active or not compliance:
        return dict(faults)
    addressed = {GUIDELINES[g][0] for g in cues.guidelines} | (set(SCHEMA_TRIGGERS) if cues.schema_cues else set())
    raised = {kind for g in cues.guidelines for kind in REGISTRY.raises.get(g, ())}
    out = {}
    for kind, share in faults.items():
        if FAULTS[kind][0] in addressed:
            share *= 1.0 - compliance
        if kind in raised:
            share = min(1.0, share * (1.0 + side_effect * compliance))
        out[kind] = share
    return out


def demo_turns(
    task: Task,
    faults: dict[str, float],
    rng: random.Random,
    cues: InterfaceState | None = None,
    compliance: float = 0.0,
    per_episode: bool = False,
    side_effect: float = SftConfig.cue_side_effect,
    draws: dict[str, float] | None = None,
) -> tuple[list[list[str]], list[str]]:
    """Assistant messages per turn, and the fault kind of each turn ("" where none): the ground truth,
    except where a fault kind that can be made at a turn is drawn (first kind in sft.faults order), with
    the shares the cues shown give (cue_shares). per_episode (sft.fault_draw: episode): each kind is drawn
    once for the whole demonstration, then shown wherever it can be made; `draws` gives those draws' uniform
    numbers (sft.fault_draw: task, task_draws) instead of rng. With error feedback shown, a
    drawn fault that leaves an error unrepaired is shown repaired instead with probability c
    (labels.Fault.repaired_as)."""
    p = plan(task)
    shares = cue_shares(faults, cues, compliance, side_effect)
    if per_episode:
        traits = {kind: (draws[kind] if draws else rng.random()) < share for kind, share in shares.items()}
    else:
        traits = None
    repairs = cues is not None and cues.error_feedback and compliance > 0
    messages, kinds = [], []
    for turn, calls in enumerate(p):
        blocks, kind = [format_call(c.name, c.arguments) for c in calls], ""
        for candidate, share in shares.items():
            built = BUILDERS[candidate](task, p, turn, rng)
            if built is not None and (traits[candidate] if traits is not None else rng.random() < share):
                blocks, kind = built[0], candidate
                repaired_as = REGISTRY.repairs.get(candidate)
                if repairs and repaired_as and rng.random() < compliance:
                    repaired = BUILDERS[repaired_as](task, p, turn, rng)
                    if repaired is not None:
                        blocks, kind = repaired[0], repaired_as
                break
        final = DONE_TEXT if calls or blocks else ABSTAIN_TEXT
        messages.append(turn_messages(blocks, final=final))
        kinds.append(kind)
    return messages, kinds


def task_draws(key: str, kinds, k: int, n: int, one: bool = False) -> dict[str, float]:
    """The uniform numbers of the k-th of a task's n demonstrations, one per fault kind, spread over the n
    (stratified): a kind of share s is drawn in s x n of them, rounded up or down, where independent draws
    may give any number from none to all, so a task's own demonstrations do not make its tendency
    all-or-nothing. one (sft.fault_draw: one): a single number per demonstration, the kinds' shares laid end
    to end over [0, 1) in sft.faults order, so a demonstration draws at most one kind and a task's
    demonstrations split between the kinds in their shares."""

    def stratified(name: str) -> float:  # the k-th of n numbers, one in each n-th of [0, 1), in a seeded order
        rng = random.Random(f"{key}:{name}")
        return (rng.sample(range(n), n)[k] + rng.random()) / n

    if not one:
        return {kind: stratified(kind) for kind in kinds}
    u, start, draws = stratified("one"), 0.0, {}
    for kind, share in kinds.items():
        draws[kind] = u - start if u >= start else 1.0  # below its share exactly inside its own stretch
        start += share
    return draws


@dataclass
class Demonstration:
    task_id: str
    input_ids: list[int]
    loss_mask: list[int]
    """1 on the assistant's tokens (what the model must learn to produce), 0 elsewhere."""
    faults: list[str]
    """Fault kind per turn ("" = the ground truth)."""
    labels: list[str]
    """The diagnoser's label per turn."""
    cues: bool = False
    """Played through the training interface with some cues on."""


def random_cues(rng: random.Random, top_k: int) -> InterfaceState:
    """An interface state as the training loop may switch on: each component on with probability one half,
    a random handful (up to top_k) of the guidelines in random order."""
    guidelines = rng.sample(sorted(GUIDELINES), rng.randint(0, min(top_k, len(GUIDELINES))))
    return InterfaceState(**{name: rng.random() < 0.5 for name in COMPONENTS}, guidelines=guidelines)


def demonstrate(
    task: Task, turns: list[list[str]], renderer, max_calls_per_turn: int = 20, cues: InterfaceState | None = None
) -> tuple:
    """Play scripted assistant messages through a fresh episode (seen through the training interface in
    state `cues`, if given), laying down tokens as the rollout engine does, in one sequence: under BFCL's
    prompts a message BFCL's history writes otherwise (a fault written one-line or fenced) does not begin a
    new segment here (sequences.py), and its demonstration goes on from the template's framing. Returns
    (episode, input_ids, loss_mask, conversation)."""
    episode = Episode(task, max_calls_per_turn)
    env = Interface(episode, cues) if cues is not None and cues.active else episode
    messages, tools = env.reset()
    conversation = [dict(m) for m in messages]
    ids = renderer.prompt_ids(messages, tools)
    mask = [0] * len(ids)
    for texts in turns:
        for text in texts:
            sampled = renderer.encode(text) + [renderer.end_of_turn_id]
            ids, mask = ids + sampled, mask + [1] * len(sampled)
            conversation.append({"role": "assistant", "content": text})
            result = env.step(text)
            new, _ = renderer.continuation(ids, conversation, result.observation, tools, not result.done)
            ids, mask = ids + new, mask + [0] * len(new)
            conversation += [dict(m) for m in result.observation]
            if result.turn_done:  # a message without a call ends the turn (so may a broken call)
                break
        if episode.done:
            break
    return episode, ids, mask, conversation


def build_demonstrations(cfg: Config, tasks: list[Task], renderer) -> tuple[list[Demonstration], dict]:
    """sft.demos_per_task demonstrations per task, each with its own seeded fault draws; and their counts."""
    out, skipped = [], 0
    limit = cfg.sft.max_tokens or cfg.rollout.max_total_tokens
    for k in range(cfg.sft.demos_per_task):
        for task in tasks:
            rng = random.Random(f"sft:{cfg.seed}:{task.id}:{k}")
            # the cues come from a stream of their own: with cue_compliance 0 the faults are the same whatever
            # the cues, and cue_share changes only the texts shown
            cue_rng = random.Random(f"sft-cues:{cfg.seed}:{task.id}:{k}")
            cues = random_cues(cue_rng, cfg.interface.top_k) if cue_rng.random() < cfg.sft.cue_share else None
            draw, draws = cfg.sft.fault_draw, None
            if draw in ("task", "one"):
                draws = task_draws(
                    f"sft-draws:{cfg.seed}:{task.id}", cfg.sft.faults, k, cfg.sft.demos_per_task, draw == "one"
                )
            turns, kinds = demo_turns(
                task, cfg.sft.faults, rng, cues, cfg.sft.cue_compliance, draw != "turn", cfg.sft.cue_side_effect, draws
            )
            env, ids, mask, _ = demonstrate(task, turns, renderer, cfg.env.max_calls_per_turn, cues)
            if len(ids) > limit:
                skipped += 1
                continue
            out.append(Demonstration(task.id, ids, mask, kinds, diagnose(env), cues is not None and cues.active))
    stats = {
        "demonstrations": len(out),
        "left_out_too_long": skipped,
        "with_a_fault": sum(any(d.faults) for d in out),
        "with_cues": sum(d.cues for d in out),
        "turns": sum(len(d.faults) for d in out),
        "faulted_turns": dict(Counter(k for d in out for k in d.faults if k)),
        "labels": dict(Counter(z for d in out for z in d.labels)),
        "tokens": sum(len(d.input_ids) for d in out),
        "assistant_tokens": sum(sum(d.loss_mask) for d in out),
    }
    return out, stats


# --- the model ---------------------------------------------------------------------------------------


def sft_loss(model, demos: list[Demonstration], device, chunk: int) -> tuple[torch.Tensor, dict]:
    """Mean negative log-likelihood of the assistant tokens of a batch (right-padded)."""
    ids = right_pad([d.input_ids for d in demos], torch.long)
    attention = right_pad([[1] * len(d.input_ids) for d in demos], torch.long)
    mask = right_pad([d.loss_mask for d in demos], torch.float32)
    ids, attention, mask = ids.to(device), attention.to(device), mask.to(device)
    logp = token_logprobs(model, ids, attention, mask, chunk)  # (B, T), 0 where mask is 0
    n = mask.sum()
    loss = -(logp * mask).sum() / n
    return loss, {"sft/loss": float(loss.detach()), "sft/tokens": float(n)}


def _schedule(step: int, total: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def epoch_batches(lengths: list[int], batch: int, rng: random.Random) -> list[list[int]]:
    """One epoch: every index once, in batches of similar length (less padding), in random order.
    Shuffled, cut into pools of 8 batches, each pool sorted by length and cut into batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), 8 * batch):
        pool = sorted(order[start : start + 8 * batch], key=lambda i: lengths[i])
        batches += [pool[k : k + batch] for k in range(0, len(pool), batch)]
    rng.shuffle(batches)
    return batches


def train_model(model, demos: list[Demonstration], cfg: Config, device) -> list[dict]:
    """sft.epochs passes over the demonstrations, shuffled per epoch with the run seed; returns the log.
    A bar shows the steps (loss, ETA); each epoch ends with one line of its mean loss."""
    sc = cfg.sft
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=sc.lr, weight_decay=sc.weight_decay)
    lengths = [len(d.input_ids) for d in demos]
    per_epoch = math.ceil(len(demos) / sc.batch)
    total = max(1, round(sc.epochs * per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _schedule(s, total, sc.warmup_steps))
    batches: list[list[int]] = []
    log = []
    model.train()
    started = time.perf_counter()
    bar = tqdm(total=total, desc="sft", unit="step", disable=not is_main())
    for step in range(total):
        if not batches:  # a new epoch, in its own seeded order
            batches = epoch_batches(lengths, sc.batch, random.Random(f"sft-order:{cfg.seed}:{step // per_epoch}"))
        batch = [demos[i] for i in batches.pop()]
        loss, metrics = sft_loss(model, batch, device, cfg.train.logprob_chunk)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        log.append({"step": step, **metrics, "sft/grad_norm": float(grad_norm), "sft/lr": scheduler.get_last_lr()[0]})
        bar.set_postfix_str(f"loss {metrics['sft/loss']:.4f}", refresh=False)
        bar.update(1)
        if not batches or step == total - 1:  # an epoch ends (the last may be cut short: sft.epochs is a float)
            epoch = [r["sft/loss"] for r in log[step - step % per_epoch :]]
            tqdm.write(
                f"[sft] epoch {step // per_epoch + 1}/{math.ceil(total / per_epoch)}: mean loss "
                f"{sum(epoch) / len(epoch):.4f} ({time.perf_counter() - started:.0f}s)"
            )
    bar.close()
    model.eval()
    return log


# --- the stage ---------------------------------------------------------------------------------------


def demonstrated_tasks(cfg: Config) -> list[Task]:
    """The tasks the warm start learns from: the training split, or (practice, sft.tasks_per_category) a
    larger pool of generated training-side tasks that starts with it."""
    if cfg.data.source == "practice" and cfg.sft.tasks_per_category:
        return pick(practice.demo_ids(cfg), cfg.data.max_train_tasks)
    return pick(load_split(cfg)["train"], cfg.data.max_train_tasks)


def warm_start_config(cfg: Config) -> Config:
    """The config the warm start is built with: the run's, with sft.seed as its seed when one is set."""
    return cfg if cfg.sft.seed < 0 else dataclasses.replace(cfg, seed=cfg.sft.seed)


def identity(cfg: Config) -> dict:
    """Everything a warm start depends on: the same identity gives the same weights."""
    from seal_mini.engine.policy import resolve_device  # looked up when called, so a test can stand in a GPU

    cfg = warm_start_config(cfg)
    d = cfg.to_dict()
    device = resolve_device(cfg.device).type
    if cfg.data.source != "tasks":  # a world's keys say nothing about another source's warm start (the shipped one)
        d["data"] = {k: v for k, v in d["data"].items() if k not in ("tasks_file", "tool_classes")}
    return {
        "format": FORMAT,
        "seed": cfg.seed,
        "device": device,
        # on a CPU the thread setting changes the rounding of the backward pass, and 1200 steps grow it into
        # another model (measured: cpu_threads 0, 1, 2, 3, 4 gave five different losses by the second step)
        "cpu_threads": cfg.cpu_threads if device == "cpu" else None,
        **{k: d[k] for k in ("model", "data", "env")},
        "sft": {k: v for k, v in d["sft"].items() if k != "seed"},  # the seed it gives is "seed" above
        "lora": d["lora"] if not cfg.sft.full else None,
        "interface_top_k": cfg.interface.top_k if cfg.sft.cue_share else None,
        "logprob_chunk": cfg.train.logprob_chunk,
        "max_grad_norm": cfg.train.max_grad_norm,
        **({"world": world.fingerprint(cfg)} if cfg.data.source == "tasks" else {}),  # the files, not their names
        **({"practice_world": practice.fingerprint(cfg)} if cfg.data.source == "practice" else {}),
    }


def run_sft(cfg: Config) -> Path:
    """Build the warm start into <run_dir>/warm_start (replacing what is there) and return that folder."""
    out = warm_start_dir(cfg)
    cfg = warm_start_config(cfg)
    started = time.perf_counter()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tasks = demonstrated_tasks(cfg)
    corpus = task_corpus(tasks) + shown_texts() if cfg.model.name == SCRATCH else []  # its tokenizer's texts
    model, tokenizer, renderer, device = load_backbone(cfg, corpus)
    demos, stats = build_demonstrations(cfg, tasks, renderer)
    if not demos:
        raise ConfigError("sft: no demonstration fits sft.max_tokens (0: rollout.max_total_tokens); raise it")
    print(
        f"[sft] {stats['demonstrations']} demonstrations ({stats['with_a_fault']} with a fault), "
        f"{stats['tokens']} tokens, {stats['assistant_tokens']} of them the assistant's; labels {stats['labels']}"
    )
    if cfg.sft.full:
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        model = add_lora(model, cfg)
    log = train_model(model, demos, cfg, device)
    if not cfg.sft.full:  # the trained weights as one plain model: the LoRA adapter merged into its base
        if getattr(model, "is_loaded_in_4bit", False) or getattr(model.get_base_model(), "is_loaded_in_4bit", False):
            raise ConfigError(
                "sft.full=false with a 4-bit base: the adapter cannot be merged into quantized weights here; "
                "set model.load_in_4bit=false for the sft stage"
            )
        model = model.merge_and_unload()

    seconds = round(time.perf_counter() - started, 1)
    with new_dir(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "sft.json", {"stats": stats, "log": log, "seconds": seconds})
        write_json(tmp / "identity.json", identity(cfg))
    print(f"[sft] warm start saved to {out} ({seconds}s)")
    return out


SHIPPED = Path(__file__).resolve().parents[2] / "recipes" / "warm_starts"
"""Warm starts the kit ships, each what `sft` built for a recipe (recipes/warm_starts/<recipe>/), so that a
first run of that recipe copies it instead of spending minutes building it; a recipe whose identity
differs in any setting builds its own, and `sft --rebuild` always builds."""


def copy_identical(cfg: Config, candidates: list[Path]) -> bool:
    """Copy the first warm start among `candidates` (their identity.json files) built with this run's identity
    into the run's warm-start folder; False where none is identical."""
    out, want = warm_start_dir(cfg), identity(cfg)
    for other in candidates:
        if other.parent != out and read_json(other) == want:
            with new_dir(out) as tmp:
                shutil.copytree(other.parent, tmp, dirs_exist_ok=True)
            source = other.parent if other.parent.parent == SHIPPED else other.parent.parent  # a run's, or shipped
            print(f"[sft] reusing the identical warm start of {source}")
            return True
    return False


def ensure_warm_start(cfg: Config, continuing: bool = False) -> Path:
    """The run's warm start: kept if built with this identity, copied from a sibling run directory or from the
    shipped warm starts (SHIPPED) where one is identical, else built now. A continuing run (continuing=True:
    it has a checkpoint) keeps the one its adapter was trained on, even where a setting a resume may change
    (cpu_threads, train.logprob_chunk) now names another."""
    out, want = warm_start_dir(cfg), identity(cfg)
    if (out / "identity.json").exists() and (continuing or read_json(out / "identity.json") == want):
        return out
    siblings = sorted(Path(cfg.out_dir).glob(f"*/{WARM_START}/identity.json"))
    if copy_identical(cfg, [*siblings, *sorted(SHIPPED.glob("*/identity.json"))]):
        return out
    return run_sft(cfg)
