"""tau2-bench suite: tau2's own tasks, tools and deterministic reward; scripted and model policies; offline."""

import copy
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="optional extra: pip install -r requirements-ood.txt")

from conftest import Interrupting  # noqa: E402

from seal_mini.config import ConfigError, load_config  # noqa: E402
from seal_mini.envs.toolcalls import format_call  # noqa: E402
from seal_mini.evaluation import tau2 as tau2_eval  # noqa: E402
from seal_mini.evaluation.agents import ScriptedAgent  # noqa: E402
from seal_mini.evaluation.ood import ACTIVE, REFUSED, NetworkRefused, loopback_only  # noqa: E402
from seal_mini.evaluation.tau2 import (  # noqa: E402
    SCRIPTED,
    InProcessUser,
    ScriptedUser,
    Tau2Episode,
    evaluate_tau2,
    load_tasks,
)
from seal_mini.runio import read_json, read_jsonl_gz  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# cpu_smoke for the tiny model; the ood settings spelled out, since cpu_smoke trims them for its pipeline
CFG = load_config(
    "recipes/cpu_smoke.yaml", ["ood.max_tasks=1", "ood.tau2_max_steps=200", "ood.tau2_domains=[retail,airline,telecom]"]
)
TELECOM_TRANSFER = "[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"
# Tasks whose expected actions change the state, so that leaving out the last write must fail them.
WRITES = {
    "retail": ["8", "9"],
    "airline": ["9", "11"],
    "telecom": [
        "[mobile_data_issue]airplane_mode_on|user_abroad_roaming_enabled_off[PERSONA:None]",
        "[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]",
    ],
}


def task(domain, task_id):
    return next(t for t in load_tasks(domain) if t.id == task_id)


def play(domain, task_id, mode, max_steps=100):
    env = Tau2Episode(domain, task(domain, task_id), ScriptedUser(), max_steps)
    record = ScriptedAgent(mode, SCRIPTED).run([env])[0]
    return env, record, env.score()


def cfg_with(**ood):
    cfg = copy.deepcopy(CFG)
    for key, value in ood.items():
        setattr(cfg.ood, key, value)
    return cfg


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom"])
def test_replay_scores_1_and_a_missing_write_or_an_empty_answer_scores_0(domain):
    state = "ENV_ASSERTION" if domain == "telecom" else "DB"
    for task_id in WRITES[domain]:
        env, record, full = play(domain, task_id, "replay")
        assert full["reward"] == 1.0 and full["termination"] == "user_stop", full["reward_info"]
        assert full["reward_info"]["reward_breakdown"][state] == 1.0
        assert record["messages"][0]["role"] == "system" and "<policy>" in record["messages"][0]["content"]
        _, _, dropped = play(domain, task_id, "drop_last_write")
        assert dropped["reward"] == 0.0 and dropped["reward_info"]["reward_breakdown"][state] == 0.0
        _, _, empty = play(domain, task_id, "empty")
        assert empty["reward"] == 0.0 and empty["termination"] == "agent_error"
    if domain == "telecom":  # the user side ran tau2's device tools
        calls = [m for m in full["tau2_messages"] if m["role"] == "user" and m.get("tool_calls")]
        assert calls and all(c["requestor"] == "user" for m in calls for c in m["tool_calls"])
        answers = [m for m in full["tau2_messages"] if m["role"] == "tool" and m["requestor"] == "user"]
        assert len(answers) == sum(len(m["tool_calls"]) for m in calls)


def test_telecom_transfer_task_is_scored_on_the_action_too():
    _, _, full = play("telecom", TELECOM_TRANSFER, "replay")
    assert full["reward"] == 1.0 and full["reward_info"]["reward_breakdown"]["ACTION"] == 1.0
    _, _, empty = play("telecom", TELECOM_TRANSFER, "empty")
    assert empty["reward"] == 0.0


def test_model_output_never_raises_and_bad_calls_come_back_as_errors():
    env = Tau2Episode("retail", task("retail", "8"), ScriptedUser(), max_steps=100)
    env.reset()
    bad = [
        "<tool_call>not json</tool_call>",
        format_call("_get_user", {}),  # not offered: private names are unreachable
        format_call("get_order_details", {}),  # missing argument
        format_call("calculate", {"expression": "9**9**9**9"}),  # would hang tau2's calculate
        b"<tool_call>\xff</tool_call>",
    ]
    for text in bad:
        result = env.step(text)
        assert not result.done and result.observation[0]["content"].startswith("Error")
    result = env.step(format_call("get_order_details", {"order_id": "#W0000000"}))
    assert result.observation == [
        {"role": "tool", "name": "get_order_details", "content": result.observation[0]["content"]}
    ]
    assert "Error" in result.observation[0]["content"]  # tau2's own error for an unknown order
    # only the dispatched call reached tau2's trajectory; every error counted toward tau2's limit of 10
    calls = [m for m in env.trajectory if m.role == "assistant" and m.tool_calls]
    assert [c.name for m in calls for c in m.tool_calls] == ["get_order_details"] and env.errors == 6
    for _ in range(4):
        result = env.step(format_call("nope", {}))
    assert result.done and env.termination.value == "too_many_errors"


