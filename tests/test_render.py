"""Render the template as users do and hold the output to the bar of hand-written code.

Fast checks run for every example, edge and adversarial answer set (tests/answer_sets/) and for
every Redis provider with each TLS mode it allows: nothing left unrendered, portable file
names, the answers file Copier needs for updates, ruff and mypy clean. The slow tests install
rendered services and run their own generated suites against a real Redis and a real
PostgreSQL (and SQLite): the whole suite for the sets of the full tier, the fast tier (unit,
integration and agent tests) for the others, each on the database the set answered (a full
tier on each database); and they run the demo end to end.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    path.stem: yaml.safe_load(path.read_text()) for path in (REPO_ROOT / "examples").glob("*.yml")
}
BIN = Path(sys.executable).parent
EIGHT_AGENTS = {
    f"agent_{n}": {
        "paid": n % 2 == 0,
        "daily_cap_usd": 5,
        "timeout_s": 30 * n,
        "lane": "slow" if n > 5 else "default",
    }
    for n in range(1, 9)
}
# Answer sets far from the examples, each saying what it stresses and its tier ("Tier: full"
# runs the whole generated suite, "Tier: fast" its unit, integration and agent tests).
ADVERSARIAL_FILES = sorted((REPO_ROOT / "tests" / "answer_sets").glob("*.yml"))
ADVERSARIAL = {path.stem: yaml.safe_load(path.read_text()) for path in ADVERSARIAL_FILES}


def tier_of(path: Path) -> str:
    found = re.search(r"^# .*Tier: (full|fast)\.$", path.read_text(), re.M)
    assert found, f"{path.name}: say 'Tier: full.' or 'Tier: fast.' in its header comment"
    return found.group(1)


TIERS = {
    "minimal": "fast",
    "support-desk": "fast",
    "research-pipeline": "full",
    **{path.stem: tier_of(path) for path in ADVERSARIAL_FILES},
}
FAST_TIER = ["tests/unit", "tests/integration", "tests/agents"]
# Test processes per generated suite (pytest-xdist): its tests wait on workers, Redis and
# PostgreSQL more than they compute, so three share two cores well.
GENERATED_WORKERS = "3"
CHOICES = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())
PROVIDER_TLS = [
    (provider, tls)
    for provider in CHOICES["redis_provider"]["choices"].values()
    for tls in CHOICES["redis_tls"]["choices"].values()
    if not (provider == "upstash" and tls == "none")  # the validator refuses it
]
ANSWER_SETS: dict[str, dict[str, Any]] = {
    **EXAMPLES,
    **ADVERSARIAL,
    "defaults": {},
    "dashed-name": {"project_name": "My Cool-Service"},
    "one-agent": {"agents": {"only": {"paid": False, "timeout_s": 5, "lane": "x"}}},
    "eight-agents": {"agents": EIGHT_AGENTS, "python_version": "3.12"},
    # The longest names the validators allow (20 characters), in every generated line that
    # holds one: a name one character longer than the lines were written for fails ruff.
    "longest-names": {
        "project_name": "Abcdefghij Klmnopqrs",
        "agents": {
            "pydantic": {
                "paid": True,
                "daily_cap_usd": 5,
                "timeout_s": 60,
                "lane": "default",
                "framework": "pydantic-ai",
            },
            "agents_sdk": {
                "paid": True,
                "daily_cap_usd": 5,
                "timeout_s": 60,
                "lane": "default",
                "framework": "openai-agents",
            },
            "plain": {
                "paid": True,
                "daily_cap_usd": 5,
                "timeout_s": 60,
                "lane": "default",
                "job_budget_usd": 1,
            },
        },
    },
}
WINDOWS_INVALID = re.compile(r'[<>:"|?*\\]|[. ]$|^(con|prn|aux|nul|com\d|lpt\d)(\..*)?$', re.I)


def render(template_repo: Path, dst: Path, data: dict[str, Any]) -> Path:
    copier.run_copy(
        str(template_repo), dst, data=data, defaults=True, unsafe=False, vcs_ref="HEAD", quiet=True
    )
    return dst


def run(
    cmd: list[str], cwd: Path, timeout: int = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module", params=sorted(ANSWER_SETS))
def rendered(
    request: pytest.FixtureRequest, template_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return render(
        template_repo, tmp_path_factory.mktemp(request.param) / "out", ANSWER_SETS[request.param]
    )


# Files whose braces are not Copier's: the console's run-time Jinja templates, the vendored
# htmx, and images. A lone "}}" is not looked for: nested dicts and JSON end with one, and a
# leftover expression always has its "{{".
NOT_COPIER_JINJA = re.compile(r"(^|/)web/(templates|static)/|\.png$")


def leftover_jinja(project: Path) -> list[str]:
    """Files (or file names) of a render that still hold Copier's Jinja."""
    return [
        str(path.relative_to(project))
        for path in project.rglob("*")
        if "{{" in path.name
        or (
            path.is_file()
            and not NOT_COPIER_JINJA.search(path.relative_to(project).as_posix())
            and re.search(r"{{|{%|%}", path.read_text(errors="replace"))
        )
    ]


