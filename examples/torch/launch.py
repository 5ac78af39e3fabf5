#!/usr/bin/env python3
"""Launch a PyTorch training job that vps switches between parallel
configurations: one train.py per rank (torch.distributed over gloo), and,
when the run switches, one vps-exec(1) beside each, given the staged plans of
the switches in the order the run makes them.

    launch.py --nproc 4 --configs tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2 \\
              --steps 40 --switch-every 10 [--dir DIR] [training options]

Plans are made with vps-layout, vps-plan and vps-stage into --dir (a new
temporary directory by default, named on the first line), which also gets
each rank's logs, the loss of every step and vps-exec's reports. At the end
it says what the run proved: the switches and every executor's digest, the
bit-for-bit checks (--check-switch), the loss, and with --compare-static the
loss against a static run of the same data. Exits 0 when every process did
and every check held. Before anything starts it checks that /dev/shm has
room for the state (every rank's, under two layouts during a switch) and
that the open-file limit allows a connection to every peer (exit 2).

It needs PyTorch and numpy: run under a Python without them it runs itself
under one that has them (VPS_PYTHON, build/venv/bin/python, then
/usr/bin/python3, Debian's, which sees python3-torch), or says which is
missing in one line."""
import argparse
import importlib.util
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import options  # noqa: E402  (no PyTorch: -h and the checks work without it)
import plans  # noqa: E402

NEEDS = ("torch", "numpy")
MAX_REL = 1e-3


def python_with_torch():
    """Run under a Python that imports PyTorch and numpy: this one, or the
    first of VPS_PYTHON, build/venv/bin/python and /usr/bin/python3 that does
    (the python3 first on PATH often is another); else exit 2 naming what is
    missing."""
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if not missing:
        return
    me = os.path.realpath(sys.executable)
    tried = []
    if not os.environ.get("VPS_LAUNCH_REEXEC"):
        for cand in (os.environ.get("VPS_PYTHON"), os.path.join(TOP, "build", "venv", "bin", "python"),
                     "/usr/bin/python3"):
            if not cand or not os.path.exists(cand) or os.path.realpath(cand) == me or cand in tried:
                continue
            tried.append(cand)
            probe = "import %s" % ", ".join(NEEDS)
            if subprocess.run([cand, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
                continue
            print("launch.py: %s has no %s; running under %s, which has" % (sys.executable, " or ".join(missing),
                                                                            cand), file=sys.stderr, flush=True)
            os.environ["VPS_LAUNCH_REEXEC"] = "1"
            os.execv(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:])
    print("launch.py: %s (Python %d.%d) cannot import %s%s; run it with a Python that has PyTorch and numpy "
          "(on Debian /usr/bin/python3 after apt-get install python3-torch python3-numpy, which make check does)"
          % (sys.executable, sys.version_info[0], sys.version_info[1], " and ".join(missing),
             ", nor can %s" % ", ".join(tried) if tried else ""), file=sys.stderr)
    sys.exit(2)


def check_room(layouts, nproc, switches):
    """Before anything starts: the state of every rank lives in /dev/shm
    (vps.State.allocate), under two layouts at once during a switch, and
    each executor holds a connection to every peer. Exit 2 saying what is
    needed and what there is."""
    import resource

    def total(lay):
        return sum(b.elements * (2 if b.dtype == 0 else 4) for r in range(lay.world) for b in lay.rank(r).buffers)
    sizes = [total(lay) for lay in layouts] or [0]
    need = max(sizes[k % len(sizes)] + sizes[(k + 1) % len(sizes)] for k in range(switches)) \
        if switches and layouts else sizes[0]
    need += nproc * (1 << 20)  # each rank's registry, under 1 MiB
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    if need > free:
        refuse("the job needs %s in /dev/shm (every rank's state%s); %s is free there: a smaller --model or fewer "
               "ranks, or a bigger /dev/shm (mount -o remount,size=SIZE /dev/shm)"
               % (size(need), ", under two layouts during a switch" if switches else "", size(free)))
    files = nproc + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        if hard != resource.RLIM_INFINITY and hard < files:
            refuse("each executor needs %d open files for %d ranks (a connection to every peer); the limit is %d "
                   "and its hard limit %d: raise it (ulimit -n)" % (files, nproc, soft, hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))


def refuse(what):
    print("launch.py: " + what, file=sys.stderr)
    sys.exit(2)


def size(n):
    """Bytes as the tools print them (vps(7) UNITS): three significant digits, binary units."""
    if n < 1000:
        return "%d B" % n
    v, units = float(n), ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    k = 0
    while v >= 999.5 and k + 1 < len(units):
        v /= 1024
        k += 1
    return ("%.0f %s" if v >= 99.95 else "%.1f %s" if v >= 9.995 else "%.2f %s") % (v, units[k])


def free_port():
    """A port for a rendezvous on this machine that nobody listens on, below
    the kernel's ephemeral range: a port the kernel hands out (bind to 0)
    is handed out again to the next outgoing connection, and on a busy
    machine one took it before rank 0 listened (EADDRINUSE), as
    scripts/free-port.sh explains."""
    try:
        high = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(10000, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    sys.exit("launch.py: no free port found below %d" % high)


def run_job(args, targs, d, vps):
    """One job in directory d: the trainers, an executor each when it
    switches. Returns its failures, one line each (none: it succeeded)."""
    os.makedirs(d, exist_ok=True)
    staged = plans.make(d, targs.model, targs.configs, targs.steps, targs.switch_every, targs.gpus_per_node,
                        targs.global_batch, targs.micro_batch, args.budget)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.nproc),
               VPS_CONFIG_PATH=os.environ.get("VPS_CONFIG_PATH", os.path.join(TOP, "configs")))
    if staged and "VPS_TOKEN" not in env:
        env["VPS_TOKEN"] = plans.run([plans.tool("vps-exec"), "--new-token"]).strip()
    tag = "vps-torch-%d" % os.getpid()
    procs = []
    for r in range(args.nproc):
        log = open(os.path.join(d, "train.%d.log" % r), "w")
        procs.append(("trainer %d" % r, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "train.py")] + options.to_argv(targs, registry=tag + "-%r"),
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT)))
    if staged:
        port = str(free_port())
        for r in range(args.nproc):
            log = open(os.path.join(d, "exec.%d.log" % r), "w")
            procs.append(("executor %d" % r, plans.executor(
                staged, tag + "-%r", r, args.nproc, "127.0.0.1:" + port, args.transport, args.exec_timeout,
                os.path.join(d, "report.%d.yaml" % r), log, env)))
    failed = []
    while procs:
        for name, p in list(procs):
            rc = p.poll()
            if rc is None:
                continue
            procs.remove((name, p))
            if rc:
                failed.append("%s exited with status %d" % (name, rc))
        if failed and procs:
            # one rank gone takes the job with it: stop the rest rather than
            # hang. A rank blocked inside torch (a rendezvous retrying for
            # half an hour) runs no Python signal handler: kill what is left
            # after a grace period.
            for _, p in procs:
                p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            for _, p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            procs = []
        time.sleep(0.05)
    # a rank killed before its registry closed leaves it: remove what is stale
    for r in range(args.nproc):
        try:
            vps.Registry.unlink("%s-%d" % (tag, r))
        except vps.Error as e:
            print("launch.py: %s" % e, file=sys.stderr)
    if failed:
        for r in range(args.nproc):
            for kind in ("train", "exec"):
                path = os.path.join(d, "%s.%d.log" % (kind, r))
                if os.path.exists(path) and os.path.getsize(path):
                    failed.append("== %s\n%s" % (path, open(path).read()[-3000:]))
    return failed, len(staged)