def test_step_limit_ends_the_episode_as_tau2_does():
    env, _, short = play("retail", "8", "replay", max_steps=6)
    assert short["termination"] == "max_steps" and short["reward"] == 0.0 and env.steps >= 6


def test_nl_assertions_are_left_out_never_judged():
    t = task("retail", "8").model_copy(deep=True)
    t.evaluation_criteria.reward_basis.append(tau2_eval.tau2().RewardType.NL_ASSERTION)
    t.evaluation_criteria.nl_assertions = ["The agent was polite."]
    env = Tau2Episode("retail", t, ScriptedUser(), 100)
    ScriptedAgent("replay", SCRIPTED).run([env])
    with loopback_only():  # a judge would need an LLM API
        scored = env.score()
    assert scored["reward"] == 1.0 and scored["left_out"] == ["NL_ASSERTION"]


def test_result_file_and_resume(tmp_path):
    user = ScriptedUser()
    with pytest.raises(KeyboardInterrupt):
        evaluate_tau2(
            Interrupting(ScriptedAgent("replay", SCRIPTED), after=1),
            CFG,
            tmp_path / "a",
            "replay",
            user=user,
            progress=False,
            chunk_size=1,
        )
    again = Interrupting(ScriptedAgent("replay", SCRIPTED), after=99)
    resumed = evaluate_tau2(again, CFG, tmp_path / "a", "replay", user=user, progress=False, chunk_size=1)
    assert again.calls == 2  # the first domain's task was kept; only the other two ran
    straight = evaluate_tau2(
        ScriptedAgent("replay", SCRIPTED), CFG, tmp_path / "b", "replay", user=user, progress=False
    )
    assert resumed == straight == read_json(tmp_path / "a" / "replay.json")
    assert resumed["scores"] == {"retail": 1.0, "airline": 1.0, "telecom": 1.0} and resumed["mean"] == 1.0
    assert resumed["suite"] == "tau2" and resumed["user_simulator"] == ScriptedUser.description
    rows = read_jsonl_gz(tmp_path / "a" / "replay.trajectories.jsonl.gz")
    assert [r["column"] for r in rows] == ["retail", "airline", "telecom"]
    assert rows[0]["task_id"] == "0" and rows[0]["termination"] == "user_stop" and rows[0]["messages"]
    assert {"reward_info", "tau2_messages", "truncated", "n_sampled", "left_out"} <= set(rows[0])
    assert not (tmp_path / "a" / "replay.partial").exists()


class ProbeUser(ScriptedUser):
    """Tries to reach a public address while the suite runs."""

    def __init__(self, outside_guards):
        self.outside, self.seen = outside_guards, []

    def for_task(self, task, user_tools):
        guarded = len(ACTIVE) > self.outside  # the suite put its own guard in place
        try:
            socket.create_connection(("93.184.216.34", 80), timeout=1)
            self.seen.append((guarded, "connected"))
        except NetworkRefused:
            self.seen.append((guarded, "refused"))
        except OSError as e:
            self.seen.append((guarded, f"other: {e}"))
        return super().for_task(task, user_tools)


def test_no_network_inside_the_suite(tmp_path):
    probe = ProbeUser(len(ACTIVE))
    cfg = cfg_with(tau2_domains=["telecom"])
    evaluate_tau2(ScriptedAgent("empty", SCRIPTED), cfg, tmp_path, "probe", user=probe, progress=False)
    assert probe.seen == [(True, "refused")]
    before = len(REFUSED)
    evaluate_tau2(ScriptedAgent("replay", SCRIPTED), CFG, tmp_path, "quiet", user=ScriptedUser(), progress=False)
    assert REFUSED[before:] == []  # replays in all three domains attempted no access at all


def test_importing_tau2_attempts_no_network_access():
    """In a fresh interpreter (nothing imported yet), importing tau2 and litellm the suite's way tries
    no connection and no lookup outside loopback: the guard's record of refusals stays empty."""
    code = "from seal_mini.evaluation.ood import REFUSED; from seal_mini.evaluation.tau2 import tau2; tau2(); print(len(REFUSED))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0"


