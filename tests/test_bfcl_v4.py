"""BFCL V4 memory and web search: BFCL's data, back ends, snapshots and agentic checker, offline."""

import socket
import string

import pytest

from seal_mini.config import ConfigError, load_config
from seal_mini.evaluation.agents import ScriptedAgent
from seal_mini.evaluation.bfcl_v4 import SCRIPTED, evaluate_bfcl_v4, memory_tasks, scripted_agent
from seal_mini.evaluation.ood import ACTIVE, REFUSED, NetworkRefused
from seal_mini.runio import read_json, read_jsonl_gz

# The built-in ood defaults (all scenarios, all questions, kv + rec_sum + vector, which is skipped: no
# embedder given), not cpu_smoke's, which trims them for the pipeline.
CFG = load_config()


def run(mode, tmp_path, tag=None, cfg=CFG, **kwargs):
    return evaluate_bfcl_v4(scripted_agent(mode), cfg, tmp_path, tag or mode, progress=False, **kwargs)


NOTETAKER = load_config(overrides=["ood.memory_backends=[kv,rec_sum]", "ood.memory_scenarios=[notetaker]"])


def test_memory_data_as_bfcl_lays_it_out(tmp_path):
    chains, questions = memory_tasks("memory_kv", tmp_path)
    assert len(questions) == 155 and {q.scenario for q in questions} == set(chains)
    assert [len(chains[s]) for s in ("customer", "student", "finance", "healthcare", "notetaker")] == [10, 10, 7, 5, 5]
    first = chains["customer"][0].task
    assert first.id == "memory_kv_prereq_0-customer-0" and first.involved_classes == ["MemoryAPI_kv"]
    assert questions[0].task.id == "memory_kv_0-customer-0" and questions[0].answers == ["Michael"]
    # a few questions still cover every scenario (round robin), and only their chains run
    chains, questions = memory_tasks("memory_kv", tmp_path, max_questions=5)
    assert sorted(q.scenario for q in questions) == sorted(chains) and len(chains) == 5


def test_answer_replay_scores_100_and_empty_0_on_every_question(tmp_path):
    answer, empty = run("answer", tmp_path), run("empty", tmp_path)
    assert answer["scores"] == {"memory_kv": 1.0, "memory_rec_sum": 1.0} and answer["total"]["memory_kv"] == 155
    assert empty["scores"] == {"memory_kv": 0.0, "memory_rec_sum": 0.0} and empty["mean"] == 0.0
    assert "memory_vector" in answer["skipped"] and "embedding_model" in answer["skipped"]["memory_vector"]
    assert read_json(tmp_path / "answer.json") == answer and not (tmp_path / "answer.partial").exists()
    rows = read_jsonl_gz(tmp_path / "empty.trajectories.jsonl.gz")
    assert sum(r["prereq"] for r in rows) == 2 * 37 and all(r["error_type"] for r in rows if not r["prereq"])


def test_memory_carries_facts_from_the_conversations_to_the_questions(tmp_path):
    """A policy that only stores what it hears and answers with what a search returns scores only
    through the back ends' own snapshots; without the conversations it scores nothing."""
    with_memory = run("memorize", tmp_path, "with", cfg=NOTETAKER)
    final = tmp_path / "with.memory" / "memory_kv" / "agentic" / "memory" / "kv" / "memory_snapshot"
    assert (final / "notetaker_final.json").is_file()  # written by BFCL's back end, inside the run dir
    # the same tag again without the conversations: the memory they left must not leak into it
    without = run("memorize", tmp_path, "with", cfg=NOTETAKER, run_prereqs=False)
    assert with_memory["total"] == {"memory_kv": 25, "memory_rec_sum": 25}
    assert with_memory["scores"]["memory_kv"] >= 0.2 and with_memory["scores"]["memory_rec_sum"] >= 0.4
    assert without["scores"] == {"memory_kv": 0.0, "memory_rec_sum": 0.0}
    print(f"memorize on notetaker: {with_memory['scores']} with the conversations, {without['scores']} without")


