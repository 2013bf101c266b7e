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

TINY = ["model.name=tiny-random", "device=cpu", "model.gradient_checkpointing=false"]


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


def test_exported_adapter_loads_in_transformers_and_peft(trained, tmp_path):
    from peft import PeftModel

    cfg, ids, mask, reference = trained
    out = export_adapter(cfg.run_dir, tmp_path / "export")
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "seal_mini_config.yaml"} <= {
        p.name for p in out.iterdir()
    }
    base, _ = load_hf_base(cfg, torch.device("cpu"), torch.float32)
    model = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        got = token_logprobs(model, ids, torch.ones_like(ids), mask)
    assert torch.equal(got, reference)
    card = (out / "README.md").read_text()
    assert "library_name: peft" in card and "| trained adapter | 25.00 |" in card and "| backbone | 0.00 |" in card


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
    if command != "chat" and damaged == "split.json":
        pytest.skip(f"{command} does not read split.json")
    argv = [command, str(run_dir)] + (["--replay", "--scripted", "ground_truth"] if command == "chat" else [])
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 2 and f"{run_dir / damaged}:" in err, err[-1500:]


def test_the_card_of_a_model_built_from_scratch_loads_its_own_tokenizer(tmp_path):
    """AutoTokenizer would rebuild a tokenizer trained here with Qwen's pre-tokenizer (see load_tokenizer)."""
    from seal_mini.programs.export import model_card

    scratch = load_config("recipes/cpu_learn.yaml", [f"out_dir={tmp_path}"])
    for merged in (False, True):
        card = model_card(tmp_path, scratch, "warm_start", merged=merged)
        assert "tokenizer = PreTrainedTokenizerFast.from_pretrained(" in card and "AutoTokenizer" not in card
    assert "tokenizer = AutoTokenizer.from_pretrained(" in model_card(tmp_path, load_config(None, []), "Qwen/x")


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
