"""Which server profile a run is judged by: the snapshot its meta.json keeps, else a profile
file as it is today, and then the verdict says which one and why.

A profile (contract/profiles/) says what a kind of server gives: which gates apply to it,
the names of its counters. The files change: a later release learns that a server lacks
something, or renames a metric. A run made before that must still be judged as it was, so
the harness writes the profile the run used into meta.json (`target_profile`) when the run
starts, and judging again reads it from there; `current=True` (`--current-profiles`) asks
for today's files instead. Nothing here falls back without saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from contract import servers
from contract.runmeta import RunMeta
from gates.legacy import fill_profile_watermarks

SNAPSHOT_KEY: Final = "target_profile"  # the RunMeta field the snapshot is kept in
assert SNAPSHOT_KEY in RunMeta.model_fields
SNAPSHOT_SOURCE: Final = "meta.json"
# The profile of a run whose meta.json names no kind kvgate knows: it assumes nothing but
# the OpenAI API, so only the client-side gates (and whatever the run's tables show) apply.
FALLBACK_KIND: Final = "openai"


class ProfileSnapshotError(ValueError):
    """meta.json keeps a profile snapshot this kvgate cannot read."""


@dataclass(frozen=True, slots=True)
class RunProfile:
    """The profile a run is judged by, where it came from (`meta.json`, or the profile file
    as it is today), and why it is not the run's own snapshot (None when it is)."""

    profile: servers.ServerProfile
    source: str
    note: str | None


def snapshot(profile: servers.ServerProfile) -> dict[str, Any]:
    """`profile` as meta.json keeps it: JSON that ServerProfile reads back as it was."""
    plain: dict[str, Any] = _plain(profile.model_dump(warnings=False))
    return plain


def _plain(value: Any) -> Any:
    """JSON's shapes for a profile's read-only mappings and its sets (sorted, so the same
    profile is always the same text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def resolve(meta: dict[str, Any], current: bool = False) -> RunProfile:
    """The profile to judge the run of `meta` by: its snapshot, unless `current` or there is
    none; then today's file of meta.target.kind; then, when that names no known profile,
    the generic one. Each but the first carries a note saying which profile and why."""
    recorded = RunMeta.read(meta)
    config = recorded.target.config if recorded.target else None
    snapshot = recorded.target_profile
    if snapshot is not None and not current:
        try:
            kept = servers.ServerProfile.model_validate(fill_profile_watermarks(snapshot, config))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "(top level)"
            raise ProfileSnapshotError(
                f"{SNAPSHOT_KEY} is not a server profile this kvgate can read ({where}: "
                f"{first['msg']}); judge the run by today's profile files with "
                "--current-profiles"
            ) from exc
        return RunProfile(kept, SNAPSHOT_SOURCE, None)
    kind = recorded.target.kind if recorded.target else None
    if kind is None and snapshot is not None:
        kind = snapshot.get("kind")
    why = (
        "--current-profiles asked for today's files, not the profile snapshot meta.json keeps"
        if snapshot is not None
        else "meta.json keeps no profile snapshot (a run written by hand, or by a kvgate "
        "older than the snapshot)"
    )
    known = servers.profiles()
    if isinstance(kind, str) and kind in known:
        profile = known[kind]
        return RunProfile(
            profile, profile.source_file, f"judged by today's {profile.source_file}: {why}"
        )
    fallback = known[FALLBACK_KIND]
    named = (
        f"its target kind {kind!r} has no profile in contract/profiles/ (known: {', '.join(known)})"
        if isinstance(kind, str)
        else "meta.json names no target kind (target.kind)"
    )
    return RunProfile(
        fallback,
        fallback.source_file,
        f"judged by the generic {FALLBACK_KIND} profile ({fallback.source_file}: only the "
        f"OpenAI API is assumed, so the client-side gates and what the run's tables show "
        f"decide): {named}; {why}",
    )
