"""pyproject.toml declares what requirements*.txt pin (run.sh installs from those files, pip from pyproject),
and the `seal-mini` command is `python -m seal_mini`."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: `bash run.sh test -m unit`

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name: str) -> list[str]:
    """The requirement lines of a requirements file, comments and blank lines left out."""
    lines = (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return sorted(line for line in lines if line)


@pytest.mark.parametrize(
    "file, extra",
    [
        ("requirements.txt", None),
        ("requirements-ood.txt", "ood"),
        ("requirements-log.txt", "log"),
        ("requirements-gpu.txt", "gpu"),
        ("requirements-dev.txt", "dev"),
    ],
)
def test_pyproject_pins_equal_the_requirements_files(file, extra):
    declared = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    where = "dependencies" if extra is None else f"optional-dependencies.{extra}"
    assert sorted(declared) == pins(file), f"pyproject.toml's {where} must pin what {file} pins"


def test_every_requirements_file_is_declared_and_no_deps_ones_are_not_dependencies():
    files = {p.name for p in ROOT.glob("requirements*.txt")}
    assert files == {
        "requirements.txt",
        "requirements-ood.txt",
        "requirements-log.txt",
        "requirements-gpu.txt",
        "requirements-dev.txt",
        "requirements-nodeps.txt",
    }, "a new requirements file needs its extra in pyproject.toml and a case in this test"
    declared = {d.split("==")[0] for d in PROJECT["dependencies"]}
    declared |= {d.split("==")[0] for deps in PROJECT["optional-dependencies"].values() for d in deps}
    nodeps = {line.split("==")[0] for line in pins("requirements-nodeps.txt")}
    # bfcl-eval's own dependency set is ~6 GB: it is installed with --no-deps, as a second step
    assert nodeps and not nodeps & declared


def test_the_console_script_is_the_module_entry_point():
    from seal_mini.__main__ import main

    module, _, function = PROJECT["scripts"]["seal-mini"].partition(":")
    assert (module, function) == ("seal_mini.__main__", "main")
    assert main(["--help"]) == 0
