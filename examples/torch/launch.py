#!/usr/bin/env python3
"""Launch a PyTorch training job that vps switches between parallel
configurations: one train.py per rank (torch.distributed over gloo), and,
when the run switches, one vps-exec(1) beside each, given the staged plans of
the switches in the order the run makes them.

    launch.py --nproc 4 --configs tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2 \\
              --steps 40 --switch-every 10 --dir run/ [train.py options]

Plans are made with vps-layout, vps-plan and vps-stage into --dir, which
also gets each rank's logs and vps-exec reports. Exits 0 when every process
did."""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import plans  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    a.add_argument("--nproc", type=int, required=True, help="ranks (every configuration's world)")
    a.add_argument("--dir", required=True, help="plans, logs and reports go here")
    a.add_argument("--budget", default="64MiB", help="vps-stage's staging budget per rank")
    a.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc)")
    a.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout")
    args, rest = a.parse_known_args()
    # the trainer's options that the plans depend on, read as it reads them
    import train
    targs = train.parse_args(rest)
    for k in ("model", "gpus_per_node", "global_batch", "micro_batch"):
        setattr(args, k, getattr(targs, k))
    sys.path.insert(0, os.path.join(TOP, "python"))
    import vps
    for c in targs.configs:
        try:
            lay = vps.layout(targs.model, c, targs.gpus_per_node)
        except vps.Error as e:
            a.error("--configs: %s: %s" % (c, e))
        w = lay.world
        if lay.parallel["cp"] != 1:
            a.error("--configs: %s: context parallelism is not implemented by this example (cp=%d)"
                    % (c, lay.parallel["cp"]))
        if w != args.nproc:
            a.error("--configs: %s has a world of %d ranks, --nproc is %d" % (c, w, args.nproc))
    os.makedirs(args.dir, exist_ok=True)
    if targs.exec_dir:
        a.error("--exec is for torchrun, which starts only the ranks; launch.py starts the executors itself")
    staged = plans.make(args.dir, args.model, targs.configs, targs.steps, targs.switch_every, args.gpus_per_node,
                        args.global_batch, args.micro_batch, args.budget)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.nproc),
               VPS_CONFIG_PATH=os.environ.get("VPS_CONFIG_PATH", os.path.join(TOP, "configs")))
    if staged and "VPS_TOKEN" not in env:
        env["VPS_TOKEN"] = plans.run([plans.tool("vps-exec"), "--new-token"]).strip()
    tag = "vps-torch-%d" % os.getpid()
    procs = []
    for r in range(args.nproc):
        log = open(os.path.join(args.dir, "train.%d.log" % r), "w")
        procs.append(("trainer %d" % r, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "train.py"), "--registry", tag + "-%r"] + rest,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT)))
    if staged:
        port = str(free_port())
        for r in range(args.nproc):
            log = open(os.path.join(args.dir, "exec.%d.log" % r), "w")
            procs.append(("executor %d" % r, plans.executor(
                staged, tag + "-%r", r, args.nproc, "127.0.0.1:" + port, args.transport, args.exec_timeout,
                os.path.join(args.dir, "report.%d.yaml" % r), log, env)))
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
            # one rank gone takes the job with it: stop the rest rather than hang
            for _, p in procs:
                p.send_signal(signal.SIGTERM)
            for _, p in procs:
                p.wait()
            procs = []
        time.sleep(0.05)
    # a rank killed before its registry closed leaves it: remove what is stale
    for r in range(args.nproc):
        try:
            vps.Registry.unlink("%s-%d" % (tag, r))
        except vps.Error as e:
            print("launch.py: %s" % e, file=sys.stderr)
    for f in failed:
        print("launch.py: " + f, file=sys.stderr)
    if failed:
        for r in range(args.nproc):
            for kind in ("train", "exec"):
                path = os.path.join(args.dir, "%s.%d.log" % (kind, r))
                if os.path.exists(path) and os.path.getsize(path):
                    print("== %s" % path, file=sys.stderr)
                    print(open(path).read()[-3000:], file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
