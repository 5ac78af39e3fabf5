#!/usr/bin/env python3
"""One process of a PyTorch training job whose state vps switches between
parallel configurations mid-training, and whose world grows and shrinks as
devices join and leave. Started by launch.py, one process per device
(RANK, its device; WORLD_SIZE, the processes it starts with; MASTER_ADDR
and MASTER_PORT, the job's store), with a vps-exec beside it for each
switch. A process that joins a running job is started with --join K, the
switch that gives it its state. Under torchrun, which starts only the ranks
and keeps their world, --exec DIR has each rank make its part of the
switches' plans in DIR and start its own vps-exec.

What vps adds to the training loop is marked "vps:"."""
import argparse
import os
import signal
import socket
import sys
import threading
import time

# when this process started, near enough: PyTorch's import, most of a
# process's start, is below (a join's processes may start long before it);
# a wall clock, to set beside the time rank 0 asked for the switch
STARTED = time.time()

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError as e:  # one line that says what to do, not a traceback
    print("train.py: %s cannot import %s: run it with the test environment's torchrun or Python "
          "(build/venv/bin/torchrun; make venv makes build/venv, which has PyTorch)" % (sys.executable, e.name),
          file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import comm  # noqa: E402
import options  # noqa: E402
import plans  # noqa: E402
import vps  # noqa: E402
import vps.elastic  # noqa: E402
from model import Stage  # noqa: E402


def parse_args(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_training(a)
    a.add_argument("--join", type=int, help="join the running job at its switch K (set by launch.py)")
    under = a.add_argument_group("under torchrun, which starts only the ranks")
    under.add_argument("--exec", dest="exec_dir", metavar="DIR",
                       help="start this rank's vps-exec beside it, with its part of the switches' plans made in "
                            "DIR/rank-R; its log and report go to DIR (needs VPS_TOKEN in the environment)")
    under.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc; default tcp)")
    under.add_argument("--budget", default="64MiB", help="vps-stage's staging budget (default 64MiB)")
    under.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout (default 120)")
    args = a.parse_args(argv)
    if args.exec_dir and args.join is not None:
        # the launcher that starts a joining process also starts the executors that give it its state
        a.error("--exec and --join: a process joins a job launch.py runs, whose executors launch.py starts; "
                "--exec is for torchrun, whose world does not change")
    if args.topology:
        try:  # every rank, before the job starts: not its first switch
            vps.topology(args.topology)
        except vps.Error as e:
            a.error("--topology: %s" % e)
    return options.finish(a, args)


# ---- a deterministic corpus: sample i is phrases of a fixed phrase book ----
class Corpus:
    def __init__(self, vocab, seq, seed, phrases=64, length=8):
        g = torch.Generator().manual_seed(seed)
        self.book = torch.randint(vocab, (phrases, length), generator=g)
        self.seq, self.seed = seq, seed

    def sample(self, i):
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        n = -(-(self.seq + 1) // self.book.shape[1])
        return self.book[torch.randint(self.book.shape[0], (n,), generator=g)].reshape(-1)[:self.seq + 1]

    def batch(self, ids):
        return torch.stack([self.sample(i) for i in ids])


# ---- this rank's process groups under one configuration, from its world's cache ----
class Groups:
    def __init__(self, world, lay, rank):
        par = lay.parallel
        self.ranks = {}
        for axis in ("tp", "dp", "pp"):
            ranks = next(g for g in vps.elastic.axis_groups(lay, axis) if rank in g)
            self.ranks[axis] = ranks
            setattr(self, axis, world.group(ranks))
        # the ranks of the configuration: the loss and the switch votes
        self.job = world.group(range(lay.world))
        self.dp_ranks = self.ranks["dp"]
        # pipeline neighbours, as ranks of the pipeline group
        i = self.ranks["pp"].index(rank)
        self.prev = i - 1 if i > 0 else None
        self.next = i + 1 if i + 1 < par["pp"] else None
        self.dp_rank, self.dp_size = lay.coords(rank).dp, par["dp"]


def dp_ranks(lay, rank):
    return next(g for g in vps.elastic.axis_groups(lay, "dp") if rank in g)


class Ahead:
    """fn(*args) in a thread of its own, started now: result() waits for it."""

    def __init__(self, fn, *args):
        self.value, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args):
        try:
            self.value = fn(*args)
        except BaseException as e:  # raised again in the thread that waits
            self.error = e

    def result(self):
        self.thread.join()
        if self.error:
            raise self.error
        return self.value


def groups_of(layouts):
    """Every group of these layouts in one order, the one every process makes
    them in."""
    out = []
    for lay in layouts:
        out += vps.elastic.layout_groups(lay)
    return out


# ---- AdamW over vps's buffers: fp32 main params and moments, ZeRO-1 over DP ----
class Adam:
    B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.01

    def __init__(self, state, groups, plan=None):
        self.state, self.groups = state, groups
        self.sets, grad_of = plan or Adam.plan(state.layout, state.rank, groups.dp_ranks, state.device)
        self.sets = [dict(s, grad=torch.zeros(s["elements"], dtype=torch.float32, device=state.device))
                     for s in self.sets]
        # each parameter's fp32 gradient buffer (that of its chunk's param buffer)
        grads = {s["param"]: s["grad"] for s in self.sets}
        self.grad_of = [grads[b] for b in grad_of]

    @staticmethod
    def plan(lay, rank, dp_ranks, dev):
        """Where each element of the rank's shard is, in its buffers and its
        data-parallel peers': from the layout alone, so made before a switch
        while the job trains."""
        v = lay.rank(rank)
        sets = []
        peers = {r: lay.rank(r) for r in dp_ranks if r != v.rank} if lay.parallel["zero"] else {}
        for b in v.buffers:
            if b.state != vps.PARAM:
                continue
            ids = [v.buffer(s, b.chunk, b.expert) for s in (vps.MAIN_PARAM, vps.EXP_AVG, vps.EXP_AVG_SQ)]
            m_pos, p_pos = vps.correspondence(v, ids[0], v, b.id, dev)
            for other in ids[1:]:
                o_pos, o_p = vps.correspondence(v, other, v, b.id, dev)
                if not (torch.equal(o_pos, m_pos) and torch.equal(o_p, p_pos)):
                    raise SystemExit("train.py: the moments are not laid out as the main params")
            decay = torch.zeros(b.elements, dtype=torch.bool, device=dev)
            for p in v.params:
                if p.chunk == b.chunk and p.expert == b.expert and len(p.shape) == 2:
                    decay[p.offset:p.offset + p.elements] = True
            gather = []
            for r, pv in peers.items():
                pm = pv.buffer(vps.MAIN_PARAM, b.chunk, b.expert)
                their, mine = vps.correspondence(pv, pm, v, b.id, dev)
                gather.append((dp_ranks.index(r), their, mine))
            sets.append(dict(param=b.id, ids=ids, m_pos=m_pos, p_pos=p_pos, decay=decay[p_pos], gather=gather,
                             elements=b.elements))
        return sets, [v.buffer(vps.PARAM, p.chunk, p.expert) for p in v.params]

    def step(self, stage, lr, t):
        bufs = self.state.buffers
        for s in self.sets:
            s["grad"].zero_()
        for p, g in stage.grads():
            self.grad_of[p.index][p.offset:p.offset + p.elements] = g.reshape(-1)
        for s in self.sets:
            if self.groups.dp is not None:
                comm.all_reduce(s["grad"], group=self.groups.dp)
            main, m1, m2 = (bufs[i] for i in s["ids"])
            pos, g = s["m_pos"], s["grad"][s["p_pos"]]
            p = main[pos] * torch.where(s["decay"], 1 - lr * self.WD, 1.0)
            a = m1[pos] * self.B1 + (1 - self.B1) * g
            b = m2[pos] * self.B2 + (1 - self.B2) * g * g
            denom = (b.sqrt() / (1 - self.B2 ** t) ** 0.5) + self.EPS
            p = p - (lr / (1 - self.B1 ** t)) * a / denom
            main[pos], m1[pos], m2[pos] = p, a, b
            param = bufs[s["param"]]
            param[s["p_pos"]] = p.to(torch.bfloat16)
            if s["gather"]:
                # ZeRO-1: every data-parallel rank updated its shard; gather the rest
                parts = [torch.empty_like(main) for _ in self.groups.dp_ranks]
                comm.all_gather(parts, main, group=self.groups.dp)
                for i, their, mine in s["gather"]:
                    param[mine] = parts[i][their].to(torch.bfloat16)


def init_state(state, model, seed):
    """Megatron-like initialization of every whole logical tensor, the same
    in any layout: normal(0, 0.02) weights, unit norms; main params are the
    bf16 params' values, the moments zero."""
    cache = {}

    def full(tid, st):
        if tid not in cache:
            g = torch.Generator().manual_seed(seed * 7919 + tid)
            shape = model.tensor_shape(tid)
            w = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
            cache[tid] = w.to(torch.bfloat16).float()
        return cache[tid] if st in (vps.PARAM, vps.MAIN_PARAM) else torch.zeros_like(cache[tid])

    state.load(full)


def same_bits(model, a, b):
    if a.keys() != b.keys():
        return "the (tensor, state) pairs differ"
    for k in a:
        x, y = a[k], b[k]
        iv = torch.int16 if x.dtype == torch.bfloat16 else torch.int32
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(iv), y.view(iv)):
            return "%s %s differs" % (model.tensor_name(k[0]), vps.STATES[k[1]])
    return None


