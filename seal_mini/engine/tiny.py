"""`model.name: tiny-random`, built offline in about a second for CPU tests: a byte-level BPE tokenizer
trained on BFCL texts (tool docs, user turns, reference calls), a chat template of our own that renders
tools, and a Qwen2 with random weights (seal_mini/engine/scratch.py builds both). Same seed, same model."""

from __future__ import annotations

import json
from functools import cache

from seal_mini.engine.scratch import MESSAGES_TEMPLATE, chat_tokenizer, random_model, train_tokenizer_json

TINY_VOCAB = 4096
"""BPE vocabulary of the tiny tokenizer (special tokens included)."""

# Like scratch.CHAT_TEMPLATE (prefix-stable, tool results of role "tool"), but the tools are listed in the
# system message as one JSON object a line.
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
    "{%- endif -%}" + MESSAGES_TEMPLATE
)


@cache
def _tiny_tokenizer_json() -> str:
    """The tiny tokenizer as JSON, trained on every tool schema, user turn and reference call of BFCL."""
    from seal_mini.envs.bfcl import load_tasks, to_chat_tool, tool_docs
    from seal_mini.envs.episode import render_new_tools

    tasks = load_tasks()
    texts = set()
    for class_name in sorted({c for t in tasks for c in t.involved_classes}):
        for doc in tool_docs(class_name):
            texts.add(json.dumps(to_chat_tool(doc)["function"]))
    for task in tasks:
        texts.update(m["content"] for turn in task.turns for m in turn)
        texts.update(call for calls in task.ground_truth for call in calls)
        texts.update(render_new_tools(docs) for docs in task.held_out.values())
    return train_tokenizer_json(sorted(texts), TINY_VOCAB, pieces=None)


def tiny_tokenizer():
    """A fresh byte-level BPE tokenizer (4096 ids) with ChatML tokens and a tool-aware chat template."""
    return chat_tokenizer(_tiny_tokenizer_json(), TINY_CHAT_TEMPLATE)


def tiny_model(tokenizer):
    """A Qwen2 causal LM with random weights (about 0.4M parameters), float32."""
    return random_model(tokenizer)
