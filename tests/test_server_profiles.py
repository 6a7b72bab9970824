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


# -- where a server keeps the facts kvgate reads (info_fields) --------------------------------


def test_each_shipped_profile_finds_the_context_length_where_its_server_gives_it() -> None:
    vllm_models = {"/v1/models": {"data": [{"id": "m", "max_model_len": 2048}]}}
    assert servers.profile("vllm").info_value("max_model_len", vllm_models) == 2048
    tgi_info = {"/v1/models": {"data": [{"id": "m"}]}, "/info": {"max_total_tokens": 8192}}
    assert servers.profile("tgi").info_value("max_model_len", tgi_info) == 8192
    # a server that does not say it: None, not a guess
    assert servers.profile("tgi").info_value("max_model_len", vllm_models) is None
    assert servers.profile("openai").info_value("max_model_len", {}) is None


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("max_model_len", "is not PATH#/json/pointer"),
        ("/stats#/limits/context", "reads /stats, which is not one of info_paths"),
    ],
)
def test_a_bad_info_field_is_refused_naming_what_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, message: str
) -> None:
    toy: dict[str, object] = {"kind": "custom", "title": "Custom", "sources": ["x"]}
    toy["info_fields"] = {"max_model_len": where}
    (tmp_path / "custom.yaml").write_text(yaml.safe_dump(toy))
    monkeypatch.setattr(servers, "PROFILE_DIR", tmp_path)
    servers.profiles.cache_clear()
    try:
        with pytest.raises(ValueError, match=re.escape(message)):
            servers.profiles()
    finally:
        servers.profiles.cache_clear()


TOY_PROFILE = {
    "kind": "toyserve",
    "title": "A toy server",
    "sources": ["tests/test_server_profiles.py"],
    "info_paths": ["/v1/models", "/stats"],
    "info_fields": {"max_model_len": "/stats#/limits/context"},
    "metric_prefixes": ["toy_"],
    "metrics": {"kv_usage": ["toy_kv_used_ratio"], "preemptions": ["toy_preempted_total"]},
    "extensions": {
        "min_tokens": True,
        "priority_field": {"critical": 9, "interactive": 5, "batch": 1},
    },
    "provides": ["kv_usage", "preemption_count"],
    "lacks": {"tenant_share": "the toy server has no tenants"},
}


def test_a_new_server_kind_is_one_profile_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe in docs/extending.md: one YAML file, and the plan, the traffic's request
    fields, the sampler's metric names, the release probe's context length and the gates'
    applicability all know the new kind."""
    from gates.evaluator import evaluate
    from gates.rundir import load_run
    from gates.spec import BUILTIN_GATES, load_gate_file
    from gates.verdict import Status
    from harness.plan import ExternalTarget, Plan
    from harness.traffic import target_dialect
    from tests.gates.builder import RunBuilder

    for path in servers.PROFILE_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "toyserve.yaml").write_text(yaml.safe_dump(TOY_PROFILE))
    monkeypatch.setattr(servers, "PROFILE_DIR", tmp_path)
    servers.profiles.cache_clear()
    try:
        plan = Plan.model_validate(
            {
                "name": "toy",
                "target": {"type": "external", "kind": "toyserve", "url": "http://127.0.0.1:1"},
                "traffic": {"classes": {"short_qa_critical": {"fixed_count": 1}}},
                "load": {"users": 1, "duration_s": 1},
            }
        )
        assert isinstance(plan.target, ExternalTarget)
        profile = plan.target.profile
        assert profile.kind == "toyserve"
        assert (
            profile.info_value("max_model_len", {"/stats": {"limits": {"context": 4096}}}) == 4096
        )
        assert "toy_kv_used_ratio" in servers.metric_names("kv_usage")
        dialect = target_dialect(plan)
        assert dialect.min_tokens and dialect.priority_values == {
            "critical": 9,
            "interactive": 5,
            "batch": 1,
        }
        run = RunBuilder()
        run.meta["target"] = {"kind": "toyserve", "model": "toy"}
        for i in range(30):
            run.request(f"r{i}", t=20.0 + i, tenant=f"t{i % 3}")
        verdict = evaluate(load_run(run.write(tmp_path / "run")), load_gate_file(BUILTIN_GATES))
        share = next(g for g in verdict.gates if g.id == "tenant_share_cap")
        assert share.status == Status.NA and "the toy server has no tenants" in share.message
    finally:
        servers.profiles.cache_clear()