def train_step(stage, opt, groups, corpus, tr, args, lr, samples):
    """One optimizer step on the global batch starting at tr.consumed_samples.
    Returns the step's loss summed over this rank's tokens (last stage only)."""
    dp, mb, gb, seq = groups.dp_size, args.micro_batch, args.global_batch, args.seq
    accum = gb // (mb * dp)
    stage.begin_step()
    held, loss_sum = [], 0.0
    for m in range(accum):
        first = tr.consumed_samples + m * mb * dp + groups.dp_rank * mb
        data = corpus.batch(range(first, first + mb)).to(args.device)
        if samples and stage.first and stage.c.tp == 0:
            samples.write("%d %d %d\n" % (tr.step + 1, first, mb))
        if stage.first:
            x = data[:, :-1]
        else:
            x = torch.empty(mb, seq, stage.m.hidden, device=args.device)
            comm.recv(x, groups.prev, groups.pp)
            x.requires_grad_()
        y = stage.forward(x)
        if stage.last:
            y = F.cross_entropy(y.reshape(-1, y.shape[-1]), data[:, 1:].reshape(-1), reduction="sum")
            loss_sum += y.item()
        else:
            comm.send(y.detach().contiguous(), groups.next, groups.pp)
        held.append((x, y))
    for x, y in reversed(held):
        if stage.last:
            (y / (gb * seq)).backward()
        else:
            g = torch.empty_like(y)
            comm.recv(g, groups.next, groups.pp)
            y.backward(g)
        if not stage.first:
            comm.send(x.grad.contiguous(), groups.prev, groups.pp)
    opt.step(stage, lr, tr.step + 1)
    if samples:
        samples.flush()
    return loss_sum if stage.last and stage.c.tp == 0 else 0.0


