"""`web`: serve the HTTP API and the web console (template-owned: copier-agent-worker)."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import app
from .support import fail, load_settings, loaded, schema_problem


@app.command()
def web(
    host: Annotated[
        str, typer.Option(help="Address to listen on; 127.0.0.1 keeps it on this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    proxy_headers: Annotated[
        bool,
        typer.Option(
            help="Trust X-Forwarded-Proto/For from --forwarded-allow-ips (behind an HTTPS proxy)."
        ),
    ] = False,
    forwarded_allow_ips: Annotated[
        str, typer.Option(help="Proxy addresses whose forwarded headers are trusted.")
    ] = "127.0.0.1",
) -> None:
    """Serve the JSON API (/api/, bearer tokens) and the console (/, a login with a token)."""
    import structlog
    import uvicorn
    from pydantic import ValidationError

    from ..settings import SettingsError
    from ..web.app import SECRET_VAR, WebSettings, create_app, web_secret

    settings = load_settings(service=True)
    problem = schema_problem(settings)
    if problem is not None:
        fail(problem)
    try:
        secret, made_up = web_secret(settings, WebSettings())
    except (SettingsError, ValidationError) as exc:
        fail(str(exc).splitlines()[0])
    # Said as log lines, in the service's format: a log shipper reading `web` gets JSON only.
    log = structlog.get_logger("web")
    if made_up:
        log.warning(
            "web_secret_made_up",
            detail="dev: console sessions end when this process stops",
            fix=f"set {SECRET_VAR} to keep them",
        )
    log.info("web_serving", url=f"http://{host}:{port}/", serves="the API and the console")
    loaded()
    uvicorn.run(
        create_app(settings, secret),
        host=host,
        port=port,
        proxy_headers=proxy_headers,
        forwarded_allow_ips=forwarded_allow_ips,
        # uvicorn's own records (start-up, one line a request) go to the service's handler,
        # in its format and at its level, not through uvicorn's plain-text logging set-up.
        log_config=None,
        log_level=None,
        server_header=False,
    )
