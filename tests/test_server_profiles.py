"""Server profiles (contract/servers.py): each extension's value mapping, checked at load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import contract
from contract import servers


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extensions: Any) -> servers.ServerProfile:
    """Loads the shipped profiles plus one `custom` profile with these extensions."""
    for path in servers.PROFILE_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    custom = {"kind": "custom", "title": "Custom", "sources": ["x"], "extensions": extensions}
    (tmp_path / "custom.yaml").write_text(yaml.safe_dump(custom))
    monkeypatch.setattr(servers, "PROFILE_DIR", tmp_path)
    servers.profiles.cache_clear()
    try:
        return servers.profiles()["custom"]
    finally:
        servers.profiles.cache_clear()


def test_vllm_takes_an_integer_priority_lowest_first() -> None:
    vllm = servers.profile("vllm")
    assert dict(vllm.priority_values or {}) == {"critical": 0, "interactive": 1, "batch": 2}
    values = [vllm.priority_value(p) or 0 for p in contract.PRIORITIES]  # highest first
    assert values == sorted(set(values))  # lower runs first, one value each
    assert vllm.accepts("priority_field") and not vllm.accepts("priority_header")


@pytest.mark.parametrize("kind", ["reference", "sglang", "tgi", "openai"])
def test_other_servers_take_no_priority_field(kind: str) -> None:
    profile = servers.profile(kind)
    assert profile.priority_values is None and profile.priority_value("critical") is None
    assert not profile.accepts("priority_field")


def test_every_shipped_mapping_names_exactly_the_priorities() -> None:
    for profile in servers.profiles().values():
        values = profile.priority_values
        assert values is None or tuple(values) == contract.PRIORITIES, profile.kind
        for name, setting in profile.extensions.items():
            assert isinstance(setting, bool) or name == "priority_field", (profile.kind, name)


def test_an_unknown_priority_is_refused_by_the_accessor() -> None:
    with pytest.raises(ValueError, match=r"unknown priority 'urgent'; one of critical"):
        servers.profile("vllm").priority_value("urgent")


@pytest.mark.parametrize(
    ("extensions", "message"),
    [
        ({"priority_field": {"critical": 0, "interactive": 1}}, r"missing \['batch'\]"),
        (
            {"priority_field": {"critical": 0, "interactive": 1, "batch": 2, "urgent": 3}},
            r"unknown priorities \['urgent'\]",
        ),
        ({"priority_field": True}, r"give each priority's value"),
        ({"priority_field": {"critical": "0", "interactive": 1, "batch": 2}}, r"int"),
        ({"cache_salt": {"critical": 0}}, r"cache_salt: give true or false"),
        ({"ignore_eos": "yes"}, r"bool"),
    ],
)
def test_a_bad_mapping_is_an_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extensions: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=r"server profile .*custom\.yaml") as info:
        load(tmp_path, monkeypatch, extensions)
    assert re.search(message, str(info.value)), str(info.value)


def test_false_switches_a_valued_extension_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom = load(tmp_path, monkeypatch, {"priority_field": False, "ignore_eos": True})
    assert not custom.accepts("priority_field") and custom.priority_values is None
    assert custom.accepts("ignore_eos")