class Switch:
    """Switch k of the run, to configuration `spec`: a static one (--configs,
    --switch-every) at step `at`, or one asked for while the job runs (at
    None: as soon as every rank is ready)."""

    def __init__(self, k, spec, lay, at):
        self.k, self.spec, self.lay, self.at = k, spec, lay, at
        self.build = None   # the new world, or the configuration's groups, made in the background
        self.adam = None    # the optimizer's plan under the new layout, made in the background
        self.waited = 0.0   # seconds the job waited for it at the switch
        self.boundary = None  # when the job stopped training for it


class Fault:
    """VPS_TRAIN_FAULT=SLOT:start, SLOT:switch:K or SLOT:freeze:K, for the
    tests: the process of device SLOT exits at once after it starts (a
    device that never joins), or is killed (switch) or stops itself
    (freeze: SIGSTOP, as an operator's kill -STOP) as it enters switch K, one
    that changes the world (its executor and the other ranks' are under
    way)."""

    def __init__(self, slot):
        f = os.environ.get("VPS_TRAIN_FAULT", "").split(":")
        self.point = f[1] if len(f) > 1 and f[0] == str(slot) else None
        self.k = int(f[2]) if self.point in ("switch", "freeze") else None

    def at_start(self):
        if self.point == "start":
            os._exit(3)

    def in_switch(self, k):
        if self.point in ("switch", "freeze") and k == self.k:
            time.sleep(0.5)  # as one stopped or killed from outside: its heartbeat has said where it is
            sig = signal.SIGKILL if self.point == "switch" else signal.SIGSTOP
            self.point = None  # once: after SIGCONT it goes on
            os.kill(os.getpid(), sig)


