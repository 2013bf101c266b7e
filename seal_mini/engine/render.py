"""Messages -> text -> token ids, through BFCL's own prompt code or the tokenizer's chat template.

Four ways to write the prompt (`model.tool_format`):
  bfcl:       BFCL's Qwen FC handler writes it with its own code (seal_mini.envs.harness.bfcl_prompt):
              what BFCL shows a Qwen model, token for token. Needs a ChatML tokenizer.
  bfcl_llama: BFCL's LlamaHandler writes it (seal_mini.envs.harness.llama_prompt): what BFCL shows
              ToolACE-2-8B. Needs a Llama 3 tokenizer.
  template:   the template renders them (`apply_chat_template(tools=...)`, as Qwen2.5, Llama 3.1 and
              ToolACE do);
  prompt:     for templates without tool support, seal_mini writes the tool block into the system
              message and hands tool results back as user messages in <tool_response> tags.
Tools come as BFCL docs or as chat-template dicts (tau2's); the last two modes convert BFCL docs.

The rollout engine never re-tokenizes what the model sampled: `continuation` renders the longer
conversation and tokenizes just the text beyond what the episode's tokens already spell.
"""

from __future__ import annotations

import functools
import json

import jinja2

from seal_mini.config import ConfigError
from seal_mini.envs.bfcl import to_chat_tool
from seal_mini.envs.harness import bfcl_prompt, decode, llama_prompt

KEEP_DEFAULT_SYSTEM = "keep_default_system"
"""Key that marks a system message to be written after the template's default system text (Qwen2.5's
"You are Qwen, ..."), which a plain system message would replace. The training interface marks its note
this way, so a prompt with the note is the prompt without it plus the note, nothing else."""
_MARKER = "SEAL_MINI_MARKER"
_PROBE_TOOLS = [
    to_chat_tool(
        {"name": "probe", "description": "A tool.", "parameters": {"type": "dict", "properties": {}, "required": []}}
    )
]
"""A tool, to learn what a template writes as its default system text when it renders tools."""


class TemplateError(ConfigError):
    """The chat template cannot be used for exact multi-turn rollouts; the message says why."""


GENERATION_PROMPT = "<|im_start|>assistant\n"
"""How BFCL's Qwen handler ends every prompt."""
LLAMA_GENERATION_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"
"""How BFCL's LlamaHandler ends every prompt."""
SPECIAL_TOKENS = {
    "bfcl": ("<|im_start|>", "<|im_end|>"),
    "bfcl_llama": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}
"""What a tokenizer must hold as single tokens for BFCL's prompts."""


def bfcl_text(messages: list[dict], tools: list[dict], add_generation_prompt: bool, next_role: str = "") -> str:
    """BFCL's Qwen prompt for a conversation. BFCL writes only prompts, which end by asking for the next
    message; a conversation that ends with an assistant message is the text of the prompt that would
    follow it, up to what comes next (`next_role`; by default a tool result after a message with calls,
    a user turn after one that ends the turn). What comes next matters: BFCL writes the reasoning of the
    messages since the last user turn, and a new user turn writes them without it."""
    if add_generation_prompt:
        return bfcl_prompt(messages, tools)
    if not messages or messages[-1]["role"] != "assistant":
        return bfcl_prompt(messages, tools).removesuffix(GENERATION_PROMPT)
    role = next_role or ("user" if decode(messages[-1]["content"]).ends_turn else "tool")
    text = bfcl_prompt([*messages, {"role": role, "content": _MARKER}], tools)
    return text[: text.rindex("<|im_start|>user\n" + ("<tool_response>\n" if role == "tool" else "") + _MARKER)]


def llama_text(messages: list[dict], tools: list[dict], add_generation_prompt: bool) -> str:
    """BFCL's LlamaHandler prompt for a conversation; without the generation prompt, the text up to where the
    next message begins (the handler writes a message the same whatever follows it)."""
    text = llama_prompt(messages, tools)
    return text if add_generation_prompt else text.removesuffix(LLAMA_GENERATION_PROMPT)