def test_a_model_runs_both_phases_through_the_rollout_engine(tmp_path):
    from seal_mini.engine.policy import load_policy
    from seal_mini.evaluation.agents import ModelAgent

    cfg = load_config(
        "recipes/cpu_smoke.yaml",
        ["ood.memory_backends=[kv]", "ood.max_tasks=2", "ood.memory_scenarios=[notetaker]", "rollout.max_new_tokens=8"],
    )
    policy = load_policy(cfg)
    result = evaluate_bfcl_v4(ModelAgent(policy, cfg, adapter=False), cfg, tmp_path, "base", progress=False)
    assert result["total"] == {"memory_kv": 2} and 0.0 <= result["scores"]["memory_kv"] <= 1.0
    assert result["policy"] == "tiny-random" and result["user_simulator"] is None
    rows = read_jsonl_gz(tmp_path / "base.trajectories.jsonl.gz")
    assert [r["prereq"] for r in rows] == [True] * 5 + [False] * 2
    for row in rows:
        assert row["messages"][0]["role"] == "system" and row["n_sampled"] > 0
    question = rows[-1]["messages"][0]["content"]
    assert "Core Memory" in question and "'answer'" in question  # BFCL's memory and answer-format prompts


def test_resume_reuses_finished_pieces(tmp_path, monkeypatch):
    import seal_mini.evaluation.bfcl_v4 as v4

    monkeypatch.setattr(v4, "CHUNK", 10)
    agent = scripted_agent("answer")
    real_run, calls = agent.run, []

    def dies_after_the_chains_and_one_piece(envs, progress=None):
        if not envs[0].item.prereq:
            calls.append(len(envs))
            if len(calls) == 2:
                raise KeyboardInterrupt
        return real_run(envs, progress)

    cfg = load_config(overrides=["ood.memory_backends=[kv]", "ood.max_tasks=25"])
    agent.run = dies_after_the_chains_and_one_piece
    with pytest.raises(KeyboardInterrupt):
        evaluate_bfcl_v4(agent, cfg, tmp_path, "r", progress=False)
    assert (tmp_path / "r.partial" / "memory_kv.prereq.jsonl.gz").is_file()
    agent.run, calls[:] = real_run, []
    resumed = evaluate_bfcl_v4(agent, cfg, tmp_path, "r", progress=False)
    assert resumed["total"] == {"memory_kv": 25} and resumed["scores"] == {"memory_kv": 1.0}


def test_web_search_without_a_key_is_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    result = run("answer", tmp_path, suite="bfcl_v4_web_search")
    assert result["scores"] == {} and result["mean"] is None
    assert set(result["skipped"]) == {"web_search_base", "web_search_no_snippet"}
    assert "SERPAPI_API_KEY" in result["skipped"]["web_search_base"]


def test_missing_extra_and_bad_settings_are_clear_errors(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "rank_bm25", None)  # as if not installed
    with pytest.raises(ConfigError, match="requirements-ood.txt"):
        run("answer", tmp_path, cfg=load_config(overrides=["ood.memory_backends=[kv]"]))
    with pytest.raises(ConfigError, match="ood.embedding_model"):
        run("answer", tmp_path, cfg=load_config(overrides=[f"ood.embedding_model={tmp_path}/nope"]))
    with pytest.raises(ConfigError, match="scripted"):
        scripted_agent("cheat")


def test_nothing_reaches_the_network_during_a_suite(tmp_path):
    """The suite installs its own guard (on top of the test-wide one), every kind of access attempted
    while it runs is refused, and the suite itself attempts none."""
    outside, inside, attempts = len(ACTIVE), [], []
    probes = {
        "tcp to an address": lambda: socket.create_connection(("93.184.216.34", 443), timeout=1),
        "tcp to a name": lambda: socket.create_connection(("pypi.org", 443), timeout=1),
        "udp datagram": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.1", 53)),
        "name lookup": lambda: socket.gethostbyname("example.com"),
    }

    class Probe(ScriptedAgent):
        def run(self, envs, progress=None):
            inside.append(len(ACTIVE))
            for name, probe in probes.items():
                try:
                    probe()
                    attempts.append((name, "reached"))
                except NetworkRefused:
                    attempts.append((name, "refused"))
            return super().run(envs, progress)

    cfg = load_config(overrides=["ood.memory_backends=[kv]", "ood.max_tasks=1"])
    evaluate_bfcl_v4(Probe("empty", SCRIPTED), cfg, tmp_path, "p", progress=False)
    assert inside and all(depth == outside + 1 for depth in inside)  # the suite's own guard was in place
    assert attempts and all(outcome == "refused" for _, outcome in attempts), attempts
    assert len(ACTIVE) == outside  # and it is gone afterwards

    before = len(REFUSED)
    evaluate_bfcl_v4(scripted_agent("memorize"), CFG, tmp_path, "quiet", progress=False)
    assert REFUSED[before:] == []  # a whole scripted run over both phases attempted no access at all


