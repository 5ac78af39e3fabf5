#!/usr/bin/env python3
"""PyTorch's distributed checkpoint (DCP) of a PyTorch-native job's state
as checkpoint-and-restart: real DTensors as FSDP2 and TP place them,
saved by the ranks of DTensor layout A and loaded resharded by the ranks
of DTensor layout B, timed and checked.

    ckpt_dtensor.py save A.layout DIR
    ckpt_dtensor.py load B.layout DIR

A and B are vps layouts of family=dtensor (dp_replicate, dp_shard, tp; one
model part) of a llama3 of torchtitan's definition (its llama3 debugmodel's
layers at the model file's shape: tests/torch/titan.py llama3_tiny; a model
file it cannot build is a usage error). One forked process per rank, the
ranks a gloo process group; each builds torchtitan's model on the meta
device and parallelizes it with torchtitan's own parallelize function
(FSDP2's fully_shard, HSDP, TP: titan.on_meta, the CPU shims of
tests/torch/titan.py), and torch's AdamW over it. The job's state is vps's
layout of the rank: every parameter's local shard (FSDP2's padded sharded
storage) and AdamW's exp_avg and exp_avg_sq are views of buffers of vps's
view of the rank (vps.dtensor's binding checks every parameter's name,
local shape and storage against the layout), filled with vps's
deterministic pattern, the trainer's (save), or zero (load); AdamW's step
is 1 (save) or 0 (load).

save: every rank at once on a signal, as a PyTorch job checkpoints:
get_state_dict(model, optimizer) (DTensors of the parameters and moments,
each rank's local shards) and dcp.save of {"model", "optimizer"} with a
FileSystemWriter (one file per rank, fsynced, and the coordinator's
metadata), DIR fsynced; the time is from the signal until the last rank is
done. load: every rank of B at once, get_state_dict of B's model and
optimizer, dcp.load of it from DIR (DCP's planner finds the saved shards
each local shard overlaps) and set_state_dict, until the last rank is done.
torchtitan 0.3.0's checkpointer saves model.state_dict(), whose hook splits
the fused wqkv into wq, wk and wv, gathering it whole on every rank;
get_state_dict needs each key to name a parameter, so the hook is off
while it runs (titan.fused_qkv_kept) and wqkv is saved as it is sharded.
Then, untimed, every rank of B reads what its model and optimizer hold
after set_state_dict: every element of every local shard and moment
against the pattern, bit for bit (A's values), FSDP2's padding zero, and
AdamW's step 1 on every parameter; a wrong one fails the run (exit 1).

Prints YAML: seconds, bytes_written (save), entries, and a line per rank.
Bad arguments exit 2."""
import datetime
import logging
import os
import sys
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ME = "ckpt_dtensor.py"

import ckpt_common as common  # noqa: E402

MODE, LAYOUT, DIR = common.arguments(ME)

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, os.path.join(TOP, "tests", "torch"))
import titan  # noqa: E402  (torchtitan and its CPU shims, imported once before the ranks fork)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torchtitan.models.common import compute_ffn_hidden_dim  # noqa: E402

import vps  # noqa: E402
import vps.dtensor  # noqa: E402

FAMILY_DTENSOR = 1


def llama3(lay):
    """torchtitan's ModelSpec of the layout's model, and its mesh; what
    torchtitan's llama3 cannot be, or the harness cannot parallelize, is a
    usage error naming it."""
    m, par = lay.model, lay.parallel
    if par["family"] != FAMILY_DTENSOR:
        common.usage(ME, "%s: %s is a Megatron layout; this is a DTensor job's (dp_shard=, dp_replicate=, tp=)"
                     % (LAYOUT, lay.describe()))
    if par["pp"] != 1 or par["cp"] != 1 or par["ep"] != 1:
        common.usage(ME, "%s: %s: FSDP2, HSDP and TP only (one model part, no CP or EP)" % (LAYOUT, lay.describe()))
    ffn = compute_ffn_hidden_dim(m.hidden, multiple_of=32)
    why = []
    if m.norm != 0 or m.activation != 0 or m.position != 0:
        why.append("RMSNorm, SwiGLU and RoPE")
    if m.bias or m.qkv_bias or m.qk_norm or m.tied_embeddings:
        why.append("no biases, no q/k norms, untied embeddings")
    if m.experts or m.kv_lora_rank or m.mtp_layers:
        why.append("dense, no MLA or MTP")
    if m.head_dim * m.heads != m.hidden:
        why.append("head_dim = hidden / heads")
    if m.ffn != ffn:
        why.append("ffn %d (compute_ffn_hidden_dim(%d, multiple_of=32))" % (ffn, m.hidden))
    if why:
        common.usage(ME, "%s: %s is not torchtitan's llama3 (%s)" % (LAYOUT, m.name, "; ".join(why)))
    spec = titan.llama3_tiny(layers=m.layers, dim=m.hidden, heads=m.heads, kv_heads=m.query_groups, vocab=m.vocab)
    return spec, {"dp_replicate": par["dp_replicate"], "dp_shard": par["dp_shard"], "tp": par["tp"]}


