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
import ctypes as C
import datetime
import logging
import os
import pickle
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ME = "ckpt_dcp.py"
STEP = 1  # the pattern's step, as ckpt_bench's


def usage(msg=None):
    if msg:
        print("%s: %s" % (ME, msg), file=sys.stderr)
    print("usage: %s save A.layout DIR | load B.layout DIR" % ME, file=sys.stderr)
    sys.exit(2)


if len(sys.argv) != 4 or sys.argv[1] not in ("save", "load"):
    usage()
MODE, LAYOUT, DIR = sys.argv[1:]
if not os.path.isfile(LAYOUT):
    usage("%s: no such layout file" % LAYOUT)
if not os.path.isdir(DIR):
    usage("%s: not a directory" % DIR)

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
sys.path.insert(0, os.path.join(TOP, "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed._shard.metadata import ShardMetadata  # noqa: E402
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor  # noqa: E402
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties  # noqa: E402

import vps  # noqa: E402
from vps import _lib  # noqa: E402

_lib.lib.vps_fill_region.restype = None
_lib.lib.vps_fill_region.argtypes = [C.c_void_p, C.POINTER(_lib.Region), C.POINTER(_lib.Tensor), C.c_int64]
_lib.lib.vps_check_region.restype = C.c_int64
_lib.lib.vps_check_region.argtypes = [C.c_void_p, C.POINTER(_lib.Region), C.POINTER(_lib.Tensor), C.c_int64]


def fail(msg):
    print("%s: %s" % (ME, msg), file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def c_region(r):
    g = _lib.Region(tensor=r.tensor, state=r.state, buffer=r.buffer, offset=r.offset)
    g.box.ndim = len(r.lo)
    for k, (lo, hi, st) in enumerate(zip(r.lo, r.hi, r.strides)):
        g.box.lo[k], g.box.hi[k], g.strides[k] = lo, hi, st
    return g


def key_of(model, r):
    return "%s/%s" % (model.tensor_name(r.tensor), vps.STATES[r.state])


def writers(lay):
    """Which rank saves each box: {(tensor, state, lo, hi): rank}. A box held
    alike by several ranks (replicas) goes to one of them, the replicas
    taking turns box by box; boxes of one tensor that overlap without being
    the same box cannot be tiled, and are refused."""
    holders = {}
    for r in range(lay.world):
        for g in lay.rank(r).regions:
            holders.setdefault((g.tensor, g.state, g.lo, g.hi), []).append(r)
    by_key, turns, owner = {}, {}, {}
    for box, ranks in sorted(holders.items()):
        group = tuple(ranks)
        k = turns.get(group, 0)
        turns[group] = k + 1
        owner[box] = group[k % len(group)]
        by_key.setdefault(box[:2], []).append(box[2:])
    for (t, s), boxes in by_key.items():
        for i, (lo, hi) in enumerate(boxes):
            for lo2, hi2 in boxes[i + 1:]:
                if all(max(a, b) < min(c, d) for a, b, c, d in zip(lo, lo2, hi, hi2)):
                    fail("tensor %d state %d: boxes %s..%s and %s..%s overlap" % (t, s, lo, hi, lo2, hi2))
    return owner


def state_dict(lay, model, rank, buffers, regions, everyone):
    """{key: ShardedTensor} of the given regions of this rank; everyone:
    {key: [(lo, hi, rank)]}, every rank's shards of each key."""
    props = {}
    local = {}
    for r in regions:
        key = key_of(model, r)
        b = buffers[r.buffer]
        view = b.as_strided([h - l for l, h in zip(r.lo, r.hi)], r.strides, r.offset)
        md = ShardMetadata([*r.lo], [h - l for l, h in zip(r.lo, r.hi)], "rank:%d/cpu" % rank)
        local.setdefault(key, []).append(Shard(view, md))
        props[key] = (model.tensor_shape(r.tensor), b.dtype)
    out = {}
    for key, shards in local.items():
        shape, dtype = props[key]
        meta = ShardedTensorMetadata(
            [ShardMetadata([*lo], [h - l for l, h in zip(lo, hi)], "rank:%d/cpu" % q) for lo, hi, q in everyone[key]],
            torch.Size(shape),
            TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False))
        out[key] = ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta)
    return out


def rank_main(rank, world, store, ready, go, done):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    lay = vps.Layout.load(LAYOUT)
    model = lay.model
    view = lay.rank(rank)
    dtypes = {vps.BF16: torch.bfloat16, vps.FP32: torch.float32}
    buffers = [torch.zeros(b.elements, dtype=dtypes[b.dtype]) for b in view.buffers]
    tensors = {}

    def tensor(tid):
        if tid not in tensors:
            tensors[tid] = model.tensor(tid)
        return tensors[tid]

    if MODE == "save":
        for r in view.regions:
            _lib.lib.vps_fill_region(buffers[r.buffer].data_ptr(), C.byref(c_region(r)), C.byref(tensor(r.tensor)),
                                     STEP)
        owner = writers(lay)
        everyone = {}
        for box, q in owner.items():
            everyone.setdefault("%s/%s" % (model.tensor_name(box[0]), vps.STATES[box[1]]), []).append(
                (box[2], box[3], q))
        mine = [r for r in view.regions if owner[(r.tensor, r.state, r.lo, r.hi)] == rank]
        sd = state_dict(lay, model, rank, buffers, mine, everyone)
    else:
        # the tiling of the distinct boxes, this rank's own as its: a
        # ShardedTensor's shards must tile the tensor, replicas would overlap
        mine = {(r.tensor, r.state, r.lo, r.hi) for r in view.regions}
        everyone = {}
        for box, q in writers(lay).items():
            everyone.setdefault("%s/%s" % (model.tensor_name(box[0]), vps.STATES[box[1]]), []).append(
                (box[2], box[3], rank if box in mine else q))
        sd = state_dict(lay, model, rank, buffers, view.regions, everyone)
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
    # untimed: every element as the pattern says, padding zero
    wrong = dirty = 0
    if MODE == "load":
        covered = [torch.zeros(b.elements, dtype=torch.bool) for b in view.buffers]
        for r in view.regions:
            wrong += _lib.lib.vps_check_region(buffers[r.buffer].data_ptr(), C.byref(c_region(r)),
                                               C.byref(tensor(r.tensor)), STEP)
            end = r.offset + sum((h - l - 1) * s for l, h, s in zip(r.lo, r.hi, r.strides)) + 1
            covered[r.buffer][r.offset:end] = True
        for b, cov in zip(buffers, covered):
            dirty += int((b[~cov] != 0).sum())
        if wrong or dirty:
            print("%s: load rank %d: %d wrong elements, %d nonzero padding elements after loading the checkpoint"
                  % (ME, rank, wrong, dirty), file=sys.stderr)
    # every rank learns whether any failed, so that none leaves the others hanging
    bad = torch.tensor([wrong + dirty])
    dist.all_reduce(bad)
    dist.destroy_process_group()
    if bad.item():
        sys.stderr.flush()
        os._exit(1)
    return len(sd) if MODE == "save" else len(view.regions)


def count(fd, n):
    """Bytes read from fd, up to n: the ranks that said so (fewer when one
    died first and every writer is gone)."""
    got = 0
    while got < n:
        k = len(os.read(fd, n - got))
        if not k:
            break
        got += k
    return got


def main():
    world = vps.Layout.load(LAYOUT).world
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    tmp = tempfile.mkdtemp(prefix="vps-dcp-")
    store = os.path.join(tmp, "store")
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(ready_r)
                os.close(go_w)
                os.close(done_r)
                n = rank_main(rank, world, store, ready_w, go_r, done_w)
                with open(os.path.join(tmp, "%d.out" % rank), "wb") as f:
                    pickle.dump(n, f)
            except BaseException as e:  # reported, whatever it is
                print("%s: %s rank %d: %s: %s" % (ME, MODE, rank, type(e).__name__, e), file=sys.stderr)
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    os.close(done_w)
    got = count(ready_r, world)
    t0 = time.monotonic()
    os.close(go_w)
    finished = count(done_r, world) if got == world else 0
    t1 = time.monotonic()
    failed = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        failed |= not os.WIFEXITED(st) or os.WEXITSTATUS(st) != 0
    if failed or got < world or finished < world:
        sys.exit(1)  # the rank said why
    counts = []
    for rank in range(world):
        with open(os.path.join(tmp, "%d.out" % rank), "rb") as f:
            counts.append(pickle.load(f))
    for rank in range(world):
        os.unlink(os.path.join(tmp, "%d.out" % rank))
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    print("seconds: %.4f" % (t1 - t0))
    if MODE == "save":
        print("bytes_written: %d" % sum(os.path.getsize(os.path.join(DIR, f)) for f in os.listdir(DIR)))
        print("entries: %d" % sum(counts))
    for rank, n in enumerate(counts):
        print("rank %d: %d %s" % (rank, n, "entries saved" if MODE == "save" else "regions loaded, checked"))


if __name__ == "__main__":
    main()