class _Server(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint: the customer's opening line, then ###STOP###."""

    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        text = "I want to exchange two items." if len(type(self).requests) == 1 else "###STOP###"
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_api_user_simulator_on_loopback(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}/v1"
        cfg = cfg_with(tau2_domains=["retail"], user_api_base=api, user_model="local-user")
        result = evaluate_tau2(ScriptedAgent("replay", SCRIPTED), cfg, tmp_path, "api", progress=False)
    finally:
        server.shutdown()
    assert result["scores"] == {"retail": 1.0} and result["user_simulator"].startswith("api: local-user at http://127")
    first = _Server.requests[0]
    assert first["model"] == "local-user" and first["messages"][0]["role"] == "system"
    assert "<scenario>" in first["messages"][0]["content"] and "Yusuf Rossi" in first["messages"][0]["content"]
    assert first["messages"][1] == {"role": "user", "content": "Hi! How can I help you today?"}  # roles flipped
    assert len(_Server.requests) == 2


class EchoUser(InProcessUser):
    """The in-process user's message handling with a fixed model answer: records what it was shown."""

    def __init__(self, answers):
        super().__init__(policy=None, description="echo")
        self.answers, self.shown = list(answers), []

    def generate(self, messages, tools, generator):
        self.shown.append((messages, tools))
        return self.answers.pop(0)


def test_in_process_user_prompt_and_device_calls():
    call = format_call("toggle_airplane_mode", {})
    user = EchoUser(["My data does not work.", call, "It is off now."])
    t = task("telecom", WRITES["telecom"][0])
    env = Tau2Episode("telecom", t, user, 100)
    messages, _ = env.reset()
    assert messages[-1] == {"role": "user", "content": "My data does not work."}
    system, greeting = user.shown[0][0][:2]
    assert "<scenario>" in system["content"] and "555-123-2002" in system["content"]
    assert greeting == {"role": "user", "content": "Hi! How can I help you today?"}
    assert "toggle_airplane_mode" in {tool["function"]["name"] for tool in user.shown[0][1]}
    result = env.step("Please turn airplane mode off.")
    assert result.observation == [{"role": "user", "content": "It is off now."}]
    shown = user.shown[-1][0]
    assert shown[-2]["role"] == "assistant" and "toggle_airplane_mode" in shown[-2]["content"]
    assert shown[-1]["role"] == "tool"  # the device's answer, as tau2 shows it to the user
    assert env.environment.user_tools.db.device.airplane_mode is False


def test_tiny_model_through_the_rollout_engine(tmp_path):
    from seal_mini.engine.policy import load_policy
    from seal_mini.evaluation.agents import ModelAgent

    # the telecom prompt (policy + manual + tools) is about 11k tiny-tokenizer tokens
    cfg = load_config(
        "recipes/cpu_smoke.yaml",
        [
            "ood.max_tasks=1",
            "ood.tau2_max_steps=8",
            "ood.user_temperature=1.0",  # greedy tiny-random writes only newlines, an empty message
            "rollout.max_prompt_tokens=12288",
            "rollout.max_total_tokens=14336",
        ],
    )
    policy = load_policy(cfg)
    agent = ModelAgent(policy, cfg, adapter=True, temperature=1.0)
    result = evaluate_tau2(agent, cfg, tmp_path, "adapter", source="fresh adapter", progress=False)
    assert result["user_simulator"] == "in-process: tiny-random (adapter disabled)"
    assert result["policy"] == "tiny-random + adapter" and result["total"] == {"retail": 1, "airline": 1, "telecom": 1}
    assert all(0.0 <= s <= 1.0 for s in result["scores"].values()) and 0.0 <= result["mean"] <= 1.0
    rows = read_jsonl_gz(tmp_path / "adapter.trajectories.jsonl.gz")
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[:4] == ["system", "assistant", "user", "assistant"] and row["n_sampled"] > 0
        assert roles.count("user") >= 2  # the model-played user answered the agent at least once
        assert row["termination"] in {"max_steps", "agent_error", "user_error", "user_stop", "too_many_errors"}
    assert read_json(tmp_path / "adapter.json") == result
    # the user simulator switches the adapter off for its own tokens only, also inside the base-model row
    assert policy.model.get_model_status().enabled is True
    user = tau2_eval.build_user(cfg, policy)
    with policy.reference():
        user.generate([{"role": "user", "content": "hi"}], [], None)
        assert policy.model.get_model_status().enabled is False
    assert policy.model.get_model_status().enabled is True


def test_clear_errors(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="choose from"):
        load_config(overrides=["ood.tau2_domains=[mock]"])
    with pytest.raises(ConfigError, match="unknown domain 'mock'"):
        evaluate_tau2(ScriptedAgent("empty", SCRIPTED), cfg_with(tau2_domains=["mock"]), tmp_path, "x", progress=False)
    with pytest.raises(ConfigError, match="ood.user_model or ood.user_api_base"):
        evaluate_tau2(ScriptedAgent("empty", SCRIPTED), CFG, tmp_path, "x", progress=False)
    with pytest.raises(ConfigError, match="choose from"):
        ScriptedAgent("oracle", SCRIPTED)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # a loopback port nobody listens on
    silent = cfg_with(user_api_base=f"http://127.0.0.1:{port}/v1", user_model="local-user")
    with pytest.raises(ConfigError, match="nothing answers at http://127.0.0.1"):
        evaluate_tau2(ScriptedAgent("empty", SCRIPTED), silent, tmp_path, "x", progress=False)
    tau2_eval.tau2.cache_clear()
    monkeypatch.setitem(sys.modules, "tau2", None)  # as if the extra were not installed
    try:
        with pytest.raises(ConfigError, match="requirements-ood.txt"):
            evaluate_tau2(ScriptedAgent("empty", SCRIPTED), CFG, tmp_path, "x", progress=False)
    finally:
        tau2_eval.tau2.cache_clear()
