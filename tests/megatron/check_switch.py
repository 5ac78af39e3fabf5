"""Megatron-Core jobs switched by vps (make check-megatron).

megatron-core trains two small models on the CPU, a forked process per rank
over gloo, as Megatron-LM's training loop does: Megatron's GPTModel in
Float16Module and DistributedDataParallel, get_megatron_optimizer's
DistributedOptimizer over AdamW, the OptimizerParamScheduler, and the
forward-backward schedule of the configuration (pipelined with PP), with the
CPU shims of mcore.py. vps.megatron makes each job switchable; one vps-exec
per rank, started beside the ranks, moves the state through the switches

    micro-gpt (learned positions, LayerNorm, biases, tied embeddings):
    tp=2,dp=2,zero=1 -> dp=4,zero=1 -> tp=2,dp=2,zero=1 -> tp=2,pp=2,zero=1
        -> pp=2,vpp=2,dp=2,zero=1 -> tp=2,dp=2,zero=1
    micro-moe (DeepSeek-V3's shape: routed experts with the routers' expert
    bias, a shared expert, SwiGLU, rotary positions):
    ep=2,dp=4,zero=1 -> tp=2,ep=2,dp=2,zero=1 -> ep=4,dp=4,zero=1
        -> pp=2,ep=2,dp=2,zero=1 -> ep=2,dp=4,zero=1

(TP, DP and its ZeRO-1 shards, PP, virtual chunks, EP and the expert TP
and DP all change), each between two steps, every --every steps; then the
other optimizers Megatron-Core builds, shorter (more with --full):

    micro-moe, Muon as Megatron's layer-wise distributed optimizer (each
    2-D weight whole on one DP rank, Adam the scalar optimizer under
    ZeRO-1): ep=2,dp=4 -> tp=2,ep=2,dp=2 -> pp=2,ep=2,dp=2 -> ep=4,dp=4
    micro-gpt, SGD with momentum (Megatron's Float16Optimizer, zero=0):
    tp=2,dp=2 -> pp=2,dp=2
    micro-gpt, Lion as the layer-wise optimizer: tp=2,dp=2 -> pp=2,dp=2

(--full: each a switch or two more, and Muon with Lion the scalar
optimizer). Each next configuration is made ready while the job trains
(Job.prepare, as soon as the switch before is done), so that the switch's
pause holds the transfer and the hand-over. Before and after each switch
every rank's whole state is gathered in Megatron's model space (shards()):
the model's own sharded state dict (the expert bias among it, which
Megatron updates every step), and the optimizer's pieces through its own
accessors (bf16 parameters, fp32 main parameters, exp_avg, exp_avg_sq,
momentum_buffer, Adam's step), and the two must be equal bit for bit,
replicas (the tied embeddings' copy on the last stage) included; the
iteration, consumed samples and scheduler position must come across; every
rank's Megatron groups must hold the ranks the layout gives it, and the
model reduce over the installed ones; the groups cache (three
configurations kept here) must make, reuse and evict what its policy says.
A static run stays in the first configuration on the same batches: up to
the first switch the two runs' losses must be equal bit for bit (vps's
buffers under Megatron's tensors change nothing), and after it within 1e-3
(relative) of each other at every step, the bound of
scripts/convergence.sh.

Each switch's pause (from the last rank calling Job.switch to the last
returning) is broken down from the Job's clocks and the executors' reports
(breakdown()); the summary line ends with `pause at most R x the transfer`,
R the largest over the switches of the pause over the slowest rank's
vps-exec pause (scripts/bench/megatron_pause.sh tabulates them).

    check_switch.py [-v] [--steps N] [--every K] [--model NAME]... [--optimizer NAME]...
                    [--full] [--keep DIR] [--no-prepare] [--pauses FILE]

Prints a line per switch and step with -v, then one summary line for Adam's
jobs and one per other optimizer; exit 1 naming what differs, 2 on bad
arguments.
"""
import argparse
import copy
import json
import os
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))


class Run:
    """A job the check trains and switches: its model, the parallel
    configurations it visits in order (the optimizer is part of them), and
    its steps and switch interval (None: --steps and --every's); full, the
    same under --full; quick=False, a job of --full only."""

    def __init__(self, name, configs, steps=None, every=None, full=None, quick=True):
        self.name, self.configs, self.steps, self.every = name, configs, steps, every
        self.full, self.quick = full, quick
        self.model = os.path.join(HERE, "models", name + ".yaml")
        spec = dict(kv.split("=", 1) for kv in configs[0].split(","))
        self.optimizer, scalar = spec.get("optimizer", "adam"), spec.get("scalar", "adam")
        # the summary line it is part of (OPTIMIZER_LINES): its optimizer's, or the offloaded one's
        self.line = "offload" if "offload" in spec else self.optimizer
        layer_wise = self.optimizer in ("muon", "lion") and spec["zero"] != "0"
        # how Megatron runs the optimizer, in the summary line (Adam's jobs: the DistributedOptimizer, said above)
        self.what = ("Megatron's HybridDeviceOptimizer (optimizer_cpu_offload)" if "offload" in spec else "") \
            if self.optimizer == "adam" else "Megatron's Float16Optimizer (zero=0)" \
            if self.optimizer == "sgd" else "%s, %s the scalar optimizer" % (
                "the layer-wise distributed optimizer" if layer_wise else "Float16Optimizers (zero=0)",
                scalar.capitalize())
        shown = [kv for kv in ("optimizer", "scalar") if kv in spec] + ([] if layer_wise or self.optimizer == "sgd"
                                                                         else ["zero"])
        self.label = name if self.optimizer == "adam" and "offload" not in spec else " ".join(
            [name] + ["%s=%s" % (k, spec[k]) for k in shown + (["offload"] if "offload" in spec else [])])

    def resolved(self, args):
        """(configurations, steps, every) of this run under the arguments."""
        configs, steps, every = (self.full or (self.configs, self.steps, self.every)) if args.full else \
            (self.configs, self.steps, self.every)
        return configs, args.steps or steps or 18, args.every or every or 3


