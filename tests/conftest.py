"""Shared fixtures for the template's own tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# What a template checkout needs in order to render: the questions, the rendered tree, the Python
# that `_migrations` run, and the ignore rules (so the copy commits what the real repo commits).
# Tests render from a committed copy, never from the working tree.
TEMPLATE_PARTS = ("copier.yml", "template", "hooks", ".gitignore")


@pytest.fixture(autouse=True)
def _isolated_copier_settings(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keep the developer's own Copier settings (defaults, trust) out of every test.

    The file holds `{}`: Copier 9.19 rejects a truly empty settings file (it loads as None and
    fails validation with "Input should be a valid dictionary or instance of SettingsModel").
    """
    settings = tmp_path_factory.getbasetemp() / "copier-settings.yml"
    if not settings.exists():
        settings.write_text("{}\n")
    monkeypatch.setenv("COPIER_SETTINGS_PATH", str(settings))


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway git repository holding the current template, with one commit.

    `vcs_ref="HEAD"` needs a commit, and the real repository may have none (or uncommitted
    edits, which Copier would render with a warning): copy what the template needs and commit it.
    """
    repo = tmp_path_factory.mktemp("template-repo")
    for part in TEMPLATE_PARTS:
        source = REPO_ROOT / part
        if source.is_dir():
            shutil.copytree(
                source, repo / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        elif source.is_file():
            shutil.copy2(source, repo / part)
    git = [
        "git",
        "-c",
        "user.name=template tests",
        "-c",
        "user.email=tests@example.invalid",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "init.defaultBranch=main",
    ]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "template under test"], cwd=repo, check=True)
    return repo
