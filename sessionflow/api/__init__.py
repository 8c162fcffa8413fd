"""The HTTP face of sessionflow: an ASGI app whose routes are thin calls of ``SessionClient``.

``create_app(client, settings)`` builds it; ``sessionflow serve`` runs it on uvicorn. The SSE
stream of a session is the store's log: each event's ``id:`` is its seq and ``Last-Event-ID`` is
the cursor, so a reconnect after any disconnect, at any age, misses and repeats nothing.
"""
