"""The label registry: every table is a view of one entry per label, an incomplete entry stops the import
with a message naming the label and what it lacks, and a new label is one entry plus one rule."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from seal_mini import config, labels
from seal_mini.core import diagnose, faults, interface, judge
from seal_mini.labels import ENTRIES, Fault, Guideline, Label, RegistryError, build, require_labels, rule_order

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

PACKAGE = Path(__file__).resolve().parents[1] / "seal_mini"


def entry(name: str) -> Label:
    return next(e for e in ENTRIES if e.name == name)


def replaced(name: str, **changes) -> list[Label]:
    """The kit's entries with one of them changed."""
    return [dataclasses.replace(e, **changes) if e.name == name else e for e in ENTRIES]


def test_every_table_is_a_view_of_the_entries():
    assert config.LABELS == labels.LABELS == tuple(e.name for e in ENTRIES)
    assert config.DEFAULT_RHO == {e.name: e.rho for e in ENTRIES}
    # the paper's values, and the kit's own choices where the paper gives none
    assert config.DEFAULT_RHO == {
        "pass": 1.0,
        "correct_abstention": 1.8,
        "invalid_tool_call": 1.5,
        "argument_mismatch": 1.2,
        "spurious_tool_call": 2.0,
        "instance_mismatch": 0.6,
        "state_mismatch": 1.0,
        "recovery_failure": 1.2,
        "missing_tool_call": 1.5,
        "response_mismatch": 0.9,
        "not_reached": 1.0,
    }
    assert labels.RHO_HELD == ("pass", "not_reached")  # the moving rho leaves them at their base
    assert (
        set(judge.LABEL_DESCRIPTIONS)
        == set(labels.FAILURE_LABELS)
        == set(labels.LABELS)
        - {
            "pass",
            "correct_abstention",
            "not_reached",
        }
    )
    assert {gid: label for gid, (label, _) in interface.GUIDELINES.items()} == {
        e.guideline.id: e.name for e in ENTRIES if e.guideline
    }
    assert {kind: label for kind, (label, _) in faults.FAULTS.items()} == {
        f.kind: e.name for e in ENTRIES for f in e.faults
    }
    assert set(config.FAULT_KINDS) == {f.kind for e in ENTRIES for f in e.faults if f.demonstrable}
    assert [z for z, _ in diagnose.RULES][:-1] == sorted(labels.LABELS, key=lambda z: -entry(z).priority)
    # instance above state, as the authors' release orders them
    order = [z for z, _ in diagnose.RULES]
    assert order.index("instance_mismatch") + 1 == order.index("state_mismatch")


@pytest.mark.parametrize(
    "entries, message",
    [
        (replaced("state_mismatch", rho=None), "label 'state_mismatch': no rho"),
        (replaced("state_mismatch", rho=-1.0), "label 'state_mismatch': rho must be > 0"),
        (replaced("state_mismatch", rho_reason=""), "label 'state_mismatch': no rho_reason"),
        (replaced("state_mismatch", priority=None), "label 'state_mismatch': no priority"),
        (replaced("state_mismatch", priority=entry("pass").priority), "share priority"),
        (replaced("instance_mismatch", description=""), "label 'instance_mismatch': no description"),
        (replaced("pass", guideline=Guideline("keep_going", "Keep going.", order=99)), "label 'pass': guideline"),
        (
            replaced("pass", guideline=None, faults=(Fault("", "nothing"),)),
            "label 'pass': a fault without a kind",
        ),
        (
            replaced("recovery_failure", faults=(Fault("spurious_call", "a second owner of the kind"),)),
            "fault kind 'spurious_call' is declared under labels ['spurious_tool_call', 'recovery_failure']",
        ),
        (
            replaced("recovery_failure", guideline=dataclasses.replace(entry("state_mismatch").guideline, order=50)),
            "guideline id 'state_aware' is used by labels",
        ),
        (
            replaced("recovery_failure", guideline=dataclasses.replace(entry("recovery_failure").guideline, order=1)),
            "share order 1",
        ),
        ([*ENTRIES, entry("pass")], "label 'pass' is declared twice"),
        (
            [*ENTRIES, Label("slow_answer", rho=1.0, rho_reason="paper", priority=45)],
            "label 'slow_answer': no description",
        ),
    ],
)
def test_an_incomplete_entry_is_named_with_what_it_lacks(entries, message):
    with pytest.raises(RegistryError, match="incomplete label registry") as raised:
        build(entries)
    assert message in str(raised.value)


