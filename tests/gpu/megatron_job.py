"""A Megatron-Core job with its state on the GPU, switched by vps
(scripts/gpu-check.sh runs it on a GPU machine; make check runs its --device
cpu form).

Megatron-Core's own GPTModel (micro-gpt), DistributedDataParallel and
DistributedOptimizer over Adam, built as Megatron-LM's get_model and
setup_model_and_optimizer build them, on CUDA tensors, trained by Megatron's
forward-backward schedule on NCCL. vps.megatron.Job registers DDP's own
parameter buffers by their CUDA IPC handles (State.adopt, no copy) and
gathers the optimizer's main parameters and moments once into GPU buffers
of vps's layout; one vps-exec beside the rank moves the state over
--transport ipc (the copy kernel, the digests on the GPU: --check).

One GPU holds one rank: NCCL refuses two ranks on one device, and a gloo
world does not reduce-scatter CUDA tensors. So the world is one rank, and
what switches is what one rank's layout can change: DDP's gradient buckets
(zero=1 -> zero=1,bucket=60000 -> zero=1: Megatron pads each bucket, so
every parameter after the first bucket moves in its buffers, and the
buffers change size). What this does not prove: transfers between GPUs
(scripts/gpu-check.sh's ipc and nccl runs do, without Megatron), Megatron's
collectives between ranks on the GPU, and TransformerEngine's modules
(absent here: Megatron-Core's own local modules stand in, as on the CPU).

Three runs, each in a process of its own (Megatron's globals and the CPU
shims are a process's): the job switched on DEVICE, the same job static on
DEVICE, and with --device cuda the job static on the CPU (mcore.py's
shims). Before and after each switch the whole state is gathered through
Megatron's own sharded state dicts and optimizer accessors and must be
equal bit for bit; the switched run's loss must be within 1e-3 (relative,
scripts/convergence.sh's bound) of the static run's on DEVICE and of the
CPU run's at every step.

    megatron_job.py [-v] [--device cuda|cpu] [--steps N] [--every K] [--no-prepare] [--keep DIR]
    VPS_BIN=build/fault-bin VPS_FAULT=exit:0 megatron_job.py --failed-switch [--device cuda|cpu]

With --failed-switch the executor (the tests' vps-exec, make fault-bin)
dies at the first switch: Job.switch must raise vps.PeerFailed with the
hand-over it made while the executor ran undone (the gradients' memory on
the device given back, the job's groups), and the job train on as it was,
its state the same bit for bit, its loss the static run's.

Prints a line per switch with -v, then one summary line; exit 1 naming what
differs, 2 on bad arguments."""
import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, os.path.join(TOP, "tests", "megatron"))
os.environ.setdefault("VPS_LIBRARY", os.path.join(TOP, "build", "libvps.so"))

CONFIGS = ["zero=1", "zero=1,bucket=60000", "zero=1"]
MODEL = os.path.join(TOP, "tests", "megatron", "models", "micro-gpt.yaml")
MAX_REL = 1e-3  # scripts/convergence.sh's bound


