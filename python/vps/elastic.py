"""Devices join and leave a running job: the trainer's side of a world change
(the paper's Elastic Device Manager), and the launcher's.

A World is the processes of one generation of a job with its process
groups: one over all of them, and every group a parallel configuration
needs, each made once and kept (the cache an in-place switch takes its
groups from). Worlds are built on the job's store (a TCPStore: the
launcher's, torchrun's agent store, or rank 0's), each under keys of its
own, so that the next world is built in a background thread (Build) while
the job trains on the current one. torch.distributed's default group is
never used nor replaced: a group here is a ProcessGroup object made on a
store, as torch 2's own init_process_group makes one, but not entered in
torch.distributed's global map (torch 2.11 offers no public way to make a
group outside the default world; torch.distributed._dist2 makes them the
same way). Collectives and isend/irecv take such a group (group=, and
group_dst= / group_src= ranks of the group); the calls that look a group up
in torch's map (recv with group_src, barrier, *_object) do not, and
World.barrier and World.gather_objects stand in for them.

The job store also carries what the launcher (the agent: the process that
starts and stops the job's processes) and the trainers say to each other
about switches, under vps/ (vps(7), DEVICES JOIN AND LEAVE):

    vps/ask/K                     rank 0, JSON: switch K is next (its
                                  configuration, world, step); the agent
                                  makes its plan, starts the processes
                                  that join and one vps-exec per rank
    vps/switch/K/ready            the agent: switch K's executors are
                                  started (those of the switch before
                                  have ended); no rank requests switch K
                                  before
    vps/request/N                 the agent: the Nth configuration asked
                                  for while the job runs (a control file)
    vps/switch/K/abandon          the agent or rank 0: switch K will not
                                  happen (a joining process died); the job
                                  trains on in its world
    vps/switch/K/verdict/A        the agent, after attempt A of a world
                                  change failed: old (train on in the old
                                  world), retry (executors of a plan
                                  without the lost ranks are up) or
                                  stop: WHY
    vps/world/K/...               the process groups of world K
    vps/done                      rank 0: training ended (processes that
                                  hold nothing leave)
    vps/alive/SLOT                every process of the job, every second:
                                  "COUNT PID WHAT" (Heartbeat): the agent
                                  names one whose count stops (frozen) and
                                  says what it was doing

Needs PyTorch: without it, importing it raises ModuleNotFoundError saying
how to get it."""
import datetime
import json
import os
import pickle
import socket
import threading
import time

from ._lib import import_torch
from .errors import Error, InvalidInput, PeerFailed, Timeout

torch = import_torch("vps.elastic")
import torch.distributed as dist  # noqa: E402
from torch.distributed import PrefixStore, TCPStore  # noqa: E402
__all__ = ["POLL", "make_group", "World", "axis_groups", "layout_groups", "Build", "Job", "Agent"]

POLL = 0.02  # seconds between looks at the store while waiting


def _delta(seconds):
    return datetime.timedelta(seconds=seconds)


def make_group(store, rank, size, backend="gloo", timeout=300.0, device=None, name=""):
    """A ProcessGroup of `size` processes, this one `rank`, on `store` (whose
    keys must be the group's own: a PrefixStore), made as torch 2's
    init_process_group makes one, and not entered in torch.distributed's
    global map: making it replaces and disturbs no other group."""
    from torch.distributed import ProcessGroup
    timeout = _delta(timeout)
    pg = ProcessGroup(store, rank, size)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo
        b = ProcessGroupGloo(store, rank, size, timeout)
        pg._set_default_backend(ProcessGroup.BackendType.GLOO)
        pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, b)
    elif backend == "nccl":
        from torch.distributed import ProcessGroupNCCL
        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        b = ProcessGroupNCCL(store, rank, size, opts)
        dev = torch.device(device or "cuda")
        # the communicator now, in the builder's thread, not at the first collective
        b.eager_connect_single_device(dev)
        pg._set_default_backend(ProcessGroup.BackendType.NCCL)
        pg._register_backend(dev, ProcessGroup.BackendType.NCCL, b)
    else:
        raise InvalidInput("backend %r: gloo or nccl" % backend)
    if name:
        pg._set_group_name(name)
    return pg


