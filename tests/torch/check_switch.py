"""A torchtitan job switched by vps (make check-torch).

torchtitan 0.3.0 builds llama3 (its own definition, _build_llama3_layers, at
the size of models/llama3-tiny.yaml) and applies its parallelize function
(TP and SP placements, FSDP2's fully_shard, HSDP) on the CPU, a forked
process per rank over gloo, and the job trains as torchtitan's Trainer does:
the model on the meta device, parallelized, then materialized; torchtitan's
cross-entropy (its loss-parallel one under TP) summed and divided by the
global token count, FSDP2's own gradient reduction, torchtitan's
clip_grad_norm_, torch's AdamW, a warm-up schedule, on a deterministic
corpus of which each data-parallel rank reads its share of the global
batch. The CPU shims are titan.install_training_shims's (causal attention
by scaled_dot_product_attention, FSDP2's sums by SUM on gloo). vps.dtensor
makes the job switchable, and vps-exec beside each rank moves its state
every --every steps through

    dp_shard=2 -> dp_shard=4 -> dp_replicate=2,dp_shard=2 -> dp_shard=2,tp=2
        -> dp_shard=4 -> dp_shard=8

(FSDP 2, its world grown to FSDP 4, then HSDP 2x2, FSDP2 x TP 2, FSDP 4,
its world grown again to FSDP 8), each between two steps: the new
configuration's model is built on the meta device and handed vps's
buffers (no copy), while the job trains for a switch within its world
(vps.dtensor.Job.prepare, as soon as the switch before is done), in the
pause for a growth (and for every switch with --no-prepare). --configs
gives other configurations, each of the world before or of a larger one.
The processes are forked from this one after it imported torch and
torchtitan (0.6 GiB) and share those pages: a rank's own memory is 40 to
80 MiB, the 8 ranks' about 0.5 GiB. A growth goes as
vps.elastic's launcher protocol has it: this script is the agent
(vps.elastic.Agent, the job's store); rank 0 asks for each switch, the
agent starts its executors (one per process of the world, serving the
switches of a world in order) and, for a growth, the processes that join,
and says ready; the processes that join take part in the switch
(vps.dtensor.Job.join) and everyone makes the new world's default group on
the job's store (vps.dtensor.init_world). Before and after each switch the
whole state is gathered through DCP's get_state_dict (full state dicts: the
model's parameters, the optimizer's exp_avg, exp_avg_sq and step per
parameter, its groups) and the two must be equal bit for bit. A static run
stays in the first configuration on the same batches: up to the first
switch the two runs' losses must be equal bit for bit (vps's buffers under
FSDP2's parameters change nothing), and after it within 1e-3 (relative) at
every step, scripts/convergence.sh's bound. A Job is also shown what it
refuses (another layout than the model's, a Megatron layout, another
optimizer, a step that is not Adam's, a switch neither prepared nor given
build, a prepare for another world).

    check_switch.py [-v] [--steps N] [--every K] [--configs 'A B ...'] [--keep DIR] [--no-prepare]

--steps defaults to K steps in each configuration (12 for the six above).

Prints a line per switch with -v, then one summary line (with rank 0's
pauses, prepared and built in them); exit 1 naming what differs, 2 on bad
arguments.
"""
import argparse
import contextlib
import gc
import os
import resource
import signal
import sys
import time
import warnings

# the launcher forks the ranks after the job's store (a TCPStore server,
# its own thread) started: a rank only connects to it, by a socket of its own
warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

import vps  # noqa: E402

MODEL_NAME = "llama3-tiny"
MODEL = os.path.join(HERE, "models", MODEL_NAME + ".yaml")
# the switches' configurations (--configs): each of the world before, or
# of a larger one (the world grows)
CONFIGS = ["dp_shard=2", "dp_shard=4", "dp_replicate=2,dp_shard=2", "dp_shard=2,tp=2", "dp_shard=4", "dp_shard=8"]
GPUS_PER_NODE = 8