RUNS = [
    Run("micro-gpt", ["tp=2,dp=2,zero=1", "dp=4,zero=1", "tp=2,dp=2,zero=1", "tp=2,pp=2,zero=1",
                      "pp=2,vpp=2,dp=2,zero=1", "tp=2,dp=2,zero=1"]),
    Run("micro-moe", ["ep=2,dp=4,zero=1", "tp=2,ep=2,dp=2,zero=1", "ep=4,dp=4,zero=1", "pp=2,ep=2,dp=2,zero=1",
                      "ep=2,dp=4,zero=1"]),
    # the richest optimizer that builds on the CPU: Muon as Megatron's layer-wise distributed optimizer
    # (each 2-D weight whole on one DP rank, experts over expert DP), Adam the scalar one (ZeRO-1), the
    # routers' expert bias; EP, TP, PP and DP change
    Run("micro-moe", ["ep=2,dp=4,zero=1,optimizer=muon", "tp=2,ep=2,dp=2,zero=1,optimizer=muon",
                      "pp=2,ep=2,dp=2,zero=1,optimizer=muon", "ep=4,dp=4,zero=1,optimizer=muon"], 7, 2,
        full=(["ep=2,dp=4,zero=1,optimizer=muon", "tp=2,ep=2,dp=2,zero=1,optimizer=muon",
               "pp=2,ep=2,dp=2,zero=1,optimizer=muon", "ep=4,dp=4,zero=1,optimizer=muon",
               "ep=2,dp=4,zero=1,optimizer=muon"], 15, 3)),
    # SGD with momentum: Megatron's Float16Optimizer (zero=0), every state whole on each DP rank
    Run("micro-gpt", ["tp=2,dp=2,zero=0,optimizer=sgd", "pp=2,dp=2,zero=0,optimizer=sgd"], 4, 2,
        full=(["tp=2,dp=2,zero=0,optimizer=sgd", "pp=2,dp=2,zero=0,optimizer=sgd", "dp=4,zero=0,optimizer=sgd",
               "tp=2,pp=2,zero=0,optimizer=sgd"], 12, 3)),
    # Lion as the layer-wise optimizer (Adam the scalar one): its exp_avg moves with each matrix's owner
    # Adam with its states offloaded (Megatron's HybridDeviceOptimizer, on a CPU as it splits them on a GPU):
    # each shard's host part and GPU part move as TP, DP and the fraction change
    Run("micro-gpt", ["tp=2,dp=2,zero=1,offload=0.5", "dp=4,zero=1,offload=0.3"], 4, 2,
        full=(["tp=2,dp=2,zero=1,offload=0.5", "dp=4,zero=1,offload=0.3", "pp=2,dp=2,zero=1,offload=1",
               "tp=2,dp=2,zero=1,offload=0.5"], 12, 3)),
    Run("micro-gpt", ["tp=2,dp=2,zero=1,optimizer=lion", "pp=2,dp=2,zero=1,optimizer=lion"], 4, 2,
        full=(["tp=2,dp=2,zero=1,optimizer=lion", "pp=2,dp=2,zero=1,optimizer=lion", "dp=4,zero=1,optimizer=lion",
               "tp=2,pp=2,zero=1,optimizer=lion"], 12, 3)),
    # --full only: Muon with Lion the scalar optimizer (--muon-scalar-optimizer lion: its exp_avg under ZeRO-1
    # ranges), and Muon without the distributed optimizer (Float16Optimizers over Muon and Adam)
    Run("micro-gpt", ["tp=2,dp=2,zero=1,optimizer=muon,scalar=lion", "pp=2,dp=2,zero=1,optimizer=muon,scalar=lion",
                      "dp=4,zero=1,optimizer=muon,scalar=lion"], 7, 3, quick=False),
    Run("micro-gpt", ["tp=2,dp=2,zero=0,optimizer=muon", "pp=2,dp=2,zero=0,optimizer=muon",
                      "dp=4,zero=0,optimizer=muon"], 9, 3, quick=False),
]
MODEL = RUNS[0].model  # the refusals' job
WORLD = 4
# seconds a failed run waits for the executors to exit, to name one that
# failed as its cause (an executor that stops a switch exits right after)
EXECUTOR_EXIT = 10

# how the line of each optimizer's jobs starts (Adam's, the first, as it always did)
OPTIMIZER_LINES = {"adam": "", "muon": "Muon: ", "sgd": "SGD with momentum: ", "lion": "Lion: ",
                   "offload": "Adam offloaded to the host: "}


def arguments():
    """The command line, checked before torch and Megatron-Core are imported (seconds): bad
    arguments exit 2 at once."""
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("-v", "--verbose", action="store_true")
    a.add_argument("--steps", type=int, help="train N steps (by default each job's: 18 for Adam's)")
    a.add_argument("--every", type=int, help="switch every K steps (by default each job's: 3 for Adam's)")
    a.add_argument("--keep", help="keep the plans, logs and reports in this directory")
    a.add_argument("--timeout", type=float, default=600)
    a.add_argument("--model", action="append", choices=sorted({r.name for r in RUNS}),
                   help="train this model's jobs only (repeatable; by default every one)")
    a.add_argument("--optimizer", action="append", choices=list(OPTIMIZER_LINES),
                   help="train the jobs of this optimizer only (repeatable; by default every one)")
    a.add_argument("--full", action="store_true",
                   help="the longer form of the jobs of other optimizers than Adam: more switches and steps")
    a.add_argument("--no-prepare", action="store_true",
                   help="no Job.prepare: each switch builds the next configuration in its pause")
    a.add_argument("--pauses", help="write each switch's pause and its parts to this file (JSON; Adam's jobs)")
    a.add_argument("--failed-switch", action="store_true",
                   help="the executors fail the first switch (VPS_FAULT, the tests' vps-exec): every rank's Job "
                        "must raise vps.Error and train on as it was, its objects, groups and state, the static "
                        "run's loss at every step")
    args = a.parse_args()
    if (args.steps is not None and args.steps < 1) or (args.every is not None and args.every < 1):
        a.error("--steps and --every must be at least 1")
    return args


if __name__ == "__main__":
    ARGS = arguments()

import mcore  # noqa: E402  (imports torch and megatron-core once, before the ranks fork)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories  # noqa: E402
from megatron.core.distributed import finalize_model_grads  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # noqa: E402

import vps  # noqa: E402
import vps.megatron  # noqa: E402
from switching import Corpus, check_refusals, run, start_executors, stop, tool, workspace  # noqa: E402
GLOBAL_BATCH, MICRO_BATCH, SEQ = 8, 2, 32
LR, SEED = 3e-3, 1234
MAX_REL = 1e-3  # scripts/convergence.sh's bound


def micro_batches(corpus, consumed, dp, dp_rank, accum):
    """Megatron's pretraining sampler: micro-batch m of the global batch that
    starts at `consumed` is samples consumed + m*mb*dp + dp_rank*mb, ..."""
    for m in range(accum):
        first = consumed + m * MICRO_BATCH * dp + dp_rank * MICRO_BATCH
        yield torch.stack([corpus.sample(i) for i in range(first, first + MICRO_BATCH)])


