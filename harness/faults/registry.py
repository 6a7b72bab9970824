"""Fault kind -> implementation. Adding a kind: its model in harness/plan.py, its name in
contract.FAULT_KINDS, one module here with its action class, and one line below."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from harness.faults.base import ActionFactory
from harness.faults.command import CommandAction
from harness.faults.network import NetworkAction
from harness.faults.replica import KillAction, PauseAction
from harness.faults.signal import SignalAction

REGISTRY: Mapping[str, ActionFactory] = MappingProxyType(
    {
        "kill": KillAction,
        "pause": PauseAction,
        "kill_during_storm": KillAction,
        "signal": SignalAction,
        "command": CommandAction,
        "network": NetworkAction,
    }
)