def arguments():
    """The command line, checked before torch and torchtitan are imported (seconds): bad
    arguments exit 2 at once."""
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("-v", "--verbose", action="store_true")
    a.add_argument("--steps", type=int, help="steps in all (default: K in each configuration)")
    a.add_argument("--every", type=int, default=2, help="switch every K steps")
    a.add_argument("--configs", default=" ".join(CONFIGS),
                   help="the configurations, space-separated; the last may have more processes (a growth)")
    a.add_argument("--keep", help="keep the plans, logs and reports in this directory")
    a.add_argument("--timeout", type=float, default=600)
    a.add_argument("--no-prepare", action="store_true",
                   help="no Job.prepare: each switch builds the next configuration in its pause")
    args = a.parse_args()
    CONFIGS[:] = args.configs.split()
    if args.steps is None:
        args.steps = args.every * len(CONFIGS)
    if args.steps < 1 or args.every < 1:
        a.error("--steps and --every must be at least 1")
    try:
        worlds = [vps.layout(MODEL, c, GPUS_PER_NODE).world for c in CONFIGS]
    except vps.Error as e:
        a.error("--configs: %s" % e)
    if len(CONFIGS) < 2 or worlds != sorted(worlds):
        a.error("--configs: two or more configurations, each of the world before or a larger one (worlds %s)"
                % worlds)
    args.configs = len(CONFIGS)
    return args


if __name__ == "__main__":
    ARGS = arguments()

import ranks  # noqa: E402
import titan  # noqa: E402  (torchtitan and its shims, imported once before the ranks fork)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # noqa: E402
from torchtitan.components.loss import cross_entropy_loss  # noqa: E402
from torchtitan.distributed import utils as dist_utils  # noqa: E402

  # noqa: E402
import vps.elastic  # noqa: E402
from ranks import RankError  # noqa: E402
from switching import Corpus, check_refusals, run, start_executors, stop, tool, workspace  # noqa: E402
GLOBAL_BATCH, SEQ = 8, 32
LR, WARMUP, MAX_NORM, SEED = 3e-3, 4, 1.0, 1234
MAX_REL = 1e-3  # scripts/convergence.sh's bound


def mesh_of(layout):
    par = layout.parallel
    return {"dp_replicate": par["dp_replicate"], "dp_shard": par["dp_shard"], "tp": par["tp"]}


# ---- a rank's job, built by torchtitan for a layout ----
class Built:
    """torchtitan's parallel dimensions, the model and its optimizer."""

    def __init__(self, pd, model, optimizer):
        self.pd, self.model, self.optimizer = pd, model, optimizer


