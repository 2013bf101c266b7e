"""BFCL V4 agentic suites, out of distribution: memory (kv, rec_sum, vector) and web search.

Both are BFCL's "agentic" categories: one user question, as many tool-calling messages as the model
wants (20 per turn at most, as in BFCL), and the score is BFCL's own agentic checker on the model's
final answer (an expected string must appear in it, ignoring case and some punctuation).

Memory is two phases, as BFCL runs it:
  1. Prerequisite conversations. For each scenario (customer, finance, ...) a chain of multi-turn
     conversations in which the user tells things worth remembering; the model is meant to store
     them with the memory tools. After each conversation the back end writes a snapshot; the next
     one starts from it. Nothing is scored here.
  2. Questions. Each starts from its scenario's final snapshot, with BFCL's memory system prompt
     (which shows the core memory) and its answer-format prompt, and is scored.
Snapshots are written by the back ends themselves, under <out_dir>/<tag>.memory/ in the run dir.

Episodes are seal_mini.envs.episode.Episode on these back ends, so model policies run through the same
rollout engine, tool-call parsing and limits as the held-in evaluation. Nothing here needs the
network except web search, which runs only when SERPAPI_API_KEY is set; everything else runs inside
seal_mini.evaluation.ood.loopback_only().
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from seal_mini.config import MEMORY_SCENARIOS, Config, ConfigError
from seal_mini.distributed import from_rank0
from seal_mini.envs.bfcl import Task, bfcl_root, read_jsonl, tool_docs
from seal_mini.envs.episode import NO_CALL, Episode
from seal_mini.envs.toolcalls import format_call
from seal_mini.evaluation.agents import ScriptedAgent, eval_identity, play_in_pieces, save_result, sending
from seal_mini.evaluation.ood import Suite, public_only, require, suite_result
from seal_mini.runio import FileError, open_partial, read_jsonl_gz, read_pieces, write_jsonl_gz

WEB_SEARCH_COLUMNS = ("web_search_base", "web_search_no_snippet")
CHUNK = 32
"""Questions per saved piece of work."""


@dataclass
class AgenticTask:
    """One BFCL V4 entry: a memory prerequisite conversation, a memory question or a web search question."""

    task: Task
    """The entry as an env.Episode task (its back end in involved_classes and initial_config)."""
    column: str
    """memory_kv | memory_rec_sum | memory_vector | web_search_base | web_search_no_snippet."""
    scenario: str
    """Memory scenario ("" for web search)."""
    answers: list[str]
    """Strings of which one must appear in the final answer; empty for prerequisite conversations."""

    @property
    def prereq(self) -> bool:
        return not self.answers


# --- the data, as BFCL lays it out -------------------------------------------------------------------


def _agentic_task(entry: dict, column: str, class_name: str, config: dict, answers: list[str], scenario: str):
    task = Task(
        id=entry["id"],
        category=column,
        index=0,
        turns=entry["question"],
        initial_config={class_name: config},
        involved_classes=[class_name],
        ground_truth=[],
        tools=list(tool_docs(class_name)),
    )
    return AgenticTask(task, column, scenario, answers)


def memory_tasks(column: str, snapshot_root: Path, max_questions: int = 0, scenarios=MEMORY_SCENARIOS):
    """(prerequisite conversations per scenario in chain order, questions) for one memory back end.

    With max_questions, questions are taken round-robin over the scenarios in file order, so a small
    number still covers every scenario; only the scenarios of the chosen questions get their chains."""
    root = bfcl_root() / "data"
    class_name = f"MemoryAPI_{column.removeprefix('memory_')}"

    def agentic(entry: dict, scenario: str, answers: list[str]) -> AgenticTask:
        # the entry under this back end's name, with what BFCL's harness gives a memory back end: where
        # snapshots live, whose they are
        entry_id = entry["id"].replace("memory", column, 1)
        config = {"model_result_dir": snapshot_root, "test_id": entry_id, "scenario": scenario}
        return _agentic_task({**entry, "id": entry_id}, column, class_name, config, answers, scenario)

    answers = {e["id"]: e["ground_truth"] for e in read_jsonl(root / "possible_answer" / "BFCL_v4_memory.json")}
    by_scenario: dict[str, list[dict]] = {s: [] for s in scenarios}
    for entry in read_jsonl(root / "BFCL_v4_memory.json"):
        if entry["scenario"] in by_scenario:
            by_scenario[entry["scenario"]].append(entry)
    rounds = max((len(v) for v in by_scenario.values()), default=0)
    ordered = [by_scenario[s][i] for i in range(rounds) for s in scenarios if i < len(by_scenario[s])]
    chosen = ordered[:max_questions] if max_questions else ordered
    questions = [agentic(entry, entry["scenario"], answers[entry["id"]]) for entry in chosen]
    chains = {}
    for scenario in dict.fromkeys(q.scenario for q in questions):
        prereqs = read_jsonl(root / "memory_prereq_conversation" / f"memory_{scenario}.json")
        chains[scenario] = [agentic(entry, scenario, []) for entry in prereqs]
    return chains, questions


def web_search_tasks(column: str, max_questions: int = 0) -> list[AgenticTask]:
    """The web search questions; no_snippet hides the result snippets, as in BFCL."""
    root = bfcl_root() / "data"
    answers = {e["id"]: e["ground_truth"] for e in read_jsonl(root / "possible_answer" / "BFCL_v4_web_search.json")}
    entries = read_jsonl(root / "BFCL_v4_web_search.json")
    entries = entries[:max_questions] if max_questions else entries
    config = {"show_snippet": column != "web_search_no_snippet"}
    return [
        _agentic_task(
            {**e, "id": e["id"].replace("web_search", column, 1)}, column, "WebSearchAPI", config, answers[e["id"]], ""
        )
        for e in entries
    ]


# --- the episode --------------------------------------------------------------------------------------


class AgenticEpisode(Episode):
    """An Episode on a V4 back end, opened with the system prompt BFCL gives this entry."""

    def __init__(self, item: AgenticTask):
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

        # BFCL's own per-turn limit (20), whatever env.max_calls_per_turn a training recipe sets
        super().__init__(item.task, MAXIMUM_STEP_LIMIT)
        self.item = item

    def reset(self) -> tuple[list[dict], list[dict]]:
        first, tools = super().reset()
        from bfcl_eval.constants.default_prompts import (
            ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT,
            MEMORY_AGENT_SETTINGS,
            MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL,
            MEMORY_BACKEND_INSTRUCTION_UNIFIED,
        )

        parts = []
        if self.item.column.startswith("memory_"):
            unified = self.item.column == "memory_rec_sum"
            template = MEMORY_BACKEND_INSTRUCTION_UNIFIED if unified else MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL
            backend = next(iter(self.instances.values()))
            memory = backend._dump_core_memory_to_context()  # our own call, never reachable by the model
            setting = MEMORY_AGENT_SETTINGS[self.item.scenario]
            parts.append(template.format(scenario_setting=setting, memory_content=memory))
        if not self.item.prereq:  # BFCL asks for its answer format on scored questions only
            parts.append(ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT)
        return [{"role": "system", "content": "\n\n".join(parts)}] + first, tools

    def final_answer(self) -> str | None:
        """The message that ended the last turn without a call; None if a limit ended it."""
        last = self.turns[-1] if getattr(self, "turns", None) else None
        return last.final_text if last is not None and last.ended_by == NO_CALL else None

    def flush_memory(self) -> None:
        """Write the back end's snapshot (what BFCL does after each prerequisite conversation)."""
        for instance in self.instances.values():
            instance._flush_memory_to_local_file()


