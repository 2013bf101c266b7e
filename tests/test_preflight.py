"""preflight at a shrunk scale on CPU: the recipe's architecture with random weights through the real
engine and update; known shapes; clear exits when a recipe does not fit (out-of-memory injected)."""

import json
from pathlib import Path

import pytest
import torch

from seal_mini.checks import preflight
from seal_mini.config import ConfigError, load_config
from seal_mini.engine.rollout import kv_bytes_per_token
from seal_mini.envs.splits import load_split


def run(capsys, *argv) -> tuple[int, list[str], dict]:
    code = preflight.main(["recipes/qwen2_5_3b.yaml", *argv])
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    return code, [line for line in (out.out + out.err).splitlines() if line.startswith("[")], json.loads(lines[-1])


def test_preflight_runs_the_recipe_at_a_shrunk_scale_on_cpu(capsys):
    code, lines, result = run(capsys, "rollout.group_size=4")
    print("\n".join(lines))
    assert code == 0 and result["fits"] and result["problems"] == []
    assert result["recipe_model"] == "Qwen/Qwen2.5-3B-Instruct" and result["device"] == "cpu"
    r = result["rollout"]
    assert r["episodes"] == 8 and r["groups"] == 2 and r["out_of_memory"] == 0
    assert r["longest_tokens"] > 900 >= r["typical_tokens"]  # one group grew to max_total_tokens (16384 / 16)
    assert r["prefill_tok_per_s"] > 0 and r["decode_tok_per_s"] > 0 and r["slots"] >= 1
    assert result["update_max"]["tokens"] == r["longest_tokens"] and result["update_typical"]["tok_per_s"] > 0
    p = result["projection"]
    assert p["run_h"] > 0 and p["eval_episodes"] == 400 * (5 + 2)  # 5 evaluations during 78 steps, then 2
    assert any(line.startswith("[device] cpu") for line in lines)  # the start banner
    assert any("shrunk scale" in line for line in lines)


def inject(monkeypatch, rows: int, update: bool):
    """Every forward with more than `rows` sequences (or, with update=True, every training forward) runs
    out of memory, as on a card that is too small."""
    from test_rollout import OutOfMemoryAbove

    import seal_mini.engine.policy as policy_module

    real = policy_module.load_policy

    def load(cfg, banner=True):
        policy = real(cfg, banner)
        OutOfMemoryAbove(policy.model, rows=rows)
        if update:
            decoder = policy.model.get_base_model().model

            def in_training(module, args, kwargs):
                if torch.is_grad_enabled():
                    raise torch.OutOfMemoryError("CUDA out of memory (injected)")

            decoder.register_forward_pre_hook(in_training, with_kwargs=True)
        return policy

    monkeypatch.setattr(policy_module, "load_policy", load)


def test_a_wave_that_runs_out_of_memory_names_the_setting_that_fit(capsys, monkeypatch):
    inject(monkeypatch, rows=2, update=False)
    code, lines, result = run(capsys, "rollout.group_size=4", "rollout.max_concurrent=8")
    assert code == 1 and not result["fits"] and result["rollout"]["out_of_memory"] >= 1
    assert any("does not fit: rollout:" in line and "rollout.max_concurrent=2" in line for line in lines)


def test_an_update_that_never_fits_names_the_sequence_length(capsys, monkeypatch):
    inject(monkeypatch, rows=10**6, update=True)
    code, lines, result = run(capsys, "rollout.group_size=4")
    assert code == 1 and not result["fits"]
    assert any("does not fit" in line and "rollout.max_total_tokens" in line for line in lines)


def test_known_shapes_match_the_published_sizes():
    from transformers import AutoConfig, AutoModelForCausalLM

    # (parameters in billions, KV bytes per token in bf16: layers x KV heads x 128 x 2 x 2)
    expected = {
        "Qwen/Qwen2.5-3B-Instruct": (3.09, 36 * 2 * 128 * 4),
        "Qwen/Qwen2.5-7B-Instruct": (7.62, 28 * 4 * 128 * 4),
        "Team-ACE/ToolACE-2-Llama-3.1-8B": (8.03, 32 * 8 * 128 * 4),
    }
    for name, (billions, kv) in expected.items():
        config = AutoConfig.for_model(**preflight.KNOWN_SHAPES[name])
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        assert round(params / 1e9, 2) == billions, name
        assert kv_bytes_per_token(config, torch.bfloat16) == kv, name