def test_every_label_needs_its_rule_and_every_rule_a_label():
    registry = build(ENTRIES)
    rules = dict(diagnose.RULE_OF)
    assert [z for z, _ in rule_order(registry, rules)] == list(registry.by_priority)
    del rules["instance_mismatch"]
    with pytest.raises(RegistryError, match=r"label 'instance_mismatch': no rule \(bind a function"):
        rule_order(registry, rules)
    with pytest.raises(RegistryError, match="bound to 'instance_mismatches', which is no label"):
        rule_order(registry, {**diagnose.RULE_OF, "instance_mismatches": len})
    with pytest.raises(RegistryError, match="has two rules"):
        diagnose.rule("pass")(lambda ev: "")


def test_tables_elsewhere_that_name_labels_are_checked():
    require_labels(["pass", "state_mismatch"], "a table")
    with pytest.raises(RegistryError, match=r"a table names \['state_mismatched'\], which are no labels"):
        require_labels(["pass", "state_mismatched"], "a table")


NEW_ENTRY = """
    Label(
        "too_many_calls",
        rho=0.8,
        rho_reason="a test label",
        priority=45,
        description="The assistant made many more calls than the request needed before it answered.",
        guideline=Guideline("few_calls", "Make only the calls the request needs.", order=9),
    ),
"""
NEW_RULE = """
@rule("too_many_calls")
def _too_many_calls(ev: TurnEvidence) -> str:
    if ev.needs_call and ev.finished and len(ev.executed) > 2 * len(ev.gt_calls):
        return f"{len(ev.executed)} calls where the reference makes {len(ev.gt_calls)}"
    return ""


"""
USE_IT = """
import json
from seal_mini.config import DEFAULT_RHO, LABELS, load_config
from seal_mini.core import diagnose, grpo, interface, judge
from seal_mini.core.faults import as_pairs, call_blocks, plan, turn_messages
from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.scripted import DONE_TEXT
from seal_mini.checks import diagnose_check

task = tasks_by_id()["multi_turn_base_0"]
gt = [turn_messages(call_blocks(as_pairs(calls))) for calls in plan(task)]
cd, grep = gt[1][:2]
episode = diagnose_check.drive(task, [gt[0], [cd, grep, grep, grep, grep, DONE_TEXT], *gt[2:]])
labels = diagnose.diagnose(episode)
cfg = load_config()
weights, _ = grpo.diagnostic_weights([diagnose.trajectory_profile(labels)], cfg.diagnosis.rho, 0.5, 2.0)
profile = diagnose.failure_profile([labels], [0.0])
state = interface.evolve(interface.InterfaceState(), profile, cfg.interface)
from seal_mini.core.judge import tiny_random_judge
agreement = diagnose_check.judge_agreement(tiny_random_judge(), limit=1, turns=16)
import seal_mini.labels
print(json.dumps({
    "file": seal_mini.labels.__file__,
    "labels": labels,
    "rho": DEFAULT_RHO["too_many_calls"],
    "in_labels": "too_many_calls" in LABELS,
    "weight": weights.tolist(),
    "description": judge.LABEL_DESCRIPTIONS["too_many_calls"],
    "guideline": interface.GUIDELINES["few_calls"][0],
    "judged": agreement["turns"],
}))
"""


def test_adding_a_label_is_one_entry_and_one_rule(tmp_path):
    """A copy of the package with one more entry in labels.py and one more rule in diagnose.py, nothing
    else: the new label is diagnosed, weighted, profiled and judged."""
    copy = tmp_path / "seal_mini"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    registry_file = copy / "labels.py"
    text = registry_file.read_text()
    end = "\n)\n# --- end of the edit point"
    assert text.count(end) == 1
    registry_file.write_text(text.replace(end, textwrap.indent(NEW_ENTRY.strip("\n"), "") + end))
    rules_file = copy / "core" / "diagnose.py"
    text = rules_file.read_text()
    anchor = "def _cut_short("
    assert text.count(anchor) == 1
    rules_file.write_text(text.replace(anchor, NEW_RULE.lstrip("\n") + anchor))

    out = subprocess.run(
        [sys.executable, "-c", USE_IT], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).is_relative_to(tmp_path)  # the edited copy ran, not the kit
    assert result["labels"] == ["pass", "too_many_calls", "pass", "pass"]
    assert result["in_labels"] and result["rho"] == 0.8
    assert result["weight"] == pytest.approx([(3 * 1.0 + 0.8) / 4])
    assert result["guideline"] == "too_many_calls" and result["description"].startswith("The assistant made")
    assert result["judged"] > 0

    # The same entry without its rule stops the import and says what to add.
    rules_file.write_text(text)
    out = subprocess.run(
        [sys.executable, "-c", "import seal_mini.core.diagnose"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0
    assert "label 'too_many_calls': no rule (bind a function in seal_mini/core/diagnose.py" in out.stderr
