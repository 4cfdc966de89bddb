"""The HTTP API and the web console, one ASGI app (template-owned: copier-agent-worker).

app.py builds it, auth.py says who is calling and what they may do, api.py is the JSON API
under /api/ (its bodies are the pydantic models of bodies.py, its document openapi.py),
pages.py the server-rendered console; services.py is what both share at run time, inputs.py
how both read what a caller sent; templates/ and static/ are its files.
"""