def test_unknown_model_and_gpu_cap_on_cpu_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="model.name: preflight knows"):
        preflight.architecture(load_config(None, ["model.name=someone/unknown-model"]), shrink=False)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    local = preflight.architecture(load_config(None, [f"model.name={tmp_path}"]), shrink=False)
    assert local["model_type"] == "llama" and local["hidden_size"] == 64
    with pytest.raises(ConfigError, match="--gpu-mem-gb: needs a CUDA GPU"):
        preflight.preflight(load_config("recipes/qwen2_5_3b.yaml", ["device=cpu"]), gpu_mem_gb=16)


def test_a_local_folder_saved_by_transformers_5_shrinks_to_a_buildable_shape(tmp_path):
    """Its config.json lists a type per layer (layer_types): the shrunk shape keeps one per layer it keeps."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    Qwen2Config(**{**preflight.KNOWN_SHAPES["Qwen/Qwen2.5-3B-Instruct"], "model_type": "qwen2"}).save_pretrained(
        tmp_path
    )
    assert len(json.loads((tmp_path / "config.json").read_text())["layer_types"]) == 36
    shape = preflight.architecture(load_config(None, [f"model.name={tmp_path}"]), shrink=True)
    assert shape["num_hidden_layers"] == 2 and shape["layer_types"] == ["full_attention"] * 2
    keep = {
        k: v for k, v in shape.items() if k not in ("architectures", "torch_dtype", "dtype", "transformers_version")
    }
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**keep))  # raised before: 2 layers, 36 types
    assert len(model.model.layers) == 2


SHIPPED = sorted(str(p) for p in (*Path("recipes").glob("*.yaml"), *Path("recipes/ablations").glob("*.yaml")))


@pytest.mark.parametrize("recipe", SHIPPED)
def test_every_shipped_recipe_has_a_shape(recipe):
    cfg = load_config(recipe)
    shape = preflight.architecture(cfg, shrink=False)
    assert shape["model_type"] in ("qwen2", "qwen3", "qwen3_5_text", "llama") and shape["num_hidden_layers"] >= 1
    if cfg.model.name == "scratch":  # the recipe's own sizes, not a stand-in's
        s = cfg.model.scratch
        assert (shape["hidden_size"], shape["num_hidden_layers"], shape["num_key_value_heads"]) == (
            s.hidden,
            s.layers,
            s.kv_heads,
        )


@pytest.mark.parametrize(
    "recipe, overrides",
    [
        ("recipes/cpu_smoke.yaml", []),
        (
            "recipes/cpu_learn.yaml",
            ["train.tasks_per_step=2", "train.mini_batch_tasks=2", "rollout.group_size=4", "train.micro_batch=4"],
        ),
    ],
)
def test_the_kits_own_models_run_at_the_recipes_own_scale(capsys, recipe, overrides):
    code = preflight.main([recipe, "cpu_threads=1", *overrides])
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    cfg = load_config(recipe, overrides)
    assert code == 0 and result["fits"] and "shrunk scale" not in out, out[-2000:]
    r = result["rollout"]
    assert r["episodes"] == 2 * cfg.rollout.group_size and r["out_of_memory"] == 0
    # the recipe's lengths: one group grows towards max_total_tokens, the others are as long as its tasks
    assert cfg.rollout.max_total_tokens // 2 < r["longest_tokens"] <= cfg.rollout.max_total_tokens
    assert r["typical_tokens"] < cfg.rollout.max_prompt_tokens
    held_in = len(load_split(cfg)["eval"])
    every = cfg.train.eval_every
    during = len([s for s in range(1, cfg.train.steps) if s % every == 0])
    assert result["projection"]["eval_episodes"] == min(held_in, cfg.data.max_eval_tasks or held_in) * (during + 2)
