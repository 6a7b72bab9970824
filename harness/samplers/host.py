"""The host's CPU while the run goes on: how much went to kvgate's own processes, how much
to the target's, and how much to everything else on the host (the foreign CPU, which the
host-contention evidence check judges: gates/evidence/checks_host.py).

The sampler process runs `HostCpuSampler.sample` once a second on a plain thread. The
metric names, and what each row means, are contract.host.HostCpu's.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from contract.host import HostCpu
from harness.samplers.prometheus import Row

Key = tuple[int, float]  # (pid, create time): a PID the kernel hands out again is another process
KVGATE, TARGET = "kvgate", "target"  # the trees TreeCpu is asked about


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as one scan of the host read it: who it is, its parent, and its CPU so
    far, its own (user + system) apart from that of the children it has reaped."""

    pid: int
    ppid: int
    started: float  # create time, epoch s
    own_s: float  # user + system
    reaped_s: float  # children_user + children_system

    @property
    def key(self) -> Key:
        return (self.pid, self.started)

    @property
    def cpu_s(self) -> float:
        return self.own_s + self.reaped_s


@dataclass(frozen=True, slots=True)
class TreeUse:
    """CPU-seconds used since the last scan, by each tree asked about, and by all of them
    together (a process in two trees, the target kvgate started, is counted once there)."""

    by_tree: dict[str, float]
    total: float


class TreeCpu:
    """The CPU some process trees used between two scans of the host.

    Why deltas of user + system + children_user + children_system over every process of a
    tree: the running check spawns a process every 10 s, a Locust worker or a replica may be
    started and end between two scans, and none of them is foreign. When a parent reaps a
    child, the kernel adds the child's whole CPU (its own reaped children's included) to the
    parent's children_user/children_system, so a process that came and went between two
    scans is in its parent's delta although no scan ever saw it. A process a scan did see
    and that has since ended is in its reaper's delta with its whole life: what the last
    scan had already read of it is taken off that delta. Its reaper is the nearest live
    ancestor as last seen; if it was orphaned instead (reaped by init), that delta holds less
    than what is taken off, so it is floored at 0: such a process can never make a tree's
    CPU negative, and at worst its last second reads as foreign.

    Owns the last scan of every process it tracks: the roots' descendants, and any that left
    its tree alive (a process whose parent died is still the run's until it ends).
    Invariant: every process's use is >= 0, so a tree's is too.
    """

    def __init__(self) -> None:
        self._last: dict[Key, Proc] = {}
        self._trees: dict[Key, frozenset[str]] = {}
        self._since: float | None = None  # when the last scan began (epoch s)

    def update(
        self, scan: Mapping[int, Proc], roots: Mapping[str, Iterable[int]], t: float
    ) -> TreeUse | None:
        """The CPU each tree of `roots` (name -> root PIDs) used since the last update, from
        `scan` (every process on the host, by PID), begun at epoch `t`; None at the first."""
        alive = {p.key: p for p in scan.values()}
        trees = self._members(scan, roots, alive)
        now = {key: alive[key] for key in trees}
        owed, by_pid = self._owed(alive), {p.pid: p for p in now.values()}
        used = {key: self._used(proc, by_pid, owed) for key, proc in now.items()}
        first = self._since is None
        self._last, self._trees, self._since = now, trees, t
        if first:
            return None
        by_tree: dict[str, float] = dict.fromkeys(roots, 0.0)
        for key, seconds in used.items():
            for name in trees[key]:
                by_tree[name] = by_tree.get(name, 0.0) + seconds
        return TreeUse(by_tree=by_tree, total=sum(used.values()))

    def _members(
        self,
        scan: Mapping[int, Proc],
        roots: Mapping[str, Iterable[int]],
        alive: Mapping[Key, Proc],
    ) -> dict[Key, frozenset[str]]:
        children: dict[int, list[int]] = defaultdict(list)
        for proc in scan.values():
            children[proc.ppid].append(proc.pid)
        trees: dict[Key, frozenset[str]] = {}
        for name, pids in roots.items():
            for pid in _descendants(children, [p for p in pids if p in scan]):
                key = scan[pid].key
                trees[key] = trees.get(key, frozenset()) | {name}
        for key, names in self._trees.items():  # left the tree alive: still the run's
            if key in alive:
                trees[key] = trees.get(key, frozenset()) | names
        return trees

    def _used(self, proc: Proc, by_pid: Mapping[int, Proc], owed: Mapping[Key, float]) -> float:
        old = self._last.get(proc.key)
        if old is not None:
            reaped = proc.reaped_s - old.reaped_s - owed.get(proc.key, 0.0)
            return max(proc.own_s - old.own_s, 0.0) + max(reaped, 0.0)
        return proc.cpu_s if self._born_since(proc, by_pid) else 0.0

    def _owed(self, alive: Mapping[Key, Proc]) -> dict[Key, float]:
        """For each live process, what the last scan read of the processes it reaped since:
        already counted then, and now in its children_* again."""
        by_pid = {p.pid: p for p in self._last.values()}
        owed: dict[Key, float] = defaultdict(float)
        for key, proc in self._last.items():
            if key in alive:
                continue
            reaper = _live_ancestor(proc, by_pid, alive)
            if reaper is not None:
                owed[reaper] += proc.cpu_s
        return owed

    def _born_since(self, proc: Proc, by_pid: Mapping[int, Proc]) -> bool:
        """Did `proc`, which the last scan did not see, start after it? A child of a process
        that scan saw did (it would have been seen with its parent); one with no parent in
        the trees (a root: the target restarted) by its create time."""
        seen: set[int] = set()
        while proc.ppid in by_pid and proc.pid not in seen:
            seen.add(proc.pid)
            parent = by_pid[proc.ppid]
            if parent.key in self._last:
                return True
            proc = parent
        return self._since is not None and proc.started >= self._since


