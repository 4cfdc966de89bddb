"""The HTTP API and the web console, one ASGI app (template-owned: copier-agent-worker).

app.py builds it, auth.py says who is calling and what they may do, api.py is the JSON API
under /api/, pages.py the server-rendered console; templates/ and static/ are its files.
"""
