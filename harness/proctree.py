"""Process trees: a server is often more than one process (vLLM's API server, its
EngineCore and worker; a replica and its tokenizer pool), and a signal meant for the server
must reach all of them, or a SIGKILL leaves orphans holding the model and the KV cache."""

from __future__ import annotations

import contextlib

import psutil


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants, parents first; [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, signum: int) -> list[int]:
    """Send `signum` to a process and every descendant, snapshotted first so that a
    parent's death cannot hide its children; the pids signalled."""
    sent = []
    for proc in process_tree(pid):
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or its pid reused
            proc.send_signal(signum)
            sent.append(proc.pid)
    return sent


def alive(procs: list[psutil.Process]) -> list[int]:
    """The pids of `procs` still running (a zombie is not running)."""
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
    return out