def _descendants(children: Mapping[int, list[int]], roots: list[int]) -> list[int]:
    found, todo = [], list(roots)
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _live_ancestor(proc: Proc, by_pid: Mapping[int, Proc], alive: Mapping[Key, Proc]) -> Key | None:
    """The nearest ancestor of an ended process, as the last scan saw them, still alive."""
    seen = {proc.pid}
    while (parent := by_pid.get(proc.ppid)) is not None and parent.pid not in seen:
        if parent.key in alive:
            return parent.key
        seen.add(parent.pid)
        proc = parent
    return None


def scan_processes() -> dict[int, Proc]:
    """Every process on the host whose counters can be read (on Linux, all of them)."""
    procs = {}
    for p in psutil.process_iter(["ppid", "create_time", "cpu_times"]):
        info = p.info
        times = info.get("cpu_times")
        if times is None or info.get("ppid") is None or info.get("create_time") is None:
            continue  # gone, or not ours to read
        procs[p.pid] = Proc(
            pid=p.pid,
            ppid=int(info["ppid"]),
            started=float(info["create_time"]),
            own_s=times.user + times.system,
            reaped_s=getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0),
        )
    return procs


@dataclass(frozen=True, slots=True)
class HostTimes:
    """The host's CPU counters, seconds summed over its CPUs: busy is everything but idle,
    iowait and steal (what this machine ran, interrupts included); steal what the
    hypervisor gave to other machines while this one had work."""

    busy_s: float
    steal_s: float


def host_times() -> HostTimes:
    fields = psutil.cpu_times()._asdict()
    # On Linux `user` and `nice` already hold guest time; psutil's own cpu_percent takes
    # guest and guest_nice out of the total in the same way.
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    steal = fields.get("steal", 0.0)
    waiting = fields.get("idle", 0.0) + fields.get("iowait", 0.0)
    return HostTimes(busy_s=total - waiting - steal, steal_s=steal)


@dataclass(frozen=True, slots=True)
class TargetPids:
    """Where the target's processes are on this host: their roots, none (it runs on another
    host), or unknown, and why."""

    pids: tuple[int, ...] = ()
    unmeasured: str | None = None


