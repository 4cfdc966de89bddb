"""The questions in copier.yml: defaults, examples, edge cases and every validator's message.

Bad answers are given the way users give them, as `copier copy -d key=value` in a subprocess:
Copier then prints a traceback whose last line must say what is wrong and what to write instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yml"))
COPIER = [sys.executable, "-m", "copier"]


def render(template_repo: Path, dst: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Render with Copier's API as a user without --trust would, and return the recorded answers."""
    copier.run_copy(
        str(template_repo),
        dst,
        data=data,
        defaults=True,
        unsafe=False,
        vcs_ref="HEAD",
        quiet=True,
    )
    answers: dict[str, Any] = yaml.safe_load((dst / ".copier-answers.yml").read_text())
    return answers


def copier_copy(template_repo: Path, dst: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`copier copy --defaults --vcs-ref HEAD <args> <template> <dst>`, never interactive."""
    return subprocess.run(
        [*COPIER, "copy", "--defaults", "--vcs-ref", "HEAD", *args, str(template_repo), str(dst)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=50,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_the_documented_example_answer_files_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"minimal.yml", "support-desk.yml", "research-pipeline.yml"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_every_example_renders_and_its_answers_are_recorded(
    template_repo: Path, tmp_path: Path, example: Path
) -> None:
    data = yaml.safe_load(example.read_text())
    answers = render(template_repo, tmp_path / "out", data)
    for key, value in data.items():
        assert answers[key] == value, key


def test_the_minimal_example_derives_its_slug_and_package_from_the_project_name(
    template_repo: Path, tmp_path: Path
) -> None:
    data = yaml.safe_load((REPO_ROOT / "examples" / "minimal.yml").read_text())
    answers = render(template_repo, tmp_path / "out", data)
    assert answers["project_slug"] == "minimal-worker"
    assert answers["package_name"] == "minimal_worker"
    assert list(answers["agents"]) == ["summarize"]
    assert answers["agents"]["summarize"]["paid"] is False


def test_rendering_again_from_the_recorded_answers_gives_the_same_files(
    template_repo: Path, tmp_path: Path
) -> None:
    for example in EXAMPLES:
        first = tmp_path / example.stem / "first"
        answers = render(template_repo, first, yaml.safe_load(example.read_text()))
        again = tmp_path / example.stem / "again"
        render(template_repo, again, {k: v for k, v in answers.items() if not k.startswith("_")})
        for path in sorted(first.rglob("*")):
            if path.is_file() and path.name != ".copier-answers.yml":
                relative = path.relative_to(first)
                assert (again / relative).read_bytes() == path.read_bytes(), (
                    f"{example.name}: {relative}"
                )


def test_copy_with_all_defaults_needs_no_trust_and_never_prompts(
    template_repo: Path, tmp_path: Path
) -> None:
    result = copier_copy(template_repo, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    answers = yaml.safe_load((tmp_path / "out" / ".copier-answers.yml").read_text())
    assert answers["project_slug"] == "agent-worker"
    assert answers["redis_tls"] == "none"
    assert answers["database"] == "sqlite"
    assert answers["global_daily_cap_usd"] is None
    assert answers["jobs_per_hour"] is None


def test_the_message_after_copy_names_each_paid_agent_without_a_cap_and_the_fix(
    template_repo: Path, tmp_path: Path
) -> None:
    agents = (
        "agents={draft: {paid: true, timeout_s: 60, lane: default},"
        " search: {paid: true, timeout_s: 60, lane: default},"
        " bill: {paid: true, daily_cap_usd: 5, timeout_s: 60, lane: default},"
        " triage: {paid: false, timeout_s: 30, lane: default}}"
    )
    result = copier_copy(template_repo, tmp_path / "out", "-d", agents)
    assert result.returncode == 0, result.stderr
    said = result.stdout + result.stderr
    for name in ("draft", "search"):
        assert f"Paid agent {name} has no daily cap" in said, said
        assert f"agent-worker caps set {name} USD_PER_DAY --approved-by YOUR_NAME" in said
    assert "Paid agent bill" not in said and "Paid agent triage" not in said
    assert "agent-worker db upgrade" in said


def test_numbers_given_as_d_strings_keep_their_int_and_float_types(
    template_repo: Path, tmp_path: Path
) -> None:
    result = copier_copy(
        template_repo,
        tmp_path / "out",
        "-d", "max_attempts=5",
        "-d", "backoff_base_s=1",
        "-d", "backoff_max_s=60",
        "-d", "longest_job_s=900",
        "-d", "global_daily_cap_usd=12.5",
        "-d", "jobs_per_hour=300",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = yaml.safe_load((tmp_path / "out" / ".copier-answers.yml").read_text())
    assert answers["max_attempts"] == 5 and type(answers["max_attempts"]) is int
    assert answers["backoff_base_s"] == 1.0 and type(answers["backoff_base_s"]) is float
    assert answers["backoff_max_s"] == 60.0 and type(answers["backoff_max_s"]) is float
    assert answers["longest_job_s"] == 900 and type(answers["longest_job_s"]) is int
    assert answers["global_daily_cap_usd"] == 12.5
    assert answers["jobs_per_hour"] == 300


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"project_name": "My Cool-Service"},
            {"project_slug": "my-cool-service", "package_name": "my_cool_service"},
            id="dashed-project-name",
        ),
        pytest.param(
            {"agents": {"only": {"paid": True, "daily_cap_usd": 3, "timeout_s": 5, "lane": "x"}}},
            {"longest_job_s": 600},
            id="one-agent",
        ),
        pytest.param(
            {
                "agents": {
                    f"agent_{n}": {
                        "paid": n % 2 == 0,
                        "daily_cap_usd": 10 + n if n % 2 == 0 else None,
                        "timeout_s": 60 * (n + 1),
                        "lane": "slow" if n >= 6 else "default",
                        "max_attempts": 1 + n % 3,
                    }
                    for n in range(8)
                }
            },
            # Every timeout (60..480 s) fits the 600 s default of longest_job_s.
            {"longest_job_s": 600},
            id="eight-agents",
        ),
        pytest.param(
            {"agents": {"deep": {"paid": False, "timeout_s": 1800, "lane": "slow"}}},
            {"longest_job_s": 1800},
            id="long-agent-raises-longest-job-default",
        ),
        pytest.param(
            {"redis_provider": "upstash"},
            {"redis_tls": "tls"},
            id="managed-redis-defaults-to-tls",
        ),
    ],
)
def test_answer_edge_cases_render(
    template_repo: Path, tmp_path: Path, data: dict[str, Any], expected: dict[str, Any]
) -> None:
    answers = render(template_repo, tmp_path / "out", data)
    for key, value in {**data, **expected}.items():
        assert answers[key] == value, key


def _agent(**fields: Any) -> str:
    spec = {"paid": False, "timeout_s": 60, "lane": "default", **fields}
    body = ", ".join(f"{key}: {value}" for key, value in spec.items())
    return f"agents={{summarize: {{{body}}}}}"


# id: (the -d answers, a fragment of the last stderr line)
BAD_ANSWERS: dict[str, tuple[list[str], str]] = {
    "dashed-package-name": (
        ["package_name=my-pkg"],
        "write my_pkg or another name of lowercase letters, digits and underscores",
    ),
    "keyword-package-name": (
        ["package_name=class"],
        "write another name, e.g. class_worker; package_name 'class' is a Python keyword",
    ),
    "long-package": (
        ["project_name=Customer Support Escalation"],
        "write a name of at most 20 characters, e.g. customer-support-esc; project_slug "
        "'customer-support-escalation' is 27 characters",
    ),
    "bad-slug": (
        ["project_slug=My_Service"],
        "write my-service or another name of lowercase letters, digits and dashes",
    ),
    "digit-first-project-name": (
        ["project_name=2nd Worker"],
        "write my-2nd-worker or another name",
    ),
    "quote-in-description": (
        ['description=say "hi"'],
        "write one plain line without a line break, a double quote or a backslash",
    ),
    "empty-agents": (
        ["agents={}"],
        "write at least one agent, e.g. {summarize: {paid: false, timeout_s: 60, lane: default}}"
        "; agents is empty",
    ),
    "agents-not-a-mapping": (
        ["agents=[summarize]"],
        "write a YAML mapping of agent name to settings, e.g. {summarize: ",
    ),
    "bad-agent-name": (
        ["agents={Bad-Name: {paid: false, timeout_s: 60, lane: default}}"],
        "write bad_name or another agent name of lowercase letters, digits and underscores "
        'starting with a letter; agent name "Bad-Name" is not a valid Python module name',
    ),
    "fans-out-to-an-unknown-agent": (
        [
            "agents={lead: {paid: false, timeout_s: 60, lane: default, fans_out_to: helper}, "
            "sub: {paid: false, timeout_s: 60, lane: default}}"
        ],
        'write fans_out_to: sub for agent lead, or leave it out; its fans_out_to "helper" is '
        "not another agent of this service",
    ),
    "fans-out-to-itself": (
        [_agent(fans_out_to="summarize")],
        "write fans_out_to: OTHER_AGENT (add that agent first) for agent summarize",
    ),
    "agent-not-a-mapping": (
        ["agents={summarize: 60}"],
        "write a mapping of settings for agent summarize, e.g. summarize: {paid: false, "
        "timeout_s: 60, lane: default}; it is 60",
    ),
    "missing-timeout": (
        ["agents={summarize: {paid: false, lane: default}}"],
        "write timeout_s for agent summarize, e.g. summarize: {paid: false, timeout_s: 60, "
        "lane: default}; it is missing timeout_s",
    ),
    "zero-timeout": (
        [_agent(timeout_s=0)],
        "write timeout_s: 60 or another whole number of seconds above 0 for agent summarize; "
        "its timeout_s is 0",
    ),
    "timeout-above-longest-job": (
        [_agent(timeout_s=5000), "longest_job_s=600"],
        "write longest_job_s 5000 or more, or lower the timeout_s of agent summarize",
    ),
    "bad-lane": (
        [_agent(lane="Fast Lane")],
        "write lane: fast_lane or another lane name of lowercase letters, digits and "
        'underscores starting with a letter for agent summarize; its lane "Fast Lane" is not',
    ),
    "paid-yes-string": (
        [_agent(paid='"yes"')],
        "write paid: true for agent summarize if its jobs spend money, else paid: false; its "
        'paid "yes" is not a boolean',
    ),
    "unknown-agent-key": (
        [_agent(colour="red")],
        "write only the allowed keys for agent summarize (paid, timeout_s, lane, "
        "daily_cap_usd, max_attempts, max_concurrent, max_concurrent_per_owner, max_paid_calls, "
        "job_budget_usd, on_budget, on_version_change, deadline_s, webhooks, fans_out_to, limit, "
        "framework); it has unknown key(s) colour",
    ),
    "negative-agent-cap": (
        [_agent(paid="true", daily_cap_usd=-1)],
        "write daily_cap_usd: 25 or another positive number of US dollars per day for agent "
        "summarize",
    ),
    "zero-agent-max-attempts": (
        [_agent(max_attempts=0)],
        "write max_attempts: 3 or another whole number above 0 for agent summarize",
    ),
    "zero-agent-max-concurrent": (
        [_agent(max_concurrent=0)],
        "write max_concurrent: 5 or another whole number above 0 for agent summarize, or "
        "leave it out for no limit; its max_concurrent is 0",
    ),
    "fractional-agent-max-concurrent-per-owner": (
        [_agent(max_concurrent_per_owner=1.5)],
        "write max_concurrent_per_owner: 1 or another whole number above 0 for agent "
        "summarize, or leave it out for no per-owner limit; its max_concurrent_per_owner is 1.5",
    ),
    "zero-agent-max-paid-calls": (
        [_agent(paid="true", max_paid_calls=0)],
        "write max_paid_calls: 20 or another whole number above 0 for agent summarize, or "
        "leave it out for no per-job count; its max_paid_calls is 0",
    ),
    "max-paid-calls-on-an-unpaid-agent": (
        [_agent(max_paid_calls=5)],
        "write paid: true for agent summarize, or leave max_paid_calls out; it has "
        "max_paid_calls 5 but makes no paid calls",
    ),
    "zero-agent-job-budget": (
        [_agent(paid="true", daily_cap_usd=5, job_budget_usd=0)],
        "write job_budget_usd: 2.00 or another amount above 0 and at most 1000000 in whole "
        "micro-dollars for agent summarize, or leave it out for no per-job budget; its "
        "job_budget_usd is 0",
    ),
    "job-budget-finer-than-a-micro-dollar": (
        [_agent(paid="true", daily_cap_usd=5, job_budget_usd="0.0000001")],
        "write job_budget_usd: 2.00 or another amount above 0 and at most 1000000 in whole "
        "micro-dollars for agent summarize, or leave it out for no per-job budget; its "
        "job_budget_usd is 1e-07",
    ),
    "on-budget-neither-deny-nor-wait": (
        [_agent(paid="true", daily_cap_usd=5, on_budget="ask")],
        "write on_budget: deny or on_budget: wait for agent summarize (deny ends a job its "
        'budget or cap cannot cover; wait asks a person); its on_budget is "ask"',
    ),
    "on-version-change-neither-run-nor-wait": (
        [_agent(paid="true", daily_cap_usd=5, on_version_change="ask")],
        "write on_version_change: run or on_version_change: wait for agent summarize (run "
        "lets a job resumed on changed code make new paid calls; wait asks a person first); "
        'its on_version_change is "ask"',
    ),
    "zero-agent-deadline": (
        [_agent(deadline_s=0)],
        "write deadline_s: 3600 or another whole number of seconds from 1 to 31536000 (365 "
        "days) for agent summarize, or leave it out for no run deadline; its deadline_s is 0",
    ),
    "agent-deadline-past-a-year": (
        [_agent(deadline_s=31536001)],
        "write deadline_s: 3600 or another whole number of seconds from 1 to 31536000 (365 "
        "days) for agent summarize, or leave it out for no run deadline; its deadline_s is "
        "31536001",
    ),
    "webhooks-not-a-list": (
        [_agent(webhooks="billing")],
        "write webhooks: [billing] or another list of distinct endpoint names (letters, digits, "
        '".", "_", "-", as NAME in NAME=URL of WEBHOOK_URLS) for agent summarize, [] for none, '
        'or leave it out for every endpoint; its webhooks is "billing"',
    ),
    "webhooks-bad-name": (
        [_agent(webhooks="[ops, 'a b']")],
        "write webhooks: [billing] or another list of distinct endpoint names (letters, digits, "
        '".", "_", "-", as NAME in NAME=URL of WEBHOOK_URLS) for agent summarize, [] for none, '
        'or leave it out for every endpoint; its webhooks is ["ops", "a b"]',
    ),
    "webhooks-twice": (
        [_agent(webhooks="[ops, ops]")],
        "write webhooks: [billing] or another list of distinct endpoint names (letters, digits, "
        '".", "_", "-", as NAME in NAME=URL of WEBHOOK_URLS) for agent summarize, [] for none, '
        'or leave it out for every endpoint; its webhooks is ["ops", "ops"]',
    ),
    "limit-without-keys": (
        ["limits={llm: {}}"],
        "write at least one of max_concurrent, requests_per_second, requests_per_minute, "
        "tokens_per_minute for limit llm",
    ),
    "limit-unknown-key": (
        ["limits={llm: {requests_per_hour: 10}}"],
        "write only the allowed keys for limit llm (max_concurrent, requests_per_second, "
        "requests_per_minute, tokens_per_minute); it has unknown key(s) requests_per_hour",
    ),
    "limit-zero-rate": (
        ["limits={llm: {requests_per_minute: 0}}"],
        "write requests_per_minute: 10 or another whole number above 0 for limit llm; its "
        "requests_per_minute is 0",
    ),
    "limits-not-a-mapping": (
        ["limits=[llm]"],
        "write a YAML mapping of limit name to settings, e.g. {llm: {max_concurrent: 20, "
        'requests_per_minute: 500}}, or {} for none; limits is ["llm"], not a mapping',
    ),
    "schedule-missing-agent": (
        ["schedules={nightly: {agent: nobody, cron: '0 3 * * *'}}"],
        "write agent: summarize or another of the agents (summarize) for schedule nightly; "
        'its agent "nobody" is not one of them',
    ),
    "schedule-bad-cron": (
        ["schedules={nightly: {agent: summarize, cron: 'at three'}}"],
        "write a five-field cron expression (minute hour day-of-month month day-of-week), "
        'e.g. cron: "0 3 * * *", for schedule nightly; its cron "at three" is not one',
    ),
    "schedule-cron-and-every": (
        ["schedules={nightly: {agent: summarize, cron: '0 3 * * *', every_s: 60}}"],
        'write exactly one of cron (e.g. cron: "0 3 * * *") or every_s (e.g. every_s: 3600) '
        "for schedule nightly; it has both",
    ),
    "schedule-unknown-key": (
        ["schedules={nightly: {agent: summarize, every_s: 60, at: noon}}"],
        "write only the allowed keys for schedule nightly (agent, cron, every_s, payload, "
        "owner); it has unknown key(s) at",
    ),
    "unknown-redis-tls": (
        ["redis_tls=ssl"],
        "'ssl' is not in ['none', 'tls', 'mtls']",
    ),
    "unknown-redis-provider": (
        ["redis_provider=aws"],
        "'aws' is not in ['self-hosted', 'elasticache'",
    ),
    "upstash-without-tls": (
        ["redis_provider=upstash", "redis_tls=none"],
        "write tls (or mtls) for redis_tls; it is none, and Upstash only accepts TLS",
    ),
    "unknown-database": (
        ["database=mysql"],
        "'mysql' is not in ['sqlite', 'postgresql']",
    ),
    "old-python": (
        ["python_version=3.10"],
        "'3.10' is not in ['3.11', '3.12', '3.13']",
    ),
    "zero-max-attempts": (
        ["max_attempts=0"],
        "write a whole number of tries above 0, e.g. 3; max_attempts is 0",
    ),
    "max-attempts-not-a-number": (
        ["max_attempts=oops"],
        'write a whole number of tries above 0, e.g. 3; max_attempts is "oops"',
    ),
    "max-attempts-fraction": (
        ["max_attempts=2.5"],
        'write a whole number of tries above 0, e.g. 3; max_attempts is "2.5"',
    ),
    "negative-backoff-base": (
        ["backoff_base_s=-1"],
        "write a number of seconds above 0, e.g. 2; backoff_base_s is -1.0",
    ),
    "backoff-base-not-a-number": (
        ["backoff_base_s=fast"],
        'write a number of seconds above 0, e.g. 2; backoff_base_s is "fast"',
    ),
    "zero-backoff-max": (
        ["backoff_max_s=0"],
        "write a number of seconds of at least backoff_base_s (2.0), e.g. 300; backoff_max_s "
        "is 0.0",
    ),
    "backoff-max-below-base": (
        ["backoff_base_s=10", "backoff_max_s=5"],
        "write a value of at least 10.0, e.g. 300, or lower backoff_base_s; backoff_max_s "
        "(5.0) is below backoff_base_s (10.0)",
    ),
    "negative-global-cap": (
        ["global_daily_cap_usd=-5"],
        "write a positive number of US dollars per day, e.g. 40, or null for no global cap; "
        "global_daily_cap_usd is -5",
    ),
    "zero-global-cap": (
        ["global_daily_cap_usd=0"],
        "write a positive number of US dollars per day, e.g. 40, or null for no global cap; "
        "global_daily_cap_usd is 0",
    ),
    "infinite-global-cap": (
        ["global_daily_cap_usd=.inf"],
        "write a positive number of US dollars per day, e.g. 40, or null for no global cap; "
        "global_daily_cap_usd is Infinity",
    ),
    "infinite-agent-cap": (
        [_agent(paid="true", daily_cap_usd=".inf")],
        "write daily_cap_usd: 25 or another positive number of US dollars per day for agent "
        "summarize",
    ),
    "zero-longest-job": (
        ["longest_job_s=0"],
        "write a whole number of seconds above 0, e.g. 600; longest_job_s is 0",
    ),
    "zero-jobs-per-hour": (
        ["jobs_per_hour=0"],
        "write a whole number of jobs per hour above 0, e.g. 500, or null if unknown; "
        "jobs_per_hour is 0",
    ),
    "negative-jobs-per-hour": (
        ["jobs_per_hour=-10"],
        "write a whole number of jobs per hour above 0, e.g. 500, or null if unknown; "
        "jobs_per_hour is -10",
    ),
}


@pytest.mark.parametrize(
    ("answers", "fragment"),
    [pytest.param(answers, fragment, id=key) for key, (answers, fragment) in BAD_ANSWERS.items()],
)
def test_a_bad_answer_stops_the_copy_with_a_last_line_that_says_what_to_write(
    template_repo: Path, tmp_path: Path, answers: list[str], fragment: str
) -> None:
    dst = tmp_path / "out"
    args = [arg for answer in answers for arg in ("-d", answer)]
    result = copier_copy(template_repo, dst, *args)
    assert result.returncode != 0, result.stderr
    message = last_line(result.stderr)
    assert fragment in message, result.stderr
    assert message.startswith("ValueError: "), message
    # Our own validators lead with the fix (the prompt cuts the end of the line at 80 columns);
    # Copier's own choice check lists the choices.
    prefix = "ValueError: Validation error for question '"
    if message.startswith(prefix):
        assert message.split("': ", 1)[1].startswith("write "), message
    else:
        assert message.startswith("ValueError: Invalid choice for '"), message
    assert not dst.exists() or not any(dst.iterdir()), sorted(dst.rglob("*"))


def test_every_question_has_help_a_default_and_a_validator() -> None:
    questions = {
        key: spec
        for key, spec in yaml.safe_load((REPO_ROOT / "copier.yml").read_text()).items()
        if not key.startswith("_")
    }
    assert questions, "copier.yml has no questions"
    for key, spec in questions.items():
        missing = [field for field in ("help", "default", "validator") if field not in spec]
        assert not missing, f"{key} has no {', '.join(missing)}"


def test_every_help_is_one_line_that_fits_an_80_column_prompt() -> None:
    # The prompt puts a two-column mark and a space before the help and cuts it at the edge;
    # tests/test_prompts.py checks the real prompts in an 80-column terminal.
    for key, spec in yaml.safe_load((REPO_ROOT / "copier.yml").read_text()).items():
        if not key.startswith("_"):
            assert "\n" not in spec["help"] and len(spec["help"]) <= 76, (key, spec["help"])


def test_copier_yml_uses_no_feature_that_needs_trust() -> None:
    settings = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())
    assert not {"_tasks", "_jinja_extensions", "_migrations"} & settings.keys()
