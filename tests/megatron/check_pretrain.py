"""megatron.training.pretrain() switched by vps (make check-megatron).

Megatron-LM's own training loop (the megatron-core wheel's
megatron.training: pretrain, train, train_step, evaluate, save_checkpoint,
load_checkpoint) runs pretrain_gpt.py's job on the CPU, 4 forked ranks over
gloo, on Megatron's mock GPT data, with the shims of mcore.py
(install_pretrain_shims). For each job, a GPT (micro-gpt's shape: learned
positions, LayerNorm, biases, tied embeddings) and a MoE (RMSNorm, SwiGLU,
RoPE, GQA, 4 experts under EP), three runs (the GPT job again with
--vps-build-in-pause, tp=2 -> dp=4 -> tp=2, the first alone; and once
more, gpt-dead-exec, with rank 1's vps-exec made ahead of the first switch
killed after iteration 2: every rank's pretrain() must end at the switch
with vps.PeerFailed, well before --vps-timeout, the killed one's naming
its vps-exec and SIGKILL's status, no vps-exec left; and gpt-exec-fails,
a switch asked for whose rank 1 vps-exec, started in the pause, exits
before it opens the registry: rank 1's pretrain() must end at once with
vps.PeerFailed naming its status and log, the others by --vps-timeout):

1. the switched run: vps.megatron_training.pretrain with --vps-switch-to
   B,A --vps-switch-every 3 goes A -> B after iteration 3 and B -> A after
   6 (9 iterations), each rank's vps-exec started by the job itself. Around
   each switch every rank's whole state is gathered in Megatron's model
   space (check_switch.gather: the model's sharded state dict, the
   DistributedOptimizer's main parameters and moments, Adam's step) and
   must be equal bit for bit; after it the job's arguments, microbatch
   calculator and process groups must be the new configuration's. Megatron
   saves a checkpoint (torch_dist, its default dp_reshardable optimizer
   format) after iteration 5, in B, and its arguments must be B's.
2. the static run: Megatron's own pretrain() in A, the same data. The
   switched run's loss must equal it bit for bit up to the first switch
   and stay within 1e-3 (relative, scripts/convergence.sh's bound) after.
3. the restart: Megatron's own pretrain() in B, --load the checkpoint
   (load_checkpoint) and train iteration 6. The state it loaded must equal
   the switched run's after iteration 5 bit for bit, and its loss at
   iteration 6 the switched run's bit for bit: Megatron's own checkpoint
   found the switched job's objects whole.

Each switch's pause is broken down (pause_parts) from the Job's clocks,
vps.megatron_training's and the executors' reports; each job's line ends
with `pause at most R x the transfer`, R the largest over its switches of
the pause over the slowest rank's vps-exec pause, and the GPT job's
switches (a fixed schedule) must have been made ready before the pause,
nothing built in it and the data iterators made ahead (the samples
foreseen: its switch after iteration 6 follows an evaluation after 4),
the MoE job's (asked for) not.

    check_pretrain.py [-v] [-k gpt|gpt-in-pause|gpt-dead-exec|gpt-exec-fails|moe] [--keep DIR] [--pauses FILE]

Prints a line per job (and per switch and step with -v); exit 1 naming
what differs, 2 on bad arguments. --pauses FILE writes each switch's
pause, broken down, as JSON (scripts/bench/megatron_pause.sh
tabulates it)."""
import argparse
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)



def imports():
    """torch, megatron-core and vps, once, before the ranks fork; not at the
    top: Megatron's checkpoint writer starts a process by spawn, which
    imports this file again (a process per rank, each as big as a rank)."""
    global mcore, torch, dist, check_switch, vps, ShardedObject, ShardedTensor, apply_factories
    import mcore
    import torch
    import torch.distributed as dist
    import check_switch  # its gather of the whole state
    import vps
    import vps.megatron
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories


