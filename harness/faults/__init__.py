"""Fault injectors (Chaos Toolkit style: each fault has a rollback that runs in finally).

Faults run as greenlets in the Locust process; every wait is cooperative (gevent's patched
sockets for HTTP, polls with gevent sleeps for commands, a thread for the process scan), so
the users keep running. One module per kind, mapped by `registry.REGISTRY`:

- replica: kill, pause, kill_during_storm, through the reference gateway's admin API;
- signal: a signal to any process (pid, pidfile or command line), CONT or a restart after;
- command: the user's shell command and its rollback command;
- network: a toxic on kvgate's proxy between the load generator and the target.
"""

from harness.faults.base import FaultAction, FaultContext, FaultError, FaultRecord
from harness.faults.network import ProxyInPath, start_proxy_in_path
from harness.faults.registry import REGISTRY
from harness.faults.replica import ReplicaAdmin
from harness.faults.scheduler import FaultScheduler

__all__ = [
    "REGISTRY",
    "FaultAction",
    "FaultContext",
    "FaultError",
    "FaultRecord",
    "FaultScheduler",
    "ProxyInPath",
    "ReplicaAdmin",
    "start_proxy_in_path",
]
