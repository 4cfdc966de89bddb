"""Any answers within the questions' bounds render: drawn at random with Hypothesis.

Every draw is an answer set the validators must accept (names, numbers and choices inside
their rules, agents that fan out to each other, limits and schedules). The render must
succeed, every Python file must compile, no Copier Jinja may be left, and ruff must pass.
The sets that also run their generated suites are in tests/answer_sets/ (see test_render.py).
"""

from __future__ import annotations

import keyword
import py_compile
import re
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parent.parent
CHOICES = yaml.safe_load((REPO_ROOT / "copier.yml").read_text())
PROVIDERS = list(CHOICES["redis_provider"]["choices"].values())
BIN = Path(sys.executable).parent
# Files whose braces are not Copier's (the console's own templates, vendored htmx, images).
NOT_COPIER_JINJA = re.compile(r"(^|/)web/(templates|static)/|\.png$")

# Names a user might well pick that are also modules the generated code or tests import.
LIKELY_NAMES = ["summarize", "pytest", "catalog", "settings", "json", "asyncio", "agent", "queue"]
names = st.one_of(
    st.sampled_from(LIKELY_NAMES),
    st.from_regex(r"[a-z][a-z0-9_]{0,14}", fullmatch=True),
).filter(lambda name: not keyword.iskeyword(name))
lanes = st.one_of(st.sampled_from(["default", "slow", "x"]), names)
positive = st.integers(min_value=1, max_value=10**6)
# Import names the package_name validator refuses as taken (read from copier.yml).
_TAKEN_LIST = re.search(r"set taken = \[(.*?)\]", CHOICES["package_name"]["validator"])
assert _TAKEN_LIST is not None, "copier.yml's package_name validator lists no taken names"
TAKEN = re.findall(r"'([a-z_]+)'", _TAKEN_LIST[1])


def derived_package(project_name: str) -> str:
    """The package_name copier.yml derives from a project name (through its slug)."""
    return re.sub("[^a-z0-9]+", "-", project_name.lower()).strip("-").replace("-", "_")


# project_slug and package_name (derived from it) allow at most 20 characters. A name whose
# derived package is a keyword ("In") or taken ("Test") is refused by the validator, as it
# should be: such a name is not an answer the defaults accept.
project_names = st.from_regex(
    r"[A-Z][A-Za-z0-9]{0,7}( [A-Za-z0-9&]{1,5}){0,2}", fullmatch=True
).filter(
    lambda name: derived_package(name) not in TAKEN and not keyword.iskeyword(derived_package(name))
)
LIMIT_KEYS = ["max_concurrent", "requests_per_second", "requests_per_minute", "tokens_per_minute"]
dollars = st.decimals(min_value=Decimal("0.01"), max_value=Decimal(100000), places=2).map(float)


@st.composite
def agent_specs(draw: st.DrawFn, agent_names: list[str]) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    for name in agent_names:
        spec: dict[str, Any] = {
            "paid": draw(st.booleans()),
            "timeout_s": draw(st.integers(min_value=1, max_value=86400)),
            "lane": draw(lanes),
        }
        if draw(st.booleans()):
            spec["daily_cap_usd"] = draw(dollars)
        for key in ("max_attempts", "max_concurrent", "max_concurrent_per_owner"):
            if draw(st.integers(0, 3)) == 0:
                spec[key] = draw(st.integers(min_value=1, max_value=50))
        if spec["paid"] and draw(st.integers(0, 3)) == 0:
            spec["max_paid_calls"] = draw(st.integers(min_value=1, max_value=50))
        if draw(st.integers(0, 3)) == 0:
            spec["job_budget_usd"] = draw(st.sampled_from([0.05, 2, 12.5, 1000000]))
        if spec["paid"] and draw(st.integers(0, 3)) == 0:
            spec["on_budget"] = draw(st.sampled_from(["deny", "wait"]))
        if draw(st.integers(0, 3)) == 0:
            spec["on_version_change"] = draw(st.sampled_from(["run", "wait"]))
        if draw(st.integers(0, 3)) == 0:
            spec["deadline_s"] = draw(st.sampled_from([1, 3600, 31536000]))
        if draw(st.integers(0, 3)) == 0:
            spec["webhooks"] = draw(st.sampled_from([[], ["ops"], ["ops", "crm.example"]]))
        others = [other for other in agent_names if other != name]
        if others and draw(st.integers(0, 3)) == 0:
            spec["fans_out_to"] = draw(st.sampled_from(others))
        specs[name] = spec
    return specs