def forward_step(data_iterator, model):
    """pretrain_gpt.py's forward step and loss: the sum of the token losses
    and the token count, which the schedule turns into the mean."""
    batch = next(data_iterator)
    tokens, labels = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    positions = torch.arange(SEQ).unsqueeze(0).expand_as(tokens)
    out = model(tokens, positions, None, labels=labels)

    def loss_func(output):
        loss = output.float().sum()
        tokens_ = torch.tensor(output.numel(), dtype=torch.int)
        return loss, tokens_, {"lm loss": torch.stack([loss.detach(), tokens_.float()])}
    return out, loss_func


# ---- a rank's job, built by Megatron-Core for a layout ----
def build(layout):
    """Megatron's own constructors for a layout, called as Megatron-LM's
    setup_model_and_optimizer calls them: the process groups, the seeds,
    GPTModel chunks in DDP, the layout's optimizer."""
    vps.megatron.initialize_groups(layout, create_gloo_process_groups=False)
    model_parallel_cuda_manual_seed(SEED, force_reset_rng=True)
    torch.manual_seed(SEED)
    par = layout.parallel
    # Megatron's MoE layer refuses to train under TP without sequence parallelism
    config = mcore.transformer_config(layout.model, par, perform_initialization=True, init_method_std=0.02,
                                      hidden_dropout=0.0, attention_dropout=0.0,
                                      sequence_parallel=layout.model.experts > 0 and par["tp"] > 1)
    model = mcore.wrap_ddp(mcore.build_chunks(layout.model, par, config), config, par)
    optimizer = get_megatron_optimizer(optimizer_config(par), model, use_gloo_process_groups=False)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return model, optimizer


def optimizer_config(par):
    """The OptimizerConfig of Megatron-LM's flags for the configuration's
    optimizer (--optimizer, --use-distributed-optimizer, which Muon and Lion
    turn into the layer-wise distributed optimizer, --muon-scalar-optimizer),
    with gradient clipping. Muon orthogonalizes a tensor-parallel matrix
    whole (--muon-tp-mode duplicated), so that its update does not depend on
    TP and a switch of TP compares with a static run; Megatron-LM's default,
    blockwise, orthogonalizes each rank's block."""
    layer_wise = mcore.layer_wise(par)
    # --optimizer-cpu-offload --optimizer-offload-fraction F, with the flag Megatron-LM asks for beside it
    # (--use-precision-aware-optimizer); pinned host memory is a GPU's
    offload = dict(optimizer_cpu_offload=True, optimizer_offload_fraction=par["offload"],
                   use_precision_aware_optimizer=True, pin_cpu_grads=False, pin_cpu_params=False) \
        if par["offload"] > 0 else {}
    return OptimizerConfig(optimizer=mcore.optimizer_name(par), lr=LR, min_lr=LR / 10, weight_decay=0.01,
                           adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0, bf16=True,
                           use_distributed_optimizer=bool(par["zero"]) and not layer_wise,
                           use_layer_wise_distributed_optimizer=layer_wise,
                           muon_scalar_optimizer=mcore.optimizer_name(par, "scalar_optimizer"),
                           muon_tp_mode="duplicated", **offload)


def make_scheduler(optimizer, steps, position):
    """Megatron's learning-rate schedule (warm-up, cosine decay) at `position`
    samples."""
    s = OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=LR, min_lr=LR / 10,
                                lr_warmup_steps=min(4, steps - 1) * GLOBAL_BATCH, lr_decay_steps=steps * GLOBAL_BATCH,
                                lr_decay_style="cosine", start_wd=0.01, end_wd=0.01,
                                wd_incr_steps=steps * GLOBAL_BATCH, wd_incr_style="constant")
    s.step(increment=position)
    return s


def train_step(model, optimizer, corpus, consumed):
    """One iteration, as Megatron-LM's train_step; returns (loss sum, tokens)
    of this rank's share of the loss (last stage, TP rank 0), else zeros."""
    dp = parallel_state.get_data_parallel_world_size()
    accum = GLOBAL_BATCH // (MICRO_BATCH * dp)
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    reports = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=[micro_batches(corpus, consumed, dp, parallel_state.get_data_parallel_rank(), accum)
                       for _ in model],
        model=model, num_microbatches=accum, seq_length=SEQ, micro_batch_size=MICRO_BATCH,
        decoder_seq_length=SEQ, forward_only=False)
    ok, _, _ = optimizer.step()
    if not ok:
        raise RuntimeError("the optimizer skipped a step")
    total = torch.zeros(2, dtype=torch.float64)
    if parallel_state.is_pipeline_last_stage() and parallel_state.get_tensor_model_parallel_rank() == 0:
        for r in reports:
            total += r["lm loss"].double()
    return total


