#!/usr/bin/env python3
"""Megatron-LM's distributed checkpoint (MCP, the paper's baseline) as
checkpoint-and-restart: the state a switch moves, saved by the ranks of
layout A with Megatron's save_checkpoint and loaded by the ranks of layout
B with its load_checkpoint, timed and checked.

    ckpt_mcp.py save A.layout DIR
    ckpt_mcp.py load B.layout DIR

One forked process per rank, the ranks a gloo process group, each a
Megatron-LM job of the wheel's megatron.training on the CPU (the shims of
tests/megatron/mcore.py, install_pretrain_shims): the arguments a
pretrain_gpt.py job of the layout's model and configuration would have
(made from the vps model), initialize_megatron, and the model and
DistributedOptimizer of setup_model_and_optimizer, checked against vps's
layout of the rank (every parameter's name and offset, every ZeRO-1 piece:
vps.megatron's binding). Its state is vps's deterministic pattern (the
trainer's and ckpt_bench's): the bf16 parameters in DDP's buffers, the fp32
main parameters and Adam's moments in the optimizer's pieces, padding zero.

Megatron's checkpoint, as --ckpt-format torch_dist makes it with
--ckpt-fully-parallel-save (Megatron's default: a tensor that data-parallel
replicas hold alike written once, the replicas sharing the work),
--ckpt-fully-parallel-load (each rank of a data-parallel group reads a
part and they exchange) and --dist-ckpt-optim-fully-reshardable (the
optimizer's format that reshards over TP and PP, which a switch between
A and B needs; the default dp_reshardable reshards over DP only), without
the ranks' random states (--no-save-rng, --no-load-rng: A's ranks' have
no place in B's). save: every rank at once
on a signal, save_checkpoint(iteration 1), the time from the signal until
the last rank has returned (Megatron's writer fsyncs its files). load: every
rank of B at once, load_checkpoint, until the last has returned. Then,
untimed, every rank checks every element of its state against the pattern
and its padding for zeros; a wrong element fails the run (exit 1).

Prints YAML: seconds, bytes_written (save), format, and a line per rank.
Bad arguments exit 2."""
import datetime
import logging
import os
import sys
import warnings

import ckpt_common as common

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ME = "ckpt_mcp.py"
ITERATION = 1

MODE = LAYOUT = DIR = None


def imports():
    """torch, megatron-core and vps, once, before the ranks fork; not at the
    top: Megatron's checkpoint writer starts a process by spawn, which
    imports this file again."""
    global mcore, torch, dist, vps
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.path.insert(0, os.path.join(TOP, "python"))
    sys.path.insert(0, os.path.join(TOP, "tests", "megatron"))
    import mcore
    import torch
    import torch.distributed as dist
    import vps
    import vps.megatron


def megatron_argv(lay):
    """The arguments of a pretrain_gpt.py job that trains the layout's model
    in its configuration, as Megatron-LM's parser takes them."""
    m, par = lay.model, lay.parallel
    if m.kv_lora_rank or m.mtp_layers or m.router_bias:
        common.usage(ME, "%s: MLA, MTP and the routers' expert bias are not made into Megatron's arguments here"
                     % m.name)
    if not par["zero"] or par["grad"] or par["grouped_gemm"]:
        common.usage(ME, "%s: Megatron's checkpoint of the distributed optimizer: zero=1, no gradients, "
                     "SequentialMLP" % LAYOUT)
    seq = 128
    a = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads,
         "--kv-channels", m.head_dim, "--vocab-size", m.vocab, "--make-vocab-size-divisible-by", m.vocab_divisor,
         "--seq-length", seq, "--micro-batch-size", 1, "--global-batch-size", 8 * lay.world, "--train-iters", 1,
         "--lr", "1e-4", "--bf16", "--use-distributed-optimizer", "--distributed-backend", "gloo",
         "--mock-data", "--tokenizer-type", "NullTokenizer", "--num-workers", 0,
         "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
         "--no-bias-dropout-fusion", "--no-persist-layer-norm", "--no-rope-fusion",
         "--transformer-impl", "transformer_engine", "--seed", 1234,
         "--tensor-model-parallel-size", par["tp"], "--pipeline-model-parallel-size", par["pp"],
         "--context-parallel-size", par["cp"],
         "--ckpt-format", "torch_dist", "--ckpt-fully-parallel-load", "--dist-ckpt-optim-fully-reshardable",
         "--no-save-rng", "--no-load-rng"]
    if m.query_groups != m.heads:
        a += ["--group-query-attention", "--num-query-groups", m.query_groups]
    if m.norm == 0:
        a += ["--normalization", "RMSNorm"]
    if m.activation == 0:
        a += ["--swiglu"]
    if m.position == 1:
        a += ["--position-embedding-type", "learned_absolute", "--max-position-embeddings", m.max_positions]
    else:
        a += ["--position-embedding-type", "rope", "--max-position-embeddings", seq]
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.bias:
        a += ["--disable-bias-linear"]
    if m.qkv_bias and not m.bias:
        a += ["--add-qkv-bias"]
    if m.qk_norm:
        a += ["--qk-layernorm"]
    if m.ffn:
        a += ["--ffn-hidden-size", m.ffn]
    if m.experts:
        a += ["--num-experts", m.experts, "--moe-ffn-hidden-size", m.moe_ffn, "--moe-router-topk", 2,
              "--expert-model-parallel-size", par["ep"], "--expert-tensor-parallel-size", par["etp"]]
        if m.first_dense:
            a += ["--moe-layer-freq", "([0]*%d+[1]*%d)" % (m.first_dense, m.layers - m.first_dense)]
        if m.shared_ffn:
            a += ["--moe-shared-expert-intermediate-size", m.shared_ffn]
    if par["vpp"] > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", par["vpp"], "--overlap-p2p-communication"]
    if par["first"]:
        a += ["--decoder-first-pipeline-num-layers", par["first"]]
    if par["last"]:
        a += ["--decoder-last-pipeline-num-layers", par["last"]]
    if par["bucket"]:
        a += ["--overlap-grad-reduce"] + (["--ddp-bucket-size", par["bucket"]] if par["bucket"] > 0 else [])
    if MODE == "save":
        a += ["--save", DIR, "--save-interval", ITERATION]
    return [str(x) for x in a]