WORLD = 4
ITERS, EVERY, SAVE_AT = 9, 3, 5
MAX_REL = 1e-3
COMMON = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 64 "
          "--micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine "
          "--lr-warmup-iters 2 --weight-decay 0.01 --adam-beta2 0.95 --clip-grad 1.0 --bf16 "
          "--use-distributed-optimizer --distributed-backend gloo --disable-gloo-process-groups --mock-data "
          "--tokenizer-type NullTokenizer --vocab-size 256 --hidden-dropout 0 --attention-dropout 0 "
          "--no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion "
          "--no-bias-dropout-fusion --no-persist-layer-norm --log-interval 2 --eval-interval 4 --eval-iters 1 "
          "--transformer-impl transformer_engine --seed 1234 --num-workers 0").split()
# NullTokenizer's vocabulary is --vocab-size (its last token the end of document): 256, which TP 1 and 2 pad
# alike, to nothing, so that no padding row, which a switch does not move, takes part in the loss
GPT = "--ffn-hidden-size 256 --position-embedding-type learned_absolute".split()
JOBS = {
    "gpt": dict(args=GPT, a="tp=2", b="pp=2,vpp=2", ask="schedule"),
    # the same job, its next configurations built in the pause: the switched run alone
    "gpt-in-pause": dict(args=GPT + ["--vps-build-in-pause"], a="tp=2", b="dp=4", ask="schedule",
                         switched_only=True),
    # the same job, rank 1's vps-exec made ahead killed before the first switch: every rank's pretrain() must end
    # at the switch, naming its own, not wait --vps-timeout
    "gpt-dead-exec": dict(args=GPT, a="tp=2", b="dp=4", ask="schedule", kill_ahead_exec_of=1),
    # a switch asked for, whose rank 1 vps-exec, started in the pause, exits before it opens the registry: rank 1's
    # pretrain() must end at once, naming it, not wait --vps-timeout (the others' executors wait for it that long)
    "gpt-exec-fails": dict(args=GPT, a="tp=2", b="dp=4", ask="control", exec_fails_on=1),
    "moe": dict(args=("--ffn-hidden-size 128 --normalization RMSNorm --swiglu --position-embedding-type rope "
                      "--no-rope-fusion --untie-embeddings-and-output-weights --disable-bias-linear "
                      "--group-query-attention --num-query-groups 2 --num-experts 4 --moe-ffn-hidden-size 128 "
                      "--moe-router-topk 2").split(),
                a="ep=2", b="ep=4", ask="control"),
}
FLAGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size", "vpp": "--num-virtual-stages-per-pipeline-rank",
         "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size"}


def megatron_flags(spec):
    out = []
    for item in spec.split(","):
        k, _, v = item.partition("=")
        out += [FLAGS[k], v]
    return out


def shards(model, optimizer):
    """check_switch.shards for any model: a ShardedTensor of the model's
    sharded state dict may hold a part of a parameter (the SwiGLU linear_fc1's
    gate and up halves, made by Megatron's swiglu factory as views of it), so
    each parameter's optimizer piece is cut along the parts it overlaps."""
    model_sd = {"model%d" % i: chunk.module.sharded_state_dict() for i, chunk in enumerate(model)}
    apply_factories(model_sd)
    out, parts = [], {}
    stack = [model_sd]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, ShardedTensor):
            if v.flattened_range is not None or not v.data.is_contiguous():
                raise RuntimeError("%s: a flattened or strided ShardedTensor of the model" % v.key)
            local = (1,) * v.prepend_axis_num + tuple(v.local_shape)
            out.append((v.key, tuple(v.global_shape), tuple(v.global_offset), local, None,
                        v.data.detach().to("cpu", copy=True)))
            base = v.data if v.data._base is None else v.data._base
            at = (v.data.data_ptr() - base.data_ptr()) // v.data.element_size()
            parts.setdefault(base, []).append((v.key, tuple(v.global_shape), tuple(v.global_offset), local, at,
                                               v.data.numel()))
        elif isinstance(v, ShardedObject) and not (v.key.endswith("._extra_state") and v.data is None):
            raise RuntimeError("%s: a ShardedObject, which this check does not compare" % v.key)
    steps = set()
    for o in vps.megatron.distributed_optimizers(optimizer):
        steps.update(g["step"] for g in o.state_dict()["optimizer"]["param_groups"])
        for ranges in o.gbuf_ranges:
            for buckets in ranges.values():
                for rm in buckets:
                    for p in rm["param_map"]:
                        r = o._get_model_param_range_map(p)["param"]
                        st = o._get_main_param_and_optimizer_states(p)
                        for key, gshape, goff, local, at, n in parts[p]:
                            lo, hi = max(r.start, at), min(r.end, at + n)
                            if lo >= hi:
                                continue
                            for name, t in (("fp32_param", st["param"]), ("exp_avg", st["exp_avg"]),
                                            ("exp_avg_sq", st["exp_avg_sq"])):
                                piece = t.detach().view(-1)[lo - r.start:hi - r.start]
                                out.append(("optimizer.state.%s.%s" % (name, key), gshape, goff, local,
                                            (lo - at, hi - at), piece.to("cpu", copy=True)))
    return out, steps


