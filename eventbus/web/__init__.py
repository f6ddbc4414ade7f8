"""The web dashboard: ``pip install 'eventbus[web]'``, then ``eventbus dashboard APP``.

:func:`create_app` returns an ASGI application (Starlette) that reads and
operates a :class:`~eventbus.Bus` only through its public methods: mount it
in a service of your own behind your own auth, or serve it with uvicorn.
Server-rendered HTML with a small script of its own; live updates over
server-sent events.
"""

from __future__ import annotations

from ._app import DEFAULT_PORT, create_app

__all__ = ["DEFAULT_PORT", "create_app"]
