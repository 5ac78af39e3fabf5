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
loss against a static run of the same data; before, a line per phase
(planning, each switch, the static run). Exits 0 when every process did
and every check held. One job holds DIR at a time (a second launch is
refused, naming the first), and no process of the job outlives the
launcher: SIGTERM, SIGINT and SIGHUP stop them all, and each dies with a
launcher that is killed (PR_SET_PDEATHSIG). Before anything starts it checks that /dev/shm has
room for the state (every rank's, under two layouts during a switch) and
that the open-file limit allows a connection to every peer (exit 2).

It needs PyTorch and numpy, which the test environment has (build/venv,
made by `make venv`): run under a Python without them it runs itself under
one that has them (VPS_PYTHON, build/venv/bin/python, then
/usr/bin/python3), or says which is missing in one line."""
import argparse
import importlib.util
import os
import random
import re
import signal
import socket
import stat
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
    print("launch.py: %s (Python %d.%d) cannot import %s%s; run it with a Python that has PyTorch and numpy: "
          "make venv makes build/venv, which has them, or name one with VPS_PYTHON"
          % (sys.executable, sys.version_info[0], sys.version_info[1], " and ".join(missing),
             ", nor can %s" % ", ".join(tried) if tried else ""), file=sys.stderr)
    sys.exit(2)


def check_room(layouts, nproc, switches):
    """Before anything starts (exit 2 saying why), or before a switch asked
    for is passed on (returns why not, or None): the state of every rank
    lives in /dev/shm (vps.State.allocate), under two layouts at once during
    a switch, and each executor holds a connection to every peer."""
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
        return ("the job needs %s in /dev/shm (every rank's state%s); %s is free there: a smaller --model or fewer "
                "ranks, or a bigger /dev/shm (mount -o remount,size=SIZE /dev/shm)"
                % (size(need), ", under two layouts during a switch" if switches else "", size(free)))
    files = nproc + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        if hard != resource.RLIM_INFINITY and hard < files:
            return ("each executor needs %d open files for %d ranks (a connection to every peer); the limit is %d "
                    "and its hard limit %d: raise it (ulimit -n)" % (files, nproc, soft, hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))
    return None


def say(what):
    """A line of the launcher's progress, on standard output with its report."""
    print("launch.py: " + what, flush=True)


# Every process the launcher started and has not reaped: stopped whole on
# the launcher's way out, however it leaves (an exception, SIGTERM, SIGINT,
# SIGHUP); PR_SET_PDEATHSIG (plans.dies_with_me) takes them with it even
# when it is killed.
CHILDREN = set()


def spawn(argv, **kw):
    p = subprocess.Popen(argv, preexec_fn=plans.dies_with_me(), **kw)
    CHILDREN.add(p)
    return p


def stop_all(procs, grace=10.0):
    """SIGTERM every process still running, SIGKILL what is left after
    `grace` seconds (one stopped, or blocked in a call, cannot take its
    signal before it returns); returns the names of those killed so."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        # one stopped (SIGSTOP) would take SIGTERM only once continued
        p.send_signal(signal.SIGKILL if proc_state(p.pid) == "stopped" else signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = []
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            killed.append(p)
            p.kill()
            p.wait()
    CHILDREN.difference_update(procs)
    return killed


def proc_state(pid):
    """The kernel's word for a process: 'stopped' (SIGSTOP), 'a zombie', or ''."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {"T": "stopped", "t": "stopped", "Z": "a zombie"}.get(st, "")


def hold_dir(d):
    """One job a directory: the first launch holds DIR/.launch.lock (flock,
    released by the kernel however the launcher ends); a second one given
    the same --dir is refused at once (exit 2), naming the live job, before
    it writes anything there. Returns the open lock, to keep."""
    import fcntl
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, ".launch.lock")
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another launcher"
        refuse("--dir %s: in use by the job of %s: give this one another --dir, or wait for that one to end"
               % (d, holder))
    f.seek(0)
    f.truncate()
    f.write("launch.py pid %d (started %s)\n" % (os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S")))
    f.flush()
    return f


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


def run_job(args, targs, d, vps, what="the job"):
    """One job in directory d: the trainers, an executor each when it
    switches. Returns its failures, one line each (none: it succeeded)."""
    os.makedirs(d, exist_ok=True)
    n = (targs.steps - 1) // targs.switch_every if targs.switch_every and len(targs.configs) > 1 else 0
    if n:
        say("%s: planning its %d switch%s (vps-layout, vps-plan, vps-stage) in %s" % (what, n, "" if n == 1 else "es",
                                                                                   d))
    staged = plans.make(d, targs.model, targs.configs, targs.steps, targs.switch_every, targs.gpus_per_node,
                        targs.global_batch, targs.micro_batch, args.budget, relay=targs.relay,
                        topology=targs.topology)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.nproc),
               VPS_CONFIG_PATH=os.environ.get("VPS_CONFIG_PATH", os.path.join(TOP, "configs")))
    if staged and "VPS_TOKEN" not in env:
        env["VPS_TOKEN"] = plans.run([plans.tool("vps-exec"), "--new-token"]).strip()
    tag = "vps-torch-%d" % os.getpid()
    procs = []
    say("%s: %d trainers in %s for %d steps%s" % (what, args.nproc, ",".join(targs.configs[:1]), targs.steps,
                                                  ", and an executor beside each" if staged else ""))
    for r in range(args.nproc):
        log = open(os.path.join(d, "train.%d.log" % r), "w")
        procs.append(("trainer %d" % r, spawn(
            [sys.executable, os.path.join(HERE, "train.py")] + options.to_argv(targs, registry=tag + "-%r"),
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT)))
    if staged:
        port = str(free_port())
        for r in range(args.nproc):
            log = open(os.path.join(d, "exec.%d.log" % r), "w")
            procs.append(("executor %d" % r, plans.executor(
                staged, tag + "-%r", r, args.nproc, "127.0.0.1:" + port, args.transport, args.exec_timeout,
                os.path.join(d, "report.%d.yaml" % r), log, env)))
            CHILDREN.add(procs[-1][1])
    failed = []
    log0, said, next_look = os.path.join(d, "train.0.log"), 0, 0.0
    while procs:
        if staged and time.monotonic() > next_look:
            # each switch as rank 0 says it is done
            next_look = time.monotonic() + 0.5
            with open(log0, "rb") as f:
                f.seek(said)
                text = f.read()
            text = text[:text.rfind(b"\n") + 1]
            said += len(text)
            for line in text.decode("utf-8", "replace").splitlines():
                m = re.match(r"train\.py: switch (\d+) at step (\d+) to ([^: ]+)", line)
                if m:
                    say("%s: switch %s at step %s to %s done" % (what, m.group(1), m.group(2), m.group(3)))
        for name, p in list(procs):
            rc = p.poll()
            if rc is None:
                continue
            procs.remove((name, p))
            CHILDREN.discard(p)
            if rc:
                failed.append("%s exited with status %d" % (name, rc))
        if failed and procs:
            # one rank gone takes the job with it: stop the rest rather than
            # hang. A rank blocked inside torch (a rendezvous retrying for
            # half an hour) runs no Python signal handler: kill what is left
            # after a grace period.
            stop_all([p for _, p in procs])
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
    dev = {s: d if d == d else float("inf") for s, d in dev.items()}  # a NaN loss is over any bound
    worst = max(dev, key=dev.get)
    return dev[worst], worst, len(dev) == len(ref) == steps and dev[worst] <= MAX_REL


