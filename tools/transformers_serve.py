"""Hugging Face `transformers serve` on the CPU with the tiny local model: a second real
serving stack for kvgate to judge, beside vLLM (harness/plans/transformers.yaml;
docs/real-server.md says how it behaves on the wire).

    python3 tools/transformers_serve.py setup           # venv + tiny model, cached (about a minute)
    python3 tools/transformers_serve.py start           # 127.0.0.1:18080, waits for /health
    python3 tools/transformers_serve.py status          # running or not, with its PID
    python3 tools/transformers_serve.py stop            # SIGTERM, SIGKILL after 10 s
    python3 tools/transformers_serve.py start --port 18081 --blocks 64  # a tiny cache

Installs into $XDG_CACHE_HOME/kvgate/transformers-serve-5.24.0 (~/.cache/... by default),
apart from the project's `.venv` and from vLLM's venv: a Python 3.11 venv with torch's CPU
wheel and `transformers[serving]`, and the tiny Llama that tools/tiny_model.py builds (its
tokenizer is kvgate's, so the server counts kvgate's prompts as kvgate does). Nothing is
downloaded at run time. A stamp is written once both are in place; a half-finished setup is
redone. The server runs in its own session with its log and PID file in the same folder, so
a kvgate `signal` fault can kill it (`match: "transformers serve"`) and this script can
start it again. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "tools" / "tiny_model.py"
TORCH, TRANSFORMERS, PYTHON_SERIES = "2.13.0", "5.24.0", "3.11"
STAMP = "installed.json"
DEFAULT_PORT = 18080
# The KV cache: always sized, since without --cb-num-blocks the server takes 60% of the free
# RAM on a CPU. 2048 blocks of 32 tokens hold 65,536 tokens (64 MiB with the tiny model).
DEFAULT_BLOCKS, DEFAULT_BLOCK_SIZE, DEFAULT_BATCH_TOKENS = 2048, 32, 2048
STOP_GRACE_S = 10.0


def root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "kvgate" / f"transformers-serve-{TRANSFORMERS}"


def say(line: str) -> None:
    print(f"transformers serve: {line}", flush=True)


def clean_env() -> dict[str, str]:
    """The caller's environment, offline, without what would point the venv elsewhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}


class Failed(Exception):
    """A step or a command that did not work: what, and what to do about it."""


def _run(argv: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        code = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=clean_env())
    if code != 0:
        tail = "\n".join("    " + line for line in log.read_text().splitlines()[-12:])
        raise Failed(f"{argv[0]} exited with {code}; the log's last lines:\n{tail}\n  log: {log}")


def installed(base: Path) -> dict[str, str] | None:
    """The stamp of a finished setup whose venv and model are still there, or None."""
    try:
        stamp: dict[str, str] = json.loads((base / STAMP).read_text())
    except (OSError, ValueError):
        return None
    ready = (base / "venv" / "bin" / "transformers").exists()
    ready = ready and (base / "tiny-llama" / "model.safetensors").exists()
    return stamp if ready and stamp.get("transformers") == TRANSFORMERS else None


def setup(base: Path) -> None:
    if installed(base) is not None:
        say(f"up to date at {base}")
        return
    python = shutil.which(f"python{PYTHON_SERIES}") or sys.executable
    t0 = time.monotonic()
    shutil.rmtree(base / "venv", ignore_errors=True)
    (base / STAMP).unlink(missing_ok=True)
    pip = str(base / "venv" / "bin" / "pip")
    steps = [
        ("venv", [python, "-m", "venv", str(base / "venv")]),
        # torch first and pinned: otherwise pip may pick a newer, multi-GB CUDA build
        ("torch", [pip, "install", "--progress-bar", "off", f"torch=={TORCH}"]),
        ("transformers", [pip, "install", "--progress-bar", "off", f"torch=={TORCH}",
                          f"transformers[serving]=={TRANSFORMERS}"]),
        ("model", [str(base / "venv" / "bin" / "python"), str(TINY_MODEL),
                   str(base / "tiny-llama")]),
    ]  # fmt: skip
    for name, argv in steps:
        say(f"{name} ...")
        _run(argv, base / "logs" / f"{name}.log")
    stamp = {
        "transformers": TRANSFORMERS,
        "torch": TORCH,
        "seconds": f"{time.monotonic() - t0:.0f}",
    }
    (base / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    say(f"installed in {time.monotonic() - t0:.0f} s at {base}")


def running_pid(base: Path) -> int | None:
    """The server's PID when its PID file names a live process, else None."""
    try:
        pid = int((base / "server.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start(base: Path, port: int, blocks: int, timeout_s: float) -> int:
    if installed(base) is None:
        raise Failed(f"not set up at {base}: run `python3 tools/transformers_serve.py setup`")
    pid = running_pid(base)
    if pid is not None:
        say(f"already running (pid {pid}); `stop` it first")
        return pid
    argv = [
        str(base / "venv" / "bin" / "transformers"), "serve", str(base / "tiny-llama"),
        "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--cb-block-size", str(DEFAULT_BLOCK_SIZE), "--cb-num-blocks", str(blocks),
        "--cb-max-batch-tokens", str(DEFAULT_BATCH_TOKENS),
    ]  # fmt: skip
    with (base / "server.log").open("a", encoding="utf-8") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=clean_env(), process_group=0,  # in the caller's session: contract/host.py
        )  # fmt: skip
    (base / "server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed(f"the server exited with {proc.returncode}; see {base / 'server.log'}")
        if healthy(port):
            say(f"healthy on http://127.0.0.1:{port} (pid {proc.pid}, log {base / 'server.log'})")
            return proc.pid
        time.sleep(0.5)
    stop(base)
    raise Failed(f"no healthy /health within {timeout_s:.0f} s; see {base / 'server.log'}")


def stop(base: Path) -> None:
    pid = running_pid(base)
    if pid is None:
        say("not running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and running_pid(base) is not None:
        time.sleep(0.2)
    if running_pid(base) is not None:
        os.kill(pid, signal.SIGKILL)
    (base / "server.pid").unlink(missing_ok=True)
    say(f"stopped (pid {pid})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("setup", "start", "stop", "status"))
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS, help="KV cache blocks of 32")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /health")
    args = p.parse_args(argv)
    base = root()
    try:
        if args.command == "setup":
            setup(base)
        elif args.command == "start":
            start(base, args.port, args.blocks, args.timeout)
        elif args.command == "stop":
            stop(base)
        else:
            pid = running_pid(base)
            say(f"running (pid {pid})" if pid is not None else "not running")
            return 0 if pid is not None else 1
    except Failed as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