def test_no_jinja_is_left_unrendered(rendered: Path) -> None:
    assert leftover_jinja(rendered) == []


def test_every_file_name_is_valid_on_windows(rendered: Path) -> None:
    bad = [
        str(p.relative_to(rendered)) for p in rendered.rglob("*") if WINDOWS_INVALID.search(p.name)
    ]
    assert bad == []


def test_the_answers_file_records_the_source_and_commit_for_updates(rendered: Path) -> None:
    answers = yaml.safe_load((rendered / ".copier-answers.yml").read_text())
    assert answers["_src_path"] and re.fullmatch(r"[0-9a-f]{40}|.+", str(answers["_commit"]))
    assert "_commit" in answers


def test_every_template_file_says_who_owns_it(rendered: Path) -> None:
    missing = [
        str(path.relative_to(rendered))
        for path in [*rendered.rglob("*.py"), *rendered.rglob("*.md"), rendered / "pyproject.toml"]
        if not re.search(r"(?i)(template|user)-owned", "\n".join(path.read_text().splitlines()[:6]))
    ]
    assert missing == []


# What a user-owned file may import of its service (STYLE rule 11): the agent contract, the
# public test API, the documented integrations and the user's own agents.
PUBLIC_FACE = re.compile(r"^(agent|testing|agents(\.\w+)?|integrations\.\w+)$")


def test_user_owned_files_import_only_the_public_face_of_their_service(rendered: Path) -> None:
    """`copier update` never changes them, so an internal module they imported would pin the
    layout of the day they were rendered."""
    answers = yaml.safe_load((rendered / ".copier-answers.yml").read_text())
    package = answers["package_name"]
    owned = [
        *(rendered / "src" / package / "agents").glob("*.py"),
        *(rendered / "tests" / "agents").glob("*.py"),
    ]
    assert owned
    found = []
    for path in owned:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                modules = ["." * node.level + (node.module or "")]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                inner = module.removeprefix(f"{package}.")
                if module.startswith((f"{package}.", ".")) and not PUBLIC_FACE.match(inner):
                    found.append(f"{path.relative_to(rendered)}: {module}")
    assert found == []


def test_the_generated_code_passes_ruff(rendered: Path) -> None:
    check = run([str(BIN / "ruff"), "check", "."], rendered)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = run([str(BIN / "ruff"), "format", "--check", "."], rendered)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for every render: the libraries are analysed once, each service in full.

    Renders differ in their package names, so nothing of one service is reused for another.
    """
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(project: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "mypy"), "--cache-dir", str(cache)], project)


def test_the_generated_code_passes_strict_mypy(rendered: Path, mypy_cache: Path) -> None:
    result = mypy(rendered, mypy_cache)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="session")
def pair_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this test process renders every provider/TLS pair, one after another.

    The pairs differ only in the files these two answers touch, so one path and one package
    name let mypy's cache check each render's changed modules (and what depends on their
    interfaces) instead of the whole service again: a full check of a service is about 20 s,
    a re-check of one changed module about 1 s.
    """
    return tmp_path_factory.mktemp("pairs") / "out"


# The unit tests read neither Redis answer (the test after the pairs keeps that true): the
# provider changes only doctor's fix text and the docs, the TLS mode the settings' default. So a
# pair's unit tests run once per TLS mode, on its first provider, instead of on all 20 pairs.
UNIT_PAIRS = {next(pair for pair in PROVIDER_TLS if pair[1] == tls) for _, tls in PROVIDER_TLS}


