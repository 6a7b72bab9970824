"""The composition root of one replica: builds config, tenants, tokenizer, virtual GPU, cost
model, scheduler, event log, metrics and step loop from the command line, once."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from server.engine.gpus import get_gpu, get_model_compute
from server.engine.sim import GIB, CostModel, VirtualGpu
from server.metrics import ReplicaMetrics
from server.mutants import tenant_book_class
from server.options import load_config, target_info
from server.promptwork import PromptTokenizer
from server.replica.events import EventLog
from server.replica.mutants import step_loop_class
from server.scheduler.config import SchedulerConfig
from server.scheduler.mutants import parse_mutant, scheduler_class
from server.scheduler.policies import Policy
from server.tenants import load_tenants
from server.tokenizer import TextTokenizer

INTERNAL_TOKEN_ENV = "KVGATE_INTERNAL_TOKEN"
PARENT_PID_ENV = "KVGATE_PARENT_PID"  # set by serve: the replica exits when serve is gone


class ReplicaRuntime:
    """Everything a replica's handlers share. Built before the event loop serves requests;
    must be constructed inside a running asyncio loop (the step loop's event needs one)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.replica_id: str = args.replica_id
        self.policy: str = args.policy
        self.started = int(time.time())
        self.config = load_config(args)
        self.info = {"replica": args.replica_id, **target_info(args, self.config)}
        self.model_name = self.config.model
        # A deployment carrying a named bug builds the mutant's subclass of each part it breaks.
        mutant = parse_mutant(args.mutant)
        self.tenants = load_tenants(args.tenants, tenant_book_class(mutant))
        self.tokenizer = TextTokenizer(args.tokenizer)
        self.prompts = PromptTokenizer(self.tokenizer)
        # Set by serve: this replica then takes only its gateway's requests. Unset, it is a
        # standalone replica that authenticates API keys itself.
        self.internal_token = os.environ.get(INTERNAL_TOKEN_ENV, "")
        profile = self.config.profile
        sku = get_gpu(args.gpu)
        # The scheduler's calibrated estimate is exact unless --kv-actual-factor says otherwise.
        actual_per_token = self.config.bytes_per_token * args.kv_actual_factor
        block_bytes = math.ceil(actual_per_token * self.config.block_tokens)
        self.gpu = VirtualGpu(sku, profile, get_model_compute(profile.name), block_bytes)
        self.cost = CostModel(sku, profile, actual_per_token)
        self.scheduler = scheduler_class(mutant)(
            self.config,
            self.tenants.quotas,
            policy=args.policy,
            clock=time.time,
            device_free_bytes=self.gpu.free_after_weights(),
        )
        warning = pool_too_big(self.scheduler.policy, self.config, self.gpu, block_bytes)
        if warning is not None:
            sys.stderr.write(warning + "\n")
        state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="kvgate-replica-"))
        self.state_dir = Path(state_dir)
        self.events = EventLog(self.replica_id, self.state_dir)
        self.metrics = ReplicaMetrics()
        self.loop = step_loop_class(mutant)(
            self.scheduler,
            self.gpu,
            self.cost,
            self.events,
            args.time_scale,
            on_lag=self.metrics.step_lag.observe,
            on_release=self.metrics.release_latency.observe,
        )
        self.metrics.attach(self.scheduler, self.gpu, lambda: self.loop.stats.lag_max)


def pool_too_big(
    policy: Policy, config: SchedulerConfig, gpu: VirtualGpu, block_bytes: int
) -> str | None:
    """The warning for a configured KV pool (at `block_bytes`, the actual bytes of a block)
    that cannot fit beside the weights and runtime on `gpu`; None when it fits, or when the
    policy sizes its pool from what the device has left (`pool_from_config` False)."""
    if not policy.pool_from_config:
        return None
    pool = config.pool_blocks() * block_bytes
    fixed = gpu.used_bytes
    if pool + fixed <= gpu.total_bytes:
        return None
    return (
        f"kvgate: warning: KV pool ({pool / GIB:.1f} GiB at actual bytes) plus weights "
        f"and runtime ({fixed / GIB:.1f} GiB) exceed {gpu.sku.name}'s "
        f"{gpu.total_bytes / GIB:.1f} GiB; lower kv_pool_gib or this replica "
        f"will run out of memory"
    )
