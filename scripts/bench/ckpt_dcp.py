#!/usr/bin/env python3
"""PyTorch's distributed checkpoint (torch.distributed.checkpoint, DCP) as
checkpoint-and-restart: the state a switch moves, saved by the ranks of
layout A and loaded resharded by the ranks of layout B, timed and checked.

    ckpt_dcp.py save A.layout DIR
    ckpt_dcp.py load B.layout DIR

One forked process per rank, the ranks a gloo process group (joined before
the clock starts, as ckpt_bench's ranks allocate theirs). Each rank's state
is vps's flat buffers of the layout, filled with the trainer's deterministic
pattern (save); every (tensor, state) pair is one DCP entry, a ShardedTensor
of the logical tensor's shape whose local shards are the rank's regions:
views of its buffers at their global offsets in the logical tensor, so
DCP sees each rank's own boxes and vps's layout is all it is told. A box
that data-parallel replicas hold alike is saved once (DCP requires the
saved shards to tile each tensor): the replicas take turns, box by box,
as Megatron's fully parallel save splits the work. save: every rank at once
on a signal, dcp.save with a FileSystemWriter (one file per rank, fsynced,
and the coordinator's metadata), DIR fsynced; the time is from the signal
until the last rank is done. load: every rank of B asks dcp.load for its own
boxes (replicas each load theirs); DCP's planner finds the saved shards
they overlap and reads them. Then, untimed, every rank checks every element
of its state against the pattern and its padding for zeros; a wrong element
fails the run (exit 1), so the figure is never that of wrong work.

Prints YAML: seconds, bytes_written (save), entries, and one line per rank.
Bad arguments exit 2."""
import datetime
import logging
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ME = "ckpt_dcp.py"

import ckpt_common as common  # noqa: E402

MODE, LAYOUT, DIR = common.arguments(ME)

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
sys.path.insert(0, os.path.join(TOP, "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import vps  # noqa: E402


def writers(lay):
    try:
        return common.writers(lay)
    except ValueError as e:
        common.fail(ME, str(e))


def rank_main(rank, world, store, ready, go, done):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    lay = vps.Layout.load(LAYOUT)
    model = lay.model
    view = lay.rank(rank)
    pattern = common.Pattern(model)
    dtypes = {vps.BF16: torch.bfloat16, vps.FP32: torch.float32}
    buffers = [torch.zeros(b.elements, dtype=dtypes[b.dtype]) for b in view.buffers]
    owner = writers(lay)
    if MODE == "save":
        for r in view.regions:
            pattern.fill(buffers[r.buffer], r)
        mine = [r for r in view.regions if owner[common.box_key(r)] == rank]
        sd = common.state_dict(model, buffers, mine, common.tiling(owner, set(), rank), rank, "cpu")
    else:
        mine = {common.box_key(r) for r in view.regions}
        sd = common.state_dict(model, buffers, view.regions, common.tiling(owner, mine, rank), rank, "cpu")
    dist.barrier()
    os.write(ready, b"r")
    os.read(go, 1)  # the parent closes its end: every rank starts at once
    if MODE == "save":
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(DIR, sync_files=True, thread_count=1))
        if rank == 0:
            fd = os.open(DIR, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    else:
        dcp.load(sd, storage_reader=dcp.FileSystemReader(DIR))
    os.write(done, b"d")
    common.end_rank(ME, rank, pattern, buffers, view.regions, MODE == "load")
    return len(sd) if MODE == "save" else len(view.regions)


def main():
    world = vps.Layout.load(LAYOUT).world
    seconds, counts = common.fork_ranks(ME, MODE, world, "vps-dcp-", rank_main)
    print("seconds: %.4f" % seconds)
    if MODE == "save":
        print("bytes_written: %d" % sum(os.path.getsize(os.path.join(DIR, f)) for f in os.listdir(DIR)))
        print("entries: %d" % sum(counts))
    for rank, n in enumerate(counts):
        print("rank %d: %d %s" % (rank, n, "entries saved" if MODE == "save" else "regions loaded, checked"))


if __name__ == "__main__":
    main()