# ---- the whole state, through Megatron's own sharded state dicts ----
def shards(model, optimizer):
    """This rank's share of the whole state in Megatron's model space, as
    (key, global shape, global offset, local shape, flattened range, data)
    on the host, and Adam's steps (none without Adam). The parameters: the
    ShardedTensors of the model's own sharded_state_dict. The optimizers'
    states, from each optimizer vps.megatron.optimizers() finds:

    - a Float16Optimizer's (zero=0, and the layer-wise optimizer's, whose
      ranks hold the matrices they own): its own sharded_state_dict, made
      from the model's as Megatron's checkpoint makes it (fp32_param and
      each state of torch's or emerging_optimizers' state dict, Adam's step
      as common_step);
    - a DistributedOptimizer's: its fully_sharded_model_space format, each
      parameter's piece of the fp32 main parameter and of each state at the
      parameter's place, made from its own accessors
      (_get_model_param_range_map, _get_main_param_and_optimizer_states) and
      the parameter's ShardedTensor, as its sharded_param_state_fs_model_
      space makes it: 0.19's integrity check refuses that format's flattened
      ranges, and its fully_reshardable format misplaces parameters that
      follow a padded bucket (tests/megatron/README.md)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    # one dict per chunk, as Megatron-LM's checkpointing keeps them: the chunks' keys are the same names
    model_sd = {"model%d" % i: chunk.module.sharded_state_dict() for i, chunk in enumerate(model)}
    leaves = vps.megatron.optimizers(optimizer)
    # made from the model's before its factories are applied, as Megatron's checkpoint makes them
    whole_sd = [o.sharded_state_dict(model_sd) for o in leaves if not isinstance(o, DistributedOptimizer)]
    apply_factories(model_sd)
    apply_factories(whole_sd)
    # a ShardedTensor's data is a parameter, or a run of its elements (the gated linear_fc1's two halves)
    params = sorted(((p.data_ptr(), p) for chunk in model for p in chunk.parameters()), key=lambda x: x[0])
    out, of_param, steps = [], {}, set()
    stack = [model_sd, whole_sd]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "common_step" in v:
                steps.add(int(v.pop("common_step")))
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, ShardedTensor):
            if v.flattened_range is not None:
                raise RuntimeError("%s: a flattened ShardedTensor" % v.key)
            local = (1,) * v.prepend_axis_num + tuple(v.local_shape)
            out.append((v.key, tuple(v.global_shape), tuple(v.global_offset), local, None,
                        v.data.detach().to("cpu", copy=True)))
            if not v.key.startswith("optimizer.") and (isinstance(v.data, torch.nn.Parameter)
                                                        or v.data.dtype == torch.bfloat16):
                p, lo = param_of(params, v)
                of_param.setdefault(p, []).append((v.key, tuple(v.global_shape), tuple(v.global_offset), local, lo,
                                                   lo + v.data.numel()))
        elif isinstance(v, ShardedObject) and not (v.key.endswith("._extra_state") and v.data is None):
            # an empty _extra_state is the linears' fp8 metadata, which bf16 runs have none of
            raise RuntimeError("%s: a ShardedObject, which this check does not compare" % v.key)
    for o in leaves:
        if not isinstance(o, DistributedOptimizer):
            continue
        if isinstance(o.optimizer, (torch.optim.Adam, torch.optim.AdamW)) or vps.megatron._hybrid(o) is not None:
            steps.update(g["step"] for g in o.state_dict()["optimizer"]["param_groups"])
        for ranges in o.gbuf_ranges:
            for buckets in ranges.values():
                for rm in buckets:
                    for p in rm["param_map"]:
                        r = o._get_model_param_range_map(p)["param"]
                        st = o._get_main_param_and_optimizer_states(p)
                        for key, gshape, goff, local, lo, hi in of_param[p]:
                            a, b = max(r.start, lo), min(r.end, hi)
                            if a >= b:
                                continue
                            for name, t in sorted(st.items()):
                                if not t.dim():
                                    continue  # Adam's step, above
                                out.append(("optimizer.state.%s.%s" % ("fp32_param" if name == "param" else name, key),
                                            gshape, goff, local, (a - lo, b - lo),
                                            t.detach().view(-1)[a - r.start:b - r.start].to("cpu", copy=True)))
    return out, steps


def param_of(params, v):
    """The parameter whose elements v.data is (a contiguous run of them), and
    where the run starts in it."""
    import bisect
    at = v.data.data_ptr()
    i = bisect.bisect_right([a for a, _ in params], at) - 1
    p = params[i][1] if i >= 0 else None
    if p is None or not v.data.is_contiguous() or at + v.data.numel() * v.data.element_size() > \
            p.data_ptr() + p.numel() * p.element_size():
        raise RuntimeError("%s: its data is not a run of one parameter's elements" % v.key)
    return p, (at - p.data_ptr()) // p.element_size()


def gather(model, optimizer, shards_of=None):
    """Rank 0: {key: whole tensor} from every rank's shards (replicas must
    agree bit for bit, and every element must be held), and Adam's step
    (None without Adam).
    shards_of(model, optimizer) gives a rank's shards, shards' by default."""
    mine = (shards_of or shards)(model, optimizer)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() != 0:
        return None
    full, seen, steps = {}, {}, set()
    for pieces, s in every:
        steps |= s
        for key, gshape, goff, lshape, fr, data in pieces:
            if key not in full:
                full[key] = torch.zeros(gshape, dtype=data.dtype)
                seen[key] = torch.zeros(gshape, dtype=torch.bool)
            box = tuple(slice(o, o + n) for o, n in zip(goff, lshape))
            lo, hi = (0, data.numel()) if fr is None else fr
            # the box's elements in row-major order; a flattened range is a run of them
            f, s_ = full[key][box].reshape(-1).clone(), seen[key][box].reshape(-1).clone()
            d = data.reshape(-1)
            held = s_[lo:hi]
            x, y = f[lo:hi][held], d[held]
            if not torch.equal(bits(x), bits(y)):
                raise RuntimeError("%s: replicas differ in %d of %d elements (the box at %s)"
                                   % (key, (bits(x) != bits(y)).sum().item(), x.numel(), list(goff)))
            f[lo:hi], s_[lo:hi] = d, True
            full[key][box], seen[key][box] = f.view(lshape), s_.view(lshape)
    for key, s_ in seen.items():
        if not s_.all():
            raise RuntimeError("%s: %d elements held by no rank" % (key, (~s_).sum().item()))
    if len(steps) > 1:
        raise RuntimeError("Adam's step differs between parameter groups: %s" % sorted(steps))
    return full, steps.pop() if steps else None


def bits(t):
    return t.view({torch.bfloat16: torch.int16, torch.float32: torch.int32}.get(t.dtype, t.dtype))


def differs(a, b):
    """Why two gathered states are not equal bit for bit, or None."""
    (fa, sa), (fb, sb) = a, b
    if sa != sb:
        return "Adam's step %s, then %s" % (sa, sb)
    if fa.keys() != fb.keys():
        return "keys %s" % sorted(set(fa) ^ set(fb))[:3]
    for k in fa:
        x, y = fa[k], fb[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return "%s: %s %s, then %s %s" % (k, x.dtype, list(x.shape), y.dtype, list(y.shape))
        if not torch.equal(bits(x), bits(y)):
            n = (bits(x) != bits(y)).sum().item()
            return "%s: %d of %d elements differ" % (k, n, x.numel())
    return None


# ---- the two runs ----
def moved_bias(layout, state):
    """A model with the routers' expert bias has it in the gathered state,
    and no longer all zero (Megatron updates it every step): the switch
    has a value to carry."""
    if not layout.model.router_bias:
        return
    (full, _) = state
    keys = [k for k in full if k.endswith("router.expert_bias")]
    if not keys or not any(full[k].any() for k in keys):
        raise RuntimeError("the routers' expert bias is %s" % ("all zero" if keys else "not in the state"))


def check_groups(layout, rank, model):
    """Megatron's groups are the layout's: each of the rank's groups (TP,
    DP, PP, CP, EP, expert TP and DP) holds the world ranks vps gives the
    same coordinates but that one, and the model's DDP reduces over the
    installed DP group (a cached group of another configuration would hold
    other ranks, or another object)."""
    ps = parallel_state
    me = layout.coords(rank)
    every = [layout.coords(r) for r in range(layout.world)]
    dense = ("tp", "cp", "dp", "pp")
    experts = ("etp", "ep", "edp", "pp")
    for name, group, axes, axis in (
            ("TP", ps.get_tensor_model_parallel_group(), dense, "tp"),
            ("DP", ps.get_data_parallel_group(), dense, "dp"),
            ("PP", ps.get_pipeline_model_parallel_group(), dense, "pp"),
            ("CP", ps.get_context_parallel_group(), dense, "cp"),
            ("EP", ps.get_expert_model_parallel_group(), experts, "ep"),
            ("expert TP", ps.get_expert_tensor_parallel_group(), experts, "etp"),
            ("expert DP", ps.get_expert_data_parallel_group(), experts, "edp")):
        want = [r for r, c in enumerate(every) if all(getattr(c, a) == getattr(me, a) for a in axes if a != axis)]
        have = sorted(dist.get_process_group_ranks(group))
        if have != want:
            raise RuntimeError("rank %d under %s: Megatron's %s group holds ranks %s, the layout's %s"
                               % (rank, layout.describe(), name, have, want))
    installed = ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
    for chunk in model:
        if chunk.intra_dp_cp_group is not installed:
            raise RuntimeError("rank %d under %s: the model's DP group is not the installed one"
                               % (rank, layout.describe()))


def rank_main(rank, job_run, steps, every, registry, switching, ahead=True, failing=False):
    """One rank of the run: its losses, its Job's clocks of each switch, the
    groups cache's counts, (rank 0, switching) a line of figures per
    switch, and (failing: the first switch is to fail) the error the
    switch raised."""
    CONFIGS = job_run.configs
    layouts = [vps.layout(job_run.model, c, WORLD) for c in CONFIGS]
    layout = layouts[0]
    corpus = Corpus(layout.model.vocab, SEQ, SEED)
    # fewer configurations than the run visits: one is evicted, and one made again after it
    vps.megatron.CACHED_CONFIGURATIONS = CACHED
    model, optimizer = build(layout)
    scheduler = make_scheduler(optimizer, steps, 0)
    reg = job = None
    nswitches = min(len(CONFIGS) - 1, (steps - 1) // every)
    if switching:
        # vps: the registry vps-exec finds this rank's buffers through
        reg = vps.Registry(registry % rank, layout, rank)
        # vps: Megatron's parameters, main parameters, moments and expert bias become views of vps's buffers
        job = vps.megatron.Job(reg, layout, rank, model, optimizer)
    iteration = consumed = 0
    losses, switches, clocks = [], [], []
    failed = None
    try:
        while iteration < steps:
            if switching and ahead and len(switches) < nswitches and job.prepared is None:
                # vps: the next configuration, made ready while the job trains
                job.prepare(layouts[len(switches) + 1], rank, build)
            if switching and iteration and iteration % every == 0 and len(switches) < nswitches:
                before = gather(model, optimizer)
                new_layout = layouts[len(switches) + 1]
                # vps: between two steps, the state moves to the new layout; the model and optimizer are prepare's
                # (build's, made in the pause, for a configuration not prepared)
                if failing:
                    failed = failed_switch(job, new_layout, rank, vps.Training(step=iteration), layout, model,
                                           optimizer, before)
                    nswitches = 0
                    continue
                model, optimizer, carried = job.switch(new_layout, rank, vps.Training(
                    step=iteration, consumed_samples=consumed, scheduler_step=scheduler.num_steps,
                    global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH), build)
                # vps: the schedule goes on where it was; the data loader, at carried.consumed_samples
                scheduler = make_scheduler(optimizer, steps, carried.scheduler_step)
                clocks.append(job.clocks)
                if (carried.step, carried.consumed_samples) != (iteration, consumed):
                    raise RuntimeError("the switch carried step %d, samples %d; the job was at %d, %d" % (
                        carried.step, carried.consumed_samples, iteration, consumed))
                if scheduler.num_steps != consumed:
                    raise RuntimeError("the scheduler is at %d after the switch, %d before" % (
                        scheduler.num_steps, consumed))
                check_groups(new_layout, rank, model)
                after = gather(model, optimizer)
                what = (len(switches) + 1, CONFIGS[len(switches)], CONFIGS[len(switches) + 1], iteration)
                switches.append(None)
                if rank == 0:
                    moved_bias(layout, before)
                    bad = differs(before, after)
                    if bad:
                        raise RuntimeError("switch %d (%s -> %s) at step %d: the state after is not the state "
                                           "before: %s" % (what + (bad,)))
                    switches[-1] = (iteration, what[1], what[2], len(after[0]),
                                    sum(t.numel() for t in after[0].values()))
            total = train_step(model, optimizer, corpus, consumed)
            dist.all_reduce(total)
            iteration += 1
            consumed += GLOBAL_BATCH
            scheduler.step(increment=GLOBAL_BATCH)
            losses.append((total[0] / total[1]).item())
    finally:
        if job:
            job.close()
        if reg:
            reg.close()
    counts = vps.megatron.cached_configurations.counts
    return losses, switches, clocks, ({k: counts[k] for k in ("made", "reused", "evicted")},
                                      len(vps.megatron.cached_configurations())), failed


def failed_switch(job, new_layout, rank, training, layout, model, optimizer, before):
    """A switch the executors fail: Job.switch must raise vps.Error and
    leave the job as it was, its model and optimizer, its layout's process
    groups, and its state (the hand-over made while the executors ran,
    undone: the gradients' memory given back, the groups the job's own
    again). Returns what the switch raised."""
    try:
        job.switch(new_layout, rank, training)
    except vps.Error as e:
        why = "vps.%s: %s" % (type(e).__name__, str(e).splitlines()[0])
    else:
        raise RuntimeError("the switch to %s did not fail" % new_layout.describe())
    if any(a is not b for a, b in zip(job.model, model)) or len(job.model) != len(model) \
            or job.optimizer is not optimizer or (job.layout.hash, job.rank) != (layout.hash, rank):
        raise RuntimeError("after a failed switch the Job holds other objects or another layout")
    if job.prepared is not None:
        raise RuntimeError("after a failed switch the Job still holds %s prepared" % (job.prepared,))
    check_groups(layout, rank, model)
    after = gather(model, optimizer)
    bad = rank == 0 and differs(before, after)
    if bad:
        raise RuntimeError("after a failed switch the state is not the state before: %s" % bad)
    return why


def refusals(rank, registry):
    """What a Job refuses, on one rank: a layout that is not what Megatron
    built, one it cannot point Megatron's tensors into, a training step
    that is not Adam's, what vps does not describe; and a prepared
    configuration discarded, which leaves the registry as it was. Returns
    the messages, in order."""
    lay = vps.layout(MODEL, "zero=1", 1)
    model, optimizer = build(lay)
    out = []
    reg = vps.Registry(registry.replace("%d", "refusals"), None, -1)

    def job(what, layout, model, optimizer):
        try:
            vps.megatron.Job(reg, layout, 0, model, optimizer).close()
            out.append("%s: accepted" % what)
        except vps.Error as e:
            out.append("%s: %s: %s" % (what, e.name, e))
    try:
        for other in ("zero=1,bucket=60000", "zero=0", "zero=1,optimizer=lion", "zero=1,precision_aware=1"):
            job(other, vps.layout(lay.model, other, 1), model, optimizer)
        j = vps.megatron.Job(reg, lay, 0, model, optimizer)
        try:
            j.switch(lay, 0, vps.Training(step=5), None)
            out.append("step 5: accepted")
        except vps.Error as e:
            out.append("step 5: %s: %s" % (e.name, e))
        # a configuration made ready, then given up: its buffers freed, the registry the job's own again
        held = lambda: [(e.role, e.buffer, e.bytes, bytes(e.shm_name)) for e in reg.entries()]  # noqa: E731
        before = held()
        try:
            with j.prepared_groups():
                out.append("prepared_groups: accepted")
        except vps.Error as e:
            out.append("prepared_groups: %s: %s" % (e.name, e))
        j.prepare(lay, 0, build)
        made = (j.prepared, len(held()) - len(before))
        j.discard()
        out.append("prepare, discard: %s" % ("VPS_OK: the registry as before" if (
            made[0] is not None and made[1] > 0 and j.prepared is None and held() == before) else
            "VPS_ECHECK: prepared %s with %d entries more; then %s, %d entries of %d as before" % (
                made + (j.prepared, sum(a == b for a, b in zip(held(), before)), len(before)))))
        j.close()
        # the groups installed kept for another configuration than theirs
        try:
            vps.megatron.adopt_groups(vps.layout(MODEL, "tp=2,zero=1", 2))
            out.append("adopt_groups tp=2: accepted")
        except vps.Error as e:
            out.append("adopt_groups tp=2: %s: %s" % (e.name, e))
        # SGD (Megatron's Float16Optimizer) where the layout has Adam, and SGD without momentum
        sgd = vps.layout(MODEL, "zero=0,optimizer=sgd", 1)
        model, optimizer = build(sgd)
        job("adam for sgd", vps.layout(MODEL, "zero=0", 1), model, optimizer)
        for group in optimizer.param_groups:
            group["momentum"] = 0.0
        job("sgd_momentum=0", sgd, model, optimizer)
        # the HybridDeviceOptimizer keeps another fraction of each shard on the host than the layout says
        offload = vps.layout(MODEL, "zero=1,offload=0.5", 1)
        model, optimizer = build(offload)
        job("offload=0.3 for 0.5", vps.layout(MODEL, "zero=1,offload=0.3", 1), model, optimizer)
    finally:
        reg.close()
    return out


REFUSALS = [
    # another bucket size: Megatron's single bucket is not the layout's buckets
    ("zero=1,bucket=60000", "VPS_ECHECK", "rank 0 chunk 0 dense buffer: Megatron's has 220544 elements, "
     "the layout's 220672"),
    ("zero=0", "VPS_EUNSUPPORTED", "rank 0 chunk 0 dense buffer: the layout's main_param is whole (zero=0)"),
    # another optimizer's buffers, or dtypes that TransformerEngine's FusedAdam keeps (a GPU's)
    ("zero=1,optimizer=lion", "VPS_ECHECK", "rank 0 chunk 0 layer-wise dense buffer: the layout has one, "
     "Megatron none"),
    ("zero=1,precision_aware=1", "VPS_EUNSUPPORTED", "the layout's main_param buffer of chunk 0 is int16 "
     "(precision_aware=1): vps.megatron binds bf16 parameters and fp32 states"),
    ("step 5", "VPS_EINPUT", "training.step is 5, the optimizer has taken 0 steps"),
    ("prepared_groups", "VPS_EINPUT", "no configuration is prepared (Job.prepare)"),
    ("prepare, discard", "VPS_OK", "the registry as before"),
    ("adopt_groups tp=2", "VPS_EINPUT", "adopt_groups: the groups installed are tp, pp, vpp, cp, ep, etp = "
     "(1, 1, 1, 1, 1, 1); tp=2,pp=1,dp=1,ep=1,etp=2,vpp=1,zero=1 is (2, 1, 1, 1, 1, 2)"),
    ("adam for sgd", "VPS_ECHECK", "embedding.word_embeddings.weight: Megatron steps it with SGD (sgd), the layout "
     "with adam"),
    ("sgd_momentum=0", "VPS_EUNSUPPORTED", "embedding.word_embeddings.weight: SGD without momentum "
     "(sgd_momentum=0) keeps no momentum_buffer"),
    ("offload=0.3 for 0.5", "VPS_ECHECK", "rank 0 chunk 0 dense buffer: main_param GPU part of 138624 elements in the "
     "layout, 105856 in Megatron's"),
]


def executors(tmp, job_run, steps, every, registry):
    """One vps-exec per rank, given the staged plans of the switches in order."""
    gpn = str(WORLD)
    CONFIGS = job_run.configs
    for i, c in enumerate(CONFIGS):
        run([tool("vps-layout"), "--model", job_run.model, "--parallel", c, "--gpus-per-node", gpn,
             "-o", os.path.join(tmp, "c%d.layout" % i)])
    staged = []
    for i in range(min(len(CONFIGS) - 1, (steps - 1) // every)):
        plan, st = os.path.join(tmp, "c%d.plan" % i), os.path.join(tmp, "c%d.staged" % i)
        run([tool("vps-plan"), os.path.join(tmp, "c%d.layout" % i), os.path.join(tmp, "c%d.layout" % (i + 1)),
             "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH), "-o", plan])
        run([tool("vps-stage"), "--budget", "16MiB", plan, "-o", st])
        staged.append(st)
    env = dict(os.environ, VPS_TOKEN=run([tool("vps-exec"), "--new-token"]).strip())
    return start_executors(tmp, staged, WORLD, registry, env), len(staged)


def main():
    args = ARGS
    mcore.install_training_shims()
    registry = "vps-mcore-%d-%%d" % os.getpid()
    with workspace(args.keep, "vps-mcore-switch-", registry, WORLD) as tmp:
        check(args, tmp, registry)


def check(args, tmp, registry):
    t0 = time.monotonic()
    (said,) = mcore.run_ranks(1, lambda r: refusals(r, registry), timeout=args.timeout)
    if isinstance(said, mcore.RankError):
        print(said.trace, file=sys.stderr)
        sys.exit("check_switch.py: refusals: %s" % said)
    check_refusals(said, REFUSALS, args.verbose)
    lines, worst, seconds, every_pause = {}, {}, {"adam": time.monotonic() - t0}, {}
    for job_run in RUNS:
        if (args.model and job_run.name not in args.model) or (args.optimizer and job_run.line
                                                                not in args.optimizer) \
                or not (job_run.quick or args.full):
            continue
        t = time.monotonic()
        sub = os.path.join(tmp, job_run.label.replace(" ", "-"))
        os.makedirs(sub, exist_ok=True)
        line, pauses = switched(args, job_run, sub, registry)
        o = job_run.line
        lines.setdefault(o, []).append(line)
        if o == "adam":
            every_pause[job_run.name] = pauses
        worst[o] = max([worst.get(o, 0.0)] + [p["pause"] / p["transfer"] for p in pauses])
        seconds[o] = seconds.get(o, 0.0) + time.monotonic() - t
    if args.pauses:
        with open(args.pauses, "w") as f:
            json.dump(every_pause, f, indent=1)
    # Adam's jobs first, as before; then a line per other optimizer
    for o in sorted(lines, key=lambda o: list(OPTIMIZER_LINES).index(o)):
        print("%s%s (%.0f s)%s" % (OPTIMIZER_LINES[o], "; ".join(lines[o]), seconds[o],
                                   "" if args.failed_switch else "; pause at most %.2f x the transfer" % worst[o]))


def switched(args, job_run, tmp, registry):
    """Train job_run switching and static, compare; its part of the summary
    line, and its switches' pauses."""
    configs, steps, every = job_run.resolved(args)
    job_run = copy.copy(job_run)
    job_run.configs = configs
    procs, nplans = executors(tmp, job_run, steps, every, registry)
    failing = args.failed_switch

    def executor_failed():
        for r, p in enumerate(procs):
            if p.poll():
                return "vps-exec rank %d exited with status %d:\n%s" % (
                    r, p.returncode, open(os.path.join(tmp, "exec.%d.log" % r)).read()[-2000:])
        return None
    try:
        try:
            results = mcore.run_ranks(WORLD, lambda r: rank_main(r, job_run, steps, every, registry, True,
                                                                 not args.no_prepare, failing),
                                      timeout=args.timeout, watch=None if failing else executor_failed)
        except RuntimeError as e:
            sys.exit("check_switch.py: %s: %s" % (job_run.label, e))
        failed = [r for r in results if isinstance(r, mcore.RankError)]
        if failed and not failing:
            # the ranks may see an executor's failure (its abort) before the
            # watch sees it exit: the executor is the cause, named as such
            deadline = time.monotonic() + EXECUTOR_EXIT
            why = executor_failed()
            while why is None and time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
                why = executor_failed()
            if why:
                sys.exit("check_switch.py: %s: %s" % (job_run.label, why))
            for f in failed:
                print(f.trace, file=sys.stderr)
            for r in range(WORLD):
                print("== exec.%d.log\n%s" % (r, open(os.path.join(tmp, "exec.%d.log" % r)).read()[-2000:]),
                      file=sys.stderr)
            sys.exit("check_switch.py: %s: %s" % (job_run.label, failed[0]))
        if failed:
            # one rank's failure is the cause, the others' may be its consequence (a peer gone): every one said
            for f in failed:
                print(f.trace, file=sys.stderr)
            sys.exit("check_switch.py: %s: after the failed switch: %s" % (
                job_run.label, "; ".join(str(f) for f in failed)))
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop(procs)
    for r, p in enumerate(procs):
        if p.returncode and not failing:
            sys.exit("check_switch.py: %s: vps-exec rank %d exited with %d:\n%s" % (
                job_run.label, r, p.returncode, open(os.path.join(tmp, "exec.%d.log" % r)).read()[-2000:]))
    digests = sum(open(os.path.join(tmp, "exec.%d.log" % r)).read().count("digest: match") for r in range(WORLD))
    losses, switches, _, (counts, held), _ = results[0]
    if failing:
        return failed_line(args, job_run, results, steps, every, registry), []
    if len(switches) != nplans or digests != nplans * WORLD:
        sys.exit("check_switch.py: %s: %d switches of %d, %d digests matched of %d" % (
            job_run.label, len(switches), nplans, digests, nplans * WORLD))
    want = cache_counts([group_key(job_run.model, c) for c in job_run.configs[:nplans + 1]])
    if counts != want or held > CACHED:
        sys.exit("check_switch.py: %s: the groups cache made, reused and evicted %s configurations and holds %d; "
                 "expected %s, at most %d" % (job_run.label, counts, held, want, CACHED))
    pauses = breakdown(tmp, [r[2] for r in results], nplans)
    for k, p in enumerate(pauses):
        p["from"], p["to"] = job_run.configs[k], job_run.configs[k + 1]
    ref = static_losses(args, job_run, steps, every, registry)
    for k, ((at, src, dst, n, elems), p) in enumerate(zip(switches, pauses)):
        if args.verbose:
            print("%s switch %d at step %d: %s -> %s: %d tensors, %d elements, equal bit for bit; pause %s"
                  % (job_run.label, k + 1, at, src, dst, n, elems, describe(p)))
    first = switches[0][0] if switches else steps
    worst, worst_at = 0.0, 0
    for i, (x, y) in enumerate(zip(losses, ref)):
        step = i + 1
        if step <= first and x != y:
            sys.exit("check_switch.py: %s: step %d, before any switch: loss %.9g, the static run's %.9g"
                     % (job_run.label, step, x, y))
        rel = abs(x - y) / abs(y)
        if rel > worst:
            worst, worst_at = rel, step
        if not rel <= MAX_REL:  # a NaN loss too
            sys.exit("check_switch.py: %s: step %d: loss %.9g, the static run's %.9g (%.2g relative, bound %g)"
                     % (job_run.label, step, x, y, rel, MAX_REL))
        if args.verbose:
            print("%s step %d: loss %.9f, static %.9f" % (job_run.label, step, x, y))
    # the optimizer is the line's and the job's (what), not a configuration's
    shown = [",".join(kv for kv in c.split(",") if not kv.startswith(("optimizer=", "scalar=")))
             for c in job_run.configs[:len(switches) + 1]]
    line = ("%s on %d ranks%s: %d switch%s through vps-exec (%s), the whole state equal bit for bit across each; "
            "loss within %g of the static run's at every step (largest %.1e, step %d)"
            % (job_run.name, WORLD, ", " + job_run.what if job_run.what else "", len(switches),
               "" if len(switches) == 1 else "es", " -> ".join(shown), MAX_REL, worst, worst_at))
    return line, pauses