class World:
    """Processes 0..size-1 of world `name` of a job, this one `rank`: pg, a
    group over all of them (None for one process), and group(ranks), the
    group of any set of them this process is in, made once. Made on the
    job's store under vps/world/NAME/. Every process comes first to a
    rendezvous of its own, so that one that never comes is named
    (VPS_ETIMEOUT after `timeout` seconds); cancelled() returning a reason
    ends the wait at once (VPS_EPEER with the reason)."""

    def __init__(self, store, name, rank, size, backend="gloo", timeout=300.0, device=None, cancelled=None):
        self.name, self.rank, self.size = str(name), rank, size
        self.backend, self.timeout, self.device = backend, timeout, device
        self.prefix = "vps/world/%s/" % self.name
        t0 = time.monotonic()
        self._rendezvous(store, cancelled)
        self.pg = make_group(PrefixStore(self.prefix + "all/", store), rank, size, backend, timeout, device,
                             "world%s" % self.name) if size > 1 else None
        self._groups = {tuple(range(size)): self.pg}
        self.retired = False
        self.seconds = time.monotonic() - t0

    def __repr__(self):
        return "World(%s: rank %d of %d, %s)" % (self.name, self.rank, self.size,
                                                 "retired" if self.retired else "%d groups" % len(self._groups))

    def _rendezvous(self, store, cancelled):
        here = self.prefix + "here/"
        store.set(here + str(self.rank), "%d@%s" % (os.getpid(), socket.gethostname()))
        keys = [here + str(r) for r in range(self.size)]
        deadline = time.monotonic() + self.timeout
        while True:
            if store.check(keys):
                return
            why = cancelled() if cancelled else None
            if why:
                raise PeerFailed("world %s: abandoned: %s" % (self.name, why))
            if time.monotonic() > deadline:
                missing = [r for r in range(self.size) if not store.check([here + str(r)])]
                raise Timeout("world %s: rank%s %s of %d did not come within %g s" % (
                    self.name, "s" if len(missing) > 1 else "", ", ".join(map(str, missing)), self.size,
                    self.timeout))
            time.sleep(POLL)

    def group(self, ranks):
        """The group of `ranks` (world ranks, this process among them; None for
        one rank), made by prepare() or now."""
        key = tuple(ranks)
        if self.retired:
            raise InvalidInput("world %s: retired (World.retire): its groups are gone" % self.name)
        if key not in self._groups:
            raise InvalidInput("world %s: no group of ranks %s was made (World.prepare)" % (self.name, list(key)))
        return self._groups[key]

    def prepare(self, groups, store):
        """Make, in the order given, every group of `groups` (lists of world
        ranks) that this process is in and that is not made yet. Every process
        must be given its groups in one order (a group is made by all its
        members at once): the order of one list that every process computes
        alike is such an order."""
        if self.retired:
            raise InvalidInput("world %s: retired (World.retire): it makes no group" % self.name)
        for ranks in groups:
            key = tuple(ranks)
            if self.rank not in key or key in self._groups:
                continue
            if len(key) == 1:
                self._groups[key] = None
                continue
            name = "-".join(map(str, key))
            self._groups[key] = make_group(PrefixStore(self.prefix + "g/%s/" % name, store), key.index(self.rank),
                                           len(key), self.backend, self.timeout, self.device,
                                           "world%s:%s" % (self.name, name))

    def retire(self):
        """Let this world's groups go in a thread of their own, and return
        it: tearing a gloo group down waits on its peers (tens of
        milliseconds on a loaded machine), which a switch's pause should not
        hold. Keep the old World until the new one has taken over (its
        groups live as long as it does), then retire it; it makes and gives
        no group after. The groups go once nothing else holds them."""
        held = [self.pg, self._groups]
        self.pg, self._groups, self.retired = None, {}, True
        t = threading.Thread(target=held.clear, name="vps-world-%s-retired" % self.name, daemon=True)
        t.start()
        return t

    def made(self, groups):
        """Whether every group of `groups` that this process is in is made."""
        return all(tuple(g) in self._groups for g in groups if self.rank in g)

    def barrier(self, group):
        """Wait until every member of `group` (one of this World's, or None
        for no wait) is here: an all-reduce, which such a group supports."""
        if group is not None:
            dist.all_reduce(torch.zeros(1), group=group)

    def gather_objects(self, obj, group):
        """Every member's `obj` (picklable), in the group's rank order, on every
        member (a group of None: [obj])."""
        if group is None:
            return [obj]
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        n = group.size()
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64), group=group)
        most = max(int(s) for s in sizes)
        padded = torch.zeros(most, dtype=torch.uint8)
        padded[:data.numel()] = data
        parts = [torch.empty(most, dtype=torch.uint8) for _ in range(n)]
        dist.all_gather(parts, padded, group=group)
        return [pickle.loads(p[:int(s)].numpy().tobytes()) for p, s in zip(parts, sizes)]


