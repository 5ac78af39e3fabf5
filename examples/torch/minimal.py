#!/usr/bin/env python3
"""The smallest complete job that vps switches: two processes hold
micro-llama's training state under tp=2, train, switch to pp=2 between two
steps, and train on; a vps-exec beside each rank moves the state, and the
whole state after the switch must equal the state before, bit for bit.

The training stands in for a model's: every step moves each parameter a
fifth of the way to a fixed target (an elementwise loss, so that a rank
updates what it holds under any layout); examples/torch/train.py trains
the real model. From the source tree, after make:

    build/venv/bin/python examples/torch/minimal.py
"""
import multiprocessing
import os
import secrets
import subprocess
import sys
import tempfile

import torch

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(TOP, "python"))  # this tree's module (or the one pip installed)
os.environ["PATH"] += os.pathsep + os.path.join(TOP, "bin")  # the tools, when make install did not put them on PATH
import vps  # noqa: E402

MODEL, FIRST, SECOND, WORLD, STEPS = "micro-llama", "tp=2", "pp=2", 2, 5
model = vps.Model(MODEL)


def values(tid, seed):  # a whole logical tensor of the model, the same in every process
    return torch.randn(model.tensor_shape(tid), generator=torch.Generator().manual_seed(seed * 1000 + tid))


def train(state):
    for r in state.view.regions_of(vps.PARAM):  # what the rank holds of each parameter, where in which buffer
        buf, at = state.buffers[r.buffer], state.index(r)
        goal = values(r.tensor, 0)[tuple(slice(lo, hi) for lo, hi in zip(r.lo, r.hi))]
        buf[at] = (buf[at].float() + 0.2 * (goal - buf[at].float())).to(buf.dtype)


def rank(r, registry):  # one process of the job: rank r
    first, second = vps.layout(MODEL, FIRST, WORLD), vps.layout(MODEL, SECOND, WORLD)
    with vps.Registry(registry % r, first, r) as reg:  # where vps-exec finds this rank's buffers
        state = vps.State.allocate(reg, first, r)
        state.load(lambda tid, st: values(tid, 1 + st))  # every state starts random
        for _ in range(STEPS):
            train(state)
        before = [(g, v.clone()) for g, v in state.pieces()]
        state, carried = vps.switch(reg, state, second, r, training=vps.Training(step=STEPS))
        after = [(g, v.clone()) for g, v in state.pieces()]
        for _ in range(STEPS):
            train(state)
        return before, after, [(g, v.clone()) for g, v in state.pieces()], carried.step


def loss(full):  # the mean squared distance of the parameters to their targets
    d = [(w.float() - values(tid, 0)).square() for (tid, st), w in full.items() if st == vps.PARAM]
    return sum(x.sum().item() for x in d) / sum(x.numel() for x in d)


def main():
    d = tempfile.mkdtemp(prefix="vps-minimal-")
    at = lambda name: os.path.join(d, name)  # noqa: E731
    for spec, name in ((FIRST, "a.layout"), (SECOND, "b.layout")):  # the plan of the switch, by vps's tools
        subprocess.run(["vps-layout", "-q", "--model", MODEL, "--parallel", spec, "--gpus-per-node", str(WORLD),
                        "-o", at(name)], check=True)
    subprocess.run(["vps-plan", "-q", at("a.layout"), at("b.layout"), "-o", at("ab.plan")], check=True)
    subprocess.run(["vps-stage", "-q", "--budget", "64MiB", at("ab.plan"), "-o", at("ab.staged")], check=True)
    port = vps.free_port()  # for the executors' rendezvous
    env, registry = dict(os.environ, VPS_TOKEN=secrets.token_hex(16)), "vps-minimal-%d-%%d" % os.getpid()
    execs = [subprocess.Popen(["vps-exec", "--registry", registry % r, "--rank", str(r), "--world", str(WORLD),
                               "--master", "127.0.0.1:%d" % port, "--wait", "--check", at("ab.staged")],
                              env=env, stdout=open(at("exec.%d.log" % r), "w"), stderr=subprocess.STDOUT)
             for r in range(WORLD)]
    try:
        with multiprocessing.get_context("spawn").Pool(WORLD) as pool:  # the ranks, a process each
            ranks = pool.starmap(rank, [(r, registry) for r in range(WORLD)])
    except BaseException:
        for e in execs:
            e.kill()
        raise
    for e in execs:
        e.wait()
    full = [vps.assemble(model, [p for rk in ranks for p in rk[i]]) for i in range(3)]
    same = full[0].keys() == full[1].keys() and all(torch.equal(full[0][k], full[1][k]) for k in full[0])
    print("minimal.py: %d ranks of %s: loss %.4f after %d steps in %s; switched to %s, step %d carried, the whole "
          "state %s; loss %.4f after %d more steps" % (WORLD, MODEL, loss(full[0]), STEPS, FIRST, SECOND,
                                                     ranks[0][3], "equal bit for bit" if same else "NOT the same",
                                                     loss(full[2]), STEPS))
    failed = [r for r, e in enumerate(execs) if e.returncode]
    print("minimal.py: vps-exec of rank %s failed" % failed if failed else "minimal.py: the executors' logs: %s" % d)
    sys.exit(0 if same and not failed else 1)

if __name__ == "__main__":
    main()
