"""A node stops promptly while a console waits on ``GET /events``: the waiting reader is answered
(200, no events) as shutdown begins, instead of holding the exit until its wait ends and then
getting an error."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from tests.support.server import ServerProcess


def test_sigterm_answers_a_waiting_event_reader(upr_server: Callable[..., ServerProcess]) -> None:
    srv = upr_server(partitions=4)
    first = httpx.get(f"{srv.url}/events", timeout=10).json()
    answers: list[httpx.Response] = []

    def wait_for_events() -> None:
        answers.append(httpx.get(f"{srv.url}/events", params={"since": first["last_id"], "log": first["log_id"]},
                                 headers={"Prefer": "wait=25"}, timeout=60))

    reader = threading.Thread(target=wait_for_events)
    reader.start()
    time.sleep(1.0)  # an unparked request is answered in milliseconds; still unanswered = waiting
    assert not answers, "the reader was answered before the node was stopped"
    assert srv.stop(timeout=60) in (0, -15)  # a clean stop ends by the SIGTERM uvicorn re-raises
    reader.join(timeout=60)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].json()["events"] == []

