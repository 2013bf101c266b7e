"""Models built from scratch, offline: a byte-level BPE tokenizer trained on a corpus, a chat template
of our own that renders tools, and a Qwen2 with random weights (also the tiny test model's, tiny.py).

`model.name: scratch` builds one from `model.scratch` (sizes) and the run's training tasks, the interface's
cue texts included, so a cue the loop switches on tokenizes as compactly as the rest; the practice recipe
starts from it and the warm start (seal_mini/training/sft.py) trains it. Byte-level BPE decodes any ids back
to the exact text, which the rollout engine relies on. Same corpus, sizes and seed: same tokenizer and weights.
"""

from __future__ import annotations

import json

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]

# The part of both chat templates (this one and seal_mini/engine/tiny.py's) after the system message: every
# other message as <|im_start|>role\ncontent<|im_end|>, then the assistant's opening when asked.
MESSAGES_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if not (loop.first and has_system) -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Our own ChatML-style template with a compact tool block (a line per tool, a line per parameter), so a
# prompt stays a few hundred tokens. Tool results are messages of role "tool". Every message is rendered on
# its own, so a conversation's text is a prefix of a longer one's, which the rollout engine relies on.
CHAT_TEMPLATE = (
    "{%- set has_system = messages|length > 0 and messages[0]['role'] == 'system' -%}"
    "{%- if has_system or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] + '\\n' -}}{%- endif -%}"
    "{%- if tools -%}"
    "{{- 'Tools:\\n' -}}"
    "{%- for tool in tools -%}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool -%}"
    "{%- set p = f['parameters'] if f['parameters'] is defined else {} -%}"
    "{%- set required = p['required'] if p['required'] is defined else [] -%}"
    "{{- '- ' + f['name'] + ': ' + (f['description'] if f['description'] is defined else '') + '\\n' -}}"
    "{%- for name, spec in (p['properties'] if p['properties'] is defined else {}).items() -%}"
    "{%- set kind = (spec['type'] if spec['type'] is defined else 'any') | string -%}"
    "{%- if spec['items'] is defined and spec['items']['type'] is defined -%}"
    "{%- set kind = kind + ' of ' + spec['items']['type'] | string -%}{%- endif -%}"
    "{{- '  ' + name + ' (' + kind + (', required' if name in required else '') + ')' -}}"
    "{%- if spec['description'] is defined and spec['description'] -%}{{- ': ' + spec['description'] -}}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}" + MESSAGES_TEMPLATE
)


PIECES = r"[A-Za-z_]+(?:\.[A-Za-z]+)*|\d+|[^A-Za-z_\d]+"
"""How scratch tokenizers cut text before BPE merges: words (underscores and dotted extensions included:
notes.txt), numbers, and runs of everything else. No piece starts with a space, so a value is the same
tokens wherever it appears (in the user's request, in a call's JSON, in a tool result): copying a value
is copying tokens, which a small model learns far sooner than GPT-2 style pieces (" notes" in a sentence
but "notes" after a quote)."""


def train_tokenizer_json(texts: list[str], vocab_size: int, pieces: str | None = PIECES) -> str:
    """A byte-level BPE (special tokens and the <tool_call> tags included in vocab_size), as JSON.
    pieces: the pre-tokenizer's pattern, or None for GPT-2's (what the tiny test tokenizer uses)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pieces is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        split = pre_tokenizers.Split(Regex(pieces), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TAGS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sorted(set(texts)), trainer)  # sorted: the trainer sees the same stream every time
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return tok.to_str()


def chat_tokenizer(tokenizer_json: str, chat_template: str = CHAT_TEMPLATE):
    """A transformers tokenizer around a trained BPE, with the ChatML tokens and a chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def random_model(
    tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 1, mlp: int = 0
):
    """A Qwen2 causal LM with random weights (float32, eval mode); mlp 0 means 4 x hidden."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp or 4 * hidden,
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


def task_corpus(tasks) -> list[str]:
    """Texts of a task set as the model will see them: each task's ground truth played through the
    environment and rendered by the chat template (framing, tool block, turns, calls in the model's
    format, outputs), and the tool schemas as a miss_func reveal shows them."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from seal_mini.envs.bfcl import to_chat_tool
    from seal_mini.envs.episode import Episode
    from seal_mini.envs.scripted import ground_truth_turns, play

    template = ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)
    texts = []
    for task in tasks:
        env = Episode(task)
        conversation = play(env, ground_truth_turns(task))
        tools = [to_chat_tool(d) for d in task.tools]
        texts.append(template.render(messages=conversation, tools=tools, add_generation_prompt=False))
        docs = list(task.tools) + [d for docs in task.held_out.values() for d in docs]
        texts += [json.dumps(to_chat_tool(d)["function"]) for d in docs]
    return texts
