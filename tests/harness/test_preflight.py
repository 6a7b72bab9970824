"""Set-up against external servers: --target-url with --set, the model check, profiles."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from contract.host import OWN_GROUP
from harness.plan import ExternalTarget, PlanError, load_plan
from harness.preflight import (
    AUTOGROUPS,
    PreflightError,
    check_external,
    other_scheduler_group,
    scheduler_group,
)
from harness.traffic import build_user_classes
from tests.built_users import built_user_classes
from tests.waiting import wait_until

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"
SMOKE = PLANS / "smoke.yaml"
NO_FAULTS = ["faults=[]"]  # the smoke plan's replica kill needs the reference deployment


class FakeServer(BaseHTTPRequestHandler):
    models: ClassVar[list[str]] = ["tiny-llama"]
    key: str | None = None

    def do_GET(self) -> None:
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._answer(401, {"error": "bad key"})
        elif self.path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": m} for m in self.models]})
        else:
            self._answer(404, {"error": "no such path"})

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[FakeServer]]]:
    handler = type("Handler", (FakeServer,), {"models": ["tiny-llama"], "key": None})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def test_target_url_takes_the_external_keys_of_set() -> None:
    plan = load_plan(
        SMOKE,
        [*NO_FAULTS, "target.model=tiny", "target.kind=vllm", "target.api_key=k"],
        target_url="http://127.0.0.1:9",
    )
    assert isinstance(plan.target, ExternalTarget)
    assert (plan.target.model, plan.target.kind, plan.target.api_key) == ("tiny", "vllm", "k")
    with pytest.raises(PlanError, match="unknown server kind 'vlm'"):
        load_plan(SMOKE, [*NO_FAULTS, "target.kind=vlm"], target_url="http://127.0.0.1:9")


def test_the_model_defaults_to_the_one_the_server_lists(
    server: tuple[str, type[FakeServer]],
) -> None:
    url, _ = server
    plan = check_external(load_plan(SMOKE, NO_FAULTS, target_url=url))
    assert isinstance(plan.target, ExternalTarget) and plan.target.model == "tiny-llama"
    classes = build_user_classes(plan, url)
    assert {getattr(c, "model", "tiny-llama") for c in classes} == {"tiny-llama"}


def test_an_unknown_model_is_refused_before_any_load(server: tuple[str, type[FakeServer]]) -> None:
    url, _ = server
    plan = load_plan(SMOKE, [*NO_FAULTS, "target.model=llama-3-8b"], target_url=url)
    with pytest.raises(PreflightError, match=r"'llama-3-8b' is not served .* it serves: tiny"):
        check_external(plan)


def test_several_models_and_no_choice_is_refused(server: tuple[str, type[FakeServer]]) -> None:
    url, handler = server
    handler.models = ["a", "b"]
    with pytest.raises(PreflightError, match=r"serves 2 models \(a, b\); choose one"):
        check_external(load_plan(SMOKE, NO_FAULTS, target_url=url))


def test_a_refused_key_says_which_setting_to_fix(server: tuple[str, type[FakeServer]]) -> None:
    url, handler = server
    handler.key = "secret"
    with pytest.raises(PreflightError, match=r"refused the key .* target\.api_key"):
        check_external(load_plan(SMOKE, NO_FAULTS, target_url=url))


def test_nothing_listening_is_a_set_up_error_not_a_traceback(refused_url: str) -> None:
    plan = load_plan(SMOKE, [*NO_FAULTS, "target.health_timeout_s=1"], target_url=refused_url)
    with pytest.raises(PreflightError, match=r"nothing answers at .* is the server running"):
        check_external(plan)


def test_extensions_go_only_to_servers_whose_profile_accepts_them() -> None:
    def long_output_ignores_eos(kind: str) -> bool:
        plan = load_plan(
            SMOKE,
            [*NO_FAULTS, f"target.kind={kind}", "target.model=m"],
            target_url="http://127.0.0.1:9",
        )
        plan.traffic.classes = {"long_output": plan.traffic.classes["long_output"]}
        (cls,) = built_user_classes(plan, "http://127.0.0.1:9")
        return bool(cls.ignore_eos and cls.dialect.ignore_eos)

    assert long_output_ignores_eos("vllm") and long_output_ignores_eos("sglang")
    assert not long_output_ignores_eos("tgi") and not long_output_ignores_eos("openai")


def test_prompt_scale_multiplies_every_class_prompt_size() -> None:
    def sizes(scale: float) -> dict[str, tuple[int, int | None]]:
        plan = load_plan(SMOKE, [f"traffic.prompt_scale={scale}"])
        return {
            c.__name__: (c.prompt_tokens, getattr(c, "prefix_tokens", None))
            for c in built_user_classes(plan, "http://127.0.0.1:9")
        }

    one, half = sizes(1.0), sizes(0.5)
    assert one["long_context"][0] == 8000 and half["long_context"][0] == 4000
    assert half["shared_prefix"][1] == 512  # the plan's 1024-token prefix, halved


# Sessions are scheduled apart only while autogroups are on and kvgate is in the root cpu cgroup.
AUTOGROUPS_ON = (
    AUTOGROUPS.exists()
    and AUTOGROUPS.read_text().strip() == "1"
    and not scheduler_group("self").startswith("cgroup ")
)


def listening(port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def http_server(**spawn: Any) -> Iterator[int]:
    """A plain HTTP server on loopback in a process of its own, started with `spawn`."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **spawn)
    try:
        wait_until(lambda: listening(port), timeout_s=30, what=f"a server on port {port}")
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.skipif(not AUTOGROUPS_ON, reason="the kernel's scheduler autogroups are off here")
@pytest.mark.timeout(60)
def test_a_server_in_another_session_on_this_host_is_warned_of() -> None:
    with http_server(start_new_session=True) as port:
        said = other_scheduler_group(f"http://127.0.0.1:{port}")
    assert said is not None and "runs in another scheduling group than kvgate" in said
    assert "Start the server from the shell that runs kvgate" in said