def compare_static(targs, loss, static):
    """Every step's loss within MAX_REL of the static run's (its loss.txt)."""
    dev, worst, held = within(loss, read_loss(static), targs.steps)
    print("launch.py: against the static run in %s (--compare-static): largest relative deviation %.3g "
          "(step %d), %s" % (targs.configs[0], dev, worst,
                              "within %g at every step" % MAX_REL if held else "OVER %g" % MAX_REL))
    return held


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
        ok &= compare_static(targs, loss, static)
    elif switches:
        print("launch.py: --compare-static also runs it statically in %s and compares every step's loss"
              % targs.configs[0])
    return ok


# ---- an elastic job: devices join and leave while it trains ----
CONTROL_MAX = 1 << 20  # bytes of a control file read at most


class Elastic:
    """One job whose world grows and shrinks: the launcher is its agent
    (vps.elastic.Agent). It hosts the job's store, starts the first
    processes, and for each switch the job asks for (vps/ask/K) makes the
    plan, starts the processes that join and one vps-exec per device of the
    transition world, and says when they are up. The processes of a join
    the schedule (--configs, --switch-every) makes are started as soon as
    their slots are free, at the start for the first, without waiting for
    the ask: a process takes seconds to start (Python, torch), and the job
    makes the new world with them only once they are up, so the world is
    made while the job trains on as early as the schedule allows. After a
    failed world change it says whether the job trains on in the old world, retries
    without a lost device (vps-plan --lost) or stops. Configurations asked
    for through --control FILE (a line each; SIGUSR1 reads it at once) go to
    the job as they come, once checked.

    It is also the job's watchdog (T: the trainers' --timeout): every
    process beats (vps/alive/SLOT); one silent for T/2 that the kernel says
    is stopped, or silent for 1.5 T (stuck), is named, with what it was
    doing, and killed, which makes it a process that died; an executor
    stopped for T/2, or left running T/2 after its trainer ended or
    --exec-timeout after another executor of its switch ended, is named and
    killed (at once when stopped and another has ended); a job told to stop
    is stopped whole T/2 later."""

    def __init__(self, args, targs, d, vps):
        from vps.elastic import Agent
        self.args, self.targs, self.d, self.vps = args, targs, d, vps
        os.makedirs(d, exist_ok=True)
        self.agent = Agent()
        self.tag = "vps-torch-%d" % os.getpid()
        self.env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.agent.port),
                        TORCHELASTIC_USE_AGENT_STORE="True", VPS_AGENT="1",
                        VPS_CONFIG_PATH=os.environ.get("VPS_CONFIG_PATH", os.path.join(TOP, "configs")))
        if "VPS_TOKEN" not in self.env:
            self.env["VPS_TOKEN"] = plans.run([plans.tool("vps-exec"), "--new-token"]).strip()
        self.trainers, self.execs, self.slots = {}, {}, set()
        self.config, self.size = targs.configs[0], args.nproc
        self.queue, self.sw = [], None
        self.layouts, self.plans = {}, {}
        self.failures, self.done, self.digests, self.crashed, self.stopping = [], [], 0, False, False
        # the control file: the bytes of its whole lines read so far, how many,
        # the last version seen (inode, size, mtime) and the last refused
        self.control_text, self.control_lines, self.control_seen, self.control_refused = b"", 0, None, None
        self.control_wake = False
        self.expect = (self.config, self.size)  # where the job is once every request passed on is done
        # the schedule's joins (switch K -> the slots that join), those of
        # them started before their ask (slot -> K) and, for a K, why one of
        # those died before it was asked (the switch is abandoned when it is)
        self.joins = self.scheduled_joins()
        self.early, self.early_dead = {}, {}
        # the watchdog: seconds a process may be silent, an executor may outlive
        # its trainer or its switch's first executor to end
        self.silence = max(targs.timeout / 2, 3.0)
        self.exec_grace = float(args.exec_timeout)
        self.beats, self.frozen, self.gone_at, self.stopped_at, self.killed = {}, {}, {}, {}, set()
        self.attempt_end, self.stop_by, self.next_watch = None, None, 0.0
        self.argv = options.to_argv(targs, registry=self.tag + "-%r",
                                    sample_log=os.path.join(d, "samples.%r.txt"),
                                    switch_log=os.path.join(d, "switches.tsv"))

    # ---- plans ----
    def layout(self, spec):
        if spec not in self.layouts:
            path = os.path.join(self.d, "c%d.layout" % len(self.layouts))
            plans.run([plans.tool("vps-layout"), "-q", "--model", self.targs.model, "--parallel", spec,
                       "--gpus-per-node", str(self.targs.gpus_per_node), "-o", path])
            self.layouts[spec] = path
        return self.layouts[spec]

    def plan(self, a, b, lost=()):
        """The staged plan from configuration a to b (lost: world ranks gone),
        or None with vps-plan's or vps-stage's word when it refuses."""
        key = (a, b, tuple(lost))
        if key not in self.plans:
            la, lb = self.layout(a), self.layout(b)
            name = "%s-%s%s" % (os.path.basename(la)[:-7], os.path.basename(lb)[:-7],
                                "-lost" + "-".join(map(str, lost)) if lost else "")
            plan, staged = (os.path.join(self.d, name + x) for x in (".plan", ".staged"))
            cmd = [plans.tool("vps-plan"), "-q", la, lb, "--global-batch", str(self.targs.global_batch), "--micro-batch",
                   str(self.targs.micro_batch), "-o", plan]
            if lost:
                cmd[2:2] = ["--lost", ",".join(map(str, lost))]
            cmd[2:2] = plans.planning_options(self.targs.relay, self.targs.topology)
            for c in (cmd, [plans.tool("vps-stage"), "-q", "--budget", self.args.budget, plan, "-o", staged]):
                r = subprocess.run(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
                if r.returncode:
                    lines = r.stderr.strip().splitlines()
                    return None, lines[-1] if lines else "%s exited with status %d" % (c[0], r.returncode)
            self.plans[key] = staged
        return self.plans[key], None

    def refusal(self, spec):
        """Why the job cannot switch to spec from where it will be, or None:
        its layout (the model, the world), the batch (vps-plan), room for it."""
        try:
            lay = self.vps.layout(self.targs.model, spec, self.targs.gpus_per_node)
        except self.vps.Error as e:
            return str(e)
        if lay.parallel["cp"] != 1:
            return "context parallelism is not implemented by this example"
        if lay.world > self.args.max_nproc:
            return "a world of %d processes; --max-nproc is %d" % (lay.world, self.args.max_nproc)
        a = self.vps.layout(self.targs.model, self.expect[0], self.targs.gpus_per_node)
        why = check_room([a, lay] if self.targs.device == "cpu" else [], max(lay.world, self.expect[1]), 1)
        if why:
            return why
        return self.plan(self.expect[0], spec)[1]

    def scheduled_joins(self):
        """The switches of the static schedule that grow the world (train.py's
        Run.static): K -> the slots of the processes that join."""
        t, joins, world = self.targs, {}, self.args.nproc
        for k, (_, b) in enumerate(plans.switches(t.configs, t.steps, t.switch_every), 1):
            w = self.vps.layout(t.model, t.configs[b], t.gpus_per_node).world
            if w > world:
                joins[k] = list(range(world, w))
            world = w
        return joins

    def start_scheduled(self):
        """The processes of the schedule's next join, once their slots are
        free (the processes that left them have ended): they wait for the
        ask of their switch, holding nothing."""
        if not self.joins:
            return
        k = min(self.joins)
        slots = self.joins[k]
        if any(s in self.trainers for s in slots) or (self.sw and self.sw["k"] >= k):
            return
        del self.joins[k]
        size = max(slots) + 1
        say("switch %d of the schedule grows the job to %d processes: the %d that join start now and wait for it"
            % (k, size, len(slots)))
        for s in slots:
            self.start_trainer(s, size, join=k)
            self.early[s] = k

    # ---- processes ----
    def start_trainer(self, slot, size, join=None):
        log = open(os.path.join(self.d, "train.%d.log" % slot), "a")
        argv = self.argv + (["--join", str(join)] if join else [])
        self.trainers[slot] = spawn(
            [sys.executable, os.path.join(HERE, "train.py")] + argv,
            env=dict(self.env, RANK=str(slot), LOCAL_RANK=str(slot), WORLD_SIZE=str(size)),
            stdout=log, stderr=subprocess.STDOUT)
        self.beats.pop(slot, None)
        self.slots.add(slot)

    def start_execs(self, staged, ranks, world, k, attempt):
        port = str(free_port())
        tail = "" if attempt == 1 else "-%d" % attempt
        for r in ranks:
            log = open(os.path.join(self.d, "exec.%d%s.%d.log" % (k, tail, r)), "w")
            # every registry is made before its executor starts: the bound is for a
            # trainer that dies meanwhile (the watchdog stops that executor sooner)
            self.execs[r] = plans.executor([staged], self.tag + "-%r", r, world, "127.0.0.1:" + port,
                                           self.args.transport, self.args.exec_timeout,
                                           os.path.join(self.d, "report.%d%s.%d.yaml" % (k, tail, r)), log, self.env,
                                           wait=2 * self.exec_grace)
            CHILDREN.add(self.execs[r])
        self.attempt_end = None
        self.sw["logs"] += [os.path.join(self.d, "exec.%d%s.%d.log" % (k, tail, r)) for r in ranks]

    def stop(self):
        """Stop every process: SIGTERM, SIGKILL what is left after 10 s;
        those killed so are named."""
        procs = {p: "process %d" % s for s, p in self.trainers.items()}
        procs.update({p: "executor %d" % r for r, p in self.execs.items()})
        for p in stop_all(list(procs)):
            print("launch.py: %s (pid %d) did not end on SIGTERM within 10 s: killed" % (procs[p], p.pid),
                  file=sys.stderr, flush=True)
        self.trainers, self.execs = {}, {}

    def kill(self, p, what):
        """The watchdog's word: name the process and kill it; the switch
        under way says so when it fails."""
        state = proc_state(p.pid)
        what = what.replace("(pid %d)" % p.pid, "(pid %d%s)" % (p.pid, ", " + state if state else ""))
        say("%s: killed" % what)
        self.killed.add(p.pid)
        if self.sw is not None:
            self.sw.setdefault("killed", []).append(what)
        p.kill()

    # ---- the watchdog ----
    def watch(self):
        now = time.monotonic()
        if now < self.next_watch:
            return
        if self.next_watch and now - self.next_watch > 1.5:
            # the launcher itself did not look (it waited on a process): that
            # time is not the processes' silence
            gap = now - self.next_watch
            self.beats = {s: (n, t + gap, w) for s, (n, t, w) in self.beats.items()}
        self.next_watch = now + 0.5
        for slot, p in list(self.trainers.items()):
            if slot in self.frozen or p.poll() is not None:
                continue
            beat = self.agent.alive(slot)
            if beat is None:
                continue  # not started yet: its peers' rendezvous bounds that
            last = self.beats.get(slot)
            if last is None or last[0] != beat[0]:
                self.beats[slot] = (beat[0], now, beat[2])
                continue
            # stopped (the kernel says so), or stuck: a call that waits for peers
            # holding the interpreter (gloo making a group) gives up within the
            # timeout, so silence past 1.5 times it is no wait
            silent = now - last[1]
            if (silent > self.silence and proc_state(p.pid) == "stopped") or silent > 1.5 * self.targs.timeout:
                self.frozen[slot] = "process %d (pid %d) gave no sign of life for %.0f s while %s" % (
                    slot, p.pid, silent, last[2] or "starting")
                self.kill(p, self.frozen[slot])
        for r, p in list(self.execs.items()):
            if p.poll() is not None or p.pid in self.killed:
                continue
            gone = self.gone_at.get(r) if r not in self.trainers else None
            if proc_state(p.pid) == "stopped":
                stopped = self.stopped_at.setdefault(p.pid, now)
            else:
                self.stopped_at.pop(p.pid, None)  # continued: it counts from 0 again
                stopped = None
            if stopped is not None and now - stopped > self.silence:
                self.kill(p, "executor %d (pid %d) was stopped for %.0f s" % (r, p.pid, now - stopped))
            elif gone is not None and now - gone > self.silence:
                self.kill(p, "executor %d (pid %d) still running %.0f s after its trainer, process %d, ended"
                          % (r, p.pid, now - gone, r))
            elif self.attempt_end is not None and proc_state(p.pid) == "stopped":
                self.kill(p, "executor %d (pid %d) was frozen when another executor of its switch ended" % (r, p.pid))
            elif self.attempt_end is not None and now - self.attempt_end > self.exec_grace:
                self.kill(p, "executor %d (pid %d) had not ended %.0f s after another executor of its switch did"
                          % (r, p.pid, now - self.attempt_end))
        if self.stop_by is not None and now > self.stop_by and (self.trainers or self.execs):
            self.stop_by = None
            left = ", ".join(sorted("process %d" % s for s in self.trainers) +
                             sorted("executor %d" % r for r in self.execs))
            say("the job was told to stop; still running %.0f s later: %s: stopped" % (self.silence, left))
            self.stop()

    # ---- switches ----
    def begin(self, ask):
        """Switch K: its plan, the processes that join, its executors."""
        k, spec, size = ask["switch"], ask["config"], ask["world"]
        if (ask["from_config"], ask["from_world"]) != (self.config, self.size):
            self.fail("switch %d asked from %s on %d processes; the launcher has the job in %s on %d"
                      % (k, ask["from_config"], ask["from_world"], self.config, self.size))
            return
        staged, why = self.plan(self.config, spec)
        sw = dict(k=k, spec=spec, size=size, world=size, attempt=1, abandoned=None, dead={}, logs=[], joiners=[],
                  leavers=[], members=[], lost=[], at=ask["at"], started=False)
        if not staged:
            # the job asked for it (its schedule); the launcher cannot make it
            self.agent.abandon(k, "its plan was refused: %s" % why)
            self.did_not_happen(sw, "its plan was refused: %s" % why)
            return
        a_world = self.vps.layout(self.targs.model, self.config, self.targs.gpus_per_node).world
        tw = max(a_world, size)  # layouts packed from node 0: A's ranks, then the devices that join
        sw.update(world=tw, joiners=list(range(self.size, size)), leavers=list(range(size, self.size)),
                  members=list(range(a_world)), staged=staged)
        self.sw = sw
        grows = "; %d process%s join%s" % (len(sw["joiners"]), "es" if len(sw["joiners"]) > 1 else "",
                                           "" if len(sw["joiners"]) > 1 else "s") if sw["joiners"] else \
            "; %d leave%s" % (len(sw["leavers"]), "" if len(sw["leavers"]) > 1 else "s") if sw["leavers"] else ""
        say("switch %d to %s on %d processes asked for %s: planned%s" % (
            k, spec, size, "at step %d" % sw["at"] if sw["at"] is not None else "as soon as every process is ready",
            grows))
        for s in sw["joiners"]:
            if self.early.pop(s, None) != k:
                self.start_trainer(s, size, join=k)
        self.joins = {j: slots for j, slots in self.joins.items() if j > k}
        dead = self.early_dead.pop(k, None)
        if dead:
            sw["abandoned"] = dead
            self.agent.abandon(k, dead)
            say("switch %d abandoned: %s" % (k, dead))

    def start_switch(self):
        """Switch K's executors, once every process that joins has made its
        registry: an executor meets its peers as soon as it opens its
        registry, and they wait for one another only --exec-timeout."""
        sw = self.sw
        if sw["started"] or sw["abandoned"] or not all(
                os.path.exists("/dev/shm/%s-%d" % (self.tag, s)) for s in sw["joiners"]):
            return
        sw["started"] = True
        self.start_execs(sw["staged"], range(sw["world"]), sw["world"], sw["k"], 1)
        self.agent.ready(sw["k"])
        say("switch %d: its %d executors are up; the job switches when every process is ready"
            % (sw["k"], sw["world"]))

    def watch_abandon(self):
        """The job gave the switch up (its new world could not be made): no rank
        requests it, so its executors wait for nothing; the processes that
        were to join hold nothing and go (at once, or after 5 s)."""
        sw = self.sw
        if not sw["abandoned"]:
            why = self.agent.abandoned(sw["k"])
            if not why:
                return
            sw["abandoned"] = why
            say("switch %d abandoned: %s" % (sw["k"], why))
            for p in self.execs.values():
                p.kill()
        sw.setdefault("gone_by", time.time() + 5)
        if time.time() > sw["gone_by"]:
            for s in sw["joiners"]:
                if s in self.trainers and self.trainers[s].poll() is None:
                    self.trainers[s].kill()

    def end_attempt(self):
        """Every executor of the switch ended: it is done, or it failed and the
        launcher says what the job does."""
        sw, ok = self.sw, all(rc == 0 for rc in self.exec_rcs.values())
        self.exec_rcs, self.attempt_end = {}, None
        if not ok:
            # a trainer its executor found gone is dying: wait until it is reaped
            # (only those: on a loaded machine an executor also names the live
            # trainer it waits for, and waiting 30 s on each of those stalled the job)
            gone = set()
            for path in sw["logs"]:
                gone |= set(int(x) for x in re.findall(r"the trainer \(pid (\d+)\) is gone", open(path).read()))
            for p in self.trainers.values():
                if p.pid in gone:
                    try:
                        p.wait(min(30.0, self.exec_grace))
                    except subprocess.TimeoutExpired:
                        pass
        self.poll_trainers()
        if ok and not sw["abandoned"]:
            self.digests += sum(count(p, "digest: match") for p in sw["logs"])
            self.config, self.size = sw["spec"], sw["size"]
            self.done.append(sw)
            self.sw = None
            say("switch %d done: the job trains in %s on %d processes" % (sw["k"], self.config, self.size))
            return
        k, a = sw["k"], sw["attempt"]
        if sw["size"] == self.size:
            self.sw = None  # in this world the trainers stop on a failed switch: they say why
            return
        # every member of the old world that is gone, whether its executor saw
        # it or not: a retry waits for no process that cannot come
        dead = sorted(s for s in sw["members"] if s not in sw["lost"] and (s in sw["dead"] or s not in self.trainers))
        if sw["abandoned"] or not dead:
            self.agent.verdict(k, a, "old")
            self.did_not_happen(sw, sw["abandoned"] or "its executors failed (%s)" % (
                "; ".join(sw.get("killed", [])) or self.first_error(sw)))
            self.sw = None
            return
        who = "process%s %s" % ("es" if len(dead) > 1 else "", ", ".join(
            "%d%s" % (s, " (frozen, killed)" if s in self.frozen else "") for s in dead))
        stays = [s for s in dead if s not in sw["leavers"]]
        if stays:
            why = "%s, which %s, died during the switch" % (who, "stay" if len(stays) > 1 else "stays")
        else:
            staged, why = self.plan(self.config, sw["spec"], lost=sw["lost"] + dead)
            if staged:
                sw["lost"] += dead
                sw["attempt"] += 1
                sw["dead"] = {}
                self.start_execs(staged, [r for r in range(sw["world"]) if r not in sw["lost"]], sw["world"], k,
                                 sw["attempt"])
                self.agent.verdict(k, a, "retry")
                say("%s, which %s, died during switch %d; its state has replicas: the switch goes on without it "
                    "(vps-plan --lost %s)" % (who, "leave" if len(dead) > 1 else "leaves", k,
                                              ",".join(map(str, sw["lost"]))))
                return
            why = "%s died during the switch and its state has no replica (vps-plan --lost: %s)" % (who, why)
        self.agent.verdict(k, a, "stop: " + why)
        self.failures.append("switch %d to %s stopped the job at step %s: %s; every rank's state is as it was "
                             "before it" % (k, sw["spec"], sw["at"], why))
        say("switch %d failed: %s; the job stops" % (k, why))
        self.stopping = self.crashed = True
        self.stop_by = time.monotonic() + self.silence
        self.sw = None

    def first_error(self, sw):
        for path in sw["logs"]:
            try:
                for line in open(path):
                    if line.startswith("vps-exec:"):
                        return line.strip()
            except OSError:
                pass
        return "no word"

    def did_not_happen(self, sw, why):
        """The job trained on in its world: the switch asked for is a failure
        of the run all the same (exit 1), said by name."""
        self.failures.append("switch %d to %s on %d processes did not happen: %s; the job trained on in %s on %d"
                             % (sw["k"], sw["spec"], sw["size"], why, self.config, self.size))
        self.expect = (self.config, self.size)

    def fail(self, what, slot=None):
        """A process failed outside a switch: the job stops, saying why."""
        self.failures.append(what)
        self.crashed = True
        say("%s: the job stops" % what)
        self.stop()
        path = os.path.join(self.d, "train.%d.log" % slot) if slot is not None else None
        if path and os.path.getsize(path):
            self.failures.append("== %s\n%s" % (path, open(path).read()[-3000:]))

    # ---- the loop ----
    def poll_trainers(self):
        for slot, p in list(self.trainers.items()):
            rc = p.poll()
            if rc is None or slot not in self.trainers:
                continue
            del self.trainers[slot]
            CHILDREN.discard(p)
            self.gone_at[slot] = time.monotonic()
            sw = self.sw
            if sw and slot in sw["joiners"]:
                # its executor waits for a registry that will not come, or is of no use
                e = self.execs.get(slot)
                if e and e.poll() is None:
                    e.kill()
            if rc == 0:
                continue
            what = self.frozen.get(slot) or "process %d exited with status %d" % (slot, rc)
            doing = self.beats.get(slot, (0, 0, "starting"))[2]
            if slot in self.early:
                # started for a switch not yet asked: that switch will not happen
                self.early_dead.setdefault(self.early[slot], "%s before it joined" % what)
                continue
            if sw and slot in sw["joiners"] and not doing.startswith("taking"):
                if not sw["abandoned"]:
                    sw["abandoned"] = "%s before it joined" % what
                    self.agent.abandon(sw["k"], sw["abandoned"])
                    say("switch %d abandoned: %s" % (sw["k"], sw["abandoned"]))
            elif sw and slot in sw["members"] and doing.startswith(("in switch", "waiting for the launcher")):
                sw["dead"][slot] = rc  # the switch fails; end_attempt decides
            elif self.stopping:
                continue  # told to stop: they say why
            else:
                # it died in a collective of its world (a step, the vote on a
                # switch, the first barrier of the new world): the others'
                # cannot complete, nor a switch under way; the job stops whole
                if sw:
                    self.agent.abandon(sw["k"], what)
                    self.sw = None
                self.fail(what if slot in self.frozen else "%s while %s" % (what, doing), slot)

    def read_control(self):
        """The control file's bytes, read whole and as one version, or None
        (absent, unchanged, or written while it was read: read next time)."""
        path = self.args.control
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.refuse_control(("error", e.errno), "cannot be read: %s" % e.strerror)
            return None
        try:
            st = os.fstat(fd)
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if seen == self.control_seen and not self.control_wake:
                return None
            if not stat.S_ISREG(st.st_mode):
                self.refuse_control(seen, "not a regular file")
                return None
            if st.st_size > CONTROL_MAX:
                self.refuse_control(seen, "%s, over the %s a control file may hold" % (size(st.st_size),
                                                                                     size(CONTROL_MAX)))
                return None
            parts = []
            while True:
                b = os.read(fd, CONTROL_MAX + 1 - sum(map(len, parts)))
                if not b:
                    break
                parts.append(b)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            return None  # written as it was read: the whole of it next time
        self.control_wake = False
        self.control_seen = seen
        return b"".join(parts)

    def refuse_control(self, version, why):
        if version != self.control_refused:
            self.control_refused = version
            print("launch.py: %s: %s; the job trains on" % (self.args.control, why), file=sys.stderr, flush=True)

    def poll_control(self):
        """Requests are lines appended to FILE, or FILE replaced (a new file
        renamed over it) by one that keeps every line read so far: a line is
        read once whole (up to its newline), checked, and passed on or
        refused with the reason. A version of FILE that does not keep the
        lines read (rewritten in place, truncated, or replaced by another) is
        refused whole: no line of it is read until it does."""
        if not self.args.control:
            return
        data = self.read_control()
        if data is None:
            return
        if not data.startswith(self.control_text):
            self.refuse_control(self.control_seen, "its first %d line%s, read already, are not as they were (rewritten "
                                "in place, truncated, or replaced by a file that does not keep them): not read; a "
                                "request is a line appended to it, or a new file, keeping those lines, renamed over "
                                "it" % (self.control_lines, "" if self.control_lines == 1 else "s"))
            return
        new = data[len(self.control_text):]
        whole = new[:new.rfind(b"\n") + 1]  # whole lines only
        self.control_text += whole
        for raw in whole.split(b"\n")[:-1]:
            self.control_lines += 1
            self.ask_line(raw)

    def ask_line(self, raw):
        where = "%s: line %d" % (self.args.control, self.control_lines)
        shown = raw[:80].decode("utf-8", "backslashreplace").replace("\0", "\\x00")
        if b"\0" in raw:
            why = "a NUL byte"
        else:
            try:
                line = raw.decode("utf-8")
                why = None
            except UnicodeDecodeError as e:
                why = "bytes that are not UTF-8 text (at %d)" % e.start
        if why:
            print("launch.py: %s: %r: %s: refused; the job trains on" % (where, shown, why), file=sys.stderr,
                  flush=True)
            return
        spec = line.split("#")[0].strip().replace(":", ",")
        if not spec:
            return
        why = self.refusal(spec)
        if why:
            print("launch.py: %s: %s: refused: %s; the job trains on" % (where, spec, why), file=sys.stderr,
                  flush=True)
            return
        n = self.agent.request(spec)
        self.expect = (spec, self.vps.layout(self.targs.model, spec, self.targs.gpus_per_node).world)
        say("%s: %s asked for (request %d)" % (self.args.control, spec, n))

    def run(self):
        self.exec_rcs = {}
        if self.args.control:
            signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "control_wake", True))
        say("%d processes train %s for %d steps%s" % (
            self.args.nproc, self.config, self.targs.steps,
            "; the configurations written to %s are asked of them" % self.args.control if self.args.control else ""))
        for slot in range(self.args.nproc):
            self.start_trainer(slot, self.args.nproc)
        try:
            self.start_scheduled()
            # the schedule's plans while the processes start, not when each switch is asked
            t = self.targs
            for a, b in plans.switches(t.configs, t.steps, t.switch_every):
                self.plan(t.configs[a], t.configs[b])
            self.loop()
        finally:
            self.stop()
            for slot in sorted(self.slots):
                try:
                    self.vps.Registry.unlink("%s-%d" % (self.tag, slot))
                except self.vps.Error as e:
                    print("launch.py: %s" % e, file=sys.stderr)
        return self.failures

    def loop(self):
        while self.trainers or self.execs:
            self.poll_control()
            self.queue += self.agent.asks()
            self.poll_trainers()
            for r, p in list(self.execs.items()):
                rc = p.poll()
                if rc is not None:
                    del self.execs[r]
                    CHILDREN.discard(p)
                    self.exec_rcs[r] = rc
                    if self.attempt_end is None:
                        self.attempt_end = time.monotonic()
            self.watch()
            if self.sw:
                self.watch_abandon()
                self.start_switch()
            if self.sw and not self.execs and self.exec_rcs:
                self.end_attempt()
            elif self.sw and self.sw["abandoned"] and not self.sw["started"] and \
                    not any(s in self.trainers for s in self.sw["joiners"]):
                # abandoned before its executors started: nothing to wait for
                self.did_not_happen(self.sw, self.sw["abandoned"])
                self.sw = None
            if self.sw is None and self.queue and not self.execs:
                self.begin(self.queue.pop(0))
                if self.sw:
                    # its executors now, not a turn of the loop later: the job may wait for them
                    self.start_switch()
            self.start_scheduled()
            time.sleep(0.05)