@pytest.mark.parametrize(
    ("provider", "tls"), [pytest.param(*pair, id="-".join(pair)) for pair in PROVIDER_TLS]
)
def test_every_provider_with_each_tls_mode_renders_clean_and_passes_its_unit_tests(
    provider: str, tls: str, template_repo: Path, pair_project: Path, mypy_cache: Path
) -> None:
    """Doctor's fixes, the runbook and the TLS settings depend on these two answers.

    Each pair is rendered afresh over the last one (see `pair_project`) and run from src/
    without installing it. Ruff and mypy check every pair; the unit tests run for one
    provider of each TLS mode (see UNIT_PAIRS).
    """
    shutil.rmtree(pair_project, ignore_errors=True)
    project = render(
        template_repo,
        pair_project,
        {"project_name": "Provider Pair", "redis_provider": provider, "redis_tls": tls},
    )
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert (answers["redis_provider"], answers["redis_tls"]) == (provider, tls)
    assert leftover_jinja(project) == []
    for check in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        result = run([str(BIN / check[0]), *check[1:]], project)
        assert result.returncode == 0, result.stdout + result.stderr
    typed = mypy(project, mypy_cache)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    if (provider, tls) not in UNIT_PAIRS:
        return
    unit = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"],
        project,
        PYTHONPATH=str(project / "src"),
    )
    assert unit.returncode == 0, unit.stdout[-4000:] + unit.stderr[-2000:]


def test_the_unit_tests_read_neither_redis_answer() -> None:
    """Why UNIT_PAIRS may run a pair's unit tests once per TLS mode: a unit test that read the
    provider or the TLS mode would need every pair again."""
    unit_tests = (REPO_ROOT / "template" / "tests" / "unit").rglob("*")
    readers = [
        path.name
        for path in unit_tests
        if path.is_file() and re.search(r"(?i)redis_(provider|tls)", path.read_text())
    ]
    assert readers == []
    assert {tls for _, tls in UNIT_PAIRS} == {tls for _, tls in PROVIDER_TLS}


# Slow: install rendered examples and run what their users run. ---------------------------


def install(project: Path) -> None:
    result = run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(project)], project
    )
    assert result.returncode == 0, result.stdout + result.stderr


def installs(name: str) -> pytest.MarkDecorator:
    """The xdist group of the slow tests that install the service of answer set `name`.

    Each slow test installs its render into this one venv (`pip install -e`), and two renders
    of one answer set (its suite and its chaos, browser or demo run) share a package name: run
    two at a time (`-n 2 --dist loadgroup`), they go to one process, one after the other, and
    never replace each other's install mid-run.
    """
    return pytest.mark.xdist_group(name)


