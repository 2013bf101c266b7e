"""export: the adapter (and the merged model) load back and give the run's own log-probs."""

import json
from pathlib import Path

import pytest
import torch

from seal_mini.config import ConfigError, load_config
from seal_mini.engine.device import DTYPES
from seal_mini.engine.logprobs import token_logprobs
from seal_mini.engine.policy import load_hf_base, load_policy, save_adapter
from seal_mini.programs.export import export_adapter, export_merged, main
from seal_mini.runio import write_json, write_yaml

TINY = ["model.name=tiny-random", "device=cpu", "model.gradient_checkpointing=false", "eval.limits=rollout"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run directory whose adapter is far from the identity (random LoRA B), with held-in results."""
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(overrides=TINY + [f"out_dir={out}", "name=tiny"])
    policy = load_policy(cfg)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    save_adapter(policy, cfg.run_dir / "adapter")
    write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())
    for tag, mean in (("base", 0.0), ("adapter", 0.25)):
        write_json(cfg.run_dir / "eval" / f"{tag}.json", {"tag": tag, "success": {"base": mean, "mean": mean}})
    ids = torch.randint(5, len(policy.tokenizer) - 5, (2, 40), generator=generator)
    mask = torch.ones_like(ids, dtype=torch.float32)
    mask[:, :8] = 0
    with torch.no_grad():
        reference = token_logprobs(policy.model, ids, torch.ones_like(ids), mask)
    with torch.no_grad(), policy.reference():
        backbone = token_logprobs(policy.model, ids, torch.ones_like(ids), mask)
    assert (reference - backbone).abs().max() > 0.1  # the adapter really changes the model
    return cfg, ids, mask, reference


def test_exported_adapter_loads_in_transformers_and_peft(trained, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM, PeftModel

    cfg, ids, mask, reference = trained
    out = export_adapter(cfg.run_dir, tmp_path / "export")
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "seal_mini_config.yaml", "base"} <= {
        p.name for p in out.iterdir()
    }
    base, _ = load_hf_base(cfg, torch.device("cpu"), torch.float32)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        got = token_logprobs(model, ids, torch.ones_like(ids), mask)
    assert torch.equal(got, reference)
    # tiny-random exists only in the kit: its weights travel in base/, named so that peft finds them from anywhere
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        out.resolve() / "base"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    model = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        got = token_logprobs(model, ids, torch.ones_like(ids), mask)
    assert (got - reference).abs().max() < 1e-5
    card = (out / "README.md").read_text()
    assert "library_name: peft" in card and "| trained adapter | 25.00 |" in card and "| backbone | 0.00 |" in card
    assert "on BFCL V3 multi-turn tool-use tasks" in card and "The base is in `base/` beside this card" in card


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 0.1)])
def test_merged_model_loads_without_peft_and_gives_the_same_logprobs(trained, tmp_path, dtype, tolerance):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, ids, mask, reference = trained
    merged = export_merged(cfg.run_dir, tmp_path / "merged", dtype=dtype)
    model = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    assert model.dtype == DTYPES[dtype]
    assert AutoTokenizer.from_pretrained(str(merged)).chat_template  # the template travels with it
    with torch.no_grad():
        got = token_logprobs(model.float(), ids, torch.ones_like(ids), mask)
    gap = float((got - reference).abs().max())
    print(f"merged {dtype}: max |log-prob gap| {gap:.2e} over {int(mask.sum())} tokens")
    assert gap < tolerance
    stated = (merged / "README.md").read_text().split(f"Merged in float32 and saved in {dtype}: ")[1]
    stated = float(stated.split("by at most ")[1].split(". ")[0])  # measured running in `dtype`, as a server does
    assert stated < 1e-4 if dtype == "float32" else 1e-3 < stated < 1.0


def test_export_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no config.yaml"):
        main([str(tmp_path)])
    cfg = load_config(overrides=TINY + [f"out_dir={tmp_path}", "name=unfinished"])
    write_yaml(cfg.run_dir / "config.yaml", cfg.to_dict())
    with pytest.raises(ConfigError, match="no trained adapter .*train --resume"):
        main([str(cfg.run_dir)])


def test_hub_is_only_reached_when_asked(trained, tmp_path, monkeypatch):
    calls = []

    class FakeApi:
        def create_repo(self, repo, **kwargs):
            calls.append(("create", repo))

        def upload_folder(self, folder_path, repo_id, **kwargs):
            calls.append(("upload", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    cfg = trained[0]
    assert main([str(cfg.run_dir), "--out", str(tmp_path / "a")]) == 0
    assert calls == []
    assert main([str(cfg.run_dir), "--out", str(tmp_path / "b"), "--push-to-hub", "someone/seal"]) == 0
    assert calls[0] == ("create", "someone/seal") and calls[1][:2] == ("upload", "someone/seal")
    assert "adapter_model.safetensors" in calls[1][2]
    assert json.loads((tmp_path / "b" / "adapter_config.json").read_text())["peft_type"] == "LORA"


def test_export_never_deletes_a_folder_that_is_not_an_export(trained, tmp_path):
    cfg = trained[0]
    victim = tmp_path / "notes"
    victim.mkdir()
    (victim / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds something other than an export; .* --force"):
        main([str(cfg.run_dir), "--out", str(victim)])
    assert (victim / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="holds something other than an export"):
        main([str(cfg.run_dir), "--out", str(tmp_path / "a"), "--merged", str(victim)])
    assert (victim / "notes.txt").read_text() == "mine" and not (tmp_path / "a").exists()
    out = export_adapter(cfg.run_dir, tmp_path / "again")
    assert export_adapter(cfg.run_dir, out) == out  # an earlier export is replaced whole
    assert main([str(cfg.run_dir), "--out", str(victim), "--force"]) == 0
    assert not (victim / "notes.txt").exists() and (victim / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("command", ["export", "dataset", "chat"])
@pytest.mark.parametrize("damaged", ["config.yaml", "split.json"])
def test_a_damaged_run_file_is_one_line_for_the_tools_that_read_a_run(trained, tmp_path, capsys, command, damaged):
    import shutil

    from seal_mini.__main__ import main as cli

    cfg = trained[0]
    run_dir = tmp_path / "copy"
    shutil.copytree(cfg.run_dir, run_dir)
    write_json(run_dir / "split.json", {"train": [], "eval": ["multi_turn_base_0"]})
    (run_dir / damaged).write_text("{ not: [valid")
    if command == "dataset" and damaged == "split.json":
        pytest.skip(f"{command} does not read split.json")
    argv = [command, str(run_dir)] + (["--replay", "--scripted", "ground_truth"] if command == "chat" else [])
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 2 and f"{run_dir / damaged}:" in err, err[-1500:]


def test_the_card_says_what_the_run_trained_on_and_scored(tmp_path):
    from seal_mini.programs.export import model_card

    practice = load_config("recipes/cpu_learn.yaml", [f"out_dir={tmp_path}"])
    success = {"base": 0.2, "miss_func": 0.1, "miss_param": 0.3, "long_context": 0.5, "mean": 0.275}
    write_json(practice.run_dir / "eval" / "adapter.json", {"tag": "adapter", "n_tasks": 600, "success": success})
    card = model_card(practice.run_dir, practice, str(tmp_path / "export" / "base"), beside={"llama": True})
    assert "## Held-in practice tasks (success, %)" in card and "not BFCL V3 itself" in card
    assert "| trained adapter | 20.00 | 10.00 | 30.00 | 50.00 | 27.50 |" in card and "Over 600 held-in tasks" in card
    assert "BFCL V3 multi-turn" not in card and "- bfcl" not in card and "base_model:" not in card  # no hub base
    assert "A small Qwen2 built from scratch, warm-started by supervised fine-tuning" in card
    assert 'AutoTokenizer.from_pretrained("<this folder>/base")' in card and "LlamaForCausalLM" in card
    bfcl = model_card(tmp_path, load_config(None, []), "Qwen/Qwen2.5-3B-Instruct")
    assert "base_model: Qwen/Qwen2.5-3B-Instruct" in bfcl and "## Held-in BFCL V3 multi-turn tasks" in bfcl


def test_the_merged_model_decodes_as_the_run_in_a_fresh_process_from_another_folder(trained, tmp_path):
    """transformers alone (no seal_mini, another cwd): AutoTokenizer gives the run's token ids, and greedy
    decoding gives the tokens the run's own policy writes. The tiny tokenizer was trained here, so the
    folder holds the model in its Llama form (AutoTokenizer would rebuild a qwen2 model's tokenizer)."""
    import subprocess
    import sys

    from seal_mini.engine.policy import TOKENIZER_PROBE
    from seal_mini.envs.bfcl import tasks_by_id
    from seal_mini.envs.episode import Episode

    cfg = trained[0]
    merged = export_merged(cfg.run_dir, tmp_path / "merged")
    assert json.loads((merged / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    policy = load_policy(load_config(overrides=TINY + [f"lora.adapter_path={cfg.run_dir / 'adapter'}"]), banner=False)
    messages, tools = Episode(tasks_by_id()["multi_turn_base_3"]).reset()  # a prompt with digits, JSON, tools
    text, prompt = (
        policy.renderer.render(messages, tools, add_generation_prompt=True),
        policy.renderer.prompt_ids(messages, tools),
    )
    with torch.no_grad():
        out = policy.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
        )
    write_json(
        tmp_path / "run.json",
        {
            "text": text,
            "prompt": prompt,
            "probe": policy.renderer.encode(TOKENIZER_PROBE),
            "probe_text": TOKENIZER_PROBE,
            "new": out[0, len(prompt) :].tolist(),
        },
    )
    fresh = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
run = json.load(open(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(sys.argv[1])
prompt = tok.encode(run["text"], add_special_tokens=False)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                     max_new_tokens=12, do_sample=False)
print(json.dumps({"probe": tok.encode(run["probe_text"], add_special_tokens=False), "prompt": prompt,
                  "new": out[0, len(prompt):].tolist()}))
"""
    (tmp_path / "elsewhere").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", fresh, str(merged), str(tmp_path / "run.json")],
        cwd=tmp_path / "elsewhere",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got, want = json.loads(done.stdout.strip().splitlines()[-1]), json.loads((tmp_path / "run.json").read_text())
    assert got["probe"] == want["probe"] and got["prompt"] == want["prompt"]
    assert got["new"] == want["new"] and len(got["new"]) > 0


@pytest.mark.parametrize("command", ["chat", "eval --adapter", "export"])
@pytest.mark.parametrize("part", ["adapter_config.json", "adapter_model.safetensors"])
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_adapter_is_one_line_and_never_copied(trained, tmp_path, capsys, command, part, damage):
    import shutil

    from seal_mini.__main__ import main as cli

    run_dir = tmp_path / "copy"
    shutil.copytree(trained[0].run_dir, run_dir)
    write_json(run_dir / "split.json", {"train": [], "eval": ["multi_turn_base_0"]})
    write_json(tmp_path / "ids.json", ["multi_turn_base_0"])
    path = run_dir / "adapter" / part
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()
    argv = {
        "chat": ["chat", str(run_dir), "--replay"],
        "eval --adapter": ["eval", *TINY, f"out_dir={tmp_path}", "--adapter", str(run_dir / "adapter")]
        + ["--ids", str(tmp_path / "ids.json")],
        "export": ["export", str(run_dir), "--out", str(tmp_path / "out")],
    }[command]
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and part in err, err[-1500:]
    assert not (tmp_path / "out").exists()