# --- LEARNER EDIT POINT: the tool block of prompt mode -------------------------------------------
def tool_block(tools: list[dict]) -> str:
    """The tool description seal_mini puts into the system message when the template has no tools."""
    lines = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return (
        "## Tools\n"
        "You can call the tools listed below, one JSON schema a line.\n"
        f"<tools>\n{lines}\n</tools>\n"
        "To call a tool, write a JSON object with the keys name and arguments between tags, like\n"
        '<tool_call>\n{"name": "tool_name", "arguments": {"key": "value"}}\n</tool_call>\n'
        "You may make several calls in one message. Results come back in <tool_response> tags. "
        "When no call is needed, answer in plain text."
    )


def to_prompt_mode(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Messages for a template without tool support: tools in the system message, tool results as a
    user message (consecutive results merged, so roles still alternate)."""
    out: list[dict] = []
    block = tool_block(tools) if tools else ""
    rest = messages
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"] + ("\n\n" + block if block else "")
        rest = messages[1:]
    else:
        system = block
    if system:
        out.append({"role": "system", "content": system})
    for k, m in enumerate(rest):
        wrapped = f"<tool_response>\n{m['content']}\n</tool_response>"
        if m["role"] != "tool":
            out.append({"role": m["role"], "content": m["content"]})
        elif k and rest[k - 1]["role"] == "tool":
            out[-1]["content"] += "\n" + wrapped
        else:
            out.append({"role": "user", "content": wrapped})
    if messages and messages[0].get(KEEP_DEFAULT_SYSTEM) and not block:
        out[0][KEEP_DEFAULT_SYSTEM] = True  # the system message is still the note alone: keep the default before it
    return out


class ChatRenderer:
    """Renders conversations with a tokenizer's chat template and turns text into exact token ids."""

    def __init__(self, tokenizer, tool_format: str = "template", extra_stop_ids: tuple[int, ...] = ()):
        template = tokenizer.chat_template
        if tool_format in SPECIAL_TOKENS:
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in SPECIAL_TOKENS[tool_format]]
            if any(len(i) != 1 for i in ids):
                raise TemplateError(
                    f"model.tool_format={tool_format} writes BFCL's prompt for "
                    f"{'Qwen' if tool_format == 'bfcl' else 'ToolACE-2 (Llama 3)'}, which needs "
                    f"{' '.join(SPECIAL_TOKENS[tool_format])} as tokens; set model.tool_format=template or prompt"
                )
        elif not isinstance(template, str) or not template:
            raise TemplateError(
                "the tokenizer has no chat template (a single string); use an instruct model or set one"
            )
        if tool_format == "template" and "tools" not in template:
            raise TemplateError(
                "model.tool_format=template, but this chat template does not render tools; "
                "set model.tool_format=prompt so seal_mini writes the tool block itself"
            )
        self.tokenizer = tokenizer
        self.tool_format = tool_format
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        # What follows an assistant message's content in the template (e.g. "<|im_end|>\n"): its first
        # token is the end-of-turn token the model samples to stop.
        user = [{"role": "user", "content": "hi"}]
        before = self.render(user, [], add_generation_prompt=True)
        after = self.render(user + [{"role": "assistant", "content": _MARKER}], [])
        if not after.startswith(before + _MARKER):
            raise TemplateError(
                "the chat template does not render an assistant message as the generation prompt followed "
                "by its content, so sampled tokens could not be kept verbatim"
            )
        self.close_text = after[len(before) + len(_MARKER) :]
        self.close_ids = self.encode(self.close_text)
        if not self.close_ids:
            raise TemplateError("the chat template puts no end-of-turn token after an assistant message")
        self.end_of_turn_id = self.close_ids[0]
        self.end_of_turn_text = self.decode([self.end_of_turn_id])
        if not self.close_text.startswith(self.end_of_turn_text):
            raise TemplateError(f"the end of an assistant turn ({self.close_text!r}) does not start with one token")
        self.stop_ids = frozenset({self.end_of_turn_id, *extra_stop_ids, tokenizer.eos_token_id} - {None})
        self.bfcl = bfcl = tool_format in SPECIAL_TOKENS
        """BFCL's handler writes the prompts: each anew, with no default system text."""
        self.default_system = {False: "" if bfcl else self._default_system(None)}
        """The template's default system text, without tools (False) and with them (True); "" if none."""
        if tool_format != "prompt":  # prompt mode never hands the template any tools
            self.default_system[True] = "" if bfcl else self._default_system(_PROBE_TOOLS)

    def render(self, messages: list[dict], tools: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as the model sees it (written as tool_format says)."""
        if self.tool_format == "bfcl":
            return bfcl_text(messages, tools, add_generation_prompt)
        if self.tool_format == "bfcl_llama":
            return llama_text(messages, tools, add_generation_prompt)
        tools = [t if t.get("type") == "function" else to_chat_tool(t) for t in tools or []]  # BFCL docs converted
        if self.tool_format == "prompt":
            messages, tools = to_prompt_mode(messages, tools), None
        if messages and messages[0].get(KEEP_DEFAULT_SYSTEM):
            default, note = self.default_system[bool(tools)], messages[0]["content"]
            messages = [{"role": "system", "content": f"{default}\n\n{note}" if default else note}, *messages[1:]]
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _default_system(self, tools: list[dict] | None) -> str:
        """What the template writes as system text when the conversation has no system message: the text in
        the place a system message's content would take ("" when it writes none there)."""
        user = [{"role": "user", "content": "hi"}]
        try:
            bare = self.tokenizer.apply_chat_template(user, tools=tools, tokenize=False)
            marked = self.tokenizer.apply_chat_template(
                [{"role": "system", "content": _MARKER}, *user], tools=tools, tokenize=False
            )
        except jinja2.TemplateError:  # a template that refuses system messages has no default to keep
            return ""
        if _MARKER not in marked:  # the template ignores system messages
            return ""
        before, after = marked.split(_MARKER, 1)
        if len(bare) < len(before) + len(after) or not (bare.startswith(before) and bare.endswith(after)):
            return ""  # no system text without a system message
        return bare[len(before) : len(bare) - len(after)]

    @functools.cached_property
    def max_token_chars(self) -> int:
        """No token decodes to more characters than this (its vocabulary's longest entry: a byte-level
        entry has a character per byte, and a decoded character is at least a byte). So a text of N
        characters needs at least N / max_token_chars tokens, known before tokenizing it."""
        return max(map(len, self.tokenizer.get_vocab()), default=1) or 1

    def encode(self, text: str) -> list[int]:
        """Token ids of a text; special tokens appear in it as text, so none are added."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """The exact text of token ids (special tokens kept, no clean-up of spaces)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """Token ids of the first prompt, ending with the start of the assistant turn."""
        text = self.render(messages, tools, add_generation_prompt=True)
        ids = self.encode(text)
        # A tokenizer that normalizes (Qwen2's applies NFC) gives back the normalized text: that is
        # what the model reads, and the ids are still exact for it. Anything else is a real mismatch.
        if self.decode(ids) != self.normalized(text):
            raise TemplateError(
                "decoding the prompt's tokens does not give back the prompt text; this tokenizer cannot "
                "keep multi-turn sequences exact (use a byte-level BPE tokenizer such as Qwen's or Llama 3's)"
            )
        return ids

    def normalized(self, text: str) -> str:
        """The text as the tokenizer's normalizer (if any) rewrites it before tokenizing."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        return normalizer.normalize_str(text) if normalizer is not None else text

    def continuation(
        self, ids: list[int], before: list[dict], new: list[dict], tools: list[dict], add_generation_prompt: bool
    ) -> tuple[list[int], bool]:
        """Tokens that extend `ids` (the conversation `before`, as sampled) to `before + new`.

        Returns (ids to append, exact). Exact: decoding the extended ids gives the template's rendering
        of before + new. Not exact: the template rewrote an assistant message it was given (some strip
        whitespace); the sampled tokens stay as they were and the template's framing is appended."""
        current = self.decode(ids)
        target = self.render(before + new, tools, add_generation_prompt)
        if target.startswith(current):
            return self.encode(target[len(current) :]), True
        if self.tool_format == "bfcl":  # the earlier messages as BFCL writes them when `new` follows
            rendered_before = bfcl_text(before, tools, False, new[0]["role"] if new else "")
        else:
            rendered_before = self.render(before, tools)
        cut = rendered_before.rfind(self.end_of_turn_text)
        if not target.startswith(rendered_before) or cut < 0 or not current.endswith(self.end_of_turn_text):
            raise TemplateError(
                "the chat template is not prefix-stable: rendering a conversation and then a longer one "
                "changes the text of the earlier messages, so observation tokens cannot be appended exactly"
            )
        glue = rendered_before[cut + len(self.end_of_turn_text) :]
        return self.encode(glue + target[len(rendered_before) :]), False
