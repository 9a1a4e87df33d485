"""A slow shutdown says where it is stuck.

A node asked to stop (SIGTERM) ends its streams, leaves the cluster and closes its engine; each
step waits on something (a task to end, a thread's job, etcd).  If the whole takes longer than
``after_s``, this logs the stack of every asyncio task still pending and every thread, once, so
an operator (or a test that gave up waiting) reads where it stopped instead of guessing: the
tasks from a loop callback, the threads from ``faulthandler``, which also works when the event
loop itself is blocked.
"""
from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import sys

__all__ = ["ShutdownWatch"]

log = logging.getLogger("upr.server")

#: longer than a healthy node takes to stop under load (the cluster stop and the engine's last
#: flush), shorter than the waits of the tools that stop it (a test's 60 s, systemd's 90 s)
DEFAULT_AFTER_S = 20.0


class ShutdownWatch:
    """Armed when a shutdown begins, disarmed when it ends; dumps the stacks once in between."""

    def __init__(self, after_s: float = DEFAULT_AFTER_S) -> None:
        self.after_s = after_s
        self._timer: asyncio.TimerHandle | None = None
        self._threads_armed = False

    def arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.after_s, self._dump_tasks)
        try:
            faulthandler.dump_traceback_later(self.after_s + 1, repeat=False, file=sys.stderr)
            self._threads_armed = True
        except (ValueError, OSError, io.UnsupportedOperation):  # no real stderr (an embedded run)
            pass

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._threads_armed:
            faulthandler.cancel_dump_traceback_later()
            self._threads_armed = False

    def _dump_tasks(self) -> None:
        self._timer = None
        pending = [t for t in asyncio.all_tasks() if not t.done()]
        out = io.StringIO()
        for task in pending:
            task.print_stack(limit=12, file=out)
        log.warning("shutdown still running after %.0f s; %d task(s) pending (thread stacks follow):\n%s",
                    self.after_s, len(pending), out.getvalue())
