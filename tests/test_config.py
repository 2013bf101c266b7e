import pytest

from seal_mini.config import DEFAULT_RHO, LABELS, Config, ConfigError, load_config, parse_override

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`


def test_defaults_validate_and_rho_covers_every_label():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert set(cfg.diagnosis.rho) == set(LABELS)
    assert cfg.diagnosis.rho["spurious_tool_call"] == 2.0 and cfg.diagnosis.rho["response_mismatch"] == 0.9


def bounded_fields():
    import dataclasses

    def walk(section, key):
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value):
                yield from walk(value, f"{key}.{f.name}" if key else f.name)
            elif "bound" in f.metadata:
                yield f"{key}.{f.name}" if key else f.name, f.metadata["bound"]

    return list(walk(Config(), ""))


def test_every_declared_range_refuses_a_value_outside_it_in_one_line_naming_the_key():
    fields = bounded_fields()
    assert len(fields) > 45  # the ranges declared with their fields (config.bounded)
    for key, rule in fields:
        bad = {"> 0": 0, ">= 0": -1, "a share in [0, 1]": 1.5}[rule]
        with pytest.raises(ConfigError, match=f"^{key.replace('.', '[.]')}: must be {rule.replace('[', '[[]')}"):
            load_config(overrides=[f"{key}={bad}"])


def test_override_parses_yaml_values():
    assert parse_override("train.steps=4") == {"train": {"steps": 4}}
    cfg = load_config(overrides=["train.steps=4", "interface.enabled=false", "data.categories=[base]"])
    assert cfg.train.steps == 4 and cfg.interface.enabled is False and cfg.data.categories == ["base"]


def test_recipe_base_chain_and_partial_rho(tmp_path):
    (tmp_path / "main.yaml").write_text("name: main\ntrain:\n  steps: 10\n  lr: 2.0e-5\n")
    (tmp_path / "ablate.yaml").write_text("base: main.yaml\nname: ablate\ndiagnosis:\n  rho:\n    pass: 0.8\n")
    cfg = load_config(tmp_path / "ablate.yaml")
    assert (cfg.name, cfg.train.steps, cfg.train.lr) == ("ablate", 10, 2e-5)
    assert cfg.diagnosis.rho["pass"] == 0.8 and cfg.diagnosis.rho["state_mismatch"] == DEFAULT_RHO["state_mismatch"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.stepz=3", "train.stepz: unknown key"),
        ("trian.steps=3", "trian: unknown key"),
        ("train.steps=three", "train.steps: expected an integer"),
        ("train.steps=0", "train.steps: must be > 0"),
        ("rollout.group_size=1", "rollout.group_size"),
        ("model.backend=vllm", "model.backend: must be auto, unsloth or hf"),
        ("diagnosis.rho.bogus=1.0", "diagnosis.rho: unknown label 'bogus'"),
        ("diagnosis.rho.pass=-1", "diagnosis.rho.pass: must be > 0"),
        ("interface.enabled=maybe", "interface.enabled: expected true/false"),
        ("data.categories=[base, web]", "data.categories: unknown category 'web'"),
        ("model.name=scratch", "model.name: scratch is built by the warm start"),
        ("train.mini_batch_tasks=5", "train.mini_batch_tasks: must divide tasks_per_step"),
        ("steps", "expected key.sub=value"),
        ("train.diagnose=false", "train.reweight: needs train.diagnose"),
        ("lora.dropout=0.1", "lora.dropout: must be 0"),
        # no setting means anything at infinity (each passed before, the first failed only after a step)
        ("train.lr=.inf", "train.lr: expected a finite number"),
        ("train.lr=1e999", "train.lr: expected a finite number"),
        ("train.lr=" + "9" * 400, "train.lr: expected a finite number"),
        ("rollout.temperature=.inf", "rollout.temperature: expected a finite number"),
        ("train.kl_coef=.nan", "train.kl_coef: expected a finite number"),
        ("diagnosis.rho.pass=.inf", "diagnosis.rho.pass: expected a finite number"),
        ("diagnosis.w_max=1e999", "diagnosis.w_max: expected a finite number"),
        ("rollout.kv_budget_gb=.inf", "rollout.kv_budget_gb: expected a finite number"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert key in str(e.value)


def test_missing_and_broken_recipes(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(tmp_path / "loop.yaml")


def test_every_recipe_loads_and_validates():
    from pathlib import Path

    recipes = sorted(Path(__file__).resolve().parents[1].glob("recipes/**/*.yaml"))
    names = {load_config(r).name for r in recipes}
    assert len(recipes) >= 9 and len(names) == len(recipes)  # each recipe writes its own run directory
    main = load_config(Path(__file__).resolve().parents[1] / "recipes" / "qwen2_5_3b.yaml")
    assert main.model.name == "Qwen/Qwen2.5-3B-Instruct" and main.model.load_in_4bit
    ablations = {r.stem: load_config(r) for r in recipes if r.parent.name == "ablations"}
    assert ablations["vanilla_rl"].interface.enabled is False and ablations["vanilla_rl"].train.reweight is False
    assert ablations["no_env_adaptation"].interface.enabled is False and ablations["no_env_adaptation"].train.reweight
    assert ablations["no_reweighting"].train.reweight is False and ablations["no_reweighting"].interface.enabled
    assert ablations["no_closed_loop"].interface.closed_loop is False


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.adv_estimator=ppo", "train.adv_estimator: must be grpo, dr_grpo or rloo, not 'ppo'"),
        (
            "train.loss_agg=sum",
            "train.loss_agg: must be token_mean, seq_mean_token_mean or seq_mean_token_sum, not 'sum'",
        ),
        ("train.old_logprobs=fresh", "train.old_logprobs: must be sampled or recompute, not 'fresh'"),
        ("train.token_sum_norm=-1", "train.token_sum_norm: must be >= 0"),
    ],
)
def test_update_switches_name_the_key_and_the_choices(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert message in str(e.value)
    cfg = load_config()  # the defaults are the paper's update
    assert (cfg.train.adv_estimator, cfg.train.loss_agg, cfg.train.old_logprobs) == ("grpo", "token_mean", "sampled")


def test_numbers_read_as_yaml_1_2_reads_them():
    """`1e-5` is the first learning rate anyone types; YAML 1.1 (PyYAML) reads it as a string."""
    cfg = load_config(overrides=["train.lr=1e-5", "train.kl_coef=2E-3", "diagnosis.w_max=+1e0"])
    assert (cfg.train.lr, cfg.train.kl_coef, cfg.diagnosis.w_max) == (1e-5, 2e-3, 1.0)


def test_a_recipes_numbers_read_as_yaml_1_2_reads_them(tmp_path):
    (tmp_path / "r.yaml").write_text("train:\n  lr: 1e-5\n  clip_ratio: .2e0\n")
    cfg = load_config(tmp_path / "r.yaml")
    assert (cfg.train.lr, cfg.train.clip_ratio) == (1e-5, 0.2)


def test_a_key_given_twice_is_an_error(tmp_path):
    (tmp_path / "r.yaml").write_text("train:\n  lr: 1.0e-5\n  steps: 3\n  lr: 2.0e-5\n")
    with pytest.raises(ConfigError, match="duplicate key 'lr'.*line 4"):
        load_config(tmp_path / "r.yaml")


@pytest.mark.parametrize("override", ["name=../escape", "name=a/b", "name=..", "name=.", "name=", "out_dir="])
def test_a_run_directory_stays_inside_out_dir(override):
    with pytest.raises(ConfigError, match=r"^(name|out_dir): must"):
        load_config(overrides=[override])


def test_a_recipe_sets_only_what_it_changes():
    """Every key a recipe sets differs from what its base recipe (or the typed defaults) gives: the defaults
    are the paper's settings, and a recipe reads as the list of its changes."""
    from pathlib import Path

    from seal_mini.config import leaves
    from seal_mini.runio import load_yaml

    for recipe in sorted(Path(__file__).resolve().parents[1].glob("recipes/**/*.yaml")):
        raw = load_yaml(recipe.read_text())
        base = raw.pop("base", None)
        before = leaves(load_config(recipe.parent / base if base else None).to_dict())
        same = [k for k, v in leaves(raw).items() if k != "name" and k in before and before[k] == v]
        assert not same, f"{recipe.name} sets {same} to what {base or 'the defaults'} already give"


def test_a_warm_start_is_refused_under_bfcls_llama_handler():
    """The warm start's demonstrations write <tool_call> JSON, which BFCL's LlamaHandler does not read."""
    with pytest.raises(ConfigError, match="sft.enabled: the warm start's demonstrations write <tool_call> JSON"):
        load_config(overrides=["model.tool_format=bfcl_llama", "sft.enabled=true"])