def read_loss(path):
    out = {}
    for line in open(path):
        f = line.split()
        out[int(f[0])] = float(f[1])
    return out


def count(path, text):
    try:
        return sum(1 for line in open(path) if text in line)
    except OSError:
        return 0


def within(loss, ref, steps):
    """The largest relative deviation of loss from ref, its step, and
    whether every step is there and within MAX_REL."""
    dev = {s: abs(loss[s] - ref[s]) / abs(ref[s]) if ref[s] else abs(loss[s]) for s in ref if s in loss}
    worst = max(dev, key=dev.get)
    return dev[worst], worst, len(dev) == len(ref) == steps and dev[worst] <= MAX_REL


def report(args, targs, d, switches, static, cpu=None):
    """What the run proved, a line each; returns whether every check held."""
    ok = True
    log0 = os.path.join(d, "train.0.log")
    moves = []
    for line in open(log0):
        m = re.match(r"train\.py: switch \d+ at step (\d+) to ([^: ]+)", line)
        if m:
            moves.append("%s from step %s" % (m.group(2), m.group(1)))
    print("launch.py: %d ranks trained %s for %d steps: %s (%d switch%s)" % (
        args.nproc, targs.model, targs.steps, ", then ".join([targs.configs[0]] + moves), switches,
        "" if switches == 1 else "es"))
    if switches:
        digests = sum(count(os.path.join(d, "exec.%d.log" % r), "digest: match") for r in range(args.nproc))
        want = switches * args.nproc
        print("launch.py: every rank's digest of its state matched across every switch (vps-exec --check): "
              "%d of %d" % (digests, want))
        ok &= digests == want
        if targs.check_switch:
            equal = count(log0, "equal bit for bit")
            print("launch.py: the whole state gathered after each switch equal bit for bit to the state before "
                  "(--check-switch): %d of %d" % (equal, switches))
            ok &= equal == switches
    loss = read_loss(targs.loss_log)
    first, last = min(loss), max(loss)
    print("launch.py: loss %.4g at step %d, %.4g at step %d (%s)" % (loss[first], first, loss[last], last,
                                                                   targs.loss_log))
    if cpu:
        dev, worst, held = within(loss, read_loss(cpu), targs.steps)
        print("launch.py: against the same run on the CPU (--compare-cpu): largest relative deviation %.3g "
              "(step %d), %s" % (dev, worst, "within %g at every step" % MAX_REL if held else "OVER %g" % MAX_REL))
        ok &= held
    if static:
        dev, worst, held = within(loss, read_loss(static), targs.steps)
        print("launch.py: against the static run in %s (--compare-static): largest relative deviation %.3g "
              "(step %d), %s" % (targs.configs[0], dev, worst,
                                  "within %g at every step" % MAX_REL if held else "OVER %g" % MAX_REL))
        ok &= held
    elif switches:
        print("launch.py: --compare-static also runs it statically in %s and compares every step's loss"
              % targs.configs[0])
    return ok


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 when every process succeeded and every check held, 1 when "
                                       "not, 2 on bad arguments or without PyTorch.")
    job = a.add_argument_group("the job")
    job.add_argument("--nproc", type=int, required=True, help="ranks (every configuration's world)")
    job.add_argument("--dir", help="plans, logs, reports and loss.txt go here (default: a new temporary directory)")
    job.add_argument("--budget", default="64MiB", help="vps-stage's staging budget per rank (default 64MiB)")
    job.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc; default tcp)")
    job.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout (default 120)")
    job.add_argument("--compare-static", action="store_true",
                     help="also run statically in the first configuration, on the same data, and require every "
                          "step's loss within %g of it" % MAX_REL)
    job.add_argument("--compare-cpu", action="store_true",
                     help="with --device cuda: also run the same job, switches included, on the CPU (over tcp) and "
                          "require every step's loss within %g of it" % MAX_REL)
    options.add_training(a.add_argument_group("training (each rank's train.py)"))
    targs = options.finish(a, a.parse_args())
    args = targs
    python_with_torch()
    sys.path.insert(0, os.path.join(TOP, "python"))
    import vps
    layouts = []
    for c in targs.configs:
        try:
            lay = vps.layout(targs.model, c, targs.gpus_per_node)
        except vps.Error as e:
            a.error("--configs: %s: %s" % (c, e))
        layouts.append(lay)
        w = lay.world
        if lay.parallel["cp"] != 1:
            a.error("--configs: %s: context parallelism is not implemented by this example (cp=%d)"
                    % (c, lay.parallel["cp"]))
        if w != args.nproc:
            a.error("--configs: %s has a world of %d ranks, --nproc is %d" % (c, w, args.nproc))
    every = targs.switch_every
    switches = (targs.steps - 1) // every if every and len(layouts) > 1 else 0
    if targs.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            refuse("--device cuda: no GPU (torch.cuda.is_available() is false under %s)" % sys.executable)
        if switches and args.transport not in ("ipc", "nccl", "auto"):
            refuse("--device cuda: vps-exec moves GPU memory over ipc, nccl or auto, not %s (--transport ipc)"
                   % args.transport)
    elif args.compare_cpu:
        a.error("--compare-cpu compares a --device cuda run with the CPU's")
    # the state of a GPU run is not in /dev/shm (only its registries are)
    check_room(layouts if targs.device == "cpu" else [], args.nproc, switches)
    if args.dir:
        d = args.dir
    else:
        d = tempfile.mkdtemp(prefix="vps-torch-")
        print("launch.py: files in %s" % d, flush=True)
    if not targs.loss_log:
        targs.loss_log = os.path.join(d, "loss.txt")
    failed, switches = run_job(args, targs, d, vps)
    static = cpu = None
    if not failed and args.compare_cpu:
        cd = os.path.join(d, "cpu")
        cpu = os.path.join(cd, "loss.txt")
        failed, _ = run_job(argparse.Namespace(**dict(vars(args), transport="tcp")),
                            argparse.Namespace(**dict(vars(targs), device="cpu", save_master=None, loss_log=cpu)), cd, vps)
        failed = ["the CPU run: " + f for f in failed]
    if not failed and args.compare_static:
        sd = os.path.join(d, "static")
        static = os.path.join(sd, "loss.txt")
        failed, _ = run_job(args, argparse.Namespace(**dict(vars(targs), configs=targs.configs[:1], switch_every=0,
                                                            check_switch=False, save_master=None,
                                                            loss_log=static)), sd, vps)
        failed = ["the static run: " + f for f in failed]
    if failed:
        for f in failed:
            print("launch.py: " + f, file=sys.stderr)
        sys.exit(1)
    if not report(args, targs, d, switches, static, cpu):
        sys.exit(1)


if __name__ == "__main__":
    main()