@st.composite
def answer_sets(draw: st.DrawFn) -> dict[str, Any]:
    agent_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    agents = draw(agent_specs(agent_names))
    provider = draw(st.sampled_from(PROVIDERS))
    tls_modes = ["tls", "mtls"] if provider == "upstash" else ["none", "tls", "mtls"]
    base = draw(st.floats(min_value=0.01, max_value=600, allow_nan=False))
    longest = max(spec["timeout_s"] for spec in agents.values())
    limits = draw(
        st.dictionaries(
            names,
            st.dictionaries(st.sampled_from(LIMIT_KEYS), positive, min_size=1),
            max_size=3,
        )
    )
    schedule = st.fixed_dictionaries(
        {"agent": st.sampled_from(agent_names)},
        optional={"payload": st.just({"text": "tick"}), "owner": st.just("ops")},
    ).flatmap(
        lambda spec: st.one_of(
            st.builds(lambda every: {**spec, "every_s": every}, positive),
            st.sampled_from(["0 3 * * *", "*/5 * * * *", "0 0 1 jan mon-fri"]).map(
                lambda cron: {**spec, "cron": cron}
            ),
        )
    )
    return {
        "project_name": draw(project_names),
        "python_version": draw(st.sampled_from(["3.11", "3.12", "3.13"])),
        "agents": agents,
        "limits": limits,
        "schedules": draw(st.dictionaries(names, schedule, max_size=2)),
        "max_attempts": draw(st.integers(min_value=1, max_value=20)),
        "backoff_base_s": base,
        "backoff_max_s": base + draw(st.floats(min_value=0, max_value=3600, allow_nan=False)),
        "global_daily_cap_usd": draw(st.one_of(st.none(), dollars)),
        "redis_provider": provider,
        "redis_tls": draw(st.sampled_from(tls_modes)),
        "database": draw(st.sampled_from(["sqlite", "postgresql"])),
        "longest_job_s": longest + draw(st.integers(min_value=0, max_value=3600)),
        "jobs_per_hour": draw(st.one_of(st.none(), positive)),
    }


def problems(project: Path) -> list[str]:
    """What is wrong with a render: Python that does not compile, Copier Jinja left over."""
    found = []
    for path in project.rglob("*"):
        relative = path.relative_to(project).as_posix()
        if "{{" in path.name:
            found.append(f"{relative}: Jinja in the file name")
        elif path.is_file() and not NOT_COPIER_JINJA.search(relative):
            if re.search(r"{{|{%|%}", path.read_text(errors="replace")):
                found.append(f"{relative}: Jinja left in the text")
            if path.suffix == ".py":
                try:
                    py_compile.compile(str(path), doraise=True, cfile=str(path) + "c")
                except py_compile.PyCompileError as error:
                    found.append(f"{relative}: {error.msg.strip().splitlines()[-1]}")
    return found


@pytest.mark.timeout(600)
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    # No shrinking: each example is a whole render, and the failing answers are printed.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(answers=answer_sets())
def test_any_answers_within_the_bounds_render_compile_and_pass_ruff(
    template_repo: Path, answers: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "out"
        copier.run_copy(
            str(template_repo),
            project,
            data=answers,
            defaults=True,
            unsafe=False,
            vcs_ref="HEAD",
            quiet=True,
        )
        assert problems(project) == [], yaml.safe_dump(answers)
        lint = subprocess.run(
            [str(BIN / "ruff"), "check", "--no-cache", "."],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr + yaml.safe_dump(answers)
