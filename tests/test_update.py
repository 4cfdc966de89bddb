"""`copier update` as users run it: from a real older release, with user edits, in CI.

A throwaway git repository holds the template at six tagged versions:

- v0.1.0  a real earlier state of this template (`OLDEST_RELEASE`, from this repo's history),
- v0.1.5  the last landed state before the work under test (`LAST_LANDING`, same history),
- v0.2.0  the working tree under test,
- v0.3.0  v0.2.0 plus one template Alembic revision,
- v0.4.0  v0.3.0 with the answer `backoff_max_s` renamed `backoff_cap_s`, carrying the
          `_migrations` step that runs hooks/rename_answer.py,
- v0.4.1  v0.4.0 plus a trivial change (a migration must not run again after its version).

Projects are generated and updated with Copier's command line in subprocesses whose standard
input is /dev/null, so a prompt would read end-of-file and fail the test instead of hanging it.
"""

from __future__ import annotations

import ast
import asyncio
import difflib
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pathspec import PathSpec

pytestmark = pytest.mark.timeout(300)

REPO_ROOT = Path(__file__).resolve().parent.parent
# The first commit of this repository with the questions and examples of today: the "older
# release" every update test starts from. The update tests need the full history (CI clones it).
OLDEST_RELEASE = "111d0d4739b15cfa87d10d4c34050a0a7110c223"
# The last landing before this release (issue 25): the services users rendered from it keep
# their user-owned tests, which import its internal modules by their paths of that day.
LAST_LANDING = "3d42c225d50ffd2df1096cf17a08b44c458376b0"
LAST_LANDING_TAG = "v0.1.5"
TEMPLATE_PARTS = ("copier.yml", "template", "hooks", ".gitignore")
EXAMPLES = {path.stem: path for path in sorted((REPO_ROOT / "examples").glob("*.yml"))}
BIN = Path(sys.executable).parent
COPIER = [sys.executable, "-m", "copier"]
ANSWERS = ".copier-answers.yml"
PROBE_REVISION = "0900_update_probe"
MARKER = re.compile(r"^(<<<<<<<|>>>>>>>)( |$)", re.M)
COMMAND_TIMEOUT_S = 180