def report_elastic(args, targs, d, job, static):
    """What an elastic run proved, a line each; returns whether every check held."""
    ok = not job.failures
    log0 = os.path.join(d, "train.0.log")
    moves, worlds = [], [args.nproc]
    rows = [line.rstrip("\n").split("\t") for line in open(os.path.join(d, "switches.tsv"))] \
        if os.path.exists(os.path.join(d, "switches.tsv")) else []
    for r in rows:
        k, step, _, to, w0, w1 = r[0], r[1], r[2], r[3], int(r[4]), int(r[5])
        moves.append("%s%s from step %s" % (to, "" if w0 == w1 else " on %d" % w1, step))
        if w1 != worlds[-1]:
            worlds.append(w1)
    print("launch.py: %s trained for %d steps on %s processes: %s (%d switch%s)" % (
        targs.model, targs.steps, " -> ".join(map(str, worlds)), ", then ".join([targs.configs[0]] + moves),
        len(rows), "" if len(rows) == 1 else "es"))
    for r in rows:
        w0, w1, joined, build, hidden, pause = int(r[4]), int(r[5]), int(r[6]), float(r[7]), float(r[8]), float(r[11])
        if w0 != w1:
            print("launch.py: switch %s, %d -> %d processes (%s): the new world made in %.2f s while the job trained "
                  "on, pause %.2f s: %.0f%% of it hidden" % (r[0], w0, w1, "%d joined" % (w1 - w0) if w1 > w0 else
                                                           "%d left" % (w0 - w1), build, pause,
                                                           100 * hidden / (hidden + pause) if hidden + pause else 100))
    want = sum(sw["world"] - len(sw["lost"]) for sw in job.done)
    print("launch.py: every rank's digest of its state matched across every switch (vps-exec --check): %d of %d"
          % (job.digests, want))
    ok &= job.digests == want
    if targs.check_switch:
        equal = count(log0, "equal bit for bit")
        print("launch.py: the whole state gathered after each switch equal bit for bit to the state before "
              "(--check-switch): %d of %d" % (equal, len(rows)))
        ok &= equal == len(rows) == len(job.done)
    ok &= samples_once(d, targs)
    loss = read_loss(targs.loss_log)
    first, last = min(loss), max(loss)
    print("launch.py: loss %.4g at step %d, %.4g at step %d (%s)" % (loss[first], first, loss[last], last,
                                                                   targs.loss_log))
    if static:
        ok &= compare_static(targs, loss, static)
    for f in job.failures:
        print("launch.py: " + f)
    return ok