def static_losses(args, job_run, steps, every, registry):
    """The losses of the job trained without a switch."""
    static = mcore.run_ranks(WORLD, lambda r: rank_main(r, job_run, steps, every, registry, False),
                             timeout=args.timeout)
    bad = [r for r in static if isinstance(r, mcore.RankError)]
    if bad:
        print(bad[0].trace, file=sys.stderr)
        sys.exit("check_switch.py: %s: the static run: %s" % (job_run.label, bad[0]))
    return static[0][0]


def failed_line(args, job_run, results, steps, every, registry):
    """--failed-switch: every rank's Job raised at the first switch and
    trained on as it was (failed_switch); its losses are the static run's,
    bit for bit. The job's part of the summary line."""
    whys = [r[4] for r in results]
    if None in whys:
        sys.exit("check_switch.py: %s: rank %d's switch did not fail" % (job_run.label, whys.index(None)))
    losses, ref = results[0][0], static_losses(args, job_run, steps, every, registry)
    if len(losses) != len(ref):
        sys.exit("check_switch.py: %s: %d steps trained, the static run %d" % (job_run.label, len(losses), len(ref)))
    for i, (x, y) in enumerate(zip(losses, ref)):
        if x != y:
            sys.exit("check_switch.py: %s: step %d, after the failed switch: loss %.9g, the static run's %.9g"
                     % (job_run.label, i + 1, x, y))
    return ("%s on %d ranks: the switch at step %d failed on every rank (rank 0: %s) and the job trained on as it "
            "was: its model, optimizer, process groups and state, the static run's loss at every one of %d steps"
            % (job_run.name, WORLD, every, whys[0], steps))