def score(episode: AgenticEpisode) -> tuple[float, str]:
    """BFCL's agentic checker on the final answer: (reward, error type or "")."""
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

    answer = episode.final_answer()
    if answer is None:
        return 0.0, f"agentic:no_final_answer ({episode.ended_by})"
    verdict = agentic_checker(answer, episode.item.answers)
    return (1.0, "") if verdict["valid"] else (0.0, verdict["error_type"])


# --- scripted policies ----------------------------------------------------------------------------------


def _call(name: str, **arguments) -> str:
    return format_call(name, arguments)


def _play_answer(env: AgenticEpisode, send) -> None:
    """Conversations: acknowledge each turn. Questions: answer with BFCL's first expected string."""
    while not env.done:
        if env.item.prereq:
            send("Noted.")
        else:
            send(json.dumps({"answer": env.item.answers[0], "context": "from memory"}))


def _play_empty(env: AgenticEpisode, send) -> None:
    while not env.done:
        send("")


def _play_memorize(env: AgenticEpisode, send) -> None:
    """A retrieval policy with no knowledge of the answers: store every user turn, answer with what
    a search of the memory returns. It scores only if the memory carried the facts from the
    prerequisite conversations to the question, through the back end's own snapshots."""
    backend = env.item.column.removeprefix("memory_")
    while not env.done:
        turn = env.turns[-1]
        if env.item.prereq:
            text = turn.user_text
            if backend == "rec_sum":
                send(_call("memory_append", text=text[:2000]))
            elif backend == "vector":
                send(_call("archival_memory_add", text=text[:2000]))
            else:
                key = f"note_{env.item.task.id.rsplit('-', 1)[-1]}_{turn.index}"
                send(_call("archival_memory_add", key=key, value=text[:2000]))
            if not env.done:
                send("Noted.")
            continue
        if backend == "rec_sum":
            found = send(_call("memory_retrieve")).observation[0]["content"]
        elif backend == "vector":
            found = send(_call("archival_memory_retrieve", query=turn.user_text, top_k=3)).observation[0]["content"]
        else:
            result = send(_call("archival_memory_key_search", query=turn.user_text, k=3))
            try:
                keys = [k for _, k in json.loads(result.observation[0]["content"]).get("ranked_results", [])]
            except (ValueError, AttributeError):  # an error message instead of results: nothing stored
                keys = []
            found = " ".join(send(_call("archival_memory_retrieve", key=k)).observation[0]["content"] for k in keys)
        if not env.done:
            send(json.dumps({"answer": found, "context": "memory search"}))