def axis_groups(layout, axis):
    """The groups of a layout along one of its dense axes (tp, cp, dp, pp):
    lists of its ranks whose other three coordinates are equal, in one order
    every process computes alike."""
    names = ("tp", "cp", "dp", "pp")
    if axis not in names:
        raise InvalidInput("axis %r: one of %s" % (axis, ", ".join(names)))
    others = [k for k in names if k != axis]
    by = {}
    for r in range(layout.world):
        c = layout.coords(r)
        by.setdefault(tuple(getattr(c, k) for k in others), []).append(r)
    return [by[key] for key in sorted(by)]


def layout_groups(layout, axes=("tp", "dp", "pp")):
    """Every group a layout's ranks use, in one order: those of each axis in
    turn, then all its ranks (the loss, the votes on a switch)."""
    out = []
    for axis in axes:
        out += axis_groups(layout, axis)
    out.append(list(range(layout.world)))
    return out


class Build:
    """A World, or more groups of one, made in a background thread while the
    job trains. done() says whether it ended, result() waits for the World
    (raising vps.Error when the making failed), seconds is how long it took,
    cancel(why) ends a rendezvous still waiting for processes that will not
    come, as does the store key `watch` once set (its value the why)."""

    def __init__(self, connect, name, rank=None, size=None, groups=(), world=None, backend="gloo", timeout=300.0,
                 device=None, watch=None):
        self.name, self.world, self.error, self.seconds = str(name), None, None, None
        self._args = (connect, rank, size, list(groups), world, backend, timeout, device, watch)
        self._why = None
        self._done = threading.Event()
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="vps-world-%s" % name, daemon=True)
        self._thread.start()

    def _run(self):
        connect, rank, size, groups, world, backend, timeout, device, watch = self._args
        try:
            store = connect()

            def cancelled():
                if not self._why and watch and store.check([watch]):
                    self._why = store.get(watch).decode()
                return self._why
            w = world or World(store, self.name, rank, size, backend, timeout, device, cancelled)
            w.prepare(groups, store)
            self.world = w
        except Error as e:
            self.error = e
        except Exception as e:  # torch's errors (a peer gone while gloo connected), named
            self.error = PeerFailed("world %s: %s" % (self.name, str(e).strip().splitlines()[0]))
        finally:
            self.seconds = time.monotonic() - self.started
            self._done.set()

    def done(self):
        """Whether the making ended, made or failed."""
        return self._done.is_set()

    def cancel(self, why):
        """End a rendezvous still waiting: result() raises vps.PeerFailed with why."""
        self._why = why

    def result(self, timeout=None):
        """The World, once made (waiting up to timeout seconds, None: no
        limit); vps.Timeout when it is not made by then, or the error that
        ended the making."""
        if not self._done.wait(timeout):
            raise Timeout("world %s: not made after %g s" % (self.name, timeout))
        if self.error:
            raise self.error
        return self.world


