"""The template's own Python (these tests and the Copier hooks) passes ruff and strict mypy,
with the configuration in the root pyproject.toml; a rendered service's code is checked by
tests/test_render.py against its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(120)


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )


def test_the_template_s_own_tests_and_hooks_pass_ruff() -> None:
    check = run("ruff", "check", "--no-cache", "tests", "hooks")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = run("ruff", "format", "--check", "--no-cache", "tests", "hooks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_the_template_s_own_tests_and_hooks_pass_strict_mypy() -> None:
    result = run("mypy")  # the files and `strict`: pyproject.toml's [tool.mypy]
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout
