"""The chaos run of a rendered PostgreSQL example: workers killed, Redis flushed and
restarted, PostgreSQL stopped, and every count checked (docs/CHAOS.md of the service).

One example only, the one with a slow lane: render, install and run take about 80 s. The
harness starts its own Redis and PostgreSQL, so it needs the machine's `redis-server` and
`initdb` (which `make test` makes sure of), not TEST_DATABASE_URL.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_render import EXAMPLES, install, installs, render, run

EXAMPLE = "research-pipeline"


@pytest.mark.slow
@installs(EXAMPLE)
@pytest.mark.timeout(600)
def test_the_chaos_run_of_a_rendered_postgresql_example_passes(
    template_repo: Path, tmp_path: Path
) -> None:
    project = render(template_repo, tmp_path / EXAMPLE, EXAMPLES[EXAMPLE])
    install(project)
    result = run(
        [sys.executable, "-m", "pytest", "-m", "chaos", "-q", "-p", "no:cacheprovider"],
        project,
        timeout=540,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\b1 passed\b", summary) and "skipped" not in summary, summary
