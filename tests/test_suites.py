"""The suites' registry (seal_mini.evaluation.suites): a recipe naming an unknown suite stops before anything runs."""

import pytest

from seal_mini.__main__ import main

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`


def test_an_unknown_suite_is_refused_in_one_line_naming_ood_suites(capsys):
    known = "choose from ['bfcl_v4_memory', 'bfcl_v4_web_search', 'tau2']"
    for command in (["pipeline", "recipes/cpu_smoke.yaml"], ["eval", "--scripted", "ground_truth"]):
        assert main([*command, "ood.suites=[bfcl_v4_memroy]", "out_dir=/nonexistent/never_written"]) == 2
        assert capsys.readouterr().err == f"error: ood.suites: unknown suite 'bfcl_v4_memroy'; {known}\n"