class TargetFinder:
    """The target's process roots: the PIDs the run was given (target.pid or pidfile, the
    reference server's gateway, a vLLM kvgate started), else, for a target on this host, the
    process listening on its URL's port, looked up again (at most every LOOKUP_S) whenever
    the one found has ended. Nothing is guessed: a target on this host that cannot be found
    is `unmeasured`, with the reason."""

    LOOKUP_S = 5.0

    def __init__(
        self,
        given: Callable[[], list[int]],
        url: str | None,
        *,
        listener: Callable[[int], int | None] | None = None,
        local: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._given = given
        self._url = urlsplit(url) if url else None
        self._listener = listener or listening_pid
        self._local = local or is_this_host
        self._clock = clock
        self._on_host: bool | None = None
        self._found: int | None = None
        self._why = "not looked up yet"
        self._next_lookup = 0.0

    def __call__(self) -> TargetPids:
        given = self._given()
        if given:
            return TargetPids(pids=tuple(given))
        if self._url is None or not self._url.hostname:
            return TargetPids(unmeasured="the target's process was not given and it has no URL")
        if self._on_host is None:
            self._on_host = self._local(self._url.hostname)
        if not self._on_host:
            return TargetPids()  # on another host: none of this host's CPU is the target's
        if self._found is not None and psutil.pid_exists(self._found):
            return TargetPids(pids=(self._found,))
        if self._clock() >= self._next_lookup:
            self._next_lookup = self._clock() + self.LOOKUP_S
            self._lookup()
        if self._found is not None:
            return TargetPids(pids=(self._found,))
        return TargetPids(unmeasured=self._why)

    def _lookup(self) -> None:
        assert self._url is not None
        port = self._url.port or (443 if self._url.scheme == "https" else 80)
        self._found = None
        try:
            self._found = self._listener(port)
        except psutil.AccessDenied as exc:
            self._why = (
                f"this host's sockets could not be listed to find the target's process on port "
                f"{port} ({exc}); give target.pid or target.pidfile"
            )
            return
        if self._found is None:
            self._why = (
                f"no process this user may see listens on port {port}, the target's; give "
                "target.pid or target.pidfile"
            )


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port` on this host, if this user may see it."""
    for conn in psutil.net_connections(kind="tcp"):
        port_of = getattr(conn.laddr, "port", None)  # an addr, or () for an unbound socket
        if conn.status == psutil.CONN_LISTEN and port_of == port and conn.pid is not None:
            return int(conn.pid)
    return None


def is_this_host(hostname: str) -> bool:
    """Whether `hostname` (a name or an address) is this machine."""
    if hostname.lower() in ("localhost", socket.gethostname().lower()):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except OSError:
        return False
    own = {a.address.split("%")[0] for nic in psutil.net_if_addrs().values() for a in nic}
    return any(ipaddress.ip_address(a).is_loopback or a in own for a in addresses)


class HostCpuSampler:
    """Rows of contract.host.HostCpu once a sample: the host's busy and stolen CPU, kvgate's
    own tree's, the target's, and the foreign CPU, busy less both trees (counted once),
    clipped at 0, plus steal. Each covers the time since the sample before; the first
    sample only sets the counters' baselines."""

    def __init__(
        self,
        own_pid: int,
        target: Callable[[], TargetPids],
        *,
        scan: Callable[[], Mapping[int, Proc]] = scan_processes,
        times: Callable[[], HostTimes] = host_times,
        cpus: int | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._own = own_pid
        self._target = target
        self._scan = scan
        self._times = times
        self._cpus = cpus or psutil.cpu_count() or 1
        self._wall = wall
        self._clock = clock
        self._tree = TreeCpu()
        self._last: tuple[float, HostTimes] | None = None

    def sample(self) -> list[Row]:
        t, mono = self._wall(), self._clock()
        host, target, scan = self._times(), self._target(), self._scan()
        use = self._tree.update(scan, {KVGATE: [self._own], TARGET: target.pids}, t)
        last, self._last = self._last, (mono, host)
        if use is None or last is None or mono <= last[0]:
            return []
        dt = mono - last[0]
        busy = max(host.busy_s - last[1].busy_s, 0.0) / dt
        steal = max(host.steal_s - last[1].steal_s, 0.0) / dt
        rows = [
            _row(t, HostCpu.CPUS, self._cpus),
            _row(t, HostCpu.BUSY, busy),
            _row(t, HostCpu.STEAL, steal),
        ]
        if self._own not in scan:
            why = f"kvgate's own process (PID {self._own}) was not found on this host"
            return [*rows, _row(t, HostCpu.UNMEASURED, 1.0, f"reason={_label(why)}")]
        rows.append(_row(t, HostCpu.KVGATE, use.by_tree[KVGATE] / dt))
        if target.unmeasured is not None:
            return [*rows, _row(t, HostCpu.UNMEASURED, 1.0, f"reason={_label(target.unmeasured)}")]
        if target.pids:
            rows.append(_row(t, HostCpu.TARGET, use.by_tree[TARGET] / dt))
        foreign = max(busy - use.total / dt, 0.0) + steal
        return [*rows, _row(t, HostCpu.FOREIGN, foreign)]


def _label(text: str) -> str:
    """`text` as a label value: the samples table's labels are `k=v,k=v`."""
    return text.replace(",", ";").replace("=", ":")[:200]


def _row(t: float, metric: HostCpu, value: float, labels: str = "") -> Row:
    return {
        "t": t,
        "source": "host",
        "target": "host",
        "metric": str(metric),
        "labels": labels,
        "value": float(value),
    }