def tiny_embedder(folder):
    """A sentence-transformers model built from a config (random weights, a character vocabulary)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(
        string.ascii_lowercase + string.digits + string.punctuation
    )
    (folder / "bert").mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocab))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BertModel(config).save_pretrained(folder / "bert")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder / "bert")
    transformer = models.Transformer(str(folder / "bert"), max_seq_length=128)
    model = SentenceTransformer(modules=[transformer, models.Pooling(32)], device="cpu")
    model.save(str(folder / "embedder"))
    return folder / "embedder"


def test_vector_back_end_embeds_with_a_local_model(tmp_path):
    embedder = tiny_embedder(tmp_path / "model")
    cfg = load_config(overrides=["ood.memory_backends=[vector]", f"ood.embedding_model={embedder}", "ood.max_tasks=10"])
    answer, memorize = run("answer", tmp_path, cfg=cfg), run("memorize", tmp_path, cfg=cfg)
    assert answer["scores"] == {"memory_vector": 1.0} and answer["skipped"] == {}
    assert memorize["total"] == {"memory_vector": 10}
    snapshot = tmp_path / "memorize.memory" / "memory_vector" / "agentic" / "memory" / "vector" / "memory_snapshot"
    assert (snapshot / "customer_final.json").is_file()


def test_a_recipe_naming_a_suite_without_its_extra_fails_before_training(monkeypatch):
    import importlib.util

    from seal_mini.evaluation.suites import check_suites
    from seal_mini.programs.pipeline import main

    check_suites(load_config("recipes/qwen2_5_3b.yaml"))  # everything installed here: no error
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tau2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tau2 needs the optional extra \(tau2 missing\).*requirements-ood.txt"):
        check_suites(load_config("recipes/qwen2_5_3b.yaml"))
    check_suites(load_config("recipes/qwen2_5_3b.yaml", ["ood.suites=[bfcl_v4_memory]"]))
    with pytest.raises(ConfigError, match="tau2"):  # the pipeline stops at once, before loading anything
        main(["recipes/cpu_smoke.yaml", "out_dir=/nonexistent/never_written"])


def test_suites_run_under_their_own_token_limits_and_count_what_they_cut(tmp_path):
    """run_suite swaps training's rollout limits for ood.max_*_tokens; an episode cut by them scores 0
    and is counted per column."""
    from seal_mini.engine.policy import load_policy
    from seal_mini.evaluation.agents import ModelAgent
    from seal_mini.evaluation.suites import run_suite, suite_config

    overrides = ["ood.memory_backends=[kv]", "ood.max_tasks=2", "ood.memory_scenarios=[notetaker]"]
    cfg = load_config("recipes/cpu_smoke.yaml", [*overrides, "ood.max_prompt_tokens=64", "ood.max_total_tokens=128"])
    suite_cfg = suite_config(cfg)
    assert (suite_cfg.rollout.max_prompt_tokens, suite_cfg.rollout.max_total_tokens) == (64, 128)
    assert cfg.rollout.max_prompt_tokens == 6144  # the training limits themselves are untouched
    agent = ModelAgent(load_policy(cfg), cfg, adapter=False)
    result = run_suite("bfcl_v4_memory", agent, cfg, tmp_path, "cut", progress=False)
    assert result["total"] == {"memory_kv": 2} and result["truncated"] == {"memory_kv": 2}  # BFCL's prompt > 64
    assert result["scores"] == {"memory_kv": 0.0}
