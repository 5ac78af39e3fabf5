"""What the switching checks of the frameworks share (tests/megatron and
tests/torch check_switch.py): vps's tools, the executors started beside the
ranks and stopped after, the corpus both jobs train on, the scratch
directory and the registries a stopped run leaves, and the refusals a Job
must say. The caller has put TOP/python on sys.path."""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import torch

import vps

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ME = "check_switch.py"


def tool(name):
    path = os.path.join(os.environ.get("VPS_BIN", os.path.join(TOP, "bin")), name)
    if not os.access(path, os.X_OK):
        sys.exit("%s: %s: not built (make)" % (ME, path))
    return path


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


# ---- the data: phrases of a fixed phrase book, sample i the same in every run ----
class Corpus:
    def __init__(self, vocab, seq, seed, phrases=64, length=8):
        g = torch.Generator().manual_seed(seed)
        self.book = torch.randint(vocab, (phrases, length), generator=g)
        self.seq, self.seed = seq, seed

    def sample(self, i):
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        n = -(-(self.seq + 1) // self.book.shape[1])
        return self.book[torch.randint(self.book.shape[0], (n,), generator=g)].reshape(-1)[:self.seq + 1]


# ---- the executors ----
def start_executors(tmp, staged, world, registry, env, first=0):
    """One vps-exec per rank of `world` over tcp, serving the `staged` plans
    in order, each checking the state it moved; logs tmp/exec.N.log and
    reports tmp/report.N.yaml, N counting from `first`."""
    port = run([os.path.join(TOP, "scripts", "free-port.sh")]).strip()
    procs = []
    for r in range(world):
        with open(os.path.join(tmp, "exec.%d.log" % (first + r)), "w") as log:
            procs.append(subprocess.Popen(
                [tool("vps-exec"), "--registry", registry.replace("%d", "%r"), "--rank", str(r),
                 "--world", str(world), "--master", "127.0.0.1:" + port, "--transport", "tcp", "--wait", "--check",
                 "--timeout", "120", "--report", os.path.join(tmp, "report.%d.yaml" % (first + r))]
                + (["--serve"] if len(staged) > 1 else []) + staged, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def stop(procs):
    """The executors still running stopped (SIGTERM), and every one waited for."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait()


# ---- the run's scratch ----
@contextlib.contextmanager
def workspace(keep, prefix, registry, world):
    """The run's directory (keep, or a temporary one removed after); after
    the run, the registries `registry % rank` (rank < world) and that of
    the refusals removed: a process stopped before its registry closed
    leaves it behind."""
    tmp = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(tmp, exist_ok=True)
    try:
        yield tmp
    finally:
        for name in [registry % r for r in range(world)] + [registry.replace("%d", "refusals")]:
            try:
                vps.Registry.unlink(name)
            except vps.Error as e:
                print("%s: %s" % (ME, e), file=sys.stderr)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def check_refusals(said, cases, verbose):
    """Exit 1 unless the answers `said` start as the cases [(what, code,
    text)] say, one for each; with verbose, a line per answer."""
    if len(said) != len(cases):
        sys.exit("%s: refusals: %d answers for %d cases: %s" % (ME, len(said), len(cases), said))
    for line, (what, code, text) in zip(said, cases):
        if not line.startswith("%s: %s: %s" % (what, code, text)):
            sys.exit("%s: a Job given %s said: %s; expected %s: %s..." % (ME, what, line, code, text))
        if verbose:
            print("refused: %s" % line)