# The slow pass starts the longest suites first, so the two processes finish together.
SLOW_ORDER = sorted(TIERS, key=lambda name: (TIERS[name] != "full", name))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(name, id=f"{name}-{TIERS[name]}", marks=installs(name)) for name in SLOW_ORDER],
)
def test_a_rendered_answer_set_passes_its_own_suite_against_real_services(
    name: str, template_repo: Path, tmp_path: Path
) -> None:
    """Any answers the validators accept give a service whose own suite passes (issue 17)."""
    database_url = os.environ.get("TEST_DATABASE_URL")
    if not database_url:
        pytest.fail(
            "TEST_DATABASE_URL is not set: run the suite with `make test`, which starts PostgreSQL"
        )
    project = render(template_repo, tmp_path / name, ANSWER_SETS[name])
    install(project)
    selection = FAST_TIER if TIERS[name] == "fast" else []
    pytest_args = ["-q", "-p", "no:cacheprovider", "-n", GENERATED_WORKERS, *selection]
    result = run(
        [sys.executable, "-m", "pytest", *pytest_args],
        project,
        timeout=900,
        TEST_DATABASE_URL=database_url,
        TEST_DATABASES=databases_of(name),
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, (
        failed_tests(result.stdout) + result.stdout[-6000:] + result.stderr[-3000:]
    )
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary


# The newest Python the `python_version` question offers. The other slow tests run every
# render on this suite's own Python (the oldest offered); this one runs on the newest, where
# new warnings (3.13: an unclosed sqlite3 connection) fail tests the oldest passes.
NEWEST_PYTHON = CHOICES["python_version"]["choices"][-1]


def interpreter(version: str) -> str | None:
    """A `python<version>` that runs, installed by pyenv or on PATH (a pyenv shim on PATH
    may name a version the shell has not selected), or None."""
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for found in [*map(str, pyenv), shutil.which(f"python{version}")]:
        if found and run([found, "-V"], Path.home()).returncode == 0:
            return found
    return None


@pytest.mark.slow
@installs("newest-python")
def test_the_newest_python_version_answer_passes_its_fast_tier_on_that_python(
    template_repo: Path, tmp_path: Path
) -> None:
    python = interpreter(NEWEST_PYTHON)
    if python is None:
        pytest.skip(f"no Python {NEWEST_PYTHON} here (on PATH or under ~/.pyenv)")
    project = render(template_repo, tmp_path / "newest", {"python_version": NEWEST_PYTHON})
    venv = tmp_path / "venv"
    made = run([python, "-m", "venv", str(venv)], project)
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    installed = run([*pip, "-e", f"{project}[dev]", "pytest-xdist"], project)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    pytest_args = ["-q", "-p", "no:cacheprovider", "-n", GENERATED_WORKERS, *FAST_TIER]
    result = run(
        [str(venv / "bin" / "python"), "-m", "pytest", *pytest_args],
        project,
        timeout=900,
        TEST_DATABASE_URL=os.environ.get("TEST_DATABASE_URL", ""),
        TEST_DATABASES="sqlite",
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, (
        failed_tests(result.stdout) + result.stdout[-6000:] + result.stderr[-3000:]
    )
    assert f"Python {NEWEST_PYTHON}" in run([str(venv / "bin" / "python"), "-V"], project).stdout
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary


# The PostgreSQL answer sets whose suite reaches PostgreSQL through a PgBouncer in transaction
# pooling mode (the generated conftest starts it from $TEST_PGBOUNCER): the unit, integration
# and agent tests of a fast tier, at no extra time.
THROUGH_PGBOUNCER = {"support-desk"}


def databases_of(name: str) -> str:
    """$TEST_DATABASES for the generated suite of answer set `name`: the database it
    answered (running every test on both doubled a whole suite's time, to near its bound),
    through PgBouncer for the sets in THROUGH_PGBOUNCER."""
    if name in THROUGH_PGBOUNCER:
        return "pgbouncer"
    return str(ANSWER_SETS[name].get("database", "sqlite"))


def test_each_database_meets_every_generated_test_in_a_full_tier() -> None:
    full = {databases_of(name) for name in TIERS if TIERS[name] == "full"}
    assert full == {"sqlite", "postgresql"}


def test_the_integration_tier_runs_through_pgbouncer_for_a_postgresql_answer_set() -> None:
    for name in THROUGH_PGBOUNCER:
        assert ANSWER_SETS[name]["database"] == "postgresql" and TIERS[name] == "fast", name
        assert "tests/integration" in FAST_TIER


MAX_E_LINES = 60  # of the failure reports, in failed_tests


def failed_tests(output: str) -> str:
    """The names of a generated suite's failed tests (its `-ra` summary) and the `E` lines
    of their reports (what each assertion or error said), which a long failure report and
    its captured logs can push out of the tail that an assertion message shows."""
    names = re.findall(r"^(?:FAILED|ERROR) .*$", output, re.M)
    if not names:
        return ""
    said = re.findall(r"^E {3}.*$", output, re.M)[:MAX_E_LINES]
    return "\n".join(["generated tests that failed:", *names, "", *said, "", ""])


def test_a_failed_generated_test_shows_what_its_report_said() -> None:
    output = "_ test_x _\n    def test_x():\n>       assert 1 == 2\nE       assert 1 == 2\n"
    output += "-- Captured log --\nlots of lines\nFAILED tests/test_a.py::test_x - assert 1 == 2\n"
    shown = failed_tests(output)
    assert "FAILED tests/test_a.py::test_x" in shown and "E       assert 1 == 2" in shown
    assert "lots of lines" not in shown and failed_tests("1 passed") == ""


@pytest.mark.slow
@installs("minimal")
def test_the_demo_runs_end_to_end_on_the_embedded_defaults(
    template_repo: Path, tmp_path: Path
) -> None:
    project = render(template_repo, tmp_path / "demo", EXAMPLES["minimal"])
    install(project)
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    # Twice: the next step says to run it again, and a second run must tell the same story
    # (its paid jobs would be denied on the first run's spend if it kept the record).
    for _ in range(2):
        result = subprocess.run(
            [str(BIN / "minimal-worker"), "dev", "--demo"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        states = re.findall(r"^[0-9a-f]{32}\s+(\w+)\s+(\w+)", result.stdout, re.M)
        assert sorted(states) == [
            ("scripted", "completed"),
            ("scripted", "dead_lettered"),
            ("scripted_paid", "completed"),
            ("scripted_paid", "denied"),
            ("scripted_paid", "in_doubt"),
            ("summarize", "completed"),
            ("summarize", "failed"),
        ]
        # Only what a person needs: no Alembic set-up or migration lines, the test doubles
        # said to be test doubles, and the next step last.
        assert "alembic" not in result.stderr.lower(), result.stderr
        assert "scripted and scripted_paid are test doubles from minimal_worker.testing" in (
            " ".join(result.stdout.split())
        ), result.stdout
        last = result.stdout.strip().split("\n\n")[-1]
        assert last.startswith("Next: write your agent in "), result.stdout