def tool(name):
    path = os.path.join(os.environ.get("VPS_BIN", os.path.join(TOP, "bin")), name)
    if not os.access(path, os.X_OK):
        sys.exit("megatron_job.py: %s: not built (make)" % path)
    return path


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit("megatron_job.py: %s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


# ---- one run, in a process of its own ----
def job(a):
    """The job on one rank, switched through vps or static; writes its
    losses and switches to a.out as JSON."""
    import mcore  # imports torch and megatron-core
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    import check_switch as cs  # the data, the schedule and the whole state's gathering of the CPU check
    import vps
    import vps.megatron

    cuda = a.device == "cuda"
    if cuda:
        mcore.install_module_shims()
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    else:
        mcore.install_training_shims()
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(a.store, 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=300))

    def build(layout):
        """Megatron-LM's get_model and setup_model_and_optimizer for the layout:
        the chunks made on the CPU (use_cpu_initialization) and moved to the
        GPU, then DDP and the optimizer; with buckets, the schedule's no_sync
        is DDP's, as the training loop sets it for --overlap-grad-reduce."""
        vps.megatron.initialize_groups(layout, create_gloo_process_groups=False)
        model_parallel_cuda_manual_seed(cs.SEED, force_reset_rng=True)
        torch.manual_seed(cs.SEED)
        par = layout.parallel
        config = mcore.transformer_config(layout.model, par, perform_initialization=True, init_method_std=0.02,
                                          hidden_dropout=0.0, attention_dropout=0.0)
        chunks = mcore.build_chunks(layout.model, par, config)
        if cuda:
            for c in chunks:
                c.cuda(torch.cuda.current_device())
        model = mcore.wrap_ddp(chunks, config, par)
        optimizer = get_megatron_optimizer(cs.optimizer_config(par), model, use_gloo_process_groups=False)
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = optimizer.scale_loss
        if par["bucket"]:
            config.no_sync_func = model[0].no_sync
        return model, optimizer

    def forward_step(data_iterator, model):
        batch = next(data_iterator).to(device)
        tokens, labels = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        positions = torch.arange(cs.SEQ, device=device).unsqueeze(0).expand_as(tokens)
        out = model(tokens, positions, None, labels=labels)

        def loss_func(output):
            loss = output.float().sum()
            n = torch.tensor(output.numel(), dtype=torch.int, device=device)
            return loss, n, {"lm loss": torch.stack([loss.detach(), n.float()])}
        return out, loss_func

    def train_step(model, optimizer, corpus, consumed):
        accum = cs.GLOBAL_BATCH // cs.MICRO_BATCH
        for chunk in model:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        reports = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=[cs.micro_batches(corpus, consumed, 1, 0, accum)],
            model=model, num_microbatches=accum, seq_length=cs.SEQ, micro_batch_size=cs.MICRO_BATCH,
            decoder_seq_length=cs.SEQ, forward_only=False)
        ok, _, _ = optimizer.step()
        if not ok:
            raise RuntimeError("the optimizer skipped a step")
        total = sum(r["lm loss"].double() for r in reports)
        return (total[0] / total[1]).item()

    def on_device(model, optimizer, state):
        """Where Megatron's tensors are: DDP's parameter buffers are vps's
        (the same memory), and everything on the device the job runs on."""
        mine = {t.data_ptr() for t in state.buffers}
        for chunk in model:
            for buf in list(chunk.buffers) + list(chunk.expert_parallel_buffers):
                if buf.param_data.device.type != device.type:
                    raise RuntimeError("a DDP buffer is on %s" % buf.param_data.device)
                if buf.param_data.data_ptr() not in mine:
                    raise RuntimeError("a DDP parameter buffer is not one of vps's buffers")
        for o in vps.megatron.distributed_optimizers(optimizer):
            for group in o.optimizer.param_groups:
                for p in group["params"]:
                    if p.device.type != device.type:
                        raise RuntimeError("a main parameter is on %s" % p.device)
        if state.device.type != device.type:
            raise RuntimeError("vps's buffers are on %s" % state.device)

    layouts = [vps.layout(MODEL, c, 1) for c in CONFIGS]
    corpus = cs.Corpus(layouts[0].model.vocab, cs.SEQ, cs.SEED)
    model, optimizer = build(layouts[0])
    scheduler = cs.make_scheduler(optimizer, a.steps, 0)
    nswitches = min(len(CONFIGS) - 1, (a.steps - 1) // a.every) if a.switched else 0
    reg = jb = failed = None
    losses, switches = [], []
    iteration = consumed = 0
    try:
        if a.switched:
            reg = vps.Registry(a.registry, layouts[0], 0)
            jb = vps.megatron.Job(reg, layouts[0], 0, model, optimizer)
            on_device(model, optimizer, jb.state)
        while iteration < a.steps:
            if a.switched and not a.no_prepare and len(switches) < nswitches and jb.prepared is None:
                jb.prepare(layouts[len(switches) + 1], 0, build)
            if a.switched and iteration and iteration % a.every == 0 and len(switches) < nswitches:
                before = cs.gather(model, optimizer)
                to = layouts[len(switches) + 1]
                if a.failed_switch:
                    failed = cs.failed_switch(jb, to, 0, vps.Training(step=iteration), layouts[0], model,
                                              optimizer, before)
                    on_device(model, optimizer, jb.state)
                    nswitches = 0
                    continue
                model, optimizer, carried = jb.switch(to, 0, vps.Training(
                    step=iteration, consumed_samples=consumed, scheduler_step=scheduler.num_steps,
                    global_batch=cs.GLOBAL_BATCH, micro_batch=cs.MICRO_BATCH), build)
                scheduler = cs.make_scheduler(optimizer, a.steps, carried.scheduler_step)
                if (carried.step, carried.consumed_samples) != (iteration, consumed):
                    raise RuntimeError("the switch carried step %d, samples %d; the job was at %d, %d" % (
                        carried.step, carried.consumed_samples, iteration, consumed))
                on_device(model, optimizer, jb.state)
                after = cs.gather(model, optimizer)
                bad = cs.differs(before, after)
                k = len(switches)
                if bad:
                    raise RuntimeError("switch %d (%s -> %s) at step %d: the state after is not the state before: %s"
                                       % (k + 1, CONFIGS[k], CONFIGS[k + 1], iteration, bad))
                switches.append(dict(step=iteration, src=CONFIGS[k], dst=CONFIGS[k + 1], tensors=len(after[0]),
                                     elements=sum(t.numel() for t in after[0].values()),
                                     pause=jb.clocks["returned"] - jb.clocks["called"]))
            losses.append(train_step(model, optimizer, corpus, consumed))
            iteration += 1
            consumed += cs.GLOBAL_BATCH
            scheduler.step(increment=cs.GLOBAL_BATCH)
    finally:
        if jb:
            jb.close()
        if reg:
            reg.close()
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()
    gpu = torch.cuda.get_device_name(0) if cuda else None
    with open(a.out, "w") as f:
        json.dump(dict(losses=losses, switches=switches, gpu=gpu, nswitches=nswitches, failed=failed), f)


# ---- the check: executors, the three runs, their comparison ----
def executors(tmp, registry, nplans):
    staged = []
    for i, c in enumerate(CONFIGS[:nplans + 1]):
        run([tool("vps-layout"), "-q", "--model", MODEL, "--parallel", c, "--gpus-per-node", "1",
             "-o", os.path.join(tmp, "c%d.layout" % i)])
    for i in range(nplans):
        plan, st = os.path.join(tmp, "c%d.plan" % i), os.path.join(tmp, "c%d.staged" % i)
        run([tool("vps-plan"), "-q", os.path.join(tmp, "c%d.layout" % i), os.path.join(tmp, "c%d.layout" % (i + 1)),
             "--global-batch", "8", "--micro-batch", "2", "-o", plan])
        run([tool("vps-stage"), "-q", "--budget", "16MiB", plan, "-o", st])
        staged.append(st)
    env = dict(os.environ, VPS_TOKEN=run([tool("vps-exec"), "--new-token"]).strip())
    port = run([os.path.join(TOP, "scripts", "free-port.sh")]).strip()
    log = open(os.path.join(tmp, "exec.log"), "w")
    return subprocess.Popen(
        [tool("vps-exec"), "--registry", registry, "--rank", "0", "--world", "1", "--master", "127.0.0.1:" + port,
         "--transport", "ipc", "--wait", "--check", "--timeout", "120"] + (["--serve"] if nplans > 1 else [])
        + staged, env=env, stdout=log, stderr=subprocess.STDOUT)


def one_run(a, tmp, name, device, switched, registry=None):
    out = os.path.join(tmp, name + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "--run", "--device", device, "--steps", str(a.steps),
           "--every", str(a.every), "--store", os.path.join(tmp, name + ".store"), "--out", out]
    if switched:
        cmd += ["--switched", "--registry", registry] + (["--no-prepare"] if a.no_prepare else []) \
            + (["--failed-switch"] if a.failed_switch else [])
    with open(os.path.join(tmp, name + ".log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
    if rc:
        with open(os.path.join(tmp, name + ".log")) as f:
            print(f.read()[-4000:], file=sys.stderr)
        return None
    with open(out) as f:
        return json.load(f)


def compare(ours, ref, what):
    """The largest relative deviation of ours from ref and its step; exits
    naming the first step past the bound."""
    worst, at = 0.0, 0
    for i, (x, y) in enumerate(zip(ours, ref)):
        rel = abs(x - y) / abs(y)
        if not rel <= MAX_REL:  # a NaN loss too
            sys.exit("megatron_job.py: step %d: loss %.9g, %s %.9g (%.2g relative, bound %g)"
                     % (i + 1, x, what, y, rel, MAX_REL))
        if rel > worst:
            worst, at = rel, i + 1
    if len(ours) != len(ref):
        sys.exit("megatron_job.py: %d steps, %s %d" % (len(ours), what, len(ref)))
    return worst, at


def check(a, tmp):
    registry = "vps-mjob-%d" % os.getpid()
    nplans = min(len(CONFIGS) - 1, (a.steps - 1) // a.every)
    ex = executors(tmp, registry, nplans)
    try:
        sw = one_run(a, tmp, "switched", a.device, True, registry)
        try:
            ex.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if ex.poll() is None:
            ex.send_signal(signal.SIGTERM)
            ex.wait()
        with contextlib.suppress(Exception):
            import vps
            vps.Registry.unlink(registry)
    with open(os.path.join(tmp, "exec.log")) as f:
        exec_log = f.read()
    if sw is None:
        print(exec_log[-2000:], file=sys.stderr)
        sys.exit("megatron_job.py: the switched run on %s failed (its log above)" % a.device)
    if a.failed_switch:
        return failed_line(a, tmp, sw, ex.returncode)
    if ex.returncode:
        sys.exit("megatron_job.py: vps-exec exited with %d:\n%s" % (ex.returncode, exec_log[-2000:]))
    digests = exec_log.count("digest: match")
    if len(sw["switches"]) != nplans or digests != nplans:
        sys.exit("megatron_job.py: %d switches of %d, %d digests matched" % (len(sw["switches"]), nplans, digests))
    transfers = [line for line in exec_log.splitlines() if " over ipc; " in line]
    static = one_run(a, tmp, "static", a.device, False)
    if static is None:
        sys.exit("megatron_job.py: the static run on %s failed (its log above)" % a.device)
    first = sw["switches"][0]["step"] if sw["switches"] else a.steps
    same_before = sw["losses"][:first] == static["losses"][:first]
    if a.device == "cpu" and not same_before:
        # the CPU computes the same in every run: before a switch nothing may differ
        sys.exit("megatron_job.py: before the first switch the loss differs from the static run's: %s, %s"
                 % (sw["losses"][:first], static["losses"][:first]))
    worst, worst_at = compare(sw["losses"], static["losses"], "the static run's on " + a.device)
    cpu_part = ""
    if a.device == "cuda":
        cpu = one_run(a, tmp, "cpu", "cpu", False)
        if cpu is None:
            sys.exit("megatron_job.py: the static run on the CPU failed (its log above)")
        cworst, cat = compare(sw["losses"], cpu["losses"], "the CPU run's")
        cpu_part = " and of the same job's on the CPU (largest %.1e, step %d)" % (cworst, cat)
    for k, s in enumerate(sw["switches"]):
        if a.verbose:
            print("switch %d at step %d: %s -> %s: %d tensors, %d elements, equal bit for bit; pause %.1f ms; %s"
                  % (k + 1, s["step"], s["src"], s["dst"], s["tensors"], s["elements"], s["pause"] * 1e3,
                     transfers[k].split(": ", 1)[-1] if k < len(transfers) else ""))
    if a.verbose:
        for i, (x, y) in enumerate(zip(sw["losses"], static["losses"])):
            print("step %d: loss %.9f, static %.9f" % (i + 1, x, y))
    te = importlib.util.find_spec("transformer_engine") is not None
    where = "1 GPU (%s)" % sw["gpu"] if sw["gpu"] else "the CPU"
    print("megatron_job.py: micro-gpt on %s: Megatron-Core's GPTModel, DDP and DistributedOptimizer (Adam), "
          "its state on %s, %d switches through vps-exec --transport ipc (%s), %s, the whole state equal bit for bit "
          "across each, %d digests matched; loss within %g of the static run's (%s; %s before the first switch)%s; "
          "TransformerEngine %s"
          % (where, "the GPU, DDP's parameter buffers adopted by their CUDA IPC handles" if sw["gpu"] else
             "the host, in vps's shared memory", len(sw["switches"]), " -> ".join(CONFIGS[:nplans + 1]),
             "each prepared while the job trained" if not a.no_prepare else "each built in the pause",
             digests, MAX_REL, "largest %.1e, step %d" % (worst, worst_at) if worst else "equal at every step",
             "equal bit for bit" if same_before else "not bit for bit",
             cpu_part, "present: not run (the precision-aware optimizer and grouped GEMM: to do)" if te else
             "not installed: the precision-aware optimizer and grouped GEMM not run"))


def failed_line(a, tmp, sw, status):
    """--failed-switch: the executor died, the Job raised and trained on as
    it was; its loss the static run's (bit for bit on the CPU)."""
    if not sw["failed"]:
        sys.exit("megatron_job.py: the switch did not fail (VPS_BIN=build/fault-bin VPS_FAULT=exit:0?)")
    if not status:
        sys.exit("megatron_job.py: the switch failed, and vps-exec exited with 0")
    static = one_run(a, tmp, "static", a.device, False)
    if static is None:
        sys.exit("megatron_job.py: the static run on %s failed (its log above)" % a.device)
    if a.device == "cpu" and sw["losses"] != static["losses"]:
        sys.exit("megatron_job.py: after the failed switch the loss differs from the static run's: %s, %s"
                 % (sw["losses"], static["losses"]))
    worst, at = compare(sw["losses"], static["losses"], "the static run's on " + a.device)
    where = "1 GPU (%s)" % sw["gpu"] if sw["gpu"] else "the CPU"
    print("megatron_job.py: micro-gpt on %s: vps-exec died at the switch at step %d (exit %d) and Job.switch raised "
          "(%s); the hand-over made while it ran undone, the job trained on as it was: its state equal bit for bit, "
          "its loss the static run's (%s)" % (where, a.every, status, sw["failed"],
                                              "largest %.1e, step %d" % (worst, at) if worst else "equal at every step"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--every", type=int, default=3, help="switch every K steps")
    p.add_argument("--no-prepare", action="store_true", help="each switch builds the next configuration in its pause")
    p.add_argument("--keep", help="keep the plans, logs and results in this directory")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--failed-switch", action="store_true",
                   help="the executor dies at the first switch (VPS_BIN=build/fault-bin VPS_FAULT=exit:0): the job "
                        "must train on as it was")
    # one run (the check starts these itself)
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--switched", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--registry", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.steps < 1 or a.every < 1:
        p.error("--steps and --every must be at least 1")
    if a.run:
        job(a)
        # its results are written: gone before the interpreter's teardown,
        # where torch's threads can abort the process ("terminate called
        # without an active exception", once under load in CI), as
        # tests/lib/ranks.py's children are
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    tmp = a.keep or tempfile.mkdtemp(prefix="vps-mjob-")
    os.makedirs(tmp, exist_ok=True)
    try:
        check(a, tmp)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
