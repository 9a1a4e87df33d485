"""Helpers the test packages share, each in the module of its concept.

- ``server``: start a real ``upr server`` process (``start_server``, ``ServerProcess``) and the
  pieces ``bench/`` reuses (``server_command``, ``server_env``, ``wait_for_url``).
- ``asgi``: the app in-process over ``httpx.ASGITransport``, for route logic that needs no socket.
- ``keys``: keys that hash to a chosen partition (the documented crc32 rule, as an oracle).
- ``problems``: the RFC 9457 problem+json check every HTTP error test makes.
- ``net``: a free TCP port on 127.0.0.1.
- ``wsclient``: the raw WebSocket oracle client (``RawStream``, ``Mirror``) of the stream tests.
- ``stream``: message predicates and a stopped server's contents read straight from its data dir.

Fixtures stay in conftest files; anything a test imports lives here, so no test imports a
conftest or another test module.
"""
