"""The questions as a person meets them: the real `copier copy` prompts in an 80-column terminal.

Copier shows each question's help on one line after a 3-column mark and cuts what does not fit
at the terminal's edge; a failing validator's sentence goes to the bottom line after
"Validation error for question 'X': ", cut the same way. tmux gives the prompts a real
terminal of a known size, and `capture-pane` reads back what a person would see.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {
    key: spec
    for key, spec in yaml.safe_load((REPO_ROOT / "copier.yml").read_text()).items()
    if not key.startswith("_")
}
COLUMNS, ROWS = 80, 24
# The whole conversation, Copier's start and the render included, stays well inside this.
DEADLINE_S = 60
# `make test` exports TEST_TMUX (scripts/test.sh, after ensure_tmux installed it), so there the
# test always runs; only a bare `pytest` on a machine without tmux skips it.
TMUX = os.environ.get("TEST_TMUX") or shutil.which("tmux")
# What the bottom line shows of max_attempts' validator at 80 columns: the fix comes first.
FIX_FIRST = "Validation error for question 'max_attempts': write a whole number"

pytestmark = [
    pytest.mark.timeout(DEADLINE_S + 30),
    pytest.mark.skipif(
        TMUX is None,
        reason="tmux is not on PATH: scripts/services.sh (ensure_tmux, run by scripts/test.sh) "
        "installs it with apt-get as root",
    ),
]


class Terminal:
    """One tmux session of COLUMNS x ROWS on a private server, driven by keys."""

    def __init__(self, socket: Path, command: str, env: dict[str, str]) -> None:
        self.base = [str(TMUX), "-S", str(socket)]
        self.deadline = time.monotonic() + DEADLINE_S
        subprocess.run(
            [
                *self.base,
                "new-session",
                "-d",
                "-s",
                "q",
                "-x",
                str(COLUMNS),
                "-y",
                str(ROWS),
                command,
            ],
            check=True,
            env=env,
            timeout=10,
        )

    def screen(self) -> list[str]:
        out = subprocess.run(
            [*self.base, "capture-pane", "-p", "-t", "q"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return out.stdout.splitlines()

    def wait_for(self, seen: Callable[[list[str]], bool], what: str) -> list[str]:
        while True:
            lines = self.screen()
            if seen(lines):
                return lines
            if time.monotonic() > self.deadline:
                screen = "\n".join(lines)
                pytest.fail(f"{what} not seen within {DEADLINE_S} s; the screen:\n{screen}")
            time.sleep(0.1)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "q", *keys], check=True, timeout=10)

    def type(self, text: str) -> None:
        subprocess.run(
            [*self.base, "send-keys", "-t", "q", "-l", "--", text], check=True, timeout=10
        )

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def terminal(template_repo: Path, tmp_path: Path) -> Iterator[tuple[Terminal, Path, Path]]:
    """`copier copy` of the template, interactive, in an 80-column tmux pane; yields the
    terminal, the destination and the file its exit code is written to."""
    dst, rc = tmp_path / "out", tmp_path / "rc"
    copy = shlex.join(
        [sys.executable, "-m", "copier", "copy", "--vcs-ref", "HEAD", str(template_repo), str(dst)]
    )
    env = {**os.environ, "TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    term = Terminal(
        tmp_path / "tmux.sock", f"{copy}; echo $? > {shlex.quote(str(rc))}; sleep 600", env
    )
    try:
        yield term, dst, rc
    finally:
        term.close()


def _has_whole_line(help_text: str) -> Callable[[list[str]], bool]:
    # The mark (an emoji, two columns) and a space, then the help; nothing cut at the edge.
    return lambda lines: any(line.rstrip().endswith(" " + help_text) for line in lines)


def _bottom_starts(text: str) -> Callable[[list[str]], bool]:
    def seen(lines: list[str]) -> bool:
        filled = [line for line in lines if line.strip()]
        return bool(filled) and filled[-1].startswith(text)

    return seen


def test_every_help_line_and_a_bad_number_are_readable_at_80_columns(
    terminal: tuple[Terminal, Path, Path],
) -> None:
    term, dst, rc = terminal
    for key, spec in QUESTIONS.items():
        help_text = spec["help"]
        term.wait_for(_has_whole_line(help_text), f"the whole help line of {key!r}")
        if key == "max_attempts":
            # A word where a number belongs: a sentence that leads with the fix, not Copier's
            # bare "Invalid input"; then a number typed at the prompt arrives as a number.
            term.keys("C-u")
            term.type("three")
            term.keys("Enter")
            lines = term.wait_for(_bottom_starts(FIX_FIRST), "the validator's line")
            assert "Invalid input" not in "\n".join(lines)
            term.keys("C-u")
            term.type("5")
        elif key == "backoff_base_s":
            term.keys("C-u")
            term.type("2")
        term.keys("Enter")
    term.wait_for(lambda _lines: rc.exists() and rc.read_text().strip() != "", "copier's exit")
    assert rc.read_text().strip() == "0", "\n".join(term.screen())
    answers = yaml.safe_load((dst / ".copier-answers.yml").read_text())
    assert answers["max_attempts"] == 5 and type(answers["max_attempts"]) is int
    assert answers["backoff_base_s"] == 2.0 and type(answers["backoff_base_s"]) is float
    assert answers["longest_job_s"] == 600 and type(answers["longest_job_s"]) is int
    catalog = (dst / "src" / "agent_worker" / "catalog.py").read_text()
    assert re.search(r"^MAX_ATTEMPTS = 5$", catalog, re.M), catalog
    assert re.search(r"^BACKOFF_BASE_S = 2\.0$", catalog, re.M), catalog