# how many configurations' groups the ranks keep: fewer than a run visits, so that one is evicted and,
# in micro-moe's run, made again after it
CACHED = 3


def group_key(model, config):
    """What vps.megatron.initialize_groups makes a configuration's process
    groups for (its cache's key): tp, pp, vpp, cp, ep and etp."""
    par = vps.layout(model, config, WORLD).parallel
    return tuple(par[k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp"))


def cache_counts(visited):
    """What vps.megatron's groups cache does over the configurations a run
    visits, by its documented policy: made, reused, evicted (least recently
    installed first, never the one running nor the one being made)."""
    cache, counts = [], {"made": 0, "reused": 0, "evicted": 0}
    running = None
    for c in visited:
        if c in cache:
            cache.remove(c)
            counts["reused"] += 1
        else:
            counts["made"] += 1
            while len(cache) + 1 > CACHED:
                victim = next(x for x in cache if x != running)
                cache.remove(victim)
                counts["evicted"] += 1
        cache.append(c)
        running = c
    return counts


def reports(tmp, nplans):
    """Each rank's executor report: its switches, in order."""
    out = []
    for r in range(WORLD):
        with open(os.path.join(tmp, "report.%d.yaml" % r)) as f:
            sw = yaml.safe_load(f)["switches"]
        if len(sw) != nplans:
            raise SystemExit("check_switch.py: report.%d.yaml: %d switches of %d" % (r, len(sw), nplans))
        out.append(sw)
    return out


def breakdown(tmp, clocks, nplans):
    """Each switch's pause (pause_parts), from the Job's clocks and the
    executors' reports."""
    rep = reports(tmp, nplans)
    with open(os.path.join(tmp, "clocks.json"), "w") as f:
        json.dump({"job": clocks, "exec": rep}, f, indent=1)
    return [pause_parts([c[k] for c in clocks], [r[k] for r in rep]) for k in range(nplans)]


def pause_parts(jc, ex):
    """A switch's pause from each rank's Job clocks (jc) and executor
    report (ex), all wall clocks of this machine: the pause from the last
    rank calling Job.switch to the last returning, and in it the arrival
    (until every executor had every rank's request: the last rank's
    request, its executor seeing it, the executors agreeing to start), the
    transfer (vps-exec's pause: the slowest rank's, from the start to done:
    mapping, agreeing on the training state, the stages, the digests), then
    what the Job did in the pause on its slowest rank: the groups
    installed, build (nothing when prepared), the hand-over (attach) and
    the wake-up after vps-exec's done (wake: the registry's wait seeing it,
    the old buffers freed, the new ones registered as sources); beside it,
    the hand-over a prepared switch makes while the executors move the
    state (meanwhile, the slowest rank's: in the transfer, not after it);
    ahead, what prepare took before (the slowest rank's)."""
    called = max(c["called"] for c in jc)
    p = {"pause": max(c["returned"] for c in jc) - called,
         "arrival": max(e["started_at"] for e in ex) - called,
         "transfer": max(e["pause_seconds"] for e in ex),
         "stages": max(e["transfer_seconds"] for e in ex),
         "wake": max(c["done"] for c in jc) - max(e["done_at"] for e in ex),
         "registry": max(c["switched"] - c["done"] for c in jc),
         "skew": called - min(c["called"] for c in jc)}
    for part in ("groups", "build", "attach", "meanwhile"):
        p[part] = max(c[part] for c in jc)
    ahead = [c["ahead"] for c in jc if c["ahead"]]
    p["ahead"] = {part: max(a[part] for a in ahead) for part in ahead[0]} if ahead else None
    return p


def describe(p):
    return "%.1f ms = %.2f x the transfer (%s)%s" % (p["pause"] * 1e3, p["pause"] / p["transfer"], *parts(p))


def parts(p):
    """What describe says of a pause's parts: those in it, and what was
    made ahead."""
    ms = lambda x: "%.1f" % (x * 1e3)  # noqa: E731
    inside = "arrival %s, transfer %s [stages %s; hand-over beside it %s], wake %s, registry %s, groups %s, " \
        "build %s, attach %s; ranks called within %s" % (
            ms(p["arrival"]), ms(p["transfer"]), ms(p["stages"]), ms(p["meanwhile"]), ms(p["wake"]),
            ms(p["registry"]), ms(p["groups"]), ms(p["build"]), ms(p["attach"]), ms(p["skew"]))
    ahead = ""
    if p["ahead"]:
        ahead = "; ahead %s ms (target %s, groups %s, build %s, attach %s)" % (
            ms(sum(p["ahead"].values())), ms(p["ahead"]["target"]), ms(p["ahead"]["groups"]),
            ms(p["ahead"]["build"]), ms(p["ahead"]["attach"]))
    return inside, ahead


if __name__ == "__main__":
    main()
