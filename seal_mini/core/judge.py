"""The optional small-model part of the diagnoser: a closed-set choice by likelihood, never free text.

The rules (seal_mini.core.diagnose) label every turn from executable evidence. Some failures they cannot
split further: a state mismatch may come from acting on the wrong item, with a wrong value, in the
wrong order, or from a skipped or an extra step. For such ambiguous turns a small causal LM reads a
compact account of the turn and scores each candidate cause's description by the mean log-likelihood
of its tokens after that account; the best-scoring candidate wins. Nothing the model writes is parsed:
it never generates. The pick goes into TurnDiagnosis.detail; the label itself stays the rules' label.

Off by default (diagnosis.small_model). The default model is the frozen base policy with its adapter
disabled, so it costs no extra memory; diagnosis.small_model_name names a separate model instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from seal_mini.config import ConfigError, DiagnosisConfig
from seal_mini.core.diagnose import shorten
from seal_mini.labels import REGISTRY

# The closed sets the small model chooses from are declared with the labels (seal_mini/labels.py): finer
# causes per rule label, each with the description the model scores, and a description of each failure
# label. Descriptions are plain sentences of similar length, so that length does not decide the mean
# log-likelihood.
FINER_LABELS: dict[str, dict[str, str]] = REGISTRY.finer
"""Rule label -> {finer cause: description}."""
LABEL_DESCRIPTIONS: dict[str, str] = REGISTRY.descriptions
"""Failure label -> its description: used to measure how often the small model agrees with the rules
(diagnose-check), never to overrule them."""


def turn_prompt(ev, finding: str = "") -> str:
    """A compact account of one turn (a seal_mini.core.diagnose.TurnEvidence) for the small model."""
    lines = [f"User request: {shorten(ev.record.user_text, 300)}", "Assistant tool calls:"]
    for e in ev.record.events[:8]:
        args = json.dumps(e.arguments) if e.arguments is not None else "?"
        result = e.error if e.error_kind else (e.output or "")
        lines.append(f"- {e.name}({shorten(args, 120)}) -> {shorten(result, 120)}")
    if not ev.record.events:
        lines.append("- (none)")
    if finding:
        lines.append(f"Finding: {finding}")
    lines.append("Most likely cause:")
    return "\n".join(lines)


class LabelJudge:
    """Picks one of a closed set of labels by the likelihood a causal LM gives each label's description."""

    def __init__(
        self,
        model,
        tokenizer,
        adapter_off: Callable[[], contextlib.AbstractContextManager] | None = None,
        max_prompt_tokens: int = 512,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.adapter_off = adapter_off or contextlib.nullcontext
        self.max_prompt_tokens = max_prompt_tokens
        self.turns_judged = 0
        """How many turns this judge was asked about (it runs only on ambiguous ones)."""

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def scores(self, prompt: str, descriptions: list[str]) -> list[float]:
        """Mean log-likelihood of each description's tokens given the prompt.

        The prompt is run once; its KV cache is repeated for the C descriptions, which are then run
        together (right-padded), so the cost is one prompt plus C short continuations."""
        import torch

        from seal_mini.engine.logprobs import right_pad

        prompt_ids = self._ids(prompt)[-self.max_prompt_tokens :]
        tails = [self._ids(" " + d) for d in descriptions]
        if not prompt_ids or any(not t for t in tails):
            raise ValueError("the prompt and every description must tokenize to at least one token")
        device = next(self.model.parameters()).device
        # (C, W): a description's end is followed by masked zeros, which no scored position attends to
        tail_ids = right_pad(tails, torch.long)
        tail_mask = right_pad([[1] * len(t) for t in tails], torch.long)
        # Eval mode for the two forwards: no dropout, and a model that trains with gradient checkpointing
        # would otherwise refuse the KV cache.
        was_training = self.model.training
        self.model.eval()
        try:
            logits, first = self._forward(prompt_ids, tail_ids, tail_mask, device)
        finally:
            self.model.train(was_training)
        logprobs = logits[:, :-1].float().log_softmax(-1)  # (C, W - 1, V)
        out_scores = []
        for i, tail in enumerate(tails):
            rest = logprobs[i, torch.arange(len(tail) - 1), tail_ids[i, 1 : len(tail)].to(device)]  # (len - 1,)
            out_scores.append((first[tail[0]] + rest.sum()).item() / len(tail))
        return out_scores

    def _forward(self, prompt_ids: list[int], tail_ids, tail_mask, device):
        """Logits (C, W, V) of the right-padded descriptions after the prompt, and the prompt's last-token
        log-probabilities (V,), which score each description's first token."""
        import torch

        n, (count, width) = len(prompt_ids), tail_ids.shape
        with torch.no_grad(), self.adapter_off():
            out = self.model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True, logits_to_keep=1)
            first = out.logits[0, -1].float().log_softmax(-1)  # (V,): predicts each description's first token
            cache = out.past_key_values
            cache.batch_repeat_interleave(count)
            attention = torch.cat([torch.ones((count, n), dtype=torch.long), tail_mask], dim=1)
            logits = self.model(
                input_ids=tail_ids.to(device),
                attention_mask=attention.to(device),
                position_ids=(n + torch.arange(width)).expand(count, width).to(device),
                past_key_values=cache,
            ).logits  # (C, W, V): position j predicts tail token j + 1
        return logits, first

    def pick(self, prompt: str, candidates: dict[str, str]) -> tuple[str, dict[str, float]]:
        """The candidate label whose description scores highest, and every candidate's score."""
        if not candidates:
            raise ValueError("pick needs at least one candidate")
        names = list(candidates)
        values = self.scores(prompt, [candidates[n] for n in names])
        scored = dict(zip(names, values, strict=True))
        return max(names, key=lambda n: scored[n]), scored

    def refine(self, diagnoses: list, evidences: list) -> int:
        """Fill `detail` of each ambiguous diagnosis that has a finer closed set; returns how many."""
        judged = 0
        for d in diagnoses:
            options = FINER_LABELS.get(d.label)
            if not d.ambiguous or not options:
                continue
            d.detail, _ = self.pick(turn_prompt(evidences[d.index], f"{d.label} ({d.reason})"), options)
            judged += 1
        self.turns_judged += judged
        return judged