class Run:
    """One process of the job: the world it is in, the configuration and
    state it holds (none while it waits to join), and the switches."""

    def __init__(self, args):
        self.args = args
        self.slot = int(os.environ["RANK"])
        self.fault = Fault(self.slot)
        self.fault.at_start()
        self.model = vps.Model(args.model)
        self.corpus = Corpus(self.model.vocab, args.seq, args.seed)
        self.layouts = {}
        # vps: the job's store, on which its worlds are made
        self.job = vps.elastic.Job.from_env(args.timeout)
        # vps: under launch.py, a heartbeat: the launcher names (and stops) a
        # process that stops beating, saying what it was doing
        self.doing = "starting"
        if self.job.agent:
            self.job.beat(self.slot, lambda: self.doing)
        # a world change waits for the launcher's word: it names a frozen or
        # dead process within the timeout and decides after; a trainer gives
        # up on its own only later
        self.patience = 2 * args.timeout if self.job.agent else args.timeout
        self.world = self.groups = self.state = self.stage = self.opt = None
        self.size = int(os.environ["WORLD_SIZE"])  # processes of the world
        self.spec, self.lay, self.rank, self.tr = args.configs[0], self.layout(args.configs[0]), -1, None
        self.k, self.requests, self.seen = 1, 0, 0
        self.pending, self.halted, self.done = None, None, 0
        self.rearm = False  # reset the registry before the next switch (an executor of a failed one may have stopped)
        self.reg = None
        self.executor = None  # --exec: this rank's own vps-exec
        if args.exec_dir:
            os.makedirs(args.exec_dir, exist_ok=True)  # before the logs, which may go into it
        self.log = open(args.loss_log, "w") if self.slot == 0 and args.loss_log else None
        self.samples = open(args.sample_log.replace("%r", str(self.slot)), "a") if args.sample_log else None
        self.switch_log = open(args.switch_log, "w") if self.slot == 0 and args.switch_log else None

    def layout(self, spec):
        if spec not in self.layouts:
            self.layouts[spec] = vps.layout(self.model, spec, self.args.gpus_per_node)
        return self.layouts[spec]

    def say(self, what):
        if self.slot == 0:
            print("train.py: " + what, flush=True)

    # ---- the schedule ----
    def static(self, k):
        a = self.args
        if self.halted or not a.switch_every or len(a.configs) <= 1 or k * a.switch_every >= a.steps:
            return None
        spec = a.configs[k % len(a.configs)]
        return Switch(k, spec, self.layout(spec), k * a.switch_every)

    def static_same_world(self, k, size):
        """The layouts of world `size` the static schedule runs from switch k on."""
        out, j = [], k
        while True:
            sw = self.static(j)
            if sw is None:
                return out
            if sw.lay.world == size and sw.lay not in out:
                out.append(sw.lay)
            j += 1

    def next_switch(self):
        sw = self.static(self.k)
        if sw is None and self.seen > self.requests:
            spec = self.job.request(self.requests + 1).replace(":", ",")
            self.requests += 1
            try:
                sw = Switch(self.k, spec, self.layout(spec), None)
            except vps.Error as e:
                self.say("the configuration asked for, %s, is refused: %s" % (spec, e))
                return None
        return sw

    # ---- starting ----
    def start(self):
        """The first world, and the first configuration's state."""
        args = self.args
        lay = self.lay
        if lay.world > self.size:
            raise SystemExit("train.py: %s has a world of %d, the job has %d processes" % (self.spec, lay.world,
                                                                                            self.size))
        switches = plans.switches(args.configs, args.steps, args.switch_every) if args.exec_dir else []
        if switches:
            self.check_exec()
        # vps: world 0 and the groups of every configuration it runs, made once
        same = [lay] + [x for x in self.static_same_world(1, self.size) if x is not lay]
        self.world = self.job.world(0, self.slot, self.size, groups_of(same))
        name = args.registry.replace("%r", str(self.slot))
        if self.slot < lay.world:
            self.rank = self.slot
            # vps: the registry through which vps-exec finds this rank's buffers
            self.reg = vps.Registry(name, lay, self.rank)
            self.state = vps.State.allocate(self.reg, lay, self.rank, device=self.args.device)
            init_state(self.state, self.model, args.seed)
            self.tr = vps.Training(global_batch=args.global_batch, micro_batch=args.micro_batch,
                                   dp=lay.parallel["dp"])
            self.bind()
        else:
            self.reg = vps.Registry(name, None, -1)  # a spare: holds nothing until a switch gives it state
        if switches:
            self.executor = self.start_executor()

    def check_exec(self):
        """--exec, before anything is made: the run can switch with its own
        executors (every configuration in this world, a job token)."""
        for spec in self.args.configs:
            lay = self.layout(spec)
            if lay.world != self.size:
                # a world that grows or shrinks needs an agent to start the processes that join
                raise SystemExit("train.py: --exec: %s has a world of %d, the job has %d ranks: under torchrun "
                                 "the world does not change (launch.py grows and shrinks a job)"
                                 % (spec, lay.world, self.size))
        if not os.environ.get("VPS_TOKEN"):
            raise SystemExit("train.py: --exec: no VPS_TOKEN in the environment: export VPS_TOKEN=$(vps-exec "
                             "--new-token) before starting the job, so that every rank's executor holds it")

    def start_executor(self):
        """--exec: this rank's part of every switch's staged plan (vps-plan
        --rank), made in DIR/rank-R, and its vps-exec, started beside it. Rank
        0 picks the executors' rendezvous port (the job's store has its own)
        and tells the others."""
        a = self.args
        d = os.path.join(a.exec_dir, "rank-%d" % self.rank)
        staged = plans.make(d, a.model, a.configs, a.steps, a.switch_every, a.gpus_per_node, a.global_batch,
                            a.micro_batch, a.budget, self.rank, a.relay, a.topology)
        host = socket.gethostbyname(os.environ["MASTER_ADDR"])
        port = vps.free_port(host) if self.rank == 0 else 0
        port = self.world.gather_objects(port, self.world.pg)[0]
        master = "%s:%d" % (host, port)
        log = open(os.path.join(a.exec_dir, "exec.%d.log" % self.rank), "w")
        return plans.executor(staged, a.registry, self.rank, self.size, master, a.transport, a.exec_timeout,
                              os.path.join(a.exec_dir, "report.%d.yaml" % self.rank), log)

    def end_executor(self, failed):
        """--exec: stop this rank's executor when training failed, or wait for
        it to finish the last switch and say whether it did."""
        if self.executor is None:
            return
        if failed:
            self.executor.terminate()
            self.executor.wait()
        elif self.executor.wait(timeout=float(self.args.exec_timeout)):
            raise SystemExit("train.py: rank %d: its vps-exec exited with status %d (%s)"
                             % (self.rank, self.executor.returncode,
                                os.path.join(self.args.exec_dir, "exec.%d.log" % self.rank)))

    def bind(self, adam=None):
        self.groups = Groups(self.world, self.lay, self.rank)
        self.stage = Stage(self.model, self.state.view, self.state, self.groups)
        self.opt = Adam(self.state, self.groups, adam.result() if adam else None)

    # ---- training ----
    def train(self):
        args = self.args
        while True:
            if self.state is None:
                if not self.join():
                    return
                continue
            if self.tr.step >= args.steps:
                if self.pending:
                    # a switch asked for and not yet ready does not happen: the
                    # launcher stops its executors and the processes that would join
                    self.abandon(self.pending, "training ended at step %d before every process was ready for it"
                                 % self.tr.step, ends=True)
                return
            if self.pending is None:
                self.pending = self.next_switch()
                if self.pending:
                    self.prepare(self.pending)
            if self.pending and self.due(self.pending):
                self.at_switch(self.pending)
                if self.state is None:
                    return  # it left
            self.step()

    def step(self):
        args, tr = self.args, self.tr
        self.doing = "training step %d in %s" % (tr.step + 1, self.spec)
        lr = args.lr * min(1.0, (tr.step + 1) / args.warmup)
        local = train_step(self.stage, self.opt, self.groups, self.corpus, tr, args, lr, self.samples)
        # the loss, and rank 0's count of the configurations asked for so far
        asked = self.requests_asked() if self.slot == 0 else 0
        total = torch.tensor([local, float(asked)], dtype=torch.float64)
        if self.groups.job is not None:
            dist.all_reduce(total, group=self.groups.job)
        self.seen = int(total[1].item())
        tr.step += 1
        tr.scheduler_step = tr.step
        tr.consumed_samples += args.global_batch
        loss = total[0].item() / (args.global_batch * args.seq)
        if self.log:
            self.log.write("%d %.9g %s\n" % (tr.step, loss, self.spec))
            self.log.flush()

    def requests_asked(self):
        n = self.seen
        while self.job.request(n + 1) is not None:
            n += 1
        return n

    # ---- switches ----
    def prepare(self, sw):
        """Ask for switch sw (rank 0; the launcher makes its plan and starts its
        executors, and the processes that join) and start making what it
        needs in the background: the new world, or the configuration's groups."""
        grows = sw.lay.world != self.size
        if self.slot < sw.lay.world:
            sw.adam = Ahead(Adam.plan, sw.lay, self.slot, dp_ranks(sw.lay, self.slot), self.args.device)
        if self.slot == 0:
            self.job.ask(sw.k, {"config": sw.spec, "world": sw.lay.world, "from_config": self.spec,
                                "from_world": self.size, "at": sw.at, "requests": self.requests,
                                "time": time.time()})
        if grows:
            if not self.job.agent:
                raise SystemExit("train.py: %s has a world of %d, the job has %d processes, and its launcher "
                                 "cannot change the world (VPS_AGENT)" % (sw.spec, sw.lay.world, self.size))
            if self.slot < sw.lay.world:
                # vps: the next world and its groups, made while the job trains on this one
                same = [sw.lay] + [x for x in self.static_same_world(sw.k + 1, sw.lay.world) if x is not sw.lay]
                sw.build = self.job.build(sw.k, self.slot, sw.lay.world, groups_of(same),
                                          watch="vps/switch/%d/abandon" % sw.k)
        elif not self.world.made(groups_of([sw.lay])):
            sw.build = self.job.extend(self.world, groups_of([sw.lay]))

    def due(self, sw):
        return sw.at is None or self.tr.step >= sw.at

    def at_switch(self, sw):
        """At a step boundary: switch now, or not yet (every rank ready or not),
        or never (abandoned: training goes on in this world)."""
        if sw.at is not None and sw.lay.world == self.size:
            # a static switch in this world: at its step, the groups are made (or it waits)
            t0 = time.monotonic()
            sw.boundary = t0
            if sw.build:
                sw.build.result()
            while not self.job.ready(sw.k):
                time.sleep(vps.elastic.POLL)
            sw.waited = time.monotonic() - t0
            self.switch(sw)
            return
        self.doing = "voting on switch %d to %s" % (sw.k, sw.spec)
        verdict, why = self.vote(sw, blocking=sw.at is not None)
        if verdict == "go":
            self.switch(sw)
        elif verdict == "abandon":
            self.abandon(sw, why)

    def vote(self, sw, blocking):
        """Every rank of the configuration says whether it is ready for sw
        (its part of the new world made, the launcher's executors up); a static
        switch waits for it, one asked for goes on training until all are."""
        t0 = time.monotonic()
        while True:
            why = self.job.abandoned(sw.k)
            if not why and sw.build and sw.build.done() and sw.build.error:
                why = str(sw.build.error)
            ready = not why and (sw.build is None or sw.build.done()) and self.job.ready(sw.k)
            if why or ready or not blocking:
                break
            time.sleep(vps.elastic.POLL)
        votes = torch.tensor([0.0 if ready else 1.0, 1.0 if why else 0.0], dtype=torch.float64)
        if self.groups.job is not None:
            dist.all_reduce(votes, group=self.groups.job)
        if votes[1] > 0:
            whys = self.world.gather_objects(why, self.groups.job)
            return "abandon", next(w for w in whys if w)
        if votes[0] > 0:
            return "wait", None
        sw.boundary, sw.waited = t0, time.monotonic() - t0
        return "go", None

    def abandon(self, sw, why, ends=False):
        """Switch sw will not happen: train on in this world (or end, as it does)."""
        if sw.build:
            sw.build.cancel(why)
        if self.slot == 0:
            self.job.abandon(sw.k, why)
            self.say("switch %d to %s abandoned at step %d: %s; %s in %s on %d ranks"
                     % (sw.k, sw.spec, self.tr.step, why, "the job ends" if ends else "training goes on", self.spec,
                        self.lay.world))
        if sw.at is not None:
            self.halted = why
        self.pending, self.rearm = None, True
        self.k += 1

    def switch(self, sw):
        """vps: move the state to sw's layout; the processes whose device the
        layout does not place leave, and the new world's groups take over."""
        args = self.args
        new_rank = self.slot if self.slot < sw.lay.world else -1
        grows = sw.lay.world != self.size
        before = self.gather_state() if args.check_switch else None
        mine = self.digest() if args.check_switch and grows else None
        t0 = time.monotonic()
        self.stage = self.opt = None  # views of the old buffers go before the buffers do
        self.rearm_registry()
        for attempt in range(1, 100):
            self.doing = "in switch %d to %s (attempt %d, as a process that %s)" % (
                sw.k, sw.spec, attempt, "leaves" if new_rank < 0 else "stays")
            if grows:
                self.fault.in_switch(sw.k)
            if self.executor is not None:
                # vps: the switch fails at once if the vps-exec this rank started has exited
                self.reg.expect_executor(self.executor.pid)
            try:
                # vps: the step and data position travel with the state
                state, carried = vps.switch(self.reg, self.state, sw.lay, new_rank, training=self.tr,
                                            timeout=self.patience if grows else args.timeout)
                self.doing = "taking the new world after switch %d" % sw.k
                break
            except vps.Error as e:
                if not grows:
                    raise SystemExit("train.py: rank %d: switch %d to %s failed: %s" % (self.rank, sw.k, sw.spec, e))
                self.doing = "waiting for the launcher's word after attempt %d of switch %d" % (attempt, sw.k)
                verdict = self.job.verdict(sw.k, attempt, self.patience)
                kept = ""
                if mine is not None:
                    if self.digest() != mine:
                        raise SystemExit("train.py: rank %d: switch %d failed and the state is not as it was"
                                         % (self.rank, sw.k))
                    kept = " (checked)"
                if verdict == "retry":
                    continue
                if verdict == "old":
                    self.bind()
                    self.rearm = True
                    self.abandon(sw, "the switch failed (%s); every rank's state as it was%s" % (e, kept))
                    return
                raise SystemExit("train.py: rank %d: switch %d to %s failed: %s; %s; this rank's state is as it "
                                 "was%s" % (self.rank, sw.k, sw.spec, e, verdict, kept))
        switched = time.monotonic() - t0
        if (carried.step, carried.consumed_samples) != (self.tr.step, self.tr.consumed_samples):
            raise SystemExit("train.py: rank %d: the switch carried step %d, samples %d; this rank was at %d, %d"
                             % (self.rank, carried.step, carried.consumed_samples, self.tr.step,
                                self.tr.consumed_samples))
        if carried.global_batch != args.global_batch:
            raise SystemExit("train.py: rank %d: the switch carried a global batch of %d, the run's is %d"
                             % (self.rank, carried.global_batch, args.global_batch))
        if new_rank < 0:
            print("train.py: process %d left the job at switch %d (step %d): its state went to the ranks that stay"
                  % (self.slot, sw.k, self.tr.step), flush=True)
            self.reg.close()
            self.state = None
            return
        old = (self.spec, self.size)
        self.state, self.rank = state, new_rank
        self.tr.dp = sw.lay.parallel["dp"]
        old_world = self.world
        if grows:
            self.world, self.size = sw.build.result(), sw.lay.world
        self.spec, self.lay = sw.spec, sw.lay
        self.bind(sw.adam)
        # training goes on when every rank of the new configuration can
        self.world.barrier(self.groups.job)
        pause = sw.waited + time.monotonic() - t0
        if grows:
            # vps: the old world's groups go now, in the background, not in the pause
            old_world.retire()
        self.after(sw, before, old, {"build": sw.build.seconds if sw.build else 0.0, "waited": sw.waited,
                                     "pause": pause, "switched": switched, "role": "stays"})

    def join(self):
        """A process that holds nothing (it joins, or is a spare): wait for a
        switch that gives it state, take part in it, and train on. False when
        it leaves instead (training ended, or the job goes on without it)."""
        args = self.args
        k = args.join if args.join and self.world is None else self.k
        self.doing = "waiting, holding nothing, for switch %d" % k
        up = time.time()
        ask = self.job.wait_asked(k)
        if ask is None:
            return False
        # what of this process's start came before rank 0 asked for the switch (all of it when it
        # was up first): part of the new world's making that the ranks' own making does not count
        ahead = max(0.0, min(up, ask.get("time", up)) - STARTED) if self.world is None else 0.0
        spec = ask["config"]
        sw = Switch(k, spec, self.layout(spec), ask["at"])
        self.k, self.requests = k, ask["requests"]
        if self.slot >= sw.lay.world:
            if self.world is None or sw.lay.world != self.size:
                return False  # the world it would join goes on without it
            self.k += 1
            return True
        t0 = time.monotonic()
        try:
            self.doing = "making world %d to join at switch %d" % (k, k)
            if self.world is None or sw.lay.world != self.size:
                # vps: the world it joins, made with the processes that stay (they train meanwhile)
                same = [sw.lay] + [x for x in self.static_same_world(k + 1, sw.lay.world) if x is not sw.lay]
                self.world = self.job.world(k, self.slot, sw.lay.world, groups_of(same),
                                            lambda: self.job.abandoned(k))
                self.size = sw.lay.world
            else:
                self.world.prepare(groups_of([sw.lay]), self.job.store)
        except vps.Error as e:
            print("train.py: process %d does not join: %s" % (self.slot, e), flush=True)
            return False
        adam = Adam.plan(sw.lay, self.slot, dp_ranks(sw.lay, self.slot), self.args.device)
        built = time.monotonic() - t0
        while not self.job.ready(k):
            time.sleep(vps.elastic.POLL)
        t1 = time.monotonic()
        self.rearm_registry()
        for attempt in range(1, 100):
            self.doing = "joining in switch %d to %s (attempt %d)" % (k, spec, attempt)
            self.fault.in_switch(k)
            try:
                # vps: a joining device receives its whole state, and where training is
                state, carried = vps.switch(self.reg, None, sw.lay, self.slot, timeout=self.patience,
                                            device=args.device)
                self.doing = "taking the new world after switch %d" % k
                break
            except vps.Error as e:
                self.doing = "waiting for the launcher's word after attempt %d of switch %d" % (attempt, k)
                verdict = self.job.verdict(k, attempt, self.patience)
                if verdict == "retry":
                    continue
                print("train.py: process %d does not join: switch %d failed: %s (%s)" % (self.slot, k, e, verdict),
                      flush=True)
                return False
        self.state, self.rank, self.tr = state, self.slot, carried
        self.spec, self.lay = spec, sw.lay
        self.opt = Adam(self.state, Groups(self.world, self.lay, self.rank), adam)
        self.groups = self.opt.groups
        self.stage = Stage(self.model, self.state.view, self.state, self.groups)
        self.world.barrier(self.groups.job)
        self.after(sw, None, None, {"build": built, "waited": 0.0, "pause": time.monotonic() - t1,
                                    "switched": time.monotonic() - t1, "role": "joins", "ahead": ahead})
        return True

    def digest(self):
        """This rank's buffers, bit for bit, in a few numbers."""
        return [int(b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32).long().sum())
                for b in self.state.buffers]

    def rearm_registry(self):
        if self.rearm:
            self.reg.reset(self.lay if self.state else None, self.rank if self.state else -1)
            if self.state:
                self.state.register(self.reg)
            self.rearm = False

    def after(self, sw, before, old, timing):
        """Every rank of the new configuration: the bit-for-bit check and the
        switch's times, said by rank 0."""
        self.pending = None
        self.k = sw.k + 1
        self.done += 1
        after = self.gather_state() if self.args.check_switch else None
        times = self.world.gather_objects(timing, self.groups.job)
        if self.slot != 0:
            return
        stays = [t for t in times if t["role"] == "stays"]
        # the new world's making: the joining processes' start where it came before the switch was
        # asked for (a scheduled join starts them with the job), then the world made with them
        build = max(t["build"] for t in stays) + max([t.get("ahead", 0.0) for t in times if t["role"] == "joins"],
                                                    default=0.0)
        pause = max(t["pause"] for t in stays)
        waited = max(t["waited"] for t in stays)
        switched = max(t["switched"] for t in stays)
        joined = sum(1 for t in times if t["role"] == "joins")
        hidden = max(build - waited, 0.0)
        where = "" if old[1] == sw.lay.world else " (world %d -> %d)" % (old[1], sw.lay.world)
        line = "switch %d at step %d to %s%s" % (self.done, self.tr.step, sw.spec, where)
        if after is not None:
            bad = same_bits(self.model, before, after)
            if bad:
                raise SystemExit("train.py: switch %d: the state after is not the state before: %s" % (self.done, bad))
            n = sum(t.numel() for t in after.values())
            line += ": %d (tensor, state) pairs, %d elements, equal bit for bit" % (len(after), n)
        line += " (%.2f s)" % pause
        if old[1] != sw.lay.world:
            line += "; the new world made in %.2f s while training, %.0f%% of it hidden" % (
                build, 100.0 * hidden / (hidden + pause) if hidden + pause > 0 else 100.0)
        self.say(line)
        if self.switch_log:
            self.switch_log.write("%d\t%d\t%s\t%s\t%d\t%d\t%d\t%.6f\t%.6f\t%.6f\t%.6f\t%.6f\n" % (
                self.done, self.tr.step, old[0], sw.spec, old[1], sw.lay.world, joined, build, hidden, waited,
                switched, pause))
            self.switch_log.flush()

    def gather_state(self):
        """Rank 0: the whole state, every (tensor, state) assembled from every rank's pieces."""
        pieces = [(r, v.cpu()) for r, v in self.state.pieces()]
        out = self.world.gather_objects(pieces, self.groups.job)
        return vps.assemble(self.model, [p for lst in out for p in lst]) if self.slot == 0 else None

    def finish(self):
        args = self.args
        if args.save_master:
            full = self.gather_state()
            if self.slot == 0:
                torch.save({self.model.tensor_name(k[0]): v for k, v in full.items() if k[1] == vps.MAIN_PARAM},
                           args.save_master)
        self.world.barrier(self.groups.job)
        if self.slot == 0:
            self.job.finish()  # processes that hold nothing leave
        self.stage = self.opt = self.state = None
        self.reg.close()  # and with it every buffer it allocated


def main():
    args = parse_args()
    # a launcher stops the job with SIGTERM: leave through the registry's close
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)
    if args.device == "cuda":
        # torchrun's rule, as vps-exec's default device: the local rank modulo the GPUs
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    run = Run(args)
    try:
        if args.join is None:
            run.start()
        else:
            # first, so that the launcher starts the switch's executors (they meet at once)
            run.reg = vps.Registry(args.registry.replace("%r", str(run.slot)), None, -1)
        run.train()
    except BaseException:
        run.end_executor(failed=True)
        raise
    run.end_executor(failed=False)
    if run.state is not None:
        run.finish()
    elif run.reg is not None:
        run.reg.close()
    if run.job.agent:
        # done, its registry closed: torch's teardown of groups of which a
        # peer was killed (a frozen process) can abort the interpreter at exit
        # ("terminate called without an active exception"); nothing is left to
        # tear down that the exit does not
        for f in (sys.stdout, sys.stderr):
            f.flush()
        if run.log:
            run.log.close()
        if run.samples:
            run.samples.close()
        if run.switch_log:
            run.switch_log.close()
        os._exit(0)


if __name__ == "__main__":
    main()