def fake_proc(root: Path, autogroups: str, **processes: tuple[str, str]) -> Path:
    """A /proc with the autogroup switch and, per process, its cgroup and autogroup files."""
    (root / "sys/kernel").mkdir(parents=True)
    (root / "sys/kernel/sched_autogroup_enabled").write_text(autogroups + "\n")
    for pid, (cgroup, autogroup) in processes.items():
        (root / pid).mkdir()
        (root / pid / "cgroup").write_text(cgroup)
        (root / pid / "autogroup").write_text(autogroup)
    return root


ROOT_CGROUPS = "4:memory:/runner/7\n2:cpu,cpuacct:/\n0::/\n"


def test_the_default_autogroup_is_a_group_of_its_own(tmp_path: Path) -> None:
    # kvgate under a runner that never started a session: its autogroup file reads empty.
    # A server started with a session of its own still gets the CPUs apart from it.
    proc = fake_proc(
        tmp_path,
        "1",
        self=(ROOT_CGROUPS, ""),
        server=(ROOT_CGROUPS, "/autogroup-7 nice 0\n"),
        child=(ROOT_CGROUPS, ""),
    )
    assert scheduler_group("self", proc) == "the default autogroup"
    assert scheduler_group("server", proc) == "/autogroup-7"
    assert scheduler_group("child", proc) == scheduler_group("self", proc)


def test_cpu_cgroups_come_before_autogroups_and_autogroups_may_be_off(tmp_path: Path) -> None:
    contained = "2:cpu,cpuacct:/docker/ab12\n0::/\n"
    proc = fake_proc(
        tmp_path,
        "0",
        self=(ROOT_CGROUPS, "/autogroup-3 nice 0\n"),
        server=(ROOT_CGROUPS, "/autogroup-7 nice 0\n"),
        boxed=(contained, "/autogroup-3 nice 0\n"),
    )
    assert scheduler_group("self", proc) == scheduler_group("server", proc) == "root"
    assert scheduler_group("boxed", proc) == "cgroup /docker/ab12"
    (proc / "sys/kernel/sched_autogroup_enabled").write_text("1\n")
    assert scheduler_group("self", proc) != scheduler_group("server", proc)
    assert scheduler_group("boxed", proc) == "cgroup /docker/ab12"  # autogroups not used there


@pytest.mark.timeout(60)
def test_a_server_in_kvgates_session_or_elsewhere_is_not() -> None:
    with http_server(process_group=OWN_GROUP) as port:
        assert other_scheduler_group(f"http://127.0.0.1:{port}") is None
    assert other_scheduler_group("http://192.0.2.1:8000") is None  # TEST-NET-1: not this host