def samples_once(d, targs):
    """Every sample read once, and each step read the global batch that
    follows the last (the samples logs of every process)."""
    seen = {}
    for name in os.listdir(d):
        if re.match(r"samples\.\d+\.txt$", name):
            for line in open(os.path.join(d, name)):
                step, first, n = map(int, line.split())
                for i in range(first, first + n):
                    seen.setdefault(i, []).append(step)
    gb, steps = targs.global_batch, targs.steps
    bad = [i for i in range(gb * steps) if len(seen.get(i, ())) != 1 or seen[i][0] != i // gb + 1]
    extra = [i for i in seen if i >= gb * steps]
    ok = not bad and not extra
    print("launch.py: every sample read exactly once, %d a step (the global batch) at every step: %s" % (
        gb, "%d samples in %d steps" % (gb * steps, steps) if ok else "NOT SO: %d wrong, first sample %d" %
        (len(bad) + len(extra), (bad + extra)[0])))
    return ok


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 when every process succeeded and every check held, 1 when "
                                       "not, 2 on bad arguments or without PyTorch.")
    job = a.add_argument_group("the job")
    job.add_argument("--nproc", type=int, required=True,
                     help="processes the job starts with (the first configuration's world, or more: the others "
                          "wait, holding nothing, for a switch that gives them state)")
    job.add_argument("--dir", help="plans, logs, reports and loss.txt go here (default: a new temporary directory)")
    job.add_argument("--budget", default="64MiB", help="vps-stage's staging budget per rank (default 64MiB)")
    job.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc; default tcp)")
    job.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout (default 120)")
    job.add_argument("--control", metavar="FILE",
                     help="the job switches to each configuration written to FILE, a line each, as it comes (read "
                          "when FILE changes, and at once on SIGUSR1); a configuration of another world grows or "
                          "shrinks the job. Append whole lines, or rename a new file that keeps the lines before "
                          "over FILE; one the job cannot take is refused, saying why, and the job trains on")
    job.add_argument("--max-nproc", type=int, default=64, metavar="N",
                     help="the most processes a configuration asked for through --control may grow the job to "
                          "(default 64)")
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
        if w > args.nproc and not layouts[1:]:
            a.error("--configs: %s has a world of %d ranks, --nproc is %d" % (c, w, args.nproc))
    if targs.topology:
        try:
            vps.topology(targs.topology)
        except vps.Error as e:
            a.error("--topology: %s" % e)
    # a configuration of another world than the job's grows or shrinks it
    elastic = bool(args.control) or any(lay.world != args.nproc for lay in layouts)
    if args.control and len(layouts) > 1:
        a.error("--control: the job switches to the configurations FILE asks for; --configs gives the first only")
    every = targs.switch_every
    switches = (targs.steps - 1) // every if every and len(layouts) > 1 else 0
    if targs.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            refuse("--device cuda: no GPU (torch.cuda.is_available() is false under %s)" % sys.executable)
        if (switches or elastic) and args.transport not in ("ipc", "nccl", "auto"):
            refuse("--device cuda: vps-exec moves GPU memory over ipc, nccl or auto, not %s (--transport ipc)"
                   % args.transport)
        if elastic and args.compare_cpu:
            a.error("--compare-cpu: a job whose world changes is not rerun on the CPU")
    elif args.compare_cpu:
        a.error("--compare-cpu compares a --device cuda run with the CPU's")
    if args.max_nproc < args.nproc:
        a.error("--max-nproc %d: below --nproc %d" % (args.max_nproc, args.nproc))
    # the state of a GPU run is not in /dev/shm (only its registries are)
    why = check_room(layouts if targs.device == "cpu" else [], max([args.nproc] + [lay.world for lay in layouts]),
                     switches)
    if why:
        refuse(why)
    if args.dir:
        d = args.dir
    else:
        d = tempfile.mkdtemp(prefix="vps-torch-")
        print("launch.py: files in %s" % d, flush=True)
    lock = hold_dir(d)  # noqa: F841  (held while the launcher lives)
    if not targs.loss_log:
        targs.loss_log = os.path.join(d, "loss.txt")
    # stopped by a signal: every process of the job stops with it (the
    # finally below), and the launcher says so
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _: sys.exit("launch.py: stopped by %s: the job's processes are stopped"
                                                 % signal.Signals(n).name))
    try:
        run(args, targs, d, vps, layouts, elastic, switches)
    finally:
        stop_all(CHILDREN)