def job(lay, rank):
    """Megatron-LM's job of this rank: arguments, initialization, and the
    model, optimizer and scheduler, as pretrain() makes them."""
    from megatron.core.enums import ModelType
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.training import training
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(lay.world),
                      LOCAL_WORLD_SIZE=str(lay.world), CUDA_DEVICE_MAX_CONNECTIONS="1")
    sys.argv = [ME] + megatron_argv(lay)
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")  # Megatron's argument table and banners
    try:
        args = parse_and_validate_args()
        training.initialize_megatron()
        cfg = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
        model, optimizer, scheduler = training.setup_model_and_optimizer(
            ModelType.encoder_or_decoder, cfg_container=cfg,
            pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    finally:
        sys.stdout.close()
        sys.stdout = out
    return args, model, optimizer, scheduler


def flat_buffers(bind, view):
    """Each buffer of vps's view as a tensor over Megatron's memory: DDP's
    parameter buffer itself; a sharded buffer as a fresh tensor, with
    put(i) and take(i) copying it into and from the optimizer's pieces."""
    dtypes = {vps.BF16: torch.bfloat16, vps.FP32: torch.float32}
    tensors = []
    for b in view.buffers:
        key = (b.chunk, b.expert, b.layerwise)
        tensors.append(bind.ddp_buffers[key].param_data if b.state == vps.PARAM
                       else torch.zeros(b.elements, dtype=dtypes[b.dtype]))

    def pieces(i):
        b = view.buffers[i]
        for pc in bind.pieces.get((b.chunk, b.expert, b.layerwise), []):
            t = pc.main if b.state == vps.MAIN_PARAM else pc.inner.state[pc.main][pc.states[b.state]]
            yield pc.at, t.data.view(-1)

    def put(i):
        if view.buffers[i].state != vps.PARAM:
            for at, t in pieces(i):
                t.copy_(tensors[i][at:at + t.numel()])

    def take(i):
        if view.buffers[i].state != vps.PARAM:
            for at, t in pieces(i):
                tensors[i][at:at + t.numel()] = t
    return tensors, put, take


def adam_state(optimizer):
    """Adam's moments and step for every main parameter of the optimizer,
    as torch's Adam makes them at its first step (a fresh job has none)."""
    for o in vps.megatron.distributed_optimizers(optimizer):
        inner = o.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                for k in ("exp_avg", "exp_avg_sq"):
                    if k not in st:
                        st[k] = torch.zeros_like(p.data)
                st["step"] = torch.tensor(float(common.STEP), dtype=torch.float32)


def rank_main(rank, world, store, ready, go, done):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    lay = vps.Layout.load(LAYOUT)
    view = lay.rank(rank)
    pattern = common.Pattern(lay.model)
    args, model, optimizer, scheduler = job(lay, rank)
    adam_state(optimizer)
    # Megatron's parameters, pieces and shards, checked against vps's layout of the rank
    bind = vps.megatron._Binding(view, model, optimizer)
    tensors, put, take = flat_buffers(bind, view)
    with torch.no_grad():
        for t in tensors:
            t.zero_()
        if MODE == "save":
            for r in view.regions:
                pattern.fill(tensors[r.buffer], r)
        for i in range(len(tensors)):
            put(i)
    from megatron.training import training
    from megatron.training.checkpointing import save_checkpoint
    if MODE == "load":
        args.load = DIR
    dist.barrier()
    os.write(ready, b"r")
    os.read(go, 1)  # the parent closes its end: every rank starts at once
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        if MODE == "save":
            save_checkpoint(ITERATION, model, optimizer, scheduler, 0)
        else:
            # the shims' load_checkpoint: Megatron's, with Adam's step as torch's Adam keeps it
            iteration, _ = training.load_checkpoint(model, optimizer, scheduler)
    finally:
        sys.stdout.close()
        sys.stdout = out
    os.write(done, b"d")
    if MODE == "load":
        if iteration != ITERATION:
            common.fail(ME, "load rank %d: iteration %d loaded, %d saved" % (rank, iteration, ITERATION))
        with torch.no_grad():
            for i in range(len(tensors)):
                take(i)
    common.end_rank(ME, rank, pattern, tensors, view.regions, MODE == "load")
    return len(view.regions)


def main():
    global MODE, LAYOUT, DIR
    MODE, LAYOUT, DIR = common.arguments(ME)
    DIR = os.path.abspath(DIR)
    imports()
    mcore.install_pretrain_shims()
    world = vps.Layout.load(LAYOUT).world
    seconds, counts = common.fork_ranks(ME, MODE, world, "vps-mcp-", rank_main)
    print("seconds: %.4f" % seconds)
    if MODE == "save":
        written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(DIR) for f in fs)
        print("bytes_written: %d" % written)
    print("format: torch_dist, fully_reshardable")
    for rank, n in enumerate(counts):
        print("rank %d: %d regions %s" % (rank, n, "saved" if MODE == "save" else "loaded, checked"))


if __name__ == "__main__":
    main()