class Heartbeat:
    """A daemon thread that says every `period` seconds, on a connection of
    its own to the job's store, that process `slot` lives and what it does
    (doing(): a few words): vps/alive/SLOT = "COUNT PID WHAT". A process
    that is stopped, or stuck in a call that holds the interpreter, stops
    counting, and its agent sees it whatever the process waits on. It ends
    when the store does (the agent gone)."""

    def __init__(self, connect, slot, doing, period=1.0):
        self.slot, self.doing, self.period = slot, doing, period
        self._connect = connect
        self._thread = threading.Thread(target=self._run, name="vps-heartbeat", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            store = self._connect()
            n, said, next_beat = 0, None, 0.0
            while True:
                # at once when what it does changes: a process that stops right
                # after is named with what it was doing
                doing = self.doing()
                if doing != said or time.monotonic() >= next_beat:
                    n += 1
                    store.set("vps/alive/%d" % self.slot, "%d %d %s" % (n, os.getpid(), doing))
                    said, next_beat = doing, time.monotonic() + self.period
                time.sleep(0.05)
        except Exception:  # the store is gone with its agent: nothing to tell
            return


class Job:
    """A trainer's end of the job store at host:port; rank 0 hosts it when no
    agent does. Worlds are made with world() (now) and build() / extend() (in
    the background); the rest is the switch protocol of the module's doc."""

    def __init__(self, host, port, host_it=False, timeout=300.0, backend="gloo", device=None, agent=False):
        self.host, self.port, self.timeout, self.agent = host, int(port), timeout, agent
        self.backend, self.device = backend, device
        self.store = TCPStore(host, self.port, None, host_it, timeout=_delta(timeout), wait_for_workers=False)

    @classmethod
    def from_env(cls, timeout=300.0, backend="gloo", device=None):
        """MASTER_ADDR and MASTER_PORT, as torchrun and launchers set them;
        rank 0 (RANK) hosts the store unless an agent does
        (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun and launch.py set).
        VPS_AGENT=1 says that the agent speaks the switch protocol (starts
        executors and joining processes when asked): without it the job
        keeps its world."""
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return cls(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"],
                   int(os.environ["RANK"]) == 0 and not agent_store, timeout, backend, device,
                   os.environ.get("VPS_AGENT") == "1")

    def connect(self):
        """A connection of its own to the store, for a thread."""
        return TCPStore(self.host, self.port, None, False, timeout=_delta(self.timeout))

    def world(self, name, rank, size, groups=(), cancelled=None):
        """World `name` of `size` processes, this one `rank`, with `groups`
        made, now (see World)."""
        w = World(self.store, name, rank, size, self.backend, self.timeout, self.device, cancelled)
        w.prepare(groups, self.store)
        return w

    def beat(self, slot, doing, period=1.0):
        """Say every `period` seconds that process `slot` lives, and doing()
        (a Heartbeat)."""
        return Heartbeat(self.connect, slot, doing, period)

    def build(self, name, rank, size, groups=(), watch=None):
        """The same World made in the background: a Build."""
        return Build(self.connect, name, rank, size, groups, None, self.backend, self.timeout, self.device, watch)

    def extend(self, world, groups):
        """More groups of an existing World made in the background: a Build."""
        return Build(self.connect, world.name, groups=groups, world=world, timeout=self.timeout)

    # ---- the switch protocol ----
    def _get(self, key):
        return self.store.get(key).decode() if self.store.check([key]) else None

    def ask(self, k, info):
        """Rank 0: say that switch k is next (info: its configuration, world, step)."""
        self.store.set("vps/ask/%d" % k, json.dumps(dict(info, switch=k)))

    def asked(self, k):
        """Switch k's ask (a dict), or None when not asked yet."""
        v = self._get("vps/ask/%d" % k)
        return json.loads(v) if v is not None else None

    def wait_asked(self, k, timeout=None):
        """Switch k's ask, or None once training ended (vps/done) or after
        timeout seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            a = self.asked(k)
            if a is not None:
                return a
            if self.finished() or (deadline is not None and time.monotonic() > deadline):
                return None
            time.sleep(POLL)

    def request(self, n):
        """The nth configuration a user asked for while the job runs, or None yet."""
        return self._get("vps/request/%d" % n)

    def ready(self, k):
        """Whether switch k's executors are up (always, without an agent: the
        launcher started them with the job)."""
        return not self.agent or self.store.check(["vps/switch/%d/ready" % k])

    def abandon(self, k, why):
        """Say that switch k will not happen (the first why said stays)."""
        self.store.compare_set("vps/switch/%d/abandon" % k, "", why)

    def abandoned(self, k):
        """Why switch k was abandoned, or None."""
        return self._get("vps/switch/%d/abandon" % k)

    def verdict(self, k, attempt, timeout):
        """The agent's word after attempt `attempt` of switch k failed: 'old',
        'retry' or 'stop: WHY' ('stop: ...' after timeout seconds)."""
        key = "vps/switch/%d/verdict/%d" % (k, attempt)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self._get(key)
            if v is not None:
                return v
            time.sleep(POLL)
        return "stop: no word from the launcher within %g s" % timeout

    def finish(self):
        """Rank 0: training ended (processes that hold nothing leave)."""
        self.store.set("vps/done", "1")

    def finished(self):
        """Whether training ended."""
        return self.store.check(["vps/done"])


class Agent:
    """The launcher's end of the job store: it hosts the store (on `port`, 0
    for any free one: .port), learns the switches the job asks for, forwards
    the configurations a user asks for, and decides after a failed world
    change."""

    def __init__(self, host="127.0.0.1", port=0, timeout=300.0):
        self.store = TCPStore(host, port, None, True, timeout=_delta(timeout), wait_for_workers=False)
        self.host, self.port = host, self.store.port
        self._next_ask, self._requests = 1, 0

    def asks(self):
        """The switches asked for since the last call, in order (dicts)."""
        out = []
        while self.store.check(["vps/ask/%d" % self._next_ask]):
            out.append(json.loads(self.store.get("vps/ask/%d" % self._next_ask).decode()))
            self._next_ask += 1
        return out

    def request(self, spec):
        """Ask the job for a configuration; returns its number."""
        self._requests += 1
        self.store.set("vps/request/%d" % self._requests, spec)
        return self._requests

    def ready(self, k):
        """Say that switch k's executors are started."""
        self.store.set("vps/switch/%d/ready" % k, "1")

    def abandon(self, k, why):
        """Say that switch k will not happen (a joining process died)."""
        self.store.compare_set("vps/switch/%d/abandon" % k, "", why)

    def abandoned(self, k):
        """Why switch k was abandoned, or None."""
        key = "vps/switch/%d/abandon" % k
        return self.store.get(key).decode() if self.store.check([key]) else None

    def verdict(self, k, attempt, what):
        """The word after attempt `attempt` of switch k failed: 'old', 'retry' or 'stop: WHY'."""
        self.store.set("vps/switch/%d/verdict/%d" % (k, attempt), what)

    def finished(self):
        """Whether the job said training ended."""
        return self.store.check(["vps/done"])

    def alive(self, slot):
        """Process `slot`'s last heartbeat: (count, pid, what it does), or
        None before its first."""
        key = "vps/alive/%d" % slot
        if not self.store.check([key]):
            return None
        n, pid, what = (self.store.get(key).decode("utf-8", "replace").split(" ", 2) + ["", ""])[:3]
        return int(n), int(pid), what
