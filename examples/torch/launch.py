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
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))


def tool(name):
    built = os.path.join(os.environ.get("VPS_BIN", os.path.join(TOP, "bin")), name)
    if os.path.exists(built):
        return built
    found = shutil.which(name)
    if not found:
        sys.exit("launch.py: %s not found: run make, or put vps's tools on PATH" % name)
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.exit("launch.py: %s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


def plan_switches(args, configs, steps, every):
    """The staged plans of the run's switches, in order (one file per distinct pair)."""
    n_switch = (steps - 1) // every if every and len(configs) > 1 else 0
    made, order = {}, []
    gpn = str(args.gpus_per_node)
    for i, c in enumerate(configs):
        run([tool("vps-layout"), "--model", args.model, "--parallel", c, "--gpus-per-node", gpn,
             "-o", os.path.join(args.dir, "c%d.layout" % i)])
    for k in range(n_switch):
        a, b = k % len(configs), (k + 1) % len(configs)
        if (a, b) not in made:
            plan = os.path.join(args.dir, "c%d-c%d.plan" % (a, b))
            staged = os.path.join(args.dir, "c%d-c%d.staged" % (a, b))
            run([tool("vps-plan"), os.path.join(args.dir, "c%d.layout" % a), os.path.join(args.dir, "c%d.layout" % b),
                 "--global-batch", str(args.global_batch), "--micro-batch", str(args.micro_batch), "-o", plan])
            run([tool("vps-stage"), "--budget", args.budget, plan, "-o", staged])
            made[(a, b)] = staged
        order.append(made[(a, b)])
    return order


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True)
    a.add_argument("--nproc", type=int, required=True, help="ranks (every configuration's world)")
    a.add_argument("--dir", required=True, help="plans, logs and reports go here")
    a.add_argument("--budget", default="64MiB", help="vps-stage's staging budget per rank")
    a.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc)")
    a.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout")
    args, rest = a.parse_known_args()
    # the trainer's options that the plans depend on, read as it reads them
    sys.path.insert(0, HERE)
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
    plans = plan_switches(args, targs.configs, targs.steps, targs.switch_every)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.nproc),
               VPS_CONFIG_PATH=os.environ.get("VPS_CONFIG_PATH", os.path.join(TOP, "configs")))
    if plans and "VPS_TOKEN" not in env:
        env["VPS_TOKEN"] = run([tool("vps-exec"), "--new-token"]).strip()
    tag = "vps-torch-%d" % os.getpid()
    procs = []
    for r in range(args.nproc):
        log = open(os.path.join(args.dir, "train.%d.log" % r), "w")
        procs.append(("trainer %d" % r, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "train.py"), "--registry", tag + "-%r"] + rest,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT)))
    if plans:
        port = str(free_port())
        serve = ["--serve"] if len(plans) > 1 else []
        for r in range(args.nproc):
            log = open(os.path.join(args.dir, "exec.%d.log" % r), "w")
            procs.append(("executor %d" % r, subprocess.Popen(
                [tool("vps-exec"), "--registry", tag + "-%r", "--rank", str(r), "--world", str(args.nproc),
                 "--master", "127.0.0.1:" + port, "--transport", args.transport, "--wait", "--check",
                 "--timeout", args.exec_timeout, "--report", os.path.join(args.dir, "report.%d.yaml" % r)]
                + serve + plans, env=env, stdout=log, stderr=subprocess.STDOUT)))
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
