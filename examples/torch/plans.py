"""The staged plans of a run's switches, made with vps's tools, and the
executor beside a rank: what launch.py does for the whole job, and what
train.py --exec does for its own rank under torchrun."""
import ctypes
import os
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child of a fork only calls it
PR_SET_PDEATHSIG = 1


def dies_with_me():
    """A preexec_fn for Popen: the child is killed (SIGKILL) when the process
    that starts it ends, however it ends, SIGKILL included
    (PR_SET_PDEATHSIG): no process of a job outlives its launcher. Popen must
    be called from the main thread (the signal follows the thread that
    forked)."""
    parent = os.getpid()

    def arm():
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it ended before the child was armed
            os._exit(1)
    return arm


def tool(name):
    built = os.path.join(os.environ.get("VPS_BIN", os.path.join(TOP, "bin")), name)
    if os.path.exists(built):
        return built
    found = shutil.which(name)
    if not found:
        sys.exit("%s: %s not found: run make, or put vps's tools on PATH" % (os.path.basename(sys.argv[0]), name))
    return found


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.exit("%s: %s failed (%d): %s" % (os.path.basename(sys.argv[0]), " ".join(cmd), r.returncode,
                                             r.stderr.strip()))
    return r.stdout


def switches(configs, steps, every):
    """(from, to) configuration indices of the run's switches, in order:
    every `every` steps to the next configuration, round and round."""
    n = (steps - 1) // every if every and len(configs) > 1 else 0
    return [(k % len(configs), (k + 1) % len(configs)) for k in range(n)]


def planning_options(relay, topology):
    """vps-plan's options for how a switch is weighed: the same for every
    plan of a job, so that the plans every rank makes alone agree."""
    return ["--relay=" + relay] + (["--topology", topology] if topology else [])


def make(d, model, configs, steps, every, gpus_per_node, global_batch, micro_batch, budget, rank=None, relay="auto",
         topology=None):
    """The staged plans of the run's switches in order, made in directory d
    (one file per distinct pair): the whole world's, or with `rank` that
    world rank's own part (vps-plan --rank), which its vps-exec takes as
    well; every rank can then make its own, on its own node. relay and
    topology are vps-plan's --relay and --topology (planning_options)."""
    os.makedirs(d, exist_ok=True)
    gpn = str(gpus_per_node)
    layouts = [os.path.join(d, "c%d.layout" % i) for i in range(len(configs))]
    for c, path in zip(configs, layouts):
        run([tool("vps-layout"), "-q", "--model", model, "--parallel", c, "--gpus-per-node", gpn, "-o", path])
    made, order = {}, []
    part = ([] if rank is None else ["--rank", str(rank)]) + planning_options(relay, topology)
    for a, b in switches(configs, steps, every):
        if (a, b) not in made:
            plan = os.path.join(d, "c%d-c%d.plan" % (a, b))
            staged = os.path.join(d, "c%d-c%d.staged" % (a, b))
            run([tool("vps-plan"), "-q"] + part + [layouts[a], layouts[b], "--global-batch", str(global_batch),
                                                   "--micro-batch", str(micro_batch), "-o", plan])
            run([tool("vps-stage"), "-q", "--budget", budget, plan, "-o", staged])
            made[(a, b)] = staged
        order.append(made[(a, b)])
    return order


def executor(plans, registry, rank, world, master, transport, timeout, report, log, env=None, wait=None):
    """Start one rank's vps-exec, given the staged plans in the order the
    run switches (--serve runs them one after the other); it dies with the
    process that starts it. wait: seconds its registry may take to appear
    (--wait=S; None: as long as it takes, for a starter that stops it when
    its trainer is gone)."""
    serve = ["--serve"] if len(plans) > 1 else []
    return subprocess.Popen(
        [tool("vps-exec"), "--registry", registry, "--rank", str(rank), "--world", str(world), "--master", master,
         "--transport", transport, "--wait" if wait is None else "--wait=%g" % wait, "--check", "--timeout",
         str(timeout), "--report", report] + serve + plans, env=env, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=dies_with_me())