def _environment(base: Path) -> dict[str, str]:
    """The environment of every subprocess: a known git identity, no personal git or Copier
    configuration, the test venv's tools first on PATH."""
    git_config = base / "gitconfig"
    git_config.write_text("[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n")
    copier_settings = base / "copier-settings.yml"
    copier_settings.write_text("{}\n")
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": "update tests",
        "GIT_AUTHOR_EMAIL": "tests@example.invalid",
        "GIT_COMMITTER_NAME": "update tests",
        "GIT_COMMITTER_EMAIL": "tests@example.invalid",
        "GIT_CONFIG_GLOBAL": str(git_config),
        "GIT_CONFIG_NOSYSTEM": "1",
        "COPIER_SETTINGS_PATH": str(copier_settings),
        "PRE_COMMIT_HOME": str(base / "pre-commit-home"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@dataclass
class Shell:
    """Runs commands the way a user's terminal would, minus the terminal."""

    env: dict[str, str]

    def run(
        self, cmd: Sequence[str | Path], cwd: Path, timeout: int = COMMAND_TIMEOUT_S, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(part) for part in cmd],
            cwd=cwd,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, cmd: Sequence[str | Path], cwd: Path, **env: str) -> str:
        # The timeout given by position: no variable of `env` can be taken for it.
        result = self.run(cmd, cwd, COMMAND_TIMEOUT_S, **env)
        assert result.returncode == 0, f"{cmd}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        return result.stdout

    def git(self, cwd: Path, *args: str) -> str:
        return self.ok(["git", *args], cwd)

    def copier(self, cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return self.run([*COPIER, *args], cwd)


@dataclass
class Versions:
    """The tagged template repository and how to generate and update projects from it."""

    repo: Path
    shell: Shell

    def generate(self, dst: Path, ref: str, data: dict[str, Any], commit: bool = True) -> Path:
        """`copier copy --defaults --vcs-ref REF --data-file ...`, then a first commit."""
        data_file = dst.parent / f"{dst.name}.answers.yml"
        data_file.write_text(yaml.safe_dump(data))
        result = self.shell.copier(
            dst.parent, "copy", "--defaults", "--vcs-ref", ref, "--data-file", data_file,
            self.repo, dst,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
        if commit:
            self.shell.git(dst, "init", "-q")
            self.shell.git(dst, "add", "-A")
            self.shell.git(dst, "commit", "-q", "-m", f"generated at {ref}")
        return dst

    def update(self, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return self.shell.copier(project, "update", "--defaults", *args)

    def commit_all(self, project: Path, message: str) -> None:
        self.shell.git(project, "add", "-A")
        self.shell.git(project, "commit", "-q", "-m", message)

    def user_owned(self, ref: str, package: str) -> PathSpec[Any]:
        """The `_skip_if_exists` patterns of version `ref`, for one package name."""
        config = yaml.safe_load(self.shell.git(self.repo, "show", f"{ref}:copier.yml"))
        patterns = [p.replace("{{ package_name }}", package) for p in config["_skip_if_exists"]]
        return PathSpec.from_lines("gitignore", patterns)


def files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def answers(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((root / ANSWERS).read_text())
    return data


def template_head(versions_dir: Path) -> str:
    """The one template revision no other template revision builds on."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in versions_dir.glob("*.py*"):
        text = path.read_text()
        revisions.update(re.findall(r'^revision: str = "([^"]+)"', text, re.M))
        parents.update(re.findall(r'^down_revision: [^=]+= "([^"]+)"', text, re.M))
    heads = revisions - parents
    assert len(heads) == 1, f"the template should have one head revision, not {sorted(heads)}"
    return heads.pop()


# The template repository with its six versions ---------------------------------------------


def _replace_tree(repo: Path, source: Path) -> None:
    for child in repo.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for part in TEMPLATE_PARTS:
        if (source / part).is_dir():
            shutil.copytree(
                source / part, repo / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        elif (source / part).is_file():
            shutil.copy2(source / part, repo / part)


def _tag(shell: Shell, repo: Path, tag: str) -> None:
    shell.git(repo, "add", "-A")
    shell.git(repo, "commit", "-q", "--allow-empty", "-m", tag)
    shell.git(repo, "tag", tag)


PROBE = '''"""Update probe: one table (template-owned revision; a fixture of tests/test_update.py).

Revision ID: {revision}
Revises: {parent}
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "{revision}"
down_revision: str | Sequence[str] | None = "{parent}"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table("update_probe", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("update_probe")
'''

RENAME_MIGRATION = """
_migrations:
  - version: v0.4.0
    when: "{{ _stage == 'before' }}"
    command:
      - "{{ _copier_python }}"
      - "{{ _copier_conf.src_path }}/hooks/rename_answer.py"
      - backoff_max_s
      - backoff_cap_s
"""


def _committed_template(shell: Shell, base: Path, commit: str) -> Path:
    """The template parts of this repository at `commit`, unpacked into a new folder."""
    known = shell.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], REPO_ROOT)
    assert known.returncode == 0, (
        f"commit {commit} is missing: the update tests need this repository's full "
        "history (git fetch --unshallow)"
    )
    listed = shell.git(REPO_ROOT, "ls-tree", "--name-only", commit).split()
    folder = base / commit
    folder.mkdir()
    archive = base / f"{commit}.tar"
    shell.git(
        REPO_ROOT, "archive", "-o", str(archive), commit,
        *[part for part in TEMPLATE_PARTS if part in listed],
    )  # fmt: skip
    shell.ok(["tar", "-xf", archive, "-C", folder], base)
    return folder


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    base = tmp_path_factory.mktemp("update")
    shell = Shell(_environment(base))
    repo = base / "template"
    repo.mkdir()
    shell.git(repo, "init", "-q")

    # v0.1.0 and v0.1.5: earlier states, exactly as this repository committed them.
    for commit, tag in ((OLDEST_RELEASE, "v0.1.0"), (LAST_LANDING, LAST_LANDING_TAG)):
        _replace_tree(repo, _committed_template(shell, base, commit))
        _tag(shell, repo, tag)

    # v0.2.0: the working tree under test.
    _replace_tree(repo, REPO_ROOT)
    _tag(shell, repo, "v0.2.0")

    # v0.3.0: a new template Alembic revision on top of the template head.
    versions_dir = repo / "template" / "src" / "{{package_name}}" / "migrations" / "versions"
    parent = template_head(versions_dir)
    (versions_dir / f"{PROBE_REVISION}.py").write_text(
        PROBE.format(revision=PROBE_REVISION, parent=parent)
    )
    _tag(shell, repo, "v0.3.0")

    # v0.4.0: an answer renamed, with the migration that carries the user's value across.
    for path in [repo / "copier.yml", *(repo / "template").rglob("*")]:
        if path.is_file() and "backoff_max_s" in path.read_text(errors="ignore"):
            path.write_text(path.read_text().replace("backoff_max_s", "backoff_cap_s"))
    with (repo / "copier.yml").open("a") as config:
        config.write(RENAME_MIGRATION)
    _tag(shell, repo, "v0.4.0")

    # v0.4.1: any later change.
    with (repo / "template" / ".gitignore").open("a") as ignore:
        ignore.write("# v0.4.1\n")
    _tag(shell, repo, "v0.4.1")
    return Versions(repo, shell)


# Agent keys the examples use that the older releases under test do not know: the update
# tests render both sides without them (an older project cannot have had them).
NEWER_AGENT_KEYS = (
    "fans_out_to",
    "max_paid_calls",
    "job_budget_usd",
    "on_budget",
    "on_version_change",
    "deadline_s",
    "webhooks",
)


def example_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLES[name].read_text())
    for spec in data.get("agents", {}).values():
        for key in NEWER_AGENT_KEYS:
            spec.pop(key, None)
    return data


# Answers the older release does not know (flow control): a project generated at v0.1.0 gets
# them the way a user adds them, with `copier update -d`.
NEW_ANSWERS = ("limits", "schedules")
NEW_AGENT_KEYS = ("max_concurrent", "max_concurrent_per_owner")


def older_release_data(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` as the older release takes it, and the `-d` arguments that add the rest."""
    old = {key: value for key, value in data.items() if key not in NEW_ANSWERS}
    old["agents"] = {
        name: {key: value for key, value in spec.items() if key not in NEW_AGENT_KEYS}
        for name, spec in data["agents"].items()
    }
    added = [key for key in NEW_ANSWERS if key in data]
    if old["agents"] != data["agents"]:
        added.append("agents")
    return old, [arg for key in added for arg in ("-d", f"{key}={json.dumps(data[key])}")]


def package_of(project: Path) -> str:
    return str(answers(project)["package_name"])


# 1. Each example: older release -> update -> the same tree as a fresh copy -------------------


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_updating_an_example_from_the_older_release_gives_a_fresh_copy_of_the_new_one(
    versions: Versions, tmp_path: Path, example: str
) -> None:
    data = example_data(example)
    older, added = older_release_data(data)
    project = versions.generate(tmp_path / "project", "v0.1.0", older)
    before = files(project)

    result = versions.update(project, "--vcs-ref", "v0.2.0", *added)
    assert result.returncode == 0, result.stderr[-4000:]

    fresh = versions.generate(tmp_path / "fresh", "v0.2.0", data, commit=False)
    updated, expected = files(project), files(fresh)
    assert sorted(updated) == sorted(expected)
    user_owned = versions.user_owned("v0.2.0", package_of(project))
    for path in sorted(expected):
        if path == ANSWERS:
            continue
        if user_owned.match_file(path):
            # User-owned files are never rewritten: they stay as the older release wrote them.
            assert updated[path] == before.get(path, expected[path]), path
        else:
            assert updated[path] == expected[path], path
    without_commit = {k: v for k, v in answers(project).items() if k != "_commit"}
    assert without_commit == {k: v for k, v in answers(fresh).items() if k != "_commit"}
    assert answers(project)["_commit"] == "v0.2.0"


# 2 and 3. User edits: kept, merged, or marked as a conflict ------------------------------------


@dataclass
class EditedUpdate:
    """A project generated at v0.1.0, edited by its user, committed, updated to v0.2.0."""

    project: Path
    fresh: Path  # a fresh copy of v0.2.0 with the same answers
    agent_module: str
    agent_module_text: str
    merged: str  # template-owned file with an edit away from the template's changes
    merged_expected: str
    conflicted: str  # template-owned file with an edit on a line the template changed
    update: subprocess.CompletedProcess[str]


USER_LINE = "# user note: kept across template updates\n"


def _distant_insertion(old: list[str], new: list[str]) -> tuple[int, int] | None:
    """Where a line can go in `old` so that it lands in `new` far from the template's changes.

    Returns (index in old, index in new) in the middle of an unchanged run of at least 13
    lines whose neighbouring lines are unique in `new`, so `git apply` has one place to go.
    """
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    if matcher.ratio() == 1.0:
        return None
    for tag, i1, i2, j1, _ in matcher.get_opcodes():
        if tag != "equal" or i2 - i1 < 13:
            continue
        for offset in range(6, i2 - i1 - 6):
            j = j1 + offset
            window = new[j - 2 : j + 2]
            if all(line.strip() and new.count(line) == 1 for line in window):
                return i1 + offset, j
    return None


def _changed_line(old: list[str], new: list[str]) -> int | None:
    """The index in `old` of a non-blank line the template rewrote."""
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag == "replace":
            for i in range(i1, i2):
                if old[i].strip():
                    return i
    return None


@pytest.fixture(scope="module")
def edited_update(versions: Versions, tmp_path_factory: pytest.TempPathFactory) -> EditedUpdate:
    base = tmp_path_factory.mktemp("edited")
    data = example_data("minimal")
    project = versions.generate(base / "project", "v0.1.0", data)
    fresh = versions.generate(base / "fresh", "v0.2.0", data, commit=False)
    package = package_of(project)
    user_owned = versions.user_owned("v0.2.0", package)

    # The user's agent module: their code, which no update may touch.
    agent_module = f"src/{package}/agents/summarize.py"
    agent_text = (project / agent_module).read_text() + (
        "\n\ndef user_helper() -> str:\n    return 'written by the user'\n"
    )
    (project / agent_module).write_text(agent_text)

    # Two template-owned Python files that the template changed since v0.1.0.
    merged = conflicted = None
    merged_expected = ""
    for path in sorted(files(fresh)):
        if not path.endswith(".py") or user_owned.match_file(path):
            continue
        if not (project / path).is_file():
            continue
        old = (project / path).read_text().splitlines(keepends=True)
        new = (fresh / path).read_text().splitlines(keepends=True)
        if merged is None and (spot := _distant_insertion(old, new)):
            i, j = spot
            (project / path).write_text("".join([*old[:i], USER_LINE, *old[i:]]))
            merged, merged_expected = path, "".join([*new[:j], USER_LINE, *new[j:]])
        elif conflicted is None and (line := _changed_line(old, new)) is not None:
            old[line] = "# user rewrote this line: " + old[line].strip() + "\n"
            (project / path).write_text("".join(old))
            conflicted = path
    assert merged and conflicted, "no template-owned file changed since the older release"
    versions.commit_all(project, "user edits")

    update = versions.update(project, "--vcs-ref", "v0.2.0")
    return EditedUpdate(
        project, fresh, agent_module, agent_text, merged, merged_expected, conflicted, update
    )


def test_copier_update_exits_0_even_when_it_leaves_a_conflict(
    edited_update: EditedUpdate,
) -> None:
    # The reason for everything in section 3: the exit code cannot be trusted.
    assert edited_update.update.returncode == 0, edited_update.update.stderr[-4000:]


def test_a_user_edit_to_an_agent_module_survives_the_update_untouched(
    edited_update: EditedUpdate,
) -> None:
    text = (edited_update.project / edited_update.agent_module).read_text()
    assert text == edited_update.agent_module_text


def test_a_user_edit_away_from_the_template_changes_merges_cleanly(
    edited_update: EditedUpdate,
) -> None:
    text = (edited_update.project / edited_update.merged).read_text()
    assert not MARKER.search(text)
    assert text == edited_update.merged_expected


def test_an_overlapping_edit_leaves_conflict_markers_and_an_unmerged_file(
    edited_update: EditedUpdate,
) -> None:
    text = (edited_update.project / edited_update.conflicted).read_text()
    assert "<<<<<<< before updating" in text and ">>>>>>> after updating" in text
    assert "# user rewrote this line: " in text
    status = subprocess.run(
        ["git", "status", "--porcelain"],
        cwd=edited_update.project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"UU {edited_update.conflicted}" in status.splitlines()


def _pre_commit_hook(project: Path, hook_id: str) -> dict[str, Any]:
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            if hook["id"] == hook_id:
                return {"repo": repo, **hook}
    raise AssertionError(f"{hook_id} is not in the generated .pre-commit-config.yaml")


def test_the_generated_pre_commit_conflict_check_refuses_the_conflicted_file_only(
    versions: Versions, edited_update: EditedUpdate
) -> None:
    hook = _pre_commit_hook(edited_update.project, "check-merge-conflict")
    assert "--assume-in-merge" in hook["args"]
    # pre-commit would fetch the hook's repository; run the same entry point, installed from
    # the pre-commit-hooks package, with the configured arguments on the files the update wrote.
    entry = [str(BIN / "check-merge-conflict"), *hook["args"]]
    project = edited_update.project
    flagged = versions.shell.run([*entry, edited_update.conflicted], project)
    assert flagged.returncode == 1, flagged.stdout + flagged.stderr
    assert edited_update.conflicted in flagged.stdout
    clean = versions.shell.run([*entry, edited_update.merged, edited_update.agent_module], project)
    assert clean.returncode == 0, clean.stdout + clean.stderr


def _ci_step(project: Path, name_fragment: str) -> str:
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            if name_fragment in step.get("name", ""):
                return str(step["run"])
    raise AssertionError(f"no CI step named like {name_fragment!r}")


def test_the_ci_conflict_step_fails_on_markers_and_passes_once_they_are_resolved(
    versions: Versions, edited_update: EditedUpdate, tmp_path: Path
) -> None:
    step = _ci_step(edited_update.project, "conflict markers")
    project = tmp_path / "project"
    shutil.copytree(edited_update.project, project, symlinks=True)

    failed = versions.shell.run(["bash", "-ec", step], project)
    assert failed.returncode != 0
    assert edited_update.conflicted in failed.stdout
    assert any(line.startswith("error: conflict markers") for line in failed.stderr.splitlines())

    # Resolving: keep the template's side, as `git checkout --theirs` would after a merge.
    shutil.copy2(edited_update.fresh / edited_update.conflicted, project / edited_update.conflicted)
    passed = versions.shell.run(["bash", "-ec", step], project)
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_a_fresh_project_passes_the_ci_conflict_step(
    versions: Versions, edited_update: EditedUpdate, tmp_path: Path
) -> None:
    # No false alarm: nothing the template writes (docs included) looks like a marker.
    fresh = tmp_path / "fresh"
    shutil.copytree(edited_update.fresh, fresh)
    versions.shell.git(fresh, "init", "-q")
    passed = versions.shell.run(["bash", "-ec", _ci_step(fresh, "conflict markers")], fresh)
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_a_rej_file_from_an_update_is_refused_by_pre_commit_and_ci(
    versions: Versions, edited_update: EditedUpdate, tmp_path: Path
) -> None:
    project = versions.generate(tmp_path / "project", "v0.1.0", example_data("minimal"))
    old = (project / edited_update.conflicted).read_text().splitlines(keepends=True)
    new = (edited_update.fresh / edited_update.conflicted).read_text().splitlines(keepends=True)
    line = _changed_line(old, new)
    assert line is not None
    old[line] = "# user rewrote this line\n"
    (project / edited_update.conflicted).write_text("".join(old))
    versions.commit_all(project, "user edit")

    result = versions.update(project, "--vcs-ref", "v0.2.0", "--conflict", "rej")
    assert result.returncode == 0, result.stderr[-4000:]
    rejected = f"{edited_update.conflicted}.rej"
    assert (project / rejected).is_file()
    status = versions.shell.git(project, "status", "--porcelain", "--untracked-files=all")
    assert f"?? {rejected}" in status.splitlines(), "a .rej file must not be git-ignored"

    ci = versions.shell.run(["bash", "-ec", _ci_step(project, "conflict markers")], project)
    assert ci.returncode != 0 and rejected in ci.stdout, ci.stdout + ci.stderr

    # The generated local hook, run by pre-commit itself (a local hook needs no download).
    hook = _pre_commit_hook(project, "no-rej-files")
    local_only = tmp_path / "local-hooks.yaml"
    local_only.write_text(yaml.safe_dump({"repos": [hook["repo"]]}))
    versions.shell.git(project, "add", "-A")
    refused = versions.shell.run(
        [BIN / "pre-commit", "run", "no-rej-files", "--config", local_only, "--files", rejected],
        project,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "copier update could not apply these hunks" in refused.stdout
    allowed = versions.shell.run(
        [BIN / "pre-commit", "run", "no-rej-files", "--config", local_only, "--files", ANSWERS],
        project,
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


# 4. Never a prompt -----------------------------------------------------------------------------


def test_update_with_defaults_and_skip_answered_never_prompts(
    versions: Versions, tmp_path: Path
) -> None:
    older, _ = older_release_data(example_data("support-desk"))
    project = versions.generate(tmp_path / "project", "v0.1.0", older)
    # Standard input is /dev/null: a single prompt would read end-of-file and fail the update.
    result = versions.update(project, "-A", "--vcs-ref", "v0.3.0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert answers(project)["_commit"] == "v0.3.0"
    assert answers(project)["backoff_max_s"] == 120.0


# 5. Agents added and removed by update -------------------------------------------------------


def _python(versions: Versions, project: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` against the project's source tree, as the installed service would."""
    return versions.shell.run(
        [sys.executable, "-c", code], project, PYTHONPATH=str(project / "src")
    )


def _agents_arg(agents: dict[str, dict[str, Any]]) -> str:
    flow: str = yaml.safe_dump(agents, default_flow_style=True)
    return "agents=" + flow.strip()


def test_an_agent_added_by_update_gets_its_module_lane_and_cap_and_the_others_stay(
    versions: Versions, tmp_path: Path
) -> None:
    data = example_data("minimal")
    project = versions.generate(tmp_path / "project", "v0.2.0", data)
    package = package_of(project)
    summarize = project / "src" / package / "agents" / "summarize.py"
    summarize.write_text(summarize.read_text() + "\nUSER_CONSTANT = 42\n")
    versions.commit_all(project, "user edit")
    before = files(project)

    agents = {
        **data["agents"],
        "translate": {"paid": True, "daily_cap_usd": 7.5, "timeout_s": 30, "lane": "fast"},
    }
    result = versions.update(project, "--vcs-ref", "v0.2.0", "-d", _agents_arg(agents))
    assert result.returncode == 0, result.stderr[-4000:]

    after = files(project)
    created = sorted(set(after) - set(before))
    assert created == [f"src/{package}/agents/translate.py", "tests/agents/test_translate.py"]
    for path, content in before.items():
        if re.search(r"agents/(test_)?summarize\.py$", path):
            assert after[path] == content, f"{path} was touched"
    wiring = _python(
        versions,
        project,
        f"from {package} import catalog\n"
        "print(catalog.AGENTS['translate'])\n"
        "print(sorted(catalog.LANES.items()))\n"
        "print(catalog.answered_caps()['translate'])\n",
    )
    assert wiring.returncode == 0, wiring.stderr
    config, lanes, cap = wiring.stdout.splitlines()
    assert "lane='fast'" in config and "timeout_s=30" in config and "paid=True" in config
    assert lanes == "[('default', 60), ('fast', 30)]"
    assert cap == "7.5"

    # The cap is seeded into the database by `db upgrade`, as for an agent answered at copy time.
    database = tmp_path / "caps.db"
    upgrade = versions.shell.run(
        [sys.executable, "-m", package, "db", "upgrade"],
        project,
        PYTHONPATH=str(project / "src"),
        DATABASE_URL=f"sqlite:///{database}",
    )
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]
    with sqlite3.connect(database) as conn:
        caps = dict(conn.execute("SELECT agent, cap_micros FROM spend_caps").fetchall())
    assert caps.get("translate") == 7_500_000


def test_an_agent_removed_by_update_loses_its_wiring_keeps_its_module_and_stops_the_service(
    versions: Versions, tmp_path: Path
) -> None:
    data = example_data("support-desk")
    project = versions.generate(tmp_path / "project", "v0.2.0", data)
    package = package_of(project)
    module = project / "src" / package / "agents" / "escalate.py"
    test_module = project / "tests" / "agents" / "test_escalate.py"
    module.write_text(module.read_text() + "\n# the user's escalation rules live here\n")
    versions.commit_all(project, "user edit")
    kept = {module: module.read_bytes(), test_module: test_module.read_bytes()}

    agents = {name: spec for name, spec in data["agents"].items() if name != "escalate"}
    result = versions.update(project, "--vcs-ref", "v0.2.0", "-d", _agents_arg(agents))
    assert result.returncode == 0, result.stderr[-4000:]

    # The user's files are theirs: still there, byte for byte.
    for path, content in kept.items():
        assert path.is_file() and path.read_bytes() == content, path
    catalog = (project / "src" / package / "catalog.py").read_text()
    assert '"escalate"' not in catalog and '"draft_reply"' in catalog

    # A module with no settings stops discovery with one sentence saying what to do.
    discover = (
        f"from {package}.settings import Settings\n"
        f"from {package}.registry import load_agents\n"
        "print(sorted(load_agents(Settings())))\n"
    )
    refused = _python(versions, project, discover)
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{package}.registry.AgentError: agent module {package}.agents.escalate")
    assert "removed" in last and "delete" in last and "CONFIG" in last

    # Deleting both files, as the message says, brings the service back.
    module.unlink()
    test_module.unlink()
    loaded = _python(versions, project, discover)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip() == str(sorted(agents))


# 6. A renamed answer and its migration --------------------------------------------------------


def test_an_update_across_a_renamed_answer_needs_trust_and_carries_the_value(
    versions: Versions, tmp_path: Path
) -> None:
    data = example_data("support-desk")
    assert data["backoff_max_s"] != 300.0, "the example must not use the default"
    project = versions.generate(tmp_path / "project", "v0.3.0", data)

    refused = versions.update(project)
    assert refused.returncode == 4, refused.stderr[-3000:]
    assert "--trust" in refused.stderr
    assert versions.shell.git(project, "status", "--porcelain") == ""

    result = versions.update(project, "--trust")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "renamed answer backoff_max_s to backoff_cap_s" in result.stderr
    recorded = answers(project)
    assert "backoff_max_s" not in recorded
    assert recorded["backoff_cap_s"] == data["backoff_max_s"]
    assert recorded["_commit"] == "v0.4.1"

    renamed = {("backoff_cap_s" if k == "backoff_max_s" else k): v for k, v in data.items()}
    fresh = versions.generate(tmp_path / "fresh", "v0.4.1", renamed, commit=False)
    package = package_of(project)
    assert (project / "src" / package / "catalog.py").read_text() == (
        fresh / "src" / package / "catalog.py"
    ).read_text()
    assert (
        f"BACKOFF_MAX_S = {data['backoff_max_s']}"
        in (project / "src" / package / "catalog.py").read_text()
    )


def test_a_migration_runs_only_across_its_own_version(versions: Versions, tmp_path: Path) -> None:
    project = versions.generate(tmp_path / "project", "v0.4.0", example_data("minimal"))
    result = versions.update(project)  # to v0.4.1, without --trust
    assert result.returncode == 0, result.stderr[-4000:]
    assert "renamed answer" not in result.stderr
    assert answers(project)["_commit"] == "v0.4.1"


def test_the_rename_hook_is_idempotent_and_refuses_an_ambiguous_answers_file(
    tmp_path: Path,
) -> None:
    hook = [sys.executable, str(REPO_ROOT / "hooks" / "rename_answer.py"), "old_key", "new_key"]

    def rename(text: str) -> tuple[int, str, str]:
        (tmp_path / ANSWERS).write_text(text)
        done = subprocess.run(hook, cwd=tmp_path, capture_output=True, text=True, check=False)
        return done.returncode, (tmp_path / ANSWERS).read_text(), done.stderr

    assert rename("_commit: v1\nold_key: 5\nold_key_2: 1\n")[:2] == (
        0,
        "_commit: v1\nnew_key: 5\nold_key_2: 1\n",
    )
    assert rename("new_key: 5\n")[:2] == (0, "new_key: 5\n")
    code, text, stderr = rename("old_key: 5\nnew_key: 6\n")
    assert (code, text) == (1, "old_key: 5\nnew_key: 6\n")
    assert stderr.startswith("error: ") and "keep one of them" in stderr


# 7. Template and user Alembic revisions -------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'service.db'}"
        return
    admin = os.environ.get("TEST_DATABASE_URL")
    if not admin:
        pytest.fail("TEST_DATABASE_URL is not set: run the suite with `make test`")
    import asyncpg

    name = f"upd_{uuid.uuid4().hex[:12]}"

    async def admin_sql(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin_sql(f'CREATE DATABASE "{name}"'))
    try:
        yield re.sub(r"/[^/]*$", f"/{name}", admin)
    finally:
        asyncio.run(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _schema(versions: Versions, project: Path, url: str) -> tuple[set[str], set[str]]:
    """The tables and the Alembic version rows of the database at `url`."""
    code = (
        "import asyncio, sys\n"
        "from sqlalchemy import inspect, text\n"
        f"from {package_of(project)}.db import create_engine\n"
        f"from {package_of(project)}.settings import Settings\n"
        "async def main():\n"
        f"    engine = create_engine(Settings(database_url={url!r}))\n"
        "    async with engine.connect() as conn:\n"
        "        tables = await conn.run_sync(lambda c: inspect(c).get_table_names())\n"
        "        rows = (await conn.execute(text('SELECT version_num FROM alembic_version')))\n"
        "        print(' '.join(tables)); print(' '.join(r[0] for r in rows))\n"
        "    await engine.dispose()\n"
        "asyncio.run(main())\n"
    )
    result = _python(versions, project, code)
    assert result.returncode == 0, result.stderr[-3000:]
    tables, heads = result.stdout.splitlines()
    return set(tables.split()), set(heads.split())


@pytest.mark.slow
@pytest.mark.xdist_group("update")  # the slow update tests share one `versions` build
def test_a_user_revision_and_a_new_template_revision_both_upgrade(
    versions: Versions, tmp_path: Path, database_url: str
) -> None:
    project = versions.generate(tmp_path / "project", "v0.2.0", example_data("minimal"))
    package = package_of(project)
    src = {"PYTHONPATH": str(project / "src")}

    # The user's own revision, written with the command the generated alembic.ini documents.
    documented = next(
        line.lstrip("# ").strip()
        for line in (project / "alembic.ini").read_text().splitlines()
        if line.lstrip("# ").startswith("alembic revision")
    )
    command = shlex.split(documented.replace('"add invoices"', '"add notes"'))
    versions.shell.ok([sys.executable, "-m", *command], project, **src)
    user_dir = project / "src" / package / "migrations" / "user"
    (revision_file,) = (path for path in user_dir.glob("*_add_notes.py"))
    text = revision_file.read_text()
    assert re.search(r'^down_revision: .*= "user_base"$', text, re.M), text
    assert re.search(r'^depends_on: .*= "\w+"$', text, re.M), text
    revision_file.write_text(
        re.sub(
            r"def upgrade\(\) -> None:\n    pass\n",
            'def upgrade() -> None:\n    op.create_table("user_notes", '
            'sa.Column("id", sa.Integer(), primary_key=True))\n',
            text,
        )
    )
    user_revision = re.findall(r'^revision: str = "(\w+)"', text, re.M)[0]
    upgrade = [sys.executable, "-m", package, "db", "upgrade"]
    versions.shell.ok(upgrade, project, DATABASE_URL=database_url, **src)
    tables, _ = _schema(versions, project, database_url)
    assert "user_notes" in tables and "update_probe" not in tables
    versions.commit_all(project, "the user's first migration")
    user_revision_text = revision_file.read_text()

    result = versions.update(project, "--vcs-ref", "v0.3.0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert (project / "src" / package / "migrations" / "versions" / f"{PROBE_REVISION}.py").exists()
    assert revision_file.read_text() == user_revision_text

    heads = versions.shell.ok([sys.executable, "-m", "alembic", "heads"], project, **src)
    assert f"{PROBE_REVISION} (template) (head)" in heads
    assert f"{user_revision} (user) (head)" in heads
    versions.shell.ok(upgrade, project, DATABASE_URL=database_url, **src)
    tables, version_rows = _schema(versions, project, database_url)
    assert {"jobs", "user_notes", "update_probe"} <= tables
    assert version_rows == {PROBE_REVISION, user_revision}


# 8. From the last landing: the user-owned files keep working ----------------------------------


@dataclass
class LandedUpdate:
    """research-pipeline rendered at the last landing, committed, updated to v0.2.0."""

    project: Path
    before: dict[str, bytes]  # every file as the last landing rendered it
    untouched: Path  # the project before the update; a test copies it, then edits the copy
    update: subprocess.CompletedProcess[str]


def _landed_example(versions: Versions, name: str) -> dict[str, Any]:
    """An example's answers as the last landing wrote them (all its questions, no newer ones)."""
    text = versions.shell.git(REPO_ROOT, "show", f"{LAST_LANDING}:examples/{name}.yml")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _service_imports(project: Path, paths: list[str]) -> set[tuple[str, str]]:
    """(module, name) for each import of the service's own package in `paths`, the package
    written `<pkg>`; the user's agent modules (`<pkg>.agents...`) are left out."""
    package = package_of(project)
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse((project / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                pairs = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                pairs = [(alias.name, "") for alias in node.names]
            else:
                continue
            for module, name in pairs:
                if module == package or module.startswith(f"{package}."):
                    generic = "<pkg>" + module[len(package) :]
                    if not generic.startswith("<pkg>.agents"):
                        found.add((generic, name))
    return found


def _user_owned_python(versions: Versions, project: Path) -> list[str]:
    owned = versions.user_owned(LAST_LANDING_TAG, package_of(project))
    return [p for p in sorted(files(project)) if p.endswith(".py") and owned.match_file(p)]


@pytest.fixture(scope="module")
def landed_update(versions: Versions, tmp_path_factory: pytest.TempPathFactory) -> LandedUpdate:
    base = tmp_path_factory.mktemp("landed")
    project = versions.generate(base / "project", LAST_LANDING_TAG, _landed_example(
        versions, "research-pipeline"
    ))  # fmt: skip
    untouched = base / "untouched"
    shutil.copytree(project, untouched, symlinks=True)
    before = files(project)
    update = versions.update(project, "--vcs-ref", "v0.2.0")
    return LandedUpdate(project, before, untouched, update)


@pytest.mark.slow
@pytest.mark.xdist_group("update")  # the slow update tests share one `versions` build
def test_the_kept_agent_tests_of_the_last_landing_pass_against_the_updated_service(
    versions: Versions, landed_update: LandedUpdate, tmp_path: Path
) -> None:
    """The old tests/agents (user-owned: the update keeps them) import internal modules by
    their paths of that day; after the update they run, unchanged, against the new code.

    One answer set runs: research-pipeline's agents take every branch of the agent and test
    templates that support-desk's take (unpaid, paid with a cap) plus the pipeline, so its
    user-owned files import every path support-desk's import (checked below on a render).
    Both databases run these tests in the render suites; the import paths are the same on
    each, so SQLite alone runs here.
    """
    project = landed_update.project
    assert landed_update.update.returncode == 0, landed_update.update.stderr[-4000:]
    kept = _user_owned_python(versions, project)
    tests = [path for path in kept if path.startswith("tests/agents/")]
    assert len(tests) == 4, kept
    for path in kept:
        assert (project / path).read_bytes() == landed_update.before[path], f"{path} changed"
    imports = _service_imports(project, kept)
    internal = {module for module, _ in imports} - {"<pkg>.agent", "<pkg>.testing"}
    assert internal, "the old tests import no internal module: this test would prove nothing"

    support_desk = versions.generate(
        tmp_path / "support-desk", LAST_LANDING_TAG, _landed_example(versions, "support-desk"),
        commit=False,
    )  # fmt: skip
    missing = _service_imports(support_desk, _user_owned_python(versions, support_desk)) - imports
    assert missing == set(), "support-desk imports what research-pipeline does not: run it too"

    result = versions.shell.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/agents"],
        project,
        timeout=600,
        PYTHONPATH=str(project / "src"),
        TEST_DATABASES="sqlite",
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\b[1-9]\d* passed", summary) and "skipped" not in summary, summary


# Files the update may remove although a user may have edited them, each with the reason it
# is safe: Copier 9.19 deletes a file the new version no longer renders even when the user
# edited it (exit 0, no conflict, `git status` shows ` D`). Keys are paths with the package
# written `<pkg>`, e.g. "src/<pkg>/limits.py".
REMOVED_ON_PURPOSE: dict[str, str] = {
    "src/<pkg>/limits.py": "now the package limits/, which would shadow a module of that name; "
    "a limits.py left there makes the service refuse to start with a one-line error "
    "(limits/__init__.py), and the CHANGELOG says to port edits from the deleted file",
}


def test_no_template_owned_file_of_the_last_landing_disappears_in_the_update(
    versions: Versions, landed_update: LandedUpdate
) -> None:
    """A module that moves keeps a file at its old path (a shim for one release), so a user's
    edit there meets the template's change as a conflict instead of vanishing."""
    project = landed_update.project
    assert landed_update.update.returncode == 0, landed_update.update.stderr[-4000:]
    package = package_of(project)
    removed = {
        path.replace(f"/{package}/", "/<pkg>/")
        for path in set(landed_update.before) - set(files(project))
    }
    assert sorted(removed - set(REMOVED_ON_PURPOSE)) == []


def _line_at_a_change(old: list[str], new: list[str]) -> int | None:
    """The index in `old` of a non-blank line the template rewrote, or else of the line
    right before lines it inserted: an edit there overlaps the template's change."""
    rewritten = _changed_line(old, new)
    if rewritten is not None:
        return rewritten
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, _, _, _ in matcher.get_opcodes():
        if tag == "insert" and i1 > 0 and old[i1 - 1].strip():
            return i1 - 1
    return None


def test_an_edit_to_a_template_owned_file_changed_since_the_last_landing_becomes_a_conflict(
    versions: Versions, landed_update: LandedUpdate, tmp_path: Path
) -> None:
    project = tmp_path / "edited"
    shutil.copytree(landed_update.untouched, project, symlinks=True)
    updated = landed_update.project
    owned = versions.user_owned("v0.2.0", package_of(project))
    for path in sorted(landed_update.before):
        if not path.endswith(".py") or owned.match_file(path) or not (updated / path).is_file():
            continue
        old = (project / path).read_text().splitlines(keepends=True)
        line = _line_at_a_change(old, (updated / path).read_text().splitlines(keepends=True))
        if line is not None:
            break
    else:
        pytest.fail("no template-owned Python file changed since the last landing")
    user_line = "# user rewrote this line: " + old[line].strip() + "\n"
    old[line] = user_line
    (project / path).write_text("".join(old))
    versions.commit_all(project, "user edit")

    result = versions.update(project, "--vcs-ref", "v0.2.0")
    assert result.returncode == 0, result.stderr[-4000:]
    text = (project / path).read_text()
    assert "<<<<<<< before updating" in text and ">>>>>>> after updating" in text, path
    assert user_line in text
    status = versions.shell.git(project, "status", "--porcelain").splitlines()
    assert f"UU {path}" in status


@pytest.mark.parametrize("moved", ["gate", "upstream"])
def test_an_edit_to_a_moved_template_owned_module_becomes_a_conflict_at_its_old_path(
    versions: Versions, landed_update: LandedUpdate, tmp_path: Path, moved: str
) -> None:
    """A module that moved into limits/ keeps a warning shim at its old path, so a user's edit
    there is a conflict the user sees, never a file silently deleted with the edit in it."""
    project = tmp_path / "edited"
    shutil.copytree(landed_update.untouched, project, symlinks=True)
    path = f"src/{package_of(project)}/{moved}.py"
    old = (project / path).read_text().splitlines(keepends=True)
    line = next(i for i, text in enumerate(old) if text.startswith(("def ", "class ")))
    user_line = "# user rewrote this line: " + old[line].strip() + "\n"
    old[line : line + 1] = [user_line, old[line]]
    (project / path).write_text("".join(old))
    versions.commit_all(project, "user edit")

    result = versions.update(project, "--vcs-ref", "v0.2.0")
    assert result.returncode == 0, result.stderr[-4000:]
    text = (project / path).read_text()
    assert "<<<<<<< before updating" in text and ">>>>>>> after updating" in text, text[:2000]
    assert user_line in text
    assert f"limits.{moved}" in text  # the shim's side of the conflict names the new home
    status = versions.shell.git(project, "status", "--porcelain").splitlines()
    assert f"UU {path}" in status


# Adopting the template into an existing service (README: "Adopting the template") -----------

LEGACY_REVISION = '''"""The legacy service's own table (user-owned)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "legacy1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("legacy", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("legacy")
'''


@pytest.mark.slow
@pytest.mark.xdist_group("update")  # the slow update tests share one `versions` build
def test_an_existing_service_adopts_the_template_keeps_its_revisions_and_then_updates(
    versions: Versions, tmp_path: Path
) -> None:
    service = tmp_path / "service"
    (service / "migrations").mkdir(parents=True)
    (service / "README.md").write_text("# The legacy service\n")
    (service / "migrations" / "legacy1.py").write_text(LEGACY_REVISION)
    versions.shell.git(service, "init", "-q")
    versions.commit_all(service, "the service before the template")
    database = tmp_path / "service.db"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE legacy (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO legacy (id) VALUES (7)")
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('legacy1')")

    # The documented steps: copy over the service, re-root its revisions on user_base.
    data_file = tmp_path / "answers.yml"
    data_file.write_text(yaml.safe_dump(example_data("minimal")))
    copied = versions.shell.copier(
        tmp_path, "copy", "--defaults", "--overwrite", "--vcs-ref", "v0.2.0",
        "--data-file", data_file, versions.repo, service,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr[-4000:]
    assert (service / "README.md").read_text() == "# The legacy service\n"
    package = package_of(service)
    moved = service / "src" / package / "migrations" / "user" / "legacy1.py"
    versions.shell.git(service, "mv", "migrations/legacy1.py", str(moved))
    moved.write_text(
        moved.read_text().replace("down_revision = None", 'down_revision = "user_base"')
    )
    upgrade = [sys.executable, "-m", package, "db", "upgrade"]
    env = {"PYTHONPATH": str(service / "src"), "DATABASE_URL": f"sqlite:///{database}"}
    versions.shell.ok(upgrade, service, **env)
    head = template_head(service / "src" / package / "migrations" / "versions")
    with sqlite3.connect(database) as conn:
        assert set(conn.execute("SELECT version_num FROM alembic_version")) == {
            ("legacy1",),
            (head,),
        }
        assert list(conn.execute("SELECT id FROM legacy")) == [(7,)]
        assert list(conn.execute("SELECT count(*) FROM jobs")) == [(0,)]
    versions.commit_all(service, "adopt copier-agent-worker")

    # From now on it is a generated service like any other.
    moved_text = moved.read_text()
    result = versions.update(service, "--vcs-ref", "v0.3.0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert moved.read_text() == moved_text
    versions.shell.ok(upgrade, service, **env)
    with sqlite3.connect(database) as conn:
        assert set(conn.execute("SELECT version_num FROM alembic_version")) == {
            ("legacy1",),
            (PROBE_REVISION,),
        }


# The generated `make check-update` ----------------------------------------------------------


def test_make_check_update_fails_with_a_message_only_when_the_template_has_a_newer_version(
    versions: Versions, tmp_path: Path
) -> None:
    copier = shlex.join(COPIER)
    behind = versions.generate(tmp_path / "behind", "v0.3.0", example_data("minimal"))
    stale = versions.shell.run(["make", "check-update", f"COPIER={copier}"], behind)
    assert stale.returncode != 0
    assert "a newer template version is available: run 'copier update --defaults'" in stale.stderr

    current = versions.generate(tmp_path / "current", "v0.4.1", example_data("minimal"))
    fresh = versions.shell.run(["make", "check-update", f"COPIER={copier}"], current)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "the template has no newer version" in fresh.stdout
