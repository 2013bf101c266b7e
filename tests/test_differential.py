"""The kit's episode and verifier against BFCL's own inference loop and scorer (seal_mini.programs.differential).

Every one of the 800 tasks, the ground truth and the perturbation kinds in CI_KINDS (one for each way the
kit once departed from BFCL, and controls): the kit's verdict must equal BFCL's on every episode.
`python -m seal_mini oracle --differential` plays the whole battery (PERTURBATIONS); it takes about
four times as long.
"""

from seal_mini.envs.bfcl import tasks_by_id
from seal_mini.envs.scripted import DONE_TEXT
from seal_mini.envs.toolcalls import format_call
from seal_mini.programs.differential import (
    CI_KINDS,
    PERTURBATIONS,
    bfcl_verdict,
    kit_verdict,
    print_report,
    run_differential,
)


def test_kit_and_bfcl_agree_on_every_episode_of_all_800_tasks(capsys):
    assert set(CI_KINDS) < set(PERTURBATIONS)
    result = run_differential(CI_KINDS)
    with capsys.disabled():
        print()
        print_report(result)
    kinds = result["kinds"]
    assert kinds["ground_truth"]["episodes"] == 800 and kinds["ground_truth"]["bfcl_passed"] == 800
    for kind, tally in kinds.items():
        assert tally["episodes"] > 100, kind
        assert tally["agree"] == tally["episodes"], (kind, tally["disagreements"])
    # Not vacuous: kinds BFCL fails, and kinds it passes although the old kit failed them.
    assert kinds["one_line_tags"]["bfcl_passed"] == kinds["parse_error_then_repair"]["bfcl_passed"] == 0
    assert kinds["broken_only_call"]["bfcl_passed"] == kinds["broken_only_call"]["episodes"]
    assert kinds["step_limit_in_last_turn"]["bfcl_passed"] == 800


def test_the_reference_is_bfcls_loop_answered_by_the_script():
    task = tasks_by_id()["multi_turn_base_0"]
    first = format_call("cd", {"folder": "document"})
    # the script answers every query; a message that decodes to no call ends BFCL's turn
    assert bfcl_verdict(task, [[first], [], [], []]) == (False, "multi_turn:instance_state_mismatch")
    assert bfcl_verdict(task, [[DONE_TEXT]] * 4) == (False, "multi_turn:empty_turn_model_response")
    assert kit_verdict(task, [[DONE_TEXT]] * 4) == (False, "multi_turn:empty_turn_model_response")


def test_bad_options_are_one_line_naming_the_option(capsys):
    from seal_mini.__main__ import main

    assert main(["oracle", "--differential", "--kinds", "bogus"]) == 2
    assert "error: --kinds: unknown perturbation kinds ['bogus']; known: ground_truth" in capsys.readouterr().err
    for argv in (["oracle", "--differential", "--limit", "-1"], ["diagnose-check", "--limit", "-1"]):
        try:
            main(argv)
            raise AssertionError(f"{argv} ran")
        except SystemExit as e:  # argparse's own one-line refusal
            assert e.code == 2
        assert "argument --limit: must be >= 0, got -1" in capsys.readouterr().err, argv
