"""The options of one training rank (train.py), shared with launch.py: its
-h lists them, and it checks them before anything starts. No PyTorch here,
so that launch.py -h and its checks work where PyTorch is missing."""
import os


def add_training(a):
    """Add train.py's options to the argparse parser (or group) a."""
    a.add_argument("--model", default="tiny-llama", help="a model of configs/models (default tiny-llama)")
    a.add_argument("--configs", required=True,
                   help="parallel configurations, comma-separated, in the order the run switches through them; "
                        "each a name of configs/parallel or a spec with ':' for ',' (tp=2:pp=2:zero=1)")
    a.add_argument("--gpus-per-node", type=int, default=8, help="devices a node has in the layouts (default 8)")
    a.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    a.add_argument("--switch-every", type=int, default=0, help="switch to the next configuration every K steps")
    a.add_argument("--global-batch", type=int, default=8, help="samples a step (default 8)")
    a.add_argument("--micro-batch", type=int, default=1, help="samples a micro-batch (default 1)")
    a.add_argument("--seq", type=int, default=32, help="tokens a sample (default 32)")
    a.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    a.add_argument("--warmup", type=int, default=10, help="steps of linear learning-rate warm-up (default 10)")
    a.add_argument("--seed", type=int, default=1234, help="model and corpus seed (default 1234)")
    a.add_argument("--registry", help="the rank's registry name, %%r the rank (default vps-torch-%%r; under "
                                      "torchrun vps-torch-RUN-%%r, RUN its TORCHELASTIC_RUN_ID)")
    a.add_argument("--timeout", type=float, default=300.0, help="seconds a switch may take (default 300)")
    a.add_argument("--loss-log", help="rank 0 writes 'STEP LOSS CONFIG' lines here")
    a.add_argument("--check-switch", action="store_true",
                   help="gather the whole state before and after each switch and compare them bit for bit")
    a.add_argument("--save-master", help="rank 0 saves the gathered fp32 master weights here at the end")
    a.add_argument("--sample-log", help="each data-parallel replica's first rank writes 'STEP FIRST COUNT' here for "
                                        "every micro-batch it reads, %%r its process")
    a.add_argument("--switch-log", help="rank 0 writes a line per switch here: what moved, the time the new world "
                                        "took to build while the job trained, the pause")
    a.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the state and the compute live: cpu (default; the state in /dev/shm) or cuda (GPU "
                        "memory from PyTorch's allocator, registered by device pointer; every rank on the GPU of "
                        "its local rank modulo the GPUs, communication through the host over gloo)")
    a.add_argument("--relay", nargs="?", const="always", default="auto", choices=("never", "auto", "always"),
                   help="where the joining ranks of a switch pass on to each other what a holder sent them once "
                        "(vps-plan --relay=MODE): auto (the default) where that wins, always (--relay alone), never")
    a.add_argument("--no-relay", dest="relay", action="store_const", const="never",
                   help="--relay never: the plans without relays")
    a.add_argument("--topology", metavar="T",
                   help="plan every switch for the time on topology T, a name of configs/topologies or a file "
                        "(vps-plan --topology): relays chosen by its links, and ranks whose NICs idle carry part "
                        "of what a node-mate takes in (transit); default: weighed in bytes, no transit")


# every training option, with its argparse destination and whether it is a flag
OPTIONS = [("--model", "model", False), ("--configs", "configs", False), ("--gpus-per-node", "gpus_per_node", False),
           ("--steps", "steps", False), ("--switch-every", "switch_every", False),
           ("--global-batch", "global_batch", False), ("--micro-batch", "micro_batch", False), ("--seq", "seq", False),
           ("--lr", "lr", False), ("--warmup", "warmup", False), ("--seed", "seed", False),
           ("--registry", "registry", False), ("--timeout", "timeout", False), ("--loss-log", "loss_log", False),
           ("--check-switch", "check_switch", True), ("--save-master", "save_master", False),
           ("--sample-log", "sample_log", False), ("--switch-log", "switch_log", False),
           ("--device", "device", False), ("--relay", "relay", False),
           ("--topology", "topology", False)]


def finish(a, args):
    """Check what argparse cannot, and split --configs into specs."""
    if args.registry is None:
        run = os.environ.get("TORCHELASTIC_RUN_ID")
        args.registry = "vps-torch-%s%%r" % (run + "-" if run else "")
    if isinstance(args.configs, str):
        args.configs = [c.replace(":", ",") for c in args.configs.split(",")]
    if args.switch_every <= 0 and len(args.configs) > 1:
        a.error("several --configs need --switch-every")
    for name in ("steps", "global_batch", "micro_batch", "seq"):
        if getattr(args, name) < 1:
            a.error("--%s: at least 1" % name.replace("_", "-"))
    return args


def to_argv(args, **change):
    """train.py's command-line arguments for args, with `change` applied
    (dest=value; None or False leaves an option out)."""
    out = []
    for flag, dest, is_flag in OPTIONS:
        v = change[dest] if dest in change else getattr(args, dest)
        if v is None or v is False:
            continue
        if is_flag:
            out.append(flag)
        else:
            out += [flag, ",".join(c.replace(",", ":") for c in v) if dest == "configs" else str(v)]
    return out
