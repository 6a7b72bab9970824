"""The harness's side of a trace replay: the replay's Locust user, built from the plan, and
its start, given to every load-generator process at once.

Locally, the load generator sets the start signal itself when the load begins. With
workers, the master sends `kvgate_replay_start` to every worker: the schedule's time 0 (a
moment far enough ahead for the message to arrive) and, in a fixed order, the workers Locust
gave a replay user, from which each takes its share (request i goes to the worker at
position i mod n), so together they send every request once, at the times one process would.
"""

from __future__ import annotations

import time
from typing import Any, Final

import numpy as np
import pandas as pd
from locust import User
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_MISSING, MasterRunner

from contract import ClientCode
from contract.host import HostCpu
from contract.runmeta import Replay, ScheduleError
from harness.plan import Plan
from harness.plan_trace import read, rules, schedule
from workloads.blocks import BlockCheck, BlockText
from workloads.openloop import ReplayStart, TraceReplayUser, replay_start
from workloads.prompts import DEFAULT_TOKENIZER_PATH, generator_for

MSG_START: Final = "kvgate_replay_start"
LEAD_S: Final = 1.0  # the schedule's time 0 this far after the load starts: users are up by then
CLASS_NAME: Final = "trace_replay"  # its Locust class name, the same on master and workers


def replay_user_class(plan: Plan, attrs: dict[str, Any]) -> type[User] | None:
    """The plan's trace as a Locust user class (None without `traffic.trace`); `attrs` are
    what every class of the plan gets (host, dialect, model, seed, block size)."""
    spec = plan.traffic.trace
    if spec is None:
        return None
    replay = schedule(spec, plan.base_dir)
    own = {
        "schedule": replay,
        "rules": rules(spec),
        "timeout_s": spec.timeout_s,
        "fixed_count": 1,  # the master sets one per worker
        "weight": 1,
        "abstract": False,
    }
    return type(CLASS_NAME, (TraceReplayUser,), attrs | own)


def start_replay(environment: Environment, lead_s: float = LEAD_S) -> ReplayStart:
    """Gives this process's replay, and every worker's, the schedule's time 0."""
    start = ReplayStart(time.time() + lead_s)
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        runner.send_message(MSG_START, {"t0": start.t0, "workers": replaying_workers(runner)})
    else:
        replay_start(environment).set(start)
    return start


def replaying_workers(runner: MasterRunner) -> list[str]:
    """The workers Locust gave a replay user, in a fixed order: the shares go to them alone
    (its dispatcher may give one worker two of the fixed users and another none). Locust's
    dispatcher keeps where it put each user in a private field; without it, every worker."""
    placed = getattr(getattr(runner, "_users_dispatcher", None), "_users_on_workers", None)
    if isinstance(placed, dict):
        ids = sorted(w for w, counts in placed.items() if counts.get(CLASS_NAME, 0) > 0)
        if ids:
            return ids
    return sorted(w.id for w in runner.clients.all if w.state != STATE_MISSING)


def install_worker_start(environment: Environment, runner: Any) -> None:
    """A worker's replay starts when the master says (its share: its place among workers).
    `runner` is the worker runner `environment.create_worker_runner` returned."""

    def on_start(environment: Environment, msg: Message, **_: Any) -> None:
        workers = list(msg.data["workers"])
        me = getattr(runner, "client_id", None)
        if me not in workers:
            return  # not among the workers the master counted: it sends nothing
        start = ReplayStart(float(msg.data["t0"]), workers.index(me), len(workers))
        replay_start(environment).set(start)

    runner.register_message(MSG_START, on_start)


def replay_meta(
    plan: Plan,
    requests: pd.DataFrame | None,
    samples: pd.DataFrame | None,
    stress: tuple[float, float] | None,
    blocks: BlockCheck | None,
) -> Replay | None:
    """meta.json's `replay`: the schedule's counts, and once the tables are written, what
    went out (sent, unsent, stragglers), its schedule error, the server's prefix reuse and
    the load generator's CPU."""
    spec = plan.traffic.trace
    if spec is None:
        return None
    replay = schedule(spec, plan.base_dir)
    trace = read(spec, plan.base_dir)
    meta = Replay(
        trace=spec.path,
        format=trace.fmt.value,
        block_tokens=replay.block_tokens,
        time_scale=spec.time_scale,
        token_scale=spec.token_scale,
        in_window=replay.in_window,
        scheduled=len(replay.requests),
        clipped=replay.clipped,
        skipped=replay.skipped,
        unmatched=replay.unmatched,
        schedule_error_bound_ms=plan.samplers.schedule_error_bound_ms,
        prefix_reuse_trace=replay.prefix_reuse(),
        blocks_checked=blocks.blocks if blocks else None,
        blocks_exact=blocks.exact if blocks else None,
    )
    if requests is not None:
        _sent(meta, requests)
    if samples is not None and stress is not None:
        cores = _own_cpu(samples, stress)
        if not cores.empty:
            meta.load_generator_cpu_cores_mean = float(cores.mean())
            meta.load_generator_cpu_cores_max = float(cores.max())
    return meta


def _sent(meta: Replay, requests: pd.DataFrame) -> None:
    replayed = requests[requests["t_scheduled"].notna()]
    meta.sent = len(replayed)
    meta.unsent = max((meta.scheduled or 0) - meta.sent, 0)
    meta.stragglers = int(replayed["error_code"].eq(str(ClientCode.USER_STOPPED)).sum())
    late = errors_ms(replayed)
    if len(late):
        meta.schedule_error_ms = ScheduleError(
            p50=float(np.percentile(late, 50)),
            p99=float(np.percentile(late, 99)),
            max=float(late.max()),
        )
    prompt = replayed["prompt_tokens"].fillna(0).sum()
    cached = replayed["cached_tokens"]
    if prompt > 0 and cached.notna().any():
        meta.prefix_reuse_server = float(cached.fillna(0).sum() / prompt)


def errors_ms(replayed: pd.DataFrame) -> np.ndarray:
    """Each replayed request's schedule error, `t_send - t_scheduled`, in ms."""
    late = (replayed["t_send"] - replayed["t_scheduled"]).dropna()
    return np.asarray(late.to_numpy(float) * 1000.0)


def _own_cpu(samples: pd.DataFrame, stress: tuple[float, float]) -> pd.Series:
    rows = samples[samples["metric"].eq(str(HostCpu.KVGATE))]
    rows = rows[(rows["t"] >= stress[0]) & (rows["t"] <= stress[1])]
    return rows["value"].dropna().astype(float)


def check_blocks(plan: Plan) -> BlockCheck | None:
    """Tokenizes a few of the replay's blocks as its users will write them: BlockTextError
    when they are not exactly the block size (None without a trace or without blocks)."""
    spec = plan.traffic.trace
    if spec is None:
        return None
    replay = schedule(spec, plan.base_dir)
    if replay.block_tokens is None:
        return None
    ids = max((r.hash_ids for r in replay.requests[:100]), key=len, default=())
    blocks = BlockText(generator_for(DEFAULT_TOKENIZER_PATH), replay.block_tokens, plan.seed)
    return blocks.check(ids) if ids else None