SCRIPTED = {"answer": sending(_play_answer), "empty": sending(_play_empty), "memorize": sending(_play_memorize)}
"""Scripted policies for the agentic suites, each play(env) -> conversation (memorize: memory back ends only)."""


scripted_agent = functools.partial(ScriptedAgent, plays=SCRIPTED, known="the BFCL V4 suites know")
"""scripted_agent(mode): a scripted policy of SCRIPTED, with the agent interface of ModelAgent (as tau2's)."""


# --- running a suite --------------------------------------------------------------------------------------


def _memory_columns(cfg: Config) -> tuple[list[str], dict[str, str]]:
    """(memory back ends to run, {back end: why it is skipped})."""
    columns, skipped = [f"memory_{b}" for b in cfg.ood.memory_backends], {}
    if "memory_vector" in columns and not cfg.ood.embedding_model:
        columns.remove("memory_vector")
        skipped["memory_vector"] = "needs ood.embedding_model, a local folder of all-MiniLM-L6-v2 (or another embedder)"
    elif "memory_vector" in columns and not Path(cfg.ood.embedding_model).is_dir():
        raise ConfigError(
            f"ood.embedding_model: {cfg.ood.embedding_model} is not a folder (a saved sentence-transformers model)"
        )
    return columns, skipped


def _web_search_columns(cfg: Config) -> tuple[list[str], dict[str, str]]:
    """(web search sets to run, {set: why it is skipped}): none without SERPAPI_API_KEY."""
    if not os.environ.get("SERPAPI_API_KEY"):
        return [], {c: "needs the network and SERPAPI_API_KEY, which is not set" for c in WEB_SEARCH_COLUMNS}
    return list(WEB_SEARCH_COLUMNS), {}


def _import_vector_backend(folder: str) -> None:
    """BFCL's vector back end loads its embedder by hub name when imported; point it at a local folder."""
    import importlib

    name = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_vector"
    if name in sys.modules:
        return
    import sentence_transformers

    hub_class = sentence_transformers.SentenceTransformer

    class LocalEmbedder(hub_class):
        def __init__(self, model_name_or_path=None, *args, **kwargs):
            super().__init__(folder, *args, **kwargs)

    sentence_transformers.SentenceTransformer = LocalEmbedder
    try:
        importlib.import_module(name)
    finally:
        sentence_transformers.SentenceTransformer = hub_class


def evaluate_bfcl_v4(
    agent,
    cfg: Config,
    out_dir: Path,
    tag: str,
    suite: str = "bfcl_v4_memory",
    source: str = "",
    progress: bool = True,
    run_prereqs: bool = True,
) -> dict:
    """Score `agent` on a BFCL V4 agentic suite; writes <out_dir>/<tag>.json and its trajectories.

    `run_prereqs=False` skips the prerequisite conversations (questions then start from an empty
    memory): a control, not the benchmark. A stopped evaluation resumes from its finished pieces."""
    spec = next((s for s in (MEMORY, WEB_SEARCH) if s.name == suite), None)
    if spec is None:
        raise ConfigError(f"--suite {suite}: expected {MEMORY.name} or {WEB_SEARCH.name}")
    columns, skipped = spec.columns(cfg)
    out_dir = Path(out_dir)
    partial, snapshots = out_dir / f"{tag}.partial", out_dir / f"{tag}.memory"
    # the questions are drawn inside the loop below, from these settings
    identity = eval_identity(
        agent,
        cfg,
        source,
        None,
        suite=suite,
        columns=columns,
        scenarios=cfg.ood.memory_scenarios,
        max_tasks=cfg.ood.max_tasks,
        prereqs=run_prereqs,
        embedding_model=cfg.ood.embedding_model,
    )
    from_rank0(_open, partial, identity, snapshots)

    rows, prereq_rows = [], []
    # web search needs the network, but only the public internet; nothing else may reach it at all
    with spec.guard():
        for column in columns:
            for module in spec.modules([column]):  # imported now: a clear message if the optional extra is missing
                require(module, spec.name)
            if column == "memory_vector":
                _import_vector_backend(cfg.ood.embedding_model)
            if column.startswith("memory_"):  # a memory back end: its prerequisite conversations build it first
                chains, questions = memory_tasks(
                    column, snapshots / column, cfg.ood.max_tasks, cfg.ood.memory_scenarios
                )
                done_file = partial / f"{column}.prereq.jsonl.gz"
                # one process builds the memory: each link of a chain starts from the snapshot the last one wrote
                prereq_rows += from_rank0(
                    _run_chains, agent, chains, done_file, snapshots / column, run_prereqs, what="building the memory"
                )
            else:
                questions = web_search_tasks(column, cfg.ood.max_tasks)
            rows += _run_questions(agent, questions, partial, column, progress)

    result = suite_result(suite, tag, agent.name, source, rows, columns, skipped)
    return save_result(out_dir, tag, prereq_rows + rows, result)