def run(args, targs, d, vps, layouts, elastic, switches):
    static = cpu = None
    if elastic:
        job = Elastic(args, targs, d, vps)
        failed = list(job.run())
    else:
        failed, switches = run_job(args, targs, d, vps)
    if not failed and args.compare_cpu:
        cd = os.path.join(d, "cpu")
        cpu = os.path.join(cd, "loss.txt")
        failed, _ = run_job(argparse.Namespace(**dict(vars(args), transport="tcp")),
                            argparse.Namespace(**dict(vars(targs), device="cpu", save_master=None, loss_log=cpu)), cd, vps,
                            "the same run on the CPU (--compare-cpu)")
        failed = ["the CPU run: " + f for f in failed]
    if not failed and args.compare_static:
        sd = os.path.join(d, "static")
        static = os.path.join(sd, "loss.txt")
        failed, _ = run_job(argparse.Namespace(**dict(vars(args), nproc=layouts[0].world)),
                            argparse.Namespace(**dict(vars(targs), configs=targs.configs[:1], switch_every=0,
                                                      check_switch=False, save_master=None, loss_log=static)),
                            sd, vps, "the static run (--compare-static)")
        failed = ["the static run: " + f for f in failed]
    if elastic:
        # what the job did, and a switch that did not happen, said in the report
        ok = not failed
        if os.path.exists(targs.loss_log) and os.path.getsize(targs.loss_log) and not job.crashed:
            ok = report_elastic(args, targs, d, job, static) and ok
        for f in failed:
            if job.crashed or f not in job.failures:
                print("launch.py: " + f, file=sys.stderr)
        sys.exit(0 if ok else 1)
    if failed:
        for f in failed:
            print("launch.py: " + f, file=sys.stderr)
        sys.exit(1)
    if not report(args, targs, d, switches, static, cpu):
        sys.exit(1)


if __name__ == "__main__":
    main()
