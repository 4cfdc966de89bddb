"""Rename one answer in a generated project's answers file (a Copier `_migrations` step).

A template version that renames a question lists this script in `copier.yml`, to run in the
`before` stage of an update that crosses that version:

    _migrations:
      - version: v2.0.0
        when: "{{ _stage == 'before' }}"
        command:
          - "{{ _copier_python }}"
          - "{{ _copier_conf.src_path }}/hooks/rename_answer.py"
          - backoff_max_s
          - backoff_cap_s

Copier runs it in the project root after it has rendered the recorded version, and reloads the
answers file afterwards, so the new version renders with the user's value under the new name.
Only the key changes: the value, its formatting and every other line stay byte for byte, so the
file needs no YAML library (the script runs on whatever Python runs Copier). Running it again
changes nothing. Exit codes: 0 renamed or nothing to do, 1 the file cannot be migrated, 2 usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def rename_answer(text: str, old: str, new: str) -> str:
    """`text` with the top-level key `old` renamed to `new`; unchanged when `old` is absent.

    >>> rename_answer("a: 1\\nbackoff_max_s: 120.0\\nz: 3\\n", "backoff_max_s", "backoff_cap_s")
    'a: 1\\nbackoff_cap_s: 120.0\\nz: 3\\n'
    >>> rename_answer("backoff_cap_s: 120.0\\n", "backoff_max_s", "backoff_cap_s")
    'backoff_cap_s: 120.0\\n'
    """
    old_key = re.compile(rf"^{re.escape(old)}:(?=\s|$)", re.M)
    if not old_key.search(text):
        return text
    if re.search(rf"^{re.escape(new)}:(?=\s|$)", text, re.M):
        raise ValueError(f"the answers file has both {old} and {new}; keep one of them and retry")
    return old_key.sub(f"{new}:", text, count=1)


def main(argv: list[str] | None = None) -> int:
    """Rename the answer in the answers file; print one line saying what happened."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the answer's name in the older template version")
    parser.add_argument("new", help="its name from the version that renames it")
    parser.add_argument("--answers-file", default=".copier-answers.yml", type=Path)
    args = parser.parse_args(argv)
    for name in (args.old, args.new):
        if not KEY.fullmatch(name):
            print(f"error: {name!r} is not an answer name", file=sys.stderr)
            return 2
    path: Path = args.answers_file
    if not path.is_file():
        print(f"error: {path} not found; run this from the project root", file=sys.stderr)
        return 1
    text = path.read_text(encoding="utf-8")
    try:
        renamed = rename_answer(text, args.old, args.new)
    except ValueError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    if renamed == text:
        print(f"{path}: no answer {args.old}; nothing to rename", file=sys.stderr)
        return 0
    path.write_text(renamed, encoding="utf-8")
    print(f"{path}: renamed answer {args.old} to {args.new}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
