"""Reading run directories written by older kvgate versions, in one place.

What is here reads a run the way kvgate read it when the run was made, so re-judging an old
run gives the verdict it had. A run written today carries everything itself and never needs
this module; nothing new may be keyed on what is here.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from contract import FaultEffect
from contract.seed import SEED

# The server kind whose runs kvgate drew the seed's watermarks for, before a server profile
# declared the watermarks its scheduler keeps (contract.servers.ServerProfile.watermarks).
_SEED_WATERMARK_KIND = "reference"
# How kvgate read its fault kinds before each declared its own effect (harness/faults/kinds/).
_KILL_KINDS = ("kill", "kill_during_storm")
_FATAL_SIGNALS = ("KILL", "TERM")
_BREAKING_TOXICS = ("reset_peer", "timeout")


def fill_fault_effects(faults: pd.DataFrame) -> pd.DataFrame:
    """The faults table with an `effect` in every row: a row without one was written before
    the column existed, and gets the one kvgate read into its kind then."""
    missing = faults["effect"].isna()
    if not missing.any():
        return faults
    rows = zip(faults.loc[missing, "kind"], faults.loc[missing, "params"], strict=True)
    filled = faults.copy()
    filled.loc[missing, "effect"] = [str(legacy_fault_effect(str(k), p)) for k, p in rows]
    return filled


def legacy_fault_effect(kind: str, params: object) -> FaultEffect:
    """The effect of a faults row written before the faults table had its `effect` column,
    from its kind and its params (JSON; unreadable reads as none): kill and
    kill_during_storm kill, pause pauses; a signal KILL or TERM kills and a STOP pauses; a
    command that exited 0 kills (a command could not say what it did then, and kvgate took
    every successful one for a docker kill); a network fault breaks connections with a
    reset_peer or timeout toxic and degrades the network with any other."""
    found = _params(params)
    if kind in _KILL_KINDS:
        return FaultEffect.KILLS
    if kind == "pause":
        return FaultEffect.PAUSES
    if kind == "signal":
        if found.get("signal") in _FATAL_SIGNALS:
            return FaultEffect.KILLS
        return FaultEffect.PAUSES if found.get("signal") == "STOP" else FaultEffect.NONE
    if kind == "command":
        return FaultEffect.KILLS if found.get("exit_code") == 0 else FaultEffect.NONE
    if kind == "network":
        toxic = found.get("toxic")
        breaking = isinstance(toxic, dict) and toxic.get("type") in _BREAKING_TOXICS
        return FaultEffect.BREAKS_CONNECTIONS if breaking else FaultEffect.DEGRADES_NETWORK
    return FaultEffect.NONE


def _params(text: object) -> dict[str, Any]:
    """A faults row's `params` JSON ({} when absent or unreadable)."""
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def fill_profile_watermarks(
    snapshot: dict[str, Any], config: dict[str, Any] | None
) -> dict[str, Any]:
    """A profile snapshot (meta.json's target_profile) with `watermarks`: one kept before
    profiles declared them gets what kvgate read into the run then, the seed's three for a
    reference server, or for any server whose recorded scheduler config (meta.json's
    target.config) named one of them, and none otherwise."""
    if "watermarks" in snapshot:
        return snapshot
    named = isinstance(config, dict) and any(name in config for name in SEED.watermarks())
    seed = snapshot.get("kind") == _SEED_WATERMARK_KIND or named
    return {**snapshot, "watermarks": list(SEED.watermarks()) if seed else []}
