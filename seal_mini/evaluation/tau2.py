"""tau2-bench (retail, airline, telecom): a policy scored with tau2's own tasks, tools, policies and reward.

Nothing here re-implements the benchmark; it plays tau2's orchestrator protocol one agent message at
a time so that the rollout engine can drive it, and hands the finished conversation to tau2's scorer.

  Tasks    tau2's default task set of each domain ("base": 114 retail, 50 airline, 114 telecom), in
           file order; ood.max_tasks > 0 keeps the first N of each. Tasks whose whole reward would
           need an LLM judge (reward basis NL_ASSERTION only) are left out (none in these domains).
  Episode  `Tau2Episode`: the system prompt is tau2's agent prompt around the domain policy, then
           tau2's fixed greeting, then the user simulator's first message. A model message with
           <tool_call> blocks runs each valid call through tau2's environment (`get_response`, the
           orchestrator's own path); one without calls goes to the user simulator, whose device
           tool calls (telecom) run at once, until it writes text for the agent. The episode ends
           where tau2's ends: the user's stop tokens (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###;
           an agent's transfer to a human ends it through the user's ###TRANSFER###), an empty agent
           or user message (tau2 rejects those), ood.tau2_max_steps steps counted as tau2 counts
           them, or tau2's limit of 10 tool errors.
  Reward   tau2's `evaluate_simulation` with its deterministic components for each task's reward
           basis: DB (the final databases against the expected actions replayed on a fresh copy),
           ENV_ASSERTION, ACTION, COMMUNICATE. NL_ASSERTION needs an LLM judge and is never called:
           it is dropped from the basis and the row records it under "left_out".
  Check    The scripted `replay` (SCRIPTED) with `ScriptedUser` scores 1.0 on every task that ships
           expected actions (retail 112 of 114, airline 43 of 50, telecom 114 of 114); the other 9
           ship none, so any episode that ends with the user's stop scores 1.0 there, as in tau2.
           Leaving out the last state-changing action scores 0.0 on retail 103 of 105, airline 30 of
           30, telecom 94 of 94 tasks that have one. The replay alone takes up to 29 (retail), 43
           (airline) and 33 (telecom) steps; tau2's command line allows 200.
  User     who plays the customer is recorded in the result: in-process (the policy's backbone
           with its adapter disabled, or ood.user_model), tau2's own LLM user simulator against an
           OpenAI-compatible server on loopback (ood.user_api_base), or `ScriptedUser` (tests).

tau2 and litellm are imported lazily, offline (no cost map or other fetch at import), and the whole
suite runs inside `seal_mini.evaluation.ood.loopback_only()`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import torch

from seal_mini.config import TAU2_DOMAINS, Config, ConfigError
from seal_mini.distributed import from_rank0
from seal_mini.engine.sequences import sample_tokens
from seal_mini.envs.toolcalls import CLOSE, OPEN, CallError, format_call, parse_tool_calls, validate_call
from seal_mini.evaluation.agents import ScriptedAgent, eval_identity, play_in_pieces, save_result, sending
from seal_mini.evaluation.ood import Suite, loopback_only, require, suite_result
from seal_mini.runio import resume_pieces

CHUNK = 16
"""Tasks per saved piece of work."""
MAX_ERRORS = 10
"""Tool errors that end an episode (tau2's default max_errors)."""
USER_ACTION = "USER ACTION:"
"""How the scripted replay asks the scripted user for a device action: this prefix, then the call's JSON."""

_OFFLINE_ENV = {
    "LITELLM_OFFLINE_MODE": "true",  # litellm fetches nothing of its own accord (catalogs, tokenizers)
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the model cost map comes from the package, not the web
    "LITELLM_LOCAL_BLOG_POSTS": "True",
}
_CALL_BLOCK = re.compile(re.escape(OPEN) + r".*?(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@functools.cache
def tau2() -> SimpleNamespace:
    """tau2's pieces this suite uses, imported once, offline and quietly."""
    for key, value in _OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    require("tau2", "tau2")
    from loguru import logger

    logger.disable("tau2")  # tau2 logs every registry step and tool call at DEBUG to stderr
    with loopback_only():
        from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
        from tau2.data_model import message
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.data_model.tasks import RewardType
        from tau2.environment.toolkit import ToolType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
        from tau2.registry import registry
        from tau2.user.base import UserState
        from tau2.user.user_simulator import UserSimulator
    return SimpleNamespace(
        AGENT_INSTRUCTION=AGENT_INSTRUCTION,
        AGENT_SYSTEM_PROMPT=SYSTEM_PROMPT,
        GREETING=DEFAULT_FIRST_AGENT_MESSAGE,
        msg=message,
        SimulationRun=SimulationRun,
        TerminationReason=TerminationReason,
        RewardType=RewardType,
        ToolType=ToolType,
        EvaluationType=EvaluationType,
        evaluate_simulation=evaluate_simulation,
        registry=registry,
        UserState=UserState,
        UserSimulator=UserSimulator,
    )


@functools.cache
def _domain_tasks(domain: str) -> tuple:
    return tuple(tau2().registry.get_tasks_loader(domain)())


def load_tasks(domain: str, max_tasks: int = 0) -> list:
    """tau2's default task set of a domain in file order (the first `max_tasks`; 0 = all), minus tasks
    only an LLM judge could score (evaluate_tau2 and the config refuse unknown domains first)."""
    nl = tau2().RewardType.NL_ASSERTION
    tasks = []
    for task in _domain_tasks(domain):
        basis = set(task.evaluation_criteria.reward_basis) if task.evaluation_criteria else set()
        if basis and basis <= {nl}:
            continue
        if task.initial_state is not None and task.initial_state.message_history:
            raise ConfigError(f"tau2 {domain} task {task.id} starts from a message history, which is not supported")
        tasks.append(task)
    return tasks[:max_tasks] if max_tasks else tasks


# --- the episode -----------------------------------------------------------------------------------


@dataclass
class Tau2Step:
    observation: list[dict]
    """Messages to append after the assistant message: tool results, then the user's reply if any."""
    done: bool


class UserSimulatorError(RuntimeError):
    """The user simulator could not answer (e.g. its prompt is over the token limit): tau2's USER_ERROR."""


def _strip_calls(text: str) -> str:
    return _CALL_BLOCK.sub("", text).strip()


class Tau2Episode:
    """One tau2 task as a reset / step episode. `trajectory` holds tau2's own message objects."""

    def __init__(self, domain: str, task, user, max_steps: int):
        self.domain, self.task, self.user, self.max_steps = domain, task, user, max_steps
        self.done = False

    # -- the engine's contract ---------------------------------------------------------------------

    def reset(self) -> tuple[list[dict], list[dict]]:
        """Fresh environment in the task's initial state; returns (system, greeting, first user message)
        and the agent's tools as chat-template dicts."""
        t = tau2()
        self.environment = t.registry.get_env_constructor(self.domain)()
        init = self.task.initial_state
        self.environment.set_state(
            initialization_data=init.initialization_data if init else None,
            initialization_actions=init.initialization_actions if init else None,
            message_history=[],
        )
        self.tools = {tool.name: tool.openai_schema for tool in self.environment.get_tools()}
        user_tools = self.environment.get_user_tools() if self.environment.user_tools is not None else None
        self.user_sim = self.user.for_task(self.task, user_tools)
        self.user_state = self.user_sim.get_init_state()
        greeting = copy.deepcopy(t.GREETING)
        self.trajectory: list = [greeting]
        self.steps = self.errors = self.n_calls = 0
        self.done, self.termination, self.truncated, self.note = False, None, False, ""
        system = t.AGENT_SYSTEM_PROMPT.format(
            agent_instruction=t.AGENT_INSTRUCTION, domain_policy=self.environment.get_policy()
        )
        first = self._user_turn(greeting)
        messages = [{"role": "system", "content": system}, {"role": "assistant", "content": greeting.content}]
        return messages + first, list(self.tools.values())

    def step(self, text: str | bytes) -> Tau2Step:
        """Run one assistant message. Never raises for anything the model wrote."""
        if self.done:  # the user may stop in its very first message
            return Tau2Step([], True)
        t = tau2()
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        parsed = parse_tool_calls(text)
        if not parsed:  # a message for the user
            message = t.msg.AssistantMessage(role="assistant", content=text)
            if not message.has_text_content():  # tau2 rejects an empty message: the agent's error
                self._end(t.TerminationReason.AGENT_ERROR, "the agent sent an empty message")
                return Tau2Step([], True)
            self.trajectory.append(message)
            self._count_step(to_env=False)
            return Tau2Step([] if self.done else self._user_turn(message), self.done)

        observation: list[dict | None] = []
        calls = []
        for item in parsed:
            checked = item if isinstance(item, CallError) else validate_call(item, self.tools)
            if not isinstance(checked, CallError):
                checked = _guard(checked.name, checked.arguments) or checked
            if isinstance(checked, CallError):
                self.errors += 1
                observation.append({"role": "tool", "name": checked.name or "", "content": f"Error: {checked.message}"})
                continue
            self.n_calls += 1
            call_id = f"call_{self.n_calls}"
            calls.append(t.msg.ToolCall(id=call_id, name=checked.name, arguments=copy.deepcopy(checked.arguments)))
            observation.append(None)  # filled with the environment's answer below, in call order
        if calls:
            prose = _strip_calls(text)
            self.trajectory.append(t.msg.AssistantMessage(role="assistant", content=prose or None, tool_calls=calls))
            answers = iter([{"role": "tool", "name": c.name, "content": self._answer(c).content or ""} for c in calls])
            observation = [o if o is not None else next(answers) for o in observation]
        # tau2 counts the agent's message (to the environment) and the environment's answer as two steps
        self._count_step(to_env=True)
        self._count_step(to_env=False)
        return Tau2Step(observation, self.done)

    def truncate(self) -> None:
        """The rollout engine ran out of tokens: tau2's agent would have failed (AGENT_ERROR)."""
        if not self.done:
            self.truncated = True
            self._end(tau2().TerminationReason.AGENT_ERROR, "token limit of the rollout engine")

    # -- scoring -----------------------------------------------------------------------------------

    def score(self) -> dict:
        """tau2's deterministic reward of the finished episode, with its breakdown."""
        t = tau2()
        task, left_out = self.task, []
        nl = t.RewardType.NL_ASSERTION
        if task.evaluation_criteria is not None and nl in task.evaluation_criteria.reward_basis:
            task = task.model_copy(deep=True)
            task.evaluation_criteria.reward_basis = [b for b in task.evaluation_criteria.reward_basis if b != nl]
            left_out.append(nl.value)  # needs an LLM judge; never called
        termination = self.termination or t.TerminationReason.AGENT_ERROR
        simulation = t.SimulationRun(
            id=f"{self.domain}/{task.id}",
            task_id=task.id,
            start_time="",
            end_time="",
            duration=0.0,
            termination_reason=termination,
            messages=self.trajectory,
        )
        info = t.evaluate_simulation(
            simulation=simulation, task=task, evaluation_type=t.EvaluationType.ALL, solo_mode=False, domain=self.domain
        )
        return {
            "reward": float(info.reward),
            "reward_info": info.model_dump(mode="json"),
            "left_out": left_out,
            "termination": termination.value,
            "note": self.note,
            "tau2_messages": [m.model_dump(mode="json") for m in self.trajectory],
        }

    # -- internals ---------------------------------------------------------------------------------

    def _answer(self, call):
        """A tool call (the agent's or the user's) through tau2's environment; its answer is recorded and counted."""
        answer = self.environment.get_response(call)  # tau2 turns a tool's exception into "Error: ..."
        self.trajectory.append(answer)
        self.errors += answer.error
        return answer

    def _user_turn(self, message) -> list[dict]:
        """The user simulator answers `message`; its own tool calls run until it writes to the agent."""
        t = tau2()
        while True:
            try:
                reply, self.user_state = self.user_sim.generate_next_message(message, self.user_state)
            except UserSimulatorError as e:
                self._end(t.TerminationReason.USER_ERROR, str(e))
                return []
            if not (reply.has_text_content() or reply.is_tool_call()):
                self._end(t.TerminationReason.USER_ERROR, "the user simulator sent an empty message")
                return []
            self.trajectory.append(reply)
            if t.UserSimulator.is_stop(reply):
                self._end(t.TerminationReason.USER_STOP)
            if not reply.is_tool_call():
                self._count_step(to_env=False)
                return [{"role": "user", "content": reply.content}]
            self._count_step(to_env=True)
            answers = [self._answer(call) for call in reply.tool_calls]
            self._count_step(to_env=False)
            if self.done:
                return []
            message = answers[0] if len(answers) == 1 else t.msg.MultiToolMessage(role="tool", tool_messages=answers)

    def _count_step(self, to_env: bool) -> None:
        """One orchestrator step; like tau2, the limits are checked only when no tool answer is due."""
        self.steps += 1
        if to_env:
            return
        reason = tau2().TerminationReason
        if self.steps >= self.max_steps:
            self._end(reason.MAX_STEPS)
        if self.errors >= MAX_ERRORS:
            self._end(reason.TOO_MANY_ERRORS)

    def _end(self, reason, note: str = "") -> None:
        self.done, self.termination = True, reason
        self.note = note or self.note


def _guard(name: str, arguments: dict) -> CallError | None:
    """Calls refused before they reach tau2's tools, because they could hang the process."""
    # tau2's calculate tool evaluates the expression after a character check that lets "**" through,
    # so "9**9**9**9" would run for ever; its description only offers + - * /.
    if name == "calculate" and "**" in str(arguments.get("expression", "")):
        return CallError("arguments", "calculate: '**' is not supported; use + - * / and parentheses", name)
    return None


# --- user simulators -------------------------------------------------------------------------------


class ScriptedUser:
    """A user for tests: opens with the task's reason for calling, performs each device action the agent
    asks for in a `USER ACTION: {json}` line (telecom), and says ###STOP### to any other agent text."""

    description = "scripted: reason for call, requested device actions, then ###STOP###"

    def for_task(self, task, user_tools):
        """A fresh simulator for one task."""
        return _ScriptedUserSim(task, user_tools)


class _ScriptedUserSim:
    def __init__(self, task, user_tools):
        instructions = task.user_scenario.instructions
        self.opening = getattr(instructions, "reason_for_call", None) or str(instructions)
        self.user_tools = {tool.name for tool in user_tools or []}
        self.pending: list[tuple[str, dict]] = []
        self.n_calls = 0

    def get_init_state(self):
        return tau2().UserState(system_messages=[], messages=[])

    def generate_next_message(self, message, state):
        msg = tau2().msg
        if isinstance(message, msg.AssistantMessage):
            if not state.messages:
                text = self.opening
            else:
                self.pending = self._requested_actions(message.content or "")
                text = None if self.pending else "###STOP###"
        else:  # the answer to its own device action
            text = None if self.pending else "Done."
        state.messages.append(message)
        if text is None:
            name, arguments = self.pending.pop(0)
            self.n_calls += 1
            call = msg.ToolCall(id=f"user_call_{self.n_calls}", name=name, arguments=arguments, requestor="user")
            reply = msg.UserMessage(role="user", tool_calls=[call])
        else:
            reply = msg.UserMessage(role="user", content=text)
        state.messages.append(reply)
        return reply, state

    def _requested_actions(self, text: str) -> list[tuple[str, dict]]:
        actions = []
        for line in text.splitlines():
            if not line.startswith(USER_ACTION):
                continue
            try:
                call = json.loads(line[len(USER_ACTION) :])
            except json.JSONDecodeError:
                continue
            if (
                isinstance(call, dict)
                and call.get("name") in self.user_tools
                and isinstance(call.get("arguments"), dict)
            ):
                actions.append((call["name"], call["arguments"]))
        return actions


class InProcessUser:
    """The user simulator as a local model: tau2's user prompt (its simulation guidelines and the task's
    scenario), roles flipped as tau2 flips them, generated with the policy's chat template.

    Called from inside the agent's step(), while the rollout engine waits, so it can share the
    policy's weights, with its adapter disabled for the user's tokens only."""

    def __init__(
        self,
        policy,
        description: str,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        max_prompt_tokens: int = 8192,
        seed: int = 0,
    ):
        self.policy, self.description, self.seed = policy, description, seed
        self.temperature, self.max_new_tokens, self.max_prompt_tokens = temperature, max_new_tokens, max_prompt_tokens

    def for_task(self, task, user_tools):
        """A fresh simulator for one task (its own sampling generator, so results do not depend on order)."""
        return _ModelUserSim(self, task, user_tools)

    def generate(self, messages: list[dict], tools: list[dict], generator) -> str:
        """One message, greedy at temperature 0; stops at the template's end of turn."""
        renderer, model = self.policy.renderer, self.policy.model
        ids = renderer.prompt_ids(messages, tools)
        if len(ids) > self.max_prompt_tokens:
            raise UserSimulatorError(f"user simulator prompt of {len(ids)} tokens is over {self.max_prompt_tokens}")
        out: list[int] = []
        with torch.no_grad(), self.policy.backbone():
            step_ids = torch.tensor([ids], device=self.policy.device)  # (1, T)
            cache_ = None
            for _ in range(self.max_new_tokens):
                # logits of the last position only: a 5k-token prompt's full (T, V) logits would take GBs
                result = model(input_ids=step_ids, past_key_values=cache_, use_cache=True, logits_to_keep=1)
                cache_ = result.past_key_values
                token = sample_tokens(result.logits[:, -1], self.temperature, generator=generator)  # (1,)
                if int(token) in renderer.stop_ids:
                    break
                out.append(int(token))
                step_ids = token.view(1, 1)
        return renderer.decode(out)


class _ModelUserSim:
    def __init__(self, owner: InProcessUser, task, user_tools):
        self.owner = owner
        # tau2's own simulator supplies the system prompt and the state (it is never asked to generate)
        self.prompt = tau2().UserSimulator(tools=user_tools, instructions=str(task.user_scenario))
        self.tools = {tool.name: tool.openai_schema for tool in user_tools or []}
        self.generator = torch.Generator().manual_seed(owner.seed)
        self.n_calls = 0

    def get_init_state(self):
        return self.prompt.get_init_state()

    def generate_next_message(self, message, state):
        msg = tau2().msg
        if isinstance(message, msg.MultiToolMessage):
            state.messages.extend(message.tool_messages)
        else:
            state.messages.append(message)
        chat = [{"role": "system", "content": state.system_messages[0].content}]
        chat += [_chat_message(m) for m in state.flip_roles()]
        text = self.owner.generate(chat, list(self.tools.values()), self.generator)
        calls = []
        for item in parse_tool_calls(text) if self.tools else []:
            checked = item if isinstance(item, CallError) else validate_call(item, self.tools)
            if not isinstance(checked, CallError):  # a malformed device call is dropped, like unparsable text
                self.n_calls += 1
                call_id = f"user_call_{self.n_calls}"
                calls.append(msg.ToolCall(id=call_id, name=checked.name, arguments=checked.arguments, requestor="user"))
        if calls:
            reply = msg.UserMessage(role="user", tool_calls=calls)
        else:
            reply = msg.UserMessage(role="user", content=_strip_calls(text))
        state.messages.append(reply)
        return reply, state


def _chat_message(message) -> dict:
    """A tau2 message (after tau2's role flip) as a chat-template dict; calls in the Hermes format."""
    if message.role == "tool":
        return {"role": "tool", "content": message.content or ""}
    content = message.content or ""
    if getattr(message, "tool_calls", None):
        content = "\n".join([content] * bool(content) + [format_call(c.name, c.arguments) for c in message.tool_calls])
    return {"role": message.role, "content": content}


class ApiUser:
    """tau2's own LLM user simulator (litellm) against an OpenAI-compatible server on loopback."""

    def __init__(self, api_base: str, model: str, temperature: float = 0.0):
        self.api_base, self.model, self.temperature = api_base, model, temperature
        self.description = f"api: {model} at {api_base} (tau2 UserSimulator)"

    def for_task(self, task, user_tools):
        """tau2's UserSimulator for one task."""
        return tau2().UserSimulator(
            tools=user_tools,
            instructions=str(task.user_scenario),
            llm=f"openai/{self.model}",
            # a local server wants no key, but the OpenAI client refuses to start without one
            llm_args={"api_base": self.api_base, "api_key": "local", "temperature": self.temperature},
        )


def _check_reachable(api_base: str) -> None:
    """A clear error now, rather than a client's traceback mid-evaluation, when nothing listens there."""
    url = urlparse(api_base)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with loopback_only():
            socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as e:
        raise ConfigError(
            f"ood.user_api_base: nothing answers at {api_base} ({e}); start the user simulator's server first"
        ) from None


def build_user(cfg: Config, policy=None):
    """The user simulator the config asks for: loopback API, ood.user_model in-process, or the policy's
    own backbone with its adapter disabled."""
    ood = cfg.ood
    if ood.user_api_base:
        if not ood.user_model:
            raise ConfigError("ood.user_model: name the model the server at ood.user_api_base serves")
        _check_reachable(ood.user_api_base)
        return ApiUser(ood.user_api_base, ood.user_model, ood.user_temperature)
    limits = {
        "temperature": ood.user_temperature,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
        "seed": cfg.seed,
    }
    if ood.user_model:
        from seal_mini.engine.policy import load_policy

        user_cfg = copy.deepcopy(cfg)
        user_cfg.model.name, user_cfg.model.gguf_file, user_cfg.lora.adapter_path = ood.user_model, "", ""
        return InProcessUser(load_policy(user_cfg), f"in-process: {ood.user_model} (no adapter)", **limits)
    if policy is None:
        raise ConfigError(
            "tau2: this policy has no model to play the user; set ood.user_model or ood.user_api_base "
            "(or pass a user simulator)"
        )
    return InProcessUser(policy, f"in-process: {cfg.model.name} (adapter disabled)", **limits)


# --- scripted policies -------------------------------------------------------------------------------


def replay_script(env: Tau2Episode, drop_last_write: bool = False) -> list[str]:
    """The agent messages that replay a task's expected actions (env after reset)."""
    criteria = env.task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria else []
    if drop_last_write:
        writes = [i for i, a in enumerate(actions) if _is_write(env, a)]
        if writes:
            actions.pop(writes[-1])
    script: list[str] = []
    for by_user, group in itertools.groupby(actions, key=lambda a: a.requestor == "user"):
        if by_user:  # a run of device actions: one message asks for them all
            asks = [f"{USER_ACTION} {json.dumps({'name': a.name, 'arguments': a.arguments})}" for a in group]
            script.append("Please do this on your phone:\n" + "\n".join(asks))
        else:
            script += [format_call(a.name, a.arguments) for a in group]
    info = list(criteria.communicate_info or []) if criteria else []
    script.append(" ".join(["Thank you, everything is done."] + info))
    return script


def _is_write(env: Tau2Episode, action) -> bool:
    kit = env.environment.user_tools if action.requestor == "user" else env.environment.tools
    return kit is not None and kit.has_tool(action.name) and kit.tool_type(action.name) == tau2().ToolType.WRITE


def _play_script(env: Tau2Episode, send, script: list[str]) -> None:
    turn = 0
    while not env.done:
        send(script[min(turn, len(script) - 1)])  # the closing text repeats until the user stops
        turn += 1


SCRIPTED = {
    "replay": sending(lambda env, send: _play_script(env, send, replay_script(env))),
    "drop_last_write": sending(lambda env, send: _play_script(env, send, replay_script(env, drop_last_write=True))),
    "empty": sending(lambda env, send: _play_script(env, send, [""])),
}
"""Scripted policies, each play(env) -> conversation: `replay` plays the task's expected actions (assistant ones
as Hermes tool calls, user ones as USER ACTION requests), then a closing text carrying the information the
task expects to be communicated; `drop_last_write` does the same without its last state-changing action;
`empty` answers with empty text."""


# --- the suite -------------------------------------------------------------------------------------


def evaluate_tau2(
    agent,
    cfg: Config,
    out_dir: Path,
    tag: str,
    source: str = "",
    user=None,
    progress: bool = True,
    chunk_size: int = CHUNK,
) -> dict:
    """Score `agent` on cfg.ood.tau2_domains; writes <out_dir>/<tag>.json and trajectories, returns the result.

    `user` is a user simulator (ScriptedUser, InProcessUser, ApiUser); None builds it from cfg.ood.
    Pieces of a stopped evaluation are reused only with the same policy, source, tasks and user."""
    domains = list(cfg.ood.tau2_domains)
    for domain in domains:
        if domain not in TAU2_DOMAINS:
            raise ConfigError(f"ood.tau2_domains: unknown domain {domain!r}; choose from {list(TAU2_DOMAINS)}")
    tau2()
    if user is None:
        user = build_user(cfg, getattr(agent, "policy", None))
    out_dir = Path(out_dir)
    with loopback_only():
        tasks = [(d, task) for d in domains for task in load_tasks(d, cfg.ood.max_tasks)]
        partial = out_dir / f"{tag}.partial"
        task_ids = [f"{d}/{task.id}" for d, task in tasks]
        identity = eval_identity(
            agent, cfg, source, task_ids, user_simulator=user.description, max_steps=cfg.ood.tau2_max_steps
        )
        done_rows = from_rank0(resume_pieces, partial, identity)  # the pieces already finished
        done = {(r["column"], r["task_id"]) for r in done_rows}
        todo = [(d, task) for d, task in tasks if (d, task.id) not in done]

        def play(chunk: list, bar) -> list[dict]:
            envs = [Tau2Episode(d, task, user, cfg.ood.tau2_max_steps) for d, task in chunk]
            records = agent.run(envs, progress=bar) if envs else []
            return [
                {"task_id": env.task.id, "column": env.domain, **env.score(), **record}
                for env, record in zip(envs, records, strict=True)
            ]

        done_rows = play_in_pieces(
            todo, chunk_size, play, done_rows, lambda n: partial / f"{n:06d}.jsonl.gz", f"tau2 {tag}", progress
        )

    by_key = {(r["column"], r["task_id"]): r for r in done_rows}
    rows = [by_key[(d, task.id)] for d, task in tasks]
    result = suite_result(TAU2.name, tag, agent.name, source, rows, domains, {}, user_simulator=user.description)
    return save_result(out_dir, tag, rows, result)


def _run(agent, cfg: Config, out_dir: Path, tag: str, source: str = "", progress: bool = True) -> dict:
    """evaluate_tau2 as the suite runs it: a scripted agent gets the scripted user that carries out the device
    actions its replay asks for; any other agent the user simulator cfg.ood names."""
    user = ScriptedUser() if isinstance(agent, ScriptedAgent) else None
    return evaluate_tau2(agent, cfg, out_dir, tag, source=source, user=user, progress=progress)


TAU2 = Suite(
    name="tau2",
    columns=lambda cfg: (list(cfg.ood.tau2_domains), {}),
    modules=lambda columns: ("tau2",),
    run=_run,
    scripted=functools.partial(ScriptedAgent, plays=SCRIPTED),
    domains="tau2_domains",
    prefix="tau2",
)
"""tau2-bench as a suite (listed in seal_mini.evaluation.suites.SUITES)."""
