"""Records: one hook, and exactly one record per request under load."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from locust import constant
from locust.env import Environment

from contract import OUTCOMES, Outcome, RequestRecord
from tests.waiting import wait_until
from tests.workloads.fakes import fake_server
from workloads.client import StreamResult
from workloads.records import RequestMeta, build_record, install_record_hook
from workloads.users.traffic import ShortQAInteractive


def test_install_record_hook_is_idempotent() -> None:
    env = Environment()
    hook = install_record_hook(env)
    assert install_record_hook(env) is hook
    assert vars(env.events)["kvgate_record"] is hook  # set at run time: no declared field


def test_inter_token_statistics_use_every_gap() -> None:
    result = StreamResult(request_id="r", t_send=1.0, outcome=Outcome.OK, chunks=101)
    result.gaps = [0.01] * 98 + [0.5, 0.02]
    meta = RequestMeta("short_qa", "acme", "interactive", "acme-demo", 64, 64, "x")
    record = build_record(meta, result)
    assert record.itl_max_s == 0.5 and record.itl_p50_s == 0.01
    # kvgate's one percentile (numpy's linear method): between the 99th and 100th sorted gap
    assert record.itl_p99_s == pytest.approx(float(np.percentile(result.gaps, 99))) == 0.0248
    # the mean of the gaps handed in above (arithmetic on given numbers, no clock read)
    assert record.itl_mean_s == pytest.approx((0.98 + 0.52) / 100, rel=0, abs=1e-12)


class FastUser(ShortQAInteractive):
    wait_time = constant(0)
    prompt_tokens = 8
    timeout_s = 60.0  # no request times out, however busy the machine: only quit cuts them


def test_one_record_per_request_across_a_thousand_requests() -> None:
    records: list[RequestRecord] = []
    locust_rows: Counter[str] = Counter()

    def on_request(name: str, **_kw: Any) -> None:
        locust_rows[name.split(":")[0]] += 1

    with fake_server(tokens=3) as srv:
        env = Environment(user_classes=[FastUser], host=srv.url)
        install_record_hook(env).add_listener(lambda record, **_kw: records.append(record))
        env.events.request.add_listener(on_request)
        runner = env.create_local_runner()
        try:
            runner.start(20, spawn_rate=1000)
            wait_until(lambda: len(records) >= 1000, timeout_s=120, what="1000 records")
        finally:
            runner.quit()
        seen = list(srv.seen)
    assert len(records) >= 1000
    ids = Counter(r.request_id for r in records)
    assert max(ids.values()) == 1  # no duplicates
    assert set(seen) <= set(ids)  # no losses: every request the server saw has its record
    assert all(r.outcome in OUTCOMES for r in records)
    unfinished = [r for r in records if r.outcome != "ok"]
    assert all(r.error_code == "user_stopped" for r in unfinished)  # only those cut by quit
    assert len(unfinished) <= 20
    assert locust_rows["e2e"] == len(records)
    assert locust_rows["ttft"] == sum(r.ttft_s is not None for r in records)
    ok = [r for r in records if r.outcome == "ok"]
    assert all(r.completion_tokens == 4 and r.chunks == 3 for r in ok)
    assert {r.traffic_class for r in records} == {"short_qa"}