def gather(model, optimizer):
    return check_switch.gather(model, optimizer, shards)


class Observer:
    """The switched run's eyes, on every rank: the whole state around each
    switch and after SAVE_AT, and the job's arguments after each switch."""

    def __init__(self, control=None, asks=()):
        self.switches, self.saved, self.clocks, self.data_sets = [], None, [], []
        self.control, self.asks = control, dict(asks)

    def before_switch(self, sw, model, optimizer):
        self.before = gather(model, optimizer)

    def after_switch(self, sw, model, optimizer):
        from megatron.core import parallel_state as ps
        from megatron.core.num_microbatches_calculator import get_num_microbatches
        from megatron.training import get_args
        after = gather(model, optimizer)
        args, par = get_args(), sw.target_layout.parallel
        have = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size,
                args.expert_model_parallel_size, ps.get_tensor_model_parallel_world_size(),
                ps.get_pipeline_model_parallel_world_size(), ps.get_data_parallel_world_size(),
                ps.get_expert_model_parallel_world_size(), get_num_microbatches())
        want = (par["tp"], par["pp"], par["dp"], par["ep"], par["tp"], par["pp"], par["dp"], par["ep"],
                args.global_batch_size // (args.micro_batch_size * par["dp"]))
        if have != want:
            raise RuntimeError("after switch %d: the job's arguments, groups and microbatches are %s; %s wants %s"
                               % (sw.k, have, sw.target, want))
        self.clocks.append((sw.clocks, sw.report))
        self.data_sets.append(sw.data_sets)
        if dist.get_rank() == 0:
            bad = check_switch.differs(self.before, after)
            if bad and os.environ.get("DUMP"):
                torch.save((self.before, after), os.environ["DUMP"])
            if bad:
                raise RuntimeError("switch %d (%s -> %s) after iteration %d: the state after is not the state "
                                   "before: %s" % (sw.k, sw.source, sw.target, sw.iteration, bad))
            self.switches.append((sw.k, sw.iteration, sw.source, sw.target, len(after[0]),
                                  sum(t.numel() for t in after[0].values()), sw.pause, sw.ready))
        self.before = None

    def after_iteration(self, iteration, model, optimizer):
        if iteration == SAVE_AT:
            self.saved = gather(model, optimizer)
        if self.control and dist.get_rank() == 0 and iteration in self.asks:
            # the scheduler: lines appended to the control file, and SIGUSR1 to rank 0, as to launch.py
            with open(self.control, "a") as f:
                f.write(self.asks[iteration])
            os.kill(os.getpid(), signal.SIGUSR1)


def run_job(rank, log, argv, observer=None, switchable=True, gather_at_start=False):
    """One rank of a job: pretrain_gpt.main(argv), its output to log % rank;
    returns its losses, the observer's findings and (gather_at_start) the
    state train() began with."""
    fd = os.open(log % rank, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # what torchrun tells each rank, which Megatron's arguments read
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                      CUDA_DEVICE_MAX_CONNECTIONS="1")
    import pretrain_gpt
    from megatron.training import training as T
    import vps.megatron_training as mt
    if switchable:
        mt.pretrain = functools.partial(mt.pretrain, observer=observer)
    else:
        # the reference runs are Megatron's own pretrain(), vps nowhere
        mt.pretrain = T.pretrain
    started = []
    if gather_at_start:
        train = T.train

        def gathering(forward_step_func, model, optimizer, *a, **kw):
            started.append(gather(model, optimizer))
            return train(forward_step_func, model, optimizer, *a, **kw)
        T.train = gathering
    pretrain_gpt.main(argv)
    out = {"losses": pretrain_gpt.LOSSES}
    if observer:
        out.update(switches=observer.switches, saved=observer.saved, clocks=observer.clocks,
                   data_sets=observer.data_sets,
                   groups=dict(vps.megatron.cached_configurations.counts))
    if started:
        out["started"] = started[0]
    return out


def per_iteration(results):
    """{iteration: loss} from every rank's micro-batch losses (TP rank 0 of
    the last stage records them): the sum of the token losses over the
    tokens, in one order."""
    parts = {}
    for r in results:
        for it, loss, tokens in r["losses"]:
            parts.setdefault(it, []).append((loss, tokens))
    return {it: sum(sorted(x[0] for x in p)) / sum(x[1] for x in p) for it, p in parts.items()}


def ranks(args, d, tag, what, *job, **kw):
    """The job on WORLD forked ranks, each one's output in d/tag.R.log."""
    log = os.path.join(d, tag + ".%d.log")
    try:
        results = mcore.run_ranks(WORLD, lambda r: run_job(r, log, *job, **kw), timeout=args.timeout)
    except RuntimeError as e:
        results = [mcore.RankError(-1, str(e), "")]
    bad = [r for r in results if isinstance(r, mcore.RankError)]
    if bad:
        for r in range(WORLD):
            if os.path.exists(log % r):
                print("== %s\n%s" % (log % r, open(log % r).read()[-3000:]), file=sys.stderr)
        print(bad[0].trace, file=sys.stderr)
        sys.exit("check_pretrain.py: %s: %s" % (what, bad[0]))
    return results


def children_named(name):
    """This process's children whose command is `name`."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == me and comm == name:
            out.append(int(pid))
    return out


class Killer:
    """Kills rank `rank`'s vps-exec, made ahead of the first switch, after
    iteration `at`."""

    def __init__(self, rank, at):
        self.rank, self.at, self.killed = rank, at, []

    def after_iteration(self, iteration, model, optimizer):
        if iteration == self.at and dist.get_rank() == self.rank:
            for pid in children_named("vps-exec"):
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)
            if not self.killed:
                raise RuntimeError("rank %d has no vps-exec after iteration %d" % (self.rank, iteration))


def run_failing(name, job, args, d, registry, extra, callback, before=None):
    """Runs job's configuration A with the flags extra, every rank expected
    to end in a vps.Error: for each rank (the error's class, its text, the
    vps-exec processes left, when it ended), or None where pretrain()
    returned. callback(r) is rank r's pretrain() callback; before(r), if
    given, runs first in rank r's process."""
    argv = COMMON + job["args"] + megatron_flags(job["a"]) + [
        "--train-iters", str(ITERS), "--vps-dir", os.path.join(d, "vps"), "--vps-registry", registry] + extra
    log = os.path.join(d, "switched.%d.log")

    def rank(r):
        if before:
            before(r)
        try:
            run_job(r, log, argv, callback(r))
        except vps.Error as e:
            return type(e).__name__, str(e), children_named("vps-exec"), time.monotonic()
        return None
    results = mcore.run_ranks(WORLD, rank, timeout=args.timeout)
    if args.verbose:
        for r, got in enumerate(results):
            print("%s: rank %d: %s" % (name, r, "vps.%s: %s" % got[:2] if got else "pretrain() returned"))
    return results


def check_dead_exec(name, job, args, d, registry):
    """A vps-exec made ahead that dies before its switch: the switch fails
    on every rank (vps.PeerFailed) well before --vps-timeout, the killed
    one's naming its vps-exec and the signal it died of, and leaves no
    vps-exec behind."""
    t0 = time.monotonic()
    timeout = 120
    killed = job["kill_ahead_exec_of"]
    results = run_failing(name, job, args, d, registry, [
        "--vps-switch-to", job["b"].replace(",", ":"), "--vps-switch-every", str(EVERY),
        "--vps-timeout", str(timeout)], lambda r: Killer(killed, EVERY - 1))
    took = time.monotonic() - t0
    for r, got in enumerate(results):
        # the others' executors, seeing their peer gone, exit before the switch, or fail it when it comes
        want = "switch 1: vps-exec rank %d, started ahead, exited with status -9 before the switch" % r \
            if r == killed else ""
        if got is None or got[0] != "PeerFailed" or want not in got[1] or got[2]:
            sys.exit("check_pretrain.py: %s: rank %d: %s; expected vps.PeerFailed \"%s\" and no vps-exec left"
                     % (name, r, got or "pretrain() returned", want))
    if took >= timeout:
        sys.exit("check_pretrain.py: %s: the switch failed after %.0f s, --vps-timeout's %d s" % (name, took, timeout))
    print("%s on %d ranks, Megatron-LM's pretrain(): rank %d's vps-exec made ahead killed before switch 1: every "
          "rank's pretrain() ended at the switch with vps.PeerFailed, none left (%.0f s)"
          % (name, WORLD, killed, took))
    return []


def check_exec_fails(name, job, args, d, registry):
    """A vps-exec started in the pause (a switch asked for) that exits
    before it opens the registry: its rank's switch fails at once with
    vps.PeerFailed naming its status and log, where nothing else tells it
    from one still starting; the other ranks, whose executors wait for it
    at the rendezvous, end by --vps-timeout (under torchrun the failed rank
    ends them); none leaves a vps-exec."""
    timeout = 12
    failing = job["exec_fails_on"]
    bin_dir = os.path.join(d, "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "vps-exec"), "w") as f:
        f.write("#!/bin/sh\n# a vps-exec that fails as it starts (check_pretrain.py %s)\n"
                "echo 'vps-exec: failing at start for the test' >&2\nexit 3\n" % name)
    os.chmod(os.path.join(bin_dir, "vps-exec"), 0o755)
    control = os.path.join(d, "control")
    open(control, "w").close()

    def before(r):
        if r == failing:
            # the job's tools are looked for in VPS_BIN first, then in the checkout's bin/
            os.environ["VPS_BIN"] = bin_dir
    results = run_failing(name, job, args, d, registry,
                          ["--vps-control", control, "--vps-timeout", str(timeout)],
                          lambda r: Observer(control, {EVERY: "%s\n" % job["b"]}), before)
    for r, got in enumerate(results):
        want = "switch 1: vps-exec rank %d exited with status 3 (" % r if r == failing else ""
        if got is None or got[0] not in ("PeerFailed", "Timeout") or want not in got[1] or got[2] or \
                (r == failing and (got[0] != "PeerFailed" or "none holds the registry" not in got[1])):
            sys.exit("check_pretrain.py: %s: rank %d: %s; expected vps.PeerFailed%s and no vps-exec left"
                     % (name, r, got or "pretrain() returned", " \"%s\"" % want if want else " or vps.Timeout"))
    ahead = min(got[3] for r, got in enumerate(results) if r != failing) - results[failing][3]
    if ahead < timeout / 2:
        sys.exit("check_pretrain.py: %s: rank %d's switch failed %.1f s before the others', which waited "
                 "--vps-timeout's %d s: it waited too" % (name, failing, ahead, timeout))
    print("%s on %d ranks, Megatron-LM's pretrain(): rank %d's vps-exec, started in the pause of an asked switch, "
          "exited before it opened the registry: its pretrain() ended at once (%.0f s before the others, which "
          "waited --vps-timeout for it), none left" % (name, WORLD, failing, ahead))
    return []


def check(name, job, args, tmp, registry):
    t0 = time.monotonic()
    d = os.path.join(tmp, name)
    if "kill_ahead_exec_of" in job:
        os.makedirs(d, exist_ok=True)
        return check_dead_exec(name, job, args, d, registry)
    if "exec_fails_on" in job:
        os.makedirs(d, exist_ok=True)
        return check_exec_fails(name, job, args, d, registry)
    ckpt = os.path.join(d, "ckpt")
    base = COMMON + job["args"]
    a, b = job["a"], job["b"]
    switched = base + megatron_flags(a) + [
        "--train-iters", str(ITERS), "--save", ckpt, "--save-interval", str(SAVE_AT),
        "--vps-dir", os.path.join(d, "vps"), "--vps-registry", registry]
    os.makedirs(d, exist_ok=True)
    if job["ask"] == "schedule":
        switched += ["--vps-switch-to", "%s,%s" % (b.replace(",", ":"), a.replace(",", ":")),
                     "--vps-switch-every", str(EVERY)]
        observer = Observer()
    else:
        # a line the job must refuse (TP 3 divides neither the world nor the heads), then B, then A
        control = os.path.join(d, "control")
        open(control, "w").close()
        switched += ["--vps-control", control]
        observer = Observer(control, {EVERY: "tp=3  # refused\n%s\n" % b, 2 * EVERY: "%s\n" % a})
    res = ranks(args, d, "switched", "%s: the switched run" % name, switched, observer)
    if job["ask"] == "control":
        said = [line for line in open(os.path.join(d, "switched.0.log")) if line.startswith("vps: tp=3:")]
        if not said or "(ignored)" not in said[0]:
            sys.exit("check_pretrain.py: %s: the job did not refuse tp=3 from its control file: %s" % (name, said))
        if args.verbose:
            print("%s: %s" % (name, said[0].strip()))
    switches = res[0]["switches"]
    if len(switches) != 2:
        sys.exit("check_pretrain.py: %s: %d switches; %s -> %s -> %s makes 2" % (name, len(switches), a, b, a))
    # the groups initialize_megatron made for A are cached (adopted), and the switch back to A installs them
    groups = [dict(r["groups"]) for r in res]
    if any((g.get("adopted"), g.get("made"), g.get("reused")) != (1, 1, 1) for g in groups):
        sys.exit("check_pretrain.py: %s: process groups adopted, made, reused on each rank: %s; %s -> %s -> %s "
                 "adopts A's, makes B's and reuses A's" % (name, groups, a, b, a))
    # Megatron's builder makes A's data sets as training starts; the iterators of the switch back to A are of them
    back = [r["data_sets"][1] for r in res]
    if any(d.get("made", 0) for d in back) or not sum(d.get("reused", 0) for d in back):
        sys.exit("check_pretrain.py: %s: switch 2 (%s -> %s): data sets made, reused on each rank: %s; the data "
                 "sets of A, made as training started, serve again" % (name, b, a, back))
    if args.verbose:
        for k in range(len(switches)):
            print("%s: switch %d: data sets made, reused on each rank: %s" % (
                name, k + 1, " ".join("%d,%d" % (r["data_sets"][k].get("made", 0), r["data_sets"][k].get("reused", 0))
                                      for r in res)))
        for k, it, src, dst, n, elems, pause, ready in switches:
            print("%s: switch %d after iteration %d: %s -> %s: %d tensors, %d elements, equal bit for bit "
                  "(%.2f s%s)" % (name, k, it, src, dst, n, elems, pause, ", its vps-exec made ahead" if ready else ""))
    # a fixed schedule's switches are known ahead: their plans and executors are made while the job trains, and
    # their configurations too (nothing built in the pause) unless --vps-build-in-pause
    ahead = job["ask"] == "schedule"
    built_ahead = ahead and "--vps-build-in-pause" not in job["args"]
    pauses = [pause_parts([r["clocks"][k] for r in res]) for k in range(len(switches))]
    late = [sw[0] for sw, p in zip(switches, pauses) if sw[7] != ahead or (p["ahead"] is not None) != built_ahead
            or (p["build"] == 0) != built_ahead or (p["data_ahead"] is not None) != built_ahead]
    if late:
        p = pauses[late[0] - 1]
        sys.exit("check_pretrain.py: %s: switch %s: its vps-exec %s, its configuration %s and its data iterators %s "
                 "the pause, not as asked" % (name, ", ".join(map(str, late)),
                                              "before" if switches[late[0] - 1][7] else "in",
                                              "before" if p["ahead"] else "in",
                                              "before" if p["data_ahead"] is not None else "in"))
    if args.verbose:
        for sw, p in zip(switches, pauses):
            print("%s: switch %d: pause %s" % (name, sw[0], describe(p)))
    worst_pause = max(p["pause"] / p["transfer"] for p in pauses)
    # the data sets the switch's iterators are of, over the ranks: made, and taken from those made before
    made = [tuple(sum(r["data_sets"][k].get(x, 0) for r in res) for x in ("made", "reused"))
            for k in range(len(switches))]
    out = [dict(p, ready=sw[7], data_sets=m, **{"from": sw[2], "to": sw[3]})
           for sw, p, m in zip(switches, pauses, made)]
    if job.get("switched_only"):
        print("%s on %d ranks, Megatron-LM's pretrain() %s: %s -> %s -> %s through vps-exec, the whole state "
              "equal bit for bit across each switch (%.0f s); pause at most %.2f x the transfer"
              % (name, WORLD, " ".join(job["args"][len(GPT):]), a, b, a, time.monotonic() - t0, worst_pause))
        return out
    from megatron.core import dist_checkpointing
    saved = dist_checkpointing.load_common_state_dict(os.path.join(ckpt, "iter_%07d" % SAVE_AT))["args"]
    want = {k: int(v) for k, v in (i.split("=") for i in b.split(","))}
    want["dp"] = WORLD // (want.get("tp", 1) * want.get("pp", 1))
    have = {"tp": saved.tensor_model_parallel_size, "pp": saved.pipeline_model_parallel_size,
            "dp": saved.data_parallel_size, "ep": saved.expert_model_parallel_size}
    if any(have[k] != want.get(k, 1) for k in have):
        sys.exit("check_pretrain.py: %s: the checkpoint saved after iteration %d has the arguments of %s; it was "
                 "saved in %s" % (name, SAVE_AT, have, b))
    static = ranks(args, d, "static", "%s: the static run" % name,
                   base + megatron_flags(a) + ["--train-iters", str(ITERS)], switchable=False)
    # one iteration more, with the schedule of the run it resumes (the checkpoint's)
    restart = base + megatron_flags(b) + ["--train-iters", str(SAVE_AT + 1), "--load", ckpt,
                                          "--ckpt-step", str(SAVE_AT), "--use-checkpoint-opt-param-scheduler"]
    fresh = ranks(args, d, "restart", "%s: the restart in %s" % (name, b), restart, switchable=False,
                  gather_at_start=True)
    got, ref, again = per_iteration(res), per_iteration(static), per_iteration(fresh)
    if sorted(got) != list(range(1, ITERS + 1)) or sorted(ref) != sorted(got):
        sys.exit("check_pretrain.py: %s: losses of iterations %s, the static run's %s" % (name, sorted(got),
                                                                                       sorted(ref)))
    worst, worst_at = 0.0, 0
    for it in range(1, ITERS + 1):
        x, y = got[it], ref[it]
        if it <= EVERY and x != y:
            sys.exit("check_pretrain.py: %s: iteration %d, before any switch: loss %.9g, the static run's %.9g"
                     % (name, it, x, y))
        rel = abs(x - y) / abs(y)
        if rel > worst:
            worst, worst_at = rel, it
        if not rel <= MAX_REL:  # a NaN loss too
            sys.exit("check_pretrain.py: %s: iteration %d: loss %.9g, the static run's %.9g (%.2g relative, "
                     "bound %g)" % (name, it, x, y, rel, MAX_REL))
        if args.verbose:
            print("%s: iteration %d: loss %.9f, static %.9f" % (name, it, x, y))
    bad = check_switch.differs(res[0]["saved"], fresh[0]["started"])
    if bad and os.environ.get("DUMP"):
        torch.save((res[0]["saved"], fresh[0]["started"]), os.environ["DUMP"])
    if bad:
        sys.exit("check_pretrain.py: %s: Megatron's load_checkpoint in %s of the checkpoint the switched job "
                 "saved after iteration %d: %s" % (name, b, SAVE_AT, bad))
    if sorted(again) != [SAVE_AT + 1] or again[SAVE_AT + 1] != got[SAVE_AT + 1]:
        sys.exit("check_pretrain.py: %s: the restart in %s: losses %s; the switched job's at iteration %d: %.9g"
                 % (name, b, again, SAVE_AT + 1, got[SAVE_AT + 1]))
    print("%s on %d ranks, Megatron-LM's pretrain(): %s -> %s -> %s through vps-exec, the whole state equal bit "
          "for bit across each switch; loss within %g of the static run's (largest %.1e, iteration %d); "
          "Megatron's checkpoint saved in %s loads in a fresh %s job to the same state and loss (%.0f s); "
          "pause at most %.2f x the transfer"
          % (name, WORLD, a, b, a, MAX_REL, worst, worst_at, b, b, time.monotonic() - t0, worst_pause))
    return out


def pause_parts(per_rank):
    """A switch's pause on the pretrain() path, from each rank's
    Switch.clocks and vps-exec report: from the last rank stopping to the
    last training again, and in it Job.switch's parts
    (check_switch.pause_parts: arrival, transfer, groups, build, attach),
    then what vps.megatron_training does after it on its slowest rank: the
    job's arguments and model config (arguments) and the data iterators;
    and after the pause, the collection of the configuration before (at
    the end of the next iteration) and the wait for vps-exec's exit (at
    the next boundary: the next switch's build ahead, or the end of the
    next iteration)."""
    import yaml
    clocks = [c for c, _ in per_rank]
    ex = []
    for _, report in per_rank:
        with open(report) as f:
            (one,) = yaml.safe_load(f)["switches"]
        ex.append(one)
    p = check_switch.pause_parts(clocks, ex)
    p["job"], p["pause"] = p["pause"], max(c["ended"] for c in clocks) - max(c["began"] for c in clocks)
    for part in ("arguments", "iterators", "collect", "exit"):
        p[part] = max(c.get(part, 0.0) for c in clocks)
    # the data iterators made ahead were taken by every rank, or made in the pause
    ahead = [c.get("data_ahead") for c in clocks]
    p["data_ahead"] = None if None in ahead else max(ahead)
    return p


def describe(p):
    ms = lambda x: "%.1f" % (x * 1e3)  # noqa: E731
    inside, ahead = check_switch.parts(p)
    if p["data_ahead"] is not None:
        ahead += "; data sets and iterators ahead %s ms" % ms(p["data_ahead"])
    return "%s ms = %.2f x the transfer: Job.switch %s ms (%s), then arguments %s, iterators %s%s; collected after " \
        "the next iteration %s, vps-exec's exit waited for after %s" % (
            ms(p["pause"]), p["pause"] / p["transfer"], ms(p["job"]), inside, ms(p["arguments"]), ms(p["iterators"]),
            ahead, ms(p["collect"]), ms(p["exit"]))


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("-v", "--verbose", action="store_true")
    a.add_argument("-k", choices=sorted(JOBS), action="append", help="this job only (repeatable)")
    a.add_argument("--keep", help="keep checkpoints, plans and logs in this directory")
    a.add_argument("--timeout", type=float, default=600)
    a.add_argument("--pauses", metavar="FILE", help="write each switch's pause, broken down, to FILE (JSON)")
    args = a.parse_args()
    imports()
    mcore.install_pretrain_shims()
    tmp = args.keep or tempfile.mkdtemp(prefix="vps-pretrain-")
    os.makedirs(tmp, exist_ok=True)
    registry = "vps-mlm-check-%d" % os.getpid()
    pauses = {}
    try:
        for name in args.k or sorted(JOBS):
            pauses[name] = check(name, JOBS[name], args, tmp, registry)
        if args.pauses:
            with open(args.pauses, "w") as f:
                json.dump(pauses, f, indent=1)
    finally:
        for r in range(WORLD):
            try:
                vps.Registry.unlink("%s-%d" % (registry, r))
            except vps.Error as e:
                print("check_pretrain.py: %s" % e, file=sys.stderr)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
