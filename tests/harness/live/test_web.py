"""The --web page without a run: starting it beside Locust's UI, its token, its routes.
(tests/harness/test_web_e2e.py drives the page of a real run in a browser.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from harness.live.web import LiveState, WebError, parse_bind, start_web_ui
from harness.rundir import TableWriter
from harness.sink import RecordSink


class FakeEnv:
    """Stands in for Locust's Environment: its web UI is a bare Flask app."""

    def __init__(self) -> None:
        self.asked: tuple[str, int] | None = None
        self.ui: Any = None

    def create_web_ui(self, host: str, port: int) -> Any:
        self.asked = (host, port)
        app = Flask("fake-locust")

        class Server:
            server_port = 40123  # what Locust bound, port 0 having asked for any

        class UI:
            pass

        self.ui = UI()
        self.ui.app, self.ui.server = app, Server()
        return self.ui


def _state(tmp_path: Path) -> LiveState:
    return LiveState(tmp_path, RecordSink(TableWriter(tmp_path, "requests")), {})


def test_the_page_is_added_to_locusts_ui_and_its_address_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["kvgate", "run", "plan.yaml", "--web"])
    env, stopped = FakeEnv(), []
    ui, shown = start_web_ui(
        env, _state(tmp_path), lambda: stopped.append(True), lambda k: k, ("127.0.0.1", 0, None)
    )
    assert ui is env.ui and env.asked == ("127.0.0.1", 0)
    assert shown == "http://127.0.0.1:40123/kvgate"
    assert sys.argv == ["kvgate"]  # Locust's UI would read ours as its own options
    client = ui.app.test_client()
    assert client.get("/kvgate").status_code == 200
    assert client.get("/kvgate/state.json").get_json()["stopping"] is None
    assert client.post("/kvgate/stop").get_json() == {
        "ok": True,
        "stopping": "stopped from the web page",
    }
    assert stopped == [True]


def test_with_a_token_every_route_needs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["kvgate"])  # start_web_ui cuts it to its first item
    web = ("0.0.0.0", 0, "s3cret")
    ui, shown = start_web_ui(FakeEnv(), _state(tmp_path), lambda: None, lambda k: k, web)
    assert shown == "http://0.0.0.0:40123/kvgate?token=s3cret"
    client = ui.app.test_client()
    assert client.get("/kvgate/state.json").status_code == 401
    assert client.get("/kvgate/state.json?token=s3cret").status_code == 200
    assert client.get("/kvgate", headers={"X-Kvgate-Token": "s3cret"}).status_code == 200


def test_beyond_loopback_a_token_is_made_up_and_a_bad_address_refused() -> None:
    assert parse_bind("127.0.0.1:8089", None) == ("127.0.0.1", 8089, None)
    host, port, token = parse_bind("0.0.0.0:9000", None)
    assert (host, port) == ("0.0.0.0", 9000) and token
    with pytest.raises(WebError, match="give HOST:PORT"):
        parse_bind("8089", None)


def test_the_state_carries_each_key_gates_way_to_a_decision(tmp_path: Path) -> None:
    state = _state(tmp_path)
    assert state.as_json()["until"] is None  # a load of fixed length
    gates = [{"id": "served", "decision": "UNDECIDED", "settled": False, "n": 40, "needs_n": 109}]
    state.until = {"text": "0/1 settled; waiting: served n=40/109", "gates": gates}
    assert state.as_json()["until"]["gates"][0]["needs_n"] == 109