def judge_from_config(cfg: DiagnosisConfig, policy=None, tokenizer=None) -> LabelJudge | None:
    """The small-model judge a recipe asks for, or None when diagnosis.small_model is off."""
    if not cfg.small_model:
        return None
    if cfg.small_model_name:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(cfg.small_model_name)
            model = AutoModelForCausalLM.from_pretrained(cfg.small_model_name)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"diagnosis.small_model_name: cannot load {cfg.small_model_name!r} ({shorten(e, 200)}); "
                "name a local model folder or leave it empty to use the frozen base policy"
            ) from None
        return LabelJudge(model.eval(), tok)
    if policy is None or tokenizer is None:
        raise ConfigError(
            "diagnosis.small_model: with an empty small_model_name the judge is the frozen policy; "
            "pass the policy and its tokenizer"
        )
    # A peft model's disable_adapter() gives the frozen base model without a second copy in memory.
    return LabelJudge(policy, tokenizer, getattr(policy, "disable_adapter", None))


def tiny_random_judge(seed: int = 0) -> LabelJudge:
    """A judge on a tiny random Qwen2 with a word-level tokenizer built offline: shows the mechanism
    (closed set, argmax of scores) at no cost; its picks carry no knowledge."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = set()
    for table in [LABEL_DESCRIPTIONS, *FINER_LABELS.values()]:
        for text in table.values():
            words.update(text.lower().replace(",", " ").replace(".", " ").split())
    words.update("user request assistant tool calls finding most likely cause none".split())
    vocab = {"[PAD]": 0, "[UNK]": 1}
    for w in sorted(words):
        vocab[w] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return LabelJudge(Qwen2ForCausalLM(config).eval(), tok)
