"""The root of your own migrations (user-owned: `copier update` never changes migrations/user/).

Revision ID: user_base
Revises:
Create Date: 2026-11-30

The template's revisions live in migrations/versions/ on the branch labelled `template`;
yours live here, on the branch labelled `user` that starts at this empty revision. Write one
from the project root with

    alembic revision --head=user@head --depends-on=template@head -m "add invoices"

which puts the file in this folder, after your last revision, and records the template
revision it was written against; `db upgrade` then runs both branches to their heads.
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "user_base"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("user",)
# Independent of the template branch, so revisions a service had before it adopted the template
# can be re-rooted here (down_revision = "user_base") without Alembic taking the template's
# tables for created. Order against the template comes from each revision's --depends-on.
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to do: this revision only starts the `user` branch."""


def downgrade() -> None:
    """Nothing to undo."""