def job(lay, spec, mesh, view, buffers, step):
    """The rank's model and AdamW, their state views of buffers (Adam at
    step), the layout checked against them: (model, optimizer, binding)."""
    _, model = titan.on_meta(spec, mesh, lay.world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    bind = vps.dtensor._Binding(view, model, optimizer)
    bind.hand(types.SimpleNamespace(buffers=buffers), step)
    return model, optimizer, bind


def held(bind, view):
    """What the model and optimizer hold now, as vps's buffers of the view
    (flat: FSDP2's padded storage, the moments' local shards), and the
    number of parameters whose Adam step is not the pattern's."""
    src = bind.sources()
    missing = [b for b in range(len(view.buffers)) if src.get(b) is None]
    if missing:
        common.fail(ME, "load rank %d: the optimizer holds no %s after set_state_dict"
                    % (view.rank, vps.STATES[view.buffers[missing[0]].state]))
    steps = sum(1 for e in bind.entries if float(e.opt.state[e.param]["step"]) != common.STEP)
    return [src[b] for b in range(len(view.buffers))], steps


def rank_main(rank, world, store, ready, go, done):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    lay = vps.Layout.load(LAYOUT)
    view = lay.rank(rank)
    spec, mesh = llama3(lay)
    pattern = common.Pattern(lay.model)
    buffers = [torch.zeros(b.elements, dtype=torch.float32) for b in view.buffers]
    if MODE == "save":
        for r in view.regions:
            pattern.fill(buffers[r.buffer], r)
    model, optimizer, bind = job(lay, spec, mesh, view, buffers, common.STEP if MODE == "save" else 0)
    dist.barrier()
    os.write(ready, b"r")
    os.read(go, 1)  # the parent closes its end: every rank starts at once
    with titan.fused_qkv_kept(model):
        msd, osd = get_state_dict(model, optimizer)
        sd = {"model": msd, "optimizer": osd}
        if MODE == "save":
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(DIR, sync_files=True, thread_count=1))
            if rank == 0:
                fd = os.open(DIR, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        else:
            dcp.load(sd, storage_reader=dcp.FileSystemReader(DIR))
            set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
    os.write(done, b"d")
    steps = 0
    if MODE == "load":
        buffers, steps = held(bind, view)
        if steps:
            print("%s: load rank %d: %d parameters' Adam step is not %d after loading the checkpoint"
                  % (ME, rank, steps, common.STEP), file=sys.stderr)
    entries = len(msd) + sum(len(v) for v in osd["state"].values())
    common.end_rank(ME, rank, pattern, buffers, view.regions, MODE == "load", steps)
    return entries if MODE == "save" else len(view.regions)


def main():
    lay = vps.Layout.load(LAYOUT)
    llama3(lay)  # refused before any rank starts
    seconds, counts = common.fork_ranks(ME, MODE, lay.world, "vps-dcp-dtensor-", rank_main)
    print("seconds: %.4f" % seconds)
    if MODE == "save":
        print("bytes_written: %d" % sum(os.path.getsize(os.path.join(DIR, f)) for f in os.listdir(DIR)))
        print("entries: %d" % sum(counts))
    for rank, n in enumerate(counts):
        print("rank %d: %d %s" % (rank, n, "entries saved" if MODE == "save" else "regions loaded, checked"))


if __name__ == "__main__":
    main()