def make(layout, materialize):
    """The model as torchtitan's Trainer builds it: on the meta device,
    parallelized by the model's parallelize function over the layout's
    mesh (torch.distributed's default group), then materialized and
    initialized from the seed (materialize), or left on the meta device
    for vps's buffers with only its buffers (RoPE's cache) made; AdamW
    over its parameters."""
    pd, model = titan.on_meta(titan.model_spec(MODEL_NAME), mesh_of(layout), layout.world)
    titan.sum_reductions(model)
    if materialize:
        model.to_empty(device="cpu")
        torch.manual_seed(SEED)
    with torch.no_grad():
        # on the meta device, the parameters' initializers do nothing and the buffers are made on the CPU
        model.init_states(buffer_device=torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return Built(pd, model, optimizer)


def set_lr(optimizer, step):
    """The learning rate of step + 1 (a function of the step the switch carries)."""
    for g in optimizer.param_groups:
        g["lr"] = LR * min(1.0, (step + 1) / WARMUP)


def train_step(b, corpus, consumed):
    """One step, as torchtitan's Trainer.train_step; returns the global loss."""
    pd = b.pd
    dp = pd.dp_replicate * pd.dp_shard
    dp_rank = pd.get_mesh("batch").get_local_rank() if pd.dp_enabled else 0
    per = GLOBAL_BATCH // dp
    first = consumed + dp_rank * per
    batch = torch.stack([corpus.sample(i) for i in range(first, first + per)])
    inputs, labels = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    b.optimizer.zero_grad()
    pred = b.model(inputs)
    loss = cross_entropy_loss(pred, labels) / (GLOBAL_BATCH * SEQ)
    del pred
    loss.backward()
    dist_utils.clip_grad_norm_(list(b.model.parameters()), MAX_NORM, foreach=True)
    b.optimizer.step()
    total = loss.detach().clone()
    if pd.dp_enabled:
        dist.all_reduce(total, group=pd.get_mesh("batch").get_group())
    return total.item()


# ---- the whole state, through DCP ----
def gather(b):
    """The whole state through DCP's get_state_dict (full state dicts, every
    rank takes part): rank 0's {key: tensor} of the model's parameters and
    the optimizer's states, and the optimizer's groups; None elsewhere
    (cpu_offload: only rank 0 keeps the full state, not every rank a copy)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    with titan.fused_qkv_kept(b.model):
        msd, osd = get_state_dict(b.model, b.optimizer, options=options)
    if dist.get_rank() != 0:
        return None
    out = {"model." + k: v.detach().clone() for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            out["optim.%s.%s" % (fqn, k)] = v.detach().clone() if torch.is_tensor(v) else v
    return out, osd["param_groups"]


def bits(t):
    return t.view({torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
                  .get(t.dtype, t.dtype))


def differs(a, b):
    """Why two gathered states are not equal bit for bit, or None."""
    (fa, ga), (fb, gb) = a, b
    if fa.keys() != fb.keys():
        return "keys %s" % sorted(set(fa) ^ set(fb))[:3]
    for k in fa:
        x, y = fa[k], fb[k]
        if not torch.is_tensor(x):
            if x != y:
                return "%s: %r, then %r" % (k, x, y)
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            return "%s: %s %s, then %s %s" % (k, x.dtype, list(x.shape), y.dtype, list(y.shape))
        if not torch.equal(bits(x), bits(y)):
            return "%s: %d of %d elements differ" % (k, (bits(x) != bits(y)).sum().item(), x.numel())
    if ga != gb:
        return "the optimizer's groups: %s, then %s" % (ga, gb)
    return None


# ---- a process of the job ----
class Rank:
    """One process: the switching run's (with vps) or the static run's."""

    def __init__(self, slot, args, host, port, registry, switching):
        self.slot, self.args, self.registry, self.switching = slot, args, registry, switching
        self.job = vps.elastic.Job(host, port, timeout=args.timeout)
        self.layouts = [vps.layout(MODEL, c, GPUS_PER_NODE) for c in CONFIGS]
        self.corpus = Corpus(self.layouts[0].model.vocab, SEQ, SEED)
        self.world = None  # the name of the world of torch.distributed's default group
        self.reg = self.vjob = None
        self.losses, self.switches = [], []

    def world_of(self, k, layout):
        """torch.distributed's default group for the layout's world (world k
        of the job, when it differs from the one the process is in)."""
        if self.world is None or dist.get_world_size() != layout.world:
            vps.dtensor.init_world(self.job.store, k, self.slot, layout.world, timeout=self.args.timeout)
            self.world = k

    def builder(self, k):
        """The build function of switch k: the world (when it changes), then
        the new configuration's model on the meta device, and its optimizer
        (what the job trains on once the switch is made)."""
        def build(layout):
            self.world_of(k, layout)
            self.built = make(layout, materialize=False)
            model, optimizer = self.built.model, self.built.optimizer
            return model, optimizer
        return build

    def prepare(self, k):
        """Switch k made ready while the job trains, where it keeps the
        job's world (a growth makes its world in build, in the pause)."""
        if not self.switching or k >= self.args.configs or k * self.args.every >= self.args.steps or \
                self.layouts[k].world != self.layouts[k - 1].world or self.args.no_prepare:
            return
        job, new_layout, rank, build = self.vjob, self.layouts[k], self.slot, self.builder(k)
        # vps: the next configuration, made ready while the job trains
        job.prepare(new_layout, rank, build)

    def first(self):
        """The first configuration's job, initialized from the seed."""
        lay = self.layouts[0]
        self.world_of(0, lay)
        self.b = make(lay, materialize=True)
        if self.switching:
            registry, rank, layout, model, optimizer = self.registry, self.slot, lay, self.b.model, self.b.optimizer
            # vps: the registry vps-exec finds this rank's buffers through
            reg = vps.Registry(registry % rank, layout, rank)
            self.reg = reg
            # vps: every local shard and Adam's moments become views of vps's buffers
            job = vps.dtensor.Job(reg, layout, rank, model, optimizer)
            self.vjob = job
        return 0, 0

    def join(self, k):
        """A process that joins at switch k: its state, and where training is."""
        if self.job.wait_asked(k) is None:
            raise RuntimeError("process %d: the job ended before switch %d" % (self.slot, k))
        self.reg = vps.Registry(self.registry % self.slot, None, -1)
        # vps: a process that joins receives its state, and its model is built around it
        self.vjob, carried = vps.dtensor.Job.join(self.reg, self.layouts[k], self.slot, self.builder(k),
                                                  timeout=self.args.timeout)
        self.b = self.built
        set_lr(self.b.optimizer, carried.step)
        self.gather_after(k, None, 0.0, False)
        self.prepare(k + 1)
        return carried.step, carried.consumed_samples

    def switch(self, k, step, consumed):
        lay = self.layouts[k]
        # vps.elastic: rank 0 asks for switch k; the agent makes sure its executors run (for a growth, it
        # starts them and the processes that join) and says it is ready
        if self.slot == 0:
            self.job.ask(k, {"config": CONFIGS[k], "world": lay.world, "from_config": CONFIGS[k - 1],
                             "from_world": self.layouts[k - 1].world, "at": step, "requests": 0})
        while not self.job.ready(k):
            time.sleep(vps.elastic.POLL)
        before = gather(self.b)
        t0 = time.monotonic()
        job, new_layout, rank, build = self.vjob, lay, self.slot, self.builder(k)
        prepared = job.prepared is not None
        # vps: between two steps the state moves to the new layout; the model is prepare's, or build's
        model, optimizer, carried = job.switch(new_layout, rank, vps.Training(
            step=step, consumed_samples=consumed, global_batch=GLOBAL_BATCH), build)
        set_lr(optimizer, carried.step)
        pause = time.monotonic() - t0
        self.b = self.built
        if model is not self.b.model or optimizer is not self.b.optimizer:
            raise RuntimeError("switch %d returned another model and optimizer than build made" % k)
        if (carried.step, carried.consumed_samples) != (step, consumed):
            raise RuntimeError("the switch carried step %d, samples %d; the job was at %d, %d" % (
                carried.step, carried.consumed_samples, step, consumed))
        self.gather_after(k, before, pause, prepared)
        self.prepare(k + 1)

    def gather_after(self, k, before, pause, prepared):
        after = gather(self.b)
        if self.slot != 0:
            return
        bad = differs(before, after)
        if bad:
            raise RuntimeError("switch %d (%s -> %s): the state after is not the state before: %s" % (
                k, CONFIGS[k - 1], CONFIGS[k], bad))
        self.switches.append((k, CONFIGS[k - 1], CONFIGS[k], len(after[0]),
                              sum(t.numel() for t in after[0].values() if torch.is_tensor(t)), pause, prepared))

    def main(self, join_at=None):
        args = self.args
        try:
            step, consumed = self.join(join_at) if join_at else self.first()
            if not join_at:
                self.prepare(1)
            set_lr(self.b.optimizer, step)
            k = 1 + sum(1 for c in range(1, len(CONFIGS)) if c * args.every <= step)
            while step < args.steps:
                if self.switching and step == k * args.every and k < args.configs:
                    self.switch(k, step, consumed)
                    k += 1
                loss = train_step(self.b, self.corpus, consumed)
                step += 1
                consumed += GLOBAL_BATCH
                set_lr(self.b.optimizer, step)
                self.losses.append(loss)
            if self.slot == 0:
                self.job.finish()
        finally:
            if self.vjob:
                self.vjob.close()
            if self.reg:
                self.reg.close()
        return self.losses, self.switches


def refusals(registry, tmp):
    """What a Job refuses, on one rank: a layout that is not the model's, a
    Megatron layout, an optimizer other than Adam, a training step that is
    not the optimizer's, a switch neither prepared nor given build, a
    prepare for another world. Returns the messages, in order."""
    store = dist.FileStore(os.path.join(tmp, "refusals.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    lay = vps.layout(MODEL, "dp_shard=1", 1)
    b = make(lay, materialize=True)
    out = []
    reg = vps.Registry(registry.replace("%d", "refusals"), None, -1)
    try:
        for what, other, opt in (("dp_shard=2", vps.layout(MODEL, "dp_shard=2", 2), b.optimizer),
                                 ("dp=1", vps.layout(MODEL, "dp=1", 1), b.optimizer),
                                 ("SGD", lay, torch.optim.SGD(b.model.parameters(), lr=0.1))):
            try:
                vps.dtensor.Job(reg, other, 0, b.model, opt)
                out.append("%s: accepted" % what)
            except vps.Error as e:
                out.append("%s: %s: %s" % (what, e.name, e))
        job = vps.dtensor.Job(reg, lay, 0, b.model, b.optimizer)
        for what, call in (("step 5", lambda: job.switch(lay, 0, vps.Training(step=5), None)),
                           ("unprepared", lambda: job.switch(lay, 0, vps.Training(step=0))),
                           ("prepare dp_shard=2", lambda: job.prepare(vps.layout(MODEL, "dp_shard=2", 2), 0, None))):
            try:
                call()
                out.append("%s: accepted" % what)
            except vps.Error as e:
                out.append("%s: %s: %s" % (what, e.name, e))
        job.close()
    finally:
        reg.close()
        dist.destroy_process_group()
    return out


REFUSALS = [
    # the layout of another configuration: its local shards are not the model's
    ("dp_shard=2", "VPS_ECHECK", "rank 0 tok_embeddings.weight: a local shard of [256, 64], the layout's [128, 64]"),
    ("dp=1", "VPS_EINPUT", "tp=1,pp=1,dp=1,ep=1,etp=1,vpp=1,zero=0 is a Megatron layout"),
    ("SGD", "VPS_EUNSUPPORTED", "SGD: vps.dtensor moves the state of torch's Adam and AdamW"),
    ("step 5", "VPS_EINPUT", "training.step is 5, the optimizer has taken 0 steps"),
    # a switch not prepared needs build
    ("unprepared", "VPS_EINPUT", "rank 0 of dp_shard=1 was not prepared (Job.prepare), and no build was given"),
    # a switch that changes the world makes it in the pause
    ("prepare dp_shard=2", "VPS_EINPUT", "dp_shard=2 is a world of 2 processes, the job's 1: a switch that "
     "changes the world is not prepared"),
]


# ---- the launcher: forked processes, executors, the agent ----
def fork(tmp, slot, fn):
    """fn() in a forked process, its output to tmp/process.SLOT.log; its
    result (or a RankError) pickled to tmp/SLOT.pickle."""
    # the objects made so far kept out of every collection: a process's
    # collections would otherwise write to each object torch and torchtitan
    # made here, copying its pages (about 75 MiB a rank that trains on)
    gc.freeze()
    pid = os.fork()
    if pid:
        return pid

    def logged():
        # PyTorch's warnings and gloo's notes to the process's log, shown when it fails
        log = os.open(os.path.join(tmp, "process.%d.log" % slot), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        torch.set_num_threads(1)
        return fn()
    ranks.child(tmp, slot, logged)


def results(tmp, slots):
    out = []
    for s in slots:
        res = ranks.result(tmp, s)
        if res is None:
            log = os.path.join(tmp, "process.%d.log" % s)
            res = RankError(s, "exited without a result", open(log).read()[-2000:] if os.path.exists(log) else "")
        out.append(res)
    return out


def failure(e):
    """A process's failure as the messages name it: by its slot."""
    return "process %d: %s" % (e.rank, e.what)


def plans(tmp):
    """The staged plans of the switches in order."""
    paths = []
    for i, c in enumerate(CONFIGS):
        paths.append(os.path.join(tmp, "c%d.layout" % i))
        run([tool("vps-layout"), "-q", "--model", MODEL, "--parallel", c, "--gpus-per-node", str(GPUS_PER_NODE),
             "-o", paths[-1]])
    staged = []
    for i in range(len(CONFIGS) - 1):
        plan, st = os.path.join(tmp, "c%d.plan" % i), os.path.join(tmp, "c%d.staged" % i)
        run([tool("vps-plan"), "-q", paths[i], paths[i + 1], "--global-batch", str(GLOBAL_BATCH), "-o", plan])
        run([tool("vps-stage"), "-q", "--budget", "16MiB", plan, "-o", st])
        staged.append(st)
    return staged


def log_tail(tmp, n):
    return open(os.path.join(tmp, "exec.%d.log" % n)).read()[-2000:]


def segments(ks):
    """The switches ks in the executors' order: a list of (world, [k...]),
    each served by one vps-exec per process of its world, started when its
    first switch is asked: the switches in one world together (--serve), a
    growth alone, in the world it grows to."""
    out = []
    for k in ks:
        a, b = (vps.layout(MODEL, CONFIGS[i], GPUS_PER_NODE).world for i in (k - 1, k))
        if a == b and out and out[-1][0] == b and not out[-1][2]:
            out[-1][1].append(k)
        else:
            out.append((b, [k], a != b))
    return [(w, k) for w, k, _ in out]


def run_job(args, tmp, registry, switching):
    """The switching run (with vps, its executors and the growth) or the
    static run: rank 0's (losses, switches), and the executors' logs read."""
    agent = vps.elastic.Agent(timeout=args.timeout)
    world = vps.layout(MODEL, CONFIGS[0], GPUS_PER_NODE).world
    pids = {}
    for s in range(world):
        pids[fork(tmp, s, lambda s=s: Rank(s, args, agent.host, agent.port, registry, switching).main())] = s
    ks = [k for k in range(1, args.configs) if k * args.every < args.steps] if switching else []
    segs = {ks_[0]: (w, ks_) for w, ks_ in segments(ks)}
    env = dict(os.environ, VPS_TOKEN=run([tool("vps-exec"), "--new-token"]).strip())
    staged = plans(tmp) if switching else []
    procs = []
    deadline = time.monotonic() + args.timeout
    failed = None
    try:
        while pids and not failed:
            done = [(pid, st) for pid, st in (os.waitpid(p, os.WNOHANG) for p in list(pids)) if pid]
            for pid, st in done:
                s = pids.pop(pid)
                if st and failed is None:
                    failed = "process %d exited with status %d" % (s, st)
            for n, p in enumerate(procs):
                if p.poll():
                    failed = "vps-exec %d exited with status %d:\n%s" % (n, p.returncode, log_tail(tmp, n))
            for ask in agent.asks():
                k = ask["switch"]
                if k in segs:
                    # vps.elastic: the executors of the switches before have ended; those of this one (and of
                    # the switches after it in its world) start, and for a growth the processes that join
                    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    w, served = segs[k]
                    procs += start_executors(tmp, [staged[j - 1] for j in served], w, registry, env, len(procs))
                    for s in range(world, w):
                        pids[fork(tmp, s, lambda s=s, k=k: Rank(s, args, agent.host, agent.port, registry,
                                                                True).main(k))] = s
                    world = max(world, w)
                agent.ready(k)
            if time.monotonic() > deadline:
                failed = "processes %s still running after %d s" % (sorted(pids.values()), args.timeout)
            time.sleep(0.02)
        if not failed:
            end = time.monotonic() + 60
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.05)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        stop(procs)
    res = results(tmp, range(world))
    errors = [r for r in res if isinstance(r, RankError)]
    if errors:
        for e in errors:
            if e.trace:
                print(e.trace, file=sys.stderr)
        raise RuntimeError(failure(errors[0]))
    if failed:
        raise RuntimeError(failed)
    for n, p in enumerate(procs):
        if p.returncode:
            raise RuntimeError("vps-exec %d exited with %d:\n%s" % (n, p.returncode, log_tail(tmp, n)))
    digests = sum(open(os.path.join(tmp, "exec.%d.log" % n)).read().count("digest: match") for n in range(len(procs)))
    expected = sum(w * len(served) for w, served in segs.values())
    if switching and digests != expected:
        raise RuntimeError("%d switches, %d digests matched of %d" % (len(res[0][1]), digests, expected))
    return res[0]


def main():
    args = ARGS
    titan.install_training_shims()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # stopped, it still removes what its processes left in /dev/shm
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("check_switch.py: stopped (SIGTERM)"))
    registry = "vps-titan-%d-%%d" % os.getpid()
    with workspace(args.keep, "vps-torch-switch-", registry, GPUS_PER_NODE) as tmp:
        check(args, tmp, registry)


def check(args, tmp, registry):
    t0 = time.monotonic()
    pid = fork(tmp, 99, lambda: refusals(registry, tmp))
    os.waitpid(pid, 0)
    (said,) = results(tmp, [99])
    if isinstance(said, RankError):
        print(said.trace, file=sys.stderr)
        sys.exit("check_switch.py: refusals: %s" % failure(said))
    check_refusals(said, REFUSALS, args.verbose)
    try:
        losses, switches = run_job(args, tmp, registry, True)
        static, _ = run_job(args, tmp, registry, False)
    except RuntimeError as e:
        sys.exit("check_switch.py: %s" % e)
    for k, src, dst, n, elems, pause, prepared in switches:
        if args.verbose:
            print("switch %d at step %d: %s -> %s: %d tensors, %d elements, equal bit for bit through DCP (%.0f ms "
                  "paused, %s)" % (k, k * args.every, src, dst, n, elems, pause * 1e3,
                                   "prepared" if prepared else "built in the pause"))
    want = sum(1 for k in range(1, args.configs) if k * args.every < args.steps)
    if len(switches) != want:
        sys.exit("check_switch.py: %d switches of %d" % (len(switches), want))
    first = switches[0][0] * args.every if switches else args.steps
    worst, worst_at = 0.0, 0
    if len(losses) != len(static):
        sys.exit("check_switch.py: %d steps, the static run %d" % (len(losses), len(static)))
    for i, (x, y) in enumerate(zip(losses, static)):
        step = i + 1
        if step <= first and x != y:
            sys.exit("check_switch.py: step %d, before any switch: loss %.9g, the static run's %.9g" % (step, x, y))
        rel = abs(x - y) / abs(y)
        if rel > worst:
            worst, worst_at = rel, step
        if not rel <= MAX_REL:  # a NaN loss too
            sys.exit("check_switch.py: step %d: loss %.9g, the static run's %.9g (%.2g relative, bound %g)"
                     % (step, x, y, rel, MAX_REL))
        if args.verbose:
            print("step %d: loss %.9f, static %.9f" % (step, x, y))
    if args.verbose:
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        print("the processes' CPU time: %.0f s" % (use.ru_utime + use.ru_stime))
    pauses = []
    for what, kind in (("prepared", True), ("built in the pause", False)):
        ps = [s[5] for s in switches if s[6] == kind]
        if ps:
            pauses.append("%d %s %.0f-%.0f ms" % (len(ps), what, min(ps) * 1e3, max(ps) * 1e3))
    print("torchtitan %s on %s ranks: %d switch%s through vps-exec (%s), the whole state through DCP equal bit "
          "for bit across each; loss within %g of the static run's at every step (largest %.1e, step %d); "
          "rank 0's pauses: %s (%.0f s)"
          % (MODEL_NAME, " -> ".join(sorted({str(vps.layout(MODEL, c, GPUS_PER_NODE).world)
                                             for c in CONFIGS[:len(switches) + 1]}, key=int)),
             len(switches), "" if len(switches) == 1 else "es", " -> ".join(CONFIGS[:len(switches) + 1]), MAX_REL,
             worst, worst_at, ", ".join(pauses) or "none", time.monotonic() - t0))


if __name__ == "__main__":
    main()