def _open(partial: Path, identity: dict, snapshots: Path) -> None:
    """Keep the pieces of a stopped run of this very evaluation; a new one starts with no memory at all."""
    if not open_partial(partial, identity):  # a new evaluation: no memory of an earlier one may leak in
        shutil.rmtree(snapshots, ignore_errors=True)


def _row(item: AgenticTask, env: AgenticEpisode, record: dict, reward: float | None, error: str) -> dict:
    return {
        "task_id": item.task.id,
        "column": item.column,
        "scenario": item.scenario,
        "prereq": item.prereq,
        "reward": reward,
        "error_type": error,
        "final_answer": env.final_answer(),
        "answers": item.answers,
        "ended_by": env.ended_by,
        **record,
    }


def _run_chains(agent, chains: dict[str, list[AgenticTask]], done_file: Path, snapshots: Path, run: bool):
    """Prerequisite conversations, link k of every scenario's chain together; each link starts from the
    snapshot the previous one wrote. Kept whole or redone whole: a half-built memory is not resumed."""
    if not run:
        return []
    if done_file.exists():
        try:
            return read_jsonl_gz(done_file)
        except FileError as e:
            print(f"[eval] {str(e).split(';')[0]}: running the prerequisite conversations again", file=sys.stderr)
    shutil.rmtree(snapshots, ignore_errors=True)  # a chain stopped half way starts again from empty
    rows = []
    for link in range(max((len(c) for c in chains.values()), default=0)):
        items = [chain[link] for chain in chains.values() if link < len(chain)]
        envs = [AgenticEpisode(item) for item in items]
        records = agent.run(envs)
        for item, env, record in zip(items, envs, records, strict=True):
            env.flush_memory()
            rows.append(_row(item, env, record, None, ""))
    write_jsonl_gz(done_file, rows)
    return rows


def _run_questions(agent, questions: list[AgenticTask], partial: Path, column: str, progress: bool):
    """`agent` on each question not yet done, scored by BFCL's agentic checker: one row per question."""

    def play(items: list[AgenticTask], bar) -> list[dict]:
        envs = [AgenticEpisode(item) for item in items]
        records = agent.run(envs, progress=bar) if envs else []
        return [_row(item, env, record, *score(env)) for item, env, record in zip(items, envs, records, strict=True)]

    done = from_rank0(read_pieces, partial, f"{column}.q*.jsonl.gz")  # a prefix of the questions, in order
    todo = questions[len(done) :]
    return play_in_pieces(
        todo, CHUNK, play, done, lambda n: partial / f"{column}.q{n:05d}.jsonl.gz", f"eval {column}", progress
    )


# --- the two suites (listed in seal_mini.evaluation.suites.SUITES) ----------------------------------------

MEMORY = Suite(
    name="bfcl_v4_memory",
    columns=_memory_columns,
    # the vector back end also embeds, with a sentence-transformers model and a faiss index
    modules=lambda columns: (
        ("overrides", "rank_bm25") + (("sentence_transformers", "faiss") if "memory_vector" in columns else ())
    ),
    run=functools.partial(evaluate_bfcl_v4, suite="bfcl_v4_memory"),
    scripted=scripted_agent,
    domains="memory_backends",
)
WEB_SEARCH = Suite(
    name="bfcl_v4_web_search",
    columns=_web_search_columns,
    modules=lambda columns: ("serpapi", "html2text", "bs4"),
    run=functools.partial(evaluate_bfcl_v4, suite="bfcl_v4_web_search"),
    scripted=scripted_agent,
    guard=public_only,  # the pages a model chooses, on the public internet only
)
