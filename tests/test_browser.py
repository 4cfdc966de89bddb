"""The console's browser tests of one rendered example: Debian's Chromium, headless, driven
by Playwright (`pytest -m browser` in the service; docs/OPERATIONS.md of the service).

One example only (render, install and run take about a minute): the tests start their own
`web` process, Redis and SQLite database, and need /usr/bin/chromium, which `make test`
installs (scripts/services.sh).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_render import EXAMPLES, install, installs, render, run

EXAMPLE = "support-desk"


@pytest.mark.slow
@installs(EXAMPLE)
@pytest.mark.timeout(600)
def test_the_console_of_a_rendered_example_passes_its_browser_tests(
    template_repo: Path, tmp_path: Path
) -> None:
    project = render(template_repo, tmp_path / EXAMPLE, EXAMPLES[EXAMPLE])
    install(project)
    result = run(
        [sys.executable, "-m", "pytest", "-m", "browser", "-q", "-p", "no:cacheprovider"],
        project,
        timeout=540,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\b9 passed\b", summary) and "skipped" not in summary, summary
