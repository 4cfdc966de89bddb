"""What the API's handlers and the console's views share (template-owned: copier-agent-worker).

Its own module so that api.py and pages.py take it without importing app.py, which imports
them both.
"""

from __future__ import annotations

from ..settings import Settings
from ..submit import Submitter
from .auth import Sessions


class Services:
    """Settings, the submitter (and its database engine), the console's sessions."""

    def __init__(self, settings: Settings, secret: str, submitter: Submitter | None = None) -> None:
        self.settings = settings
        self.submitter = submitter if submitter is not None else Submitter(settings)
        self.engine = self.submitter.engine
        self.sessions = Sessions(secret)

    async def close(self) -> None:
        await self.submitter.close()
