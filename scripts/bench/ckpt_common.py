"""What the checkpoint-and-restart benchmarks share (ckpt_dcp.py,
ckpt_mcp.py, gpu_dcp.py): the pattern their ranks fill and check, what
PyTorch's DCP is told of vps's boxes, and the forked ranks timed from one
signal until the last is done.

Imports only the standard library at the top: ckpt_mcp.py's file is
imported again by the process Megatron's checkpoint writer spawns, and
gpu_dcp.py's parent never imports torch. Whoever calls what needs vps has
put TOP/python on sys.path first."""
import ctypes as C
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time

STEP = 1  # the pattern's step, as ckpt_bench's


def usage(me, msg=None):
    if msg:
        print("%s: %s" % (me, msg), file=sys.stderr)
    print("usage: %s save A.layout DIR | load B.layout DIR" % me, file=sys.stderr)
    sys.exit(2)


def arguments(me):
    """(mode, layout, dir) of `save A.layout DIR` or `load B.layout DIR`;
    anything else is a usage error (exit 2)."""
    if len(sys.argv) != 4 or sys.argv[1] not in ("save", "load"):
        usage(me)
    mode, layout, where = sys.argv[1:]
    if not os.path.isfile(layout):
        usage(me, "%s: no such layout file" % layout)
    if not os.path.isdir(where):
        usage(me, "%s: not a directory" % where)
    return mode, layout, where


def fail(me, msg):
    """A rank's failure: said, and the rank gone at once (the parent counts it)."""
    print("%s: %s" % (me, msg), file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


class Pattern:
    """The trainer's deterministic pattern (ckpt_bench's) over the tensors of
    one model: a rank's regions filled with it, and its state checked."""

    def __init__(self, model):
        from vps import _lib
        self._lib = _lib
        lib = _lib.lib
        lib.vps_fill_region.restype = None
        lib.vps_fill_region.argtypes = [C.c_void_p, C.POINTER(_lib.Region), C.POINTER(_lib.Tensor), C.c_int64]
        lib.vps_check_region.restype = C.c_int64
        lib.vps_check_region.argtypes = [C.c_void_p, C.POINTER(_lib.Region), C.POINTER(_lib.Tensor), C.c_int64]
        self.model = model
        self._tensors = {}

    def _tensor(self, tid):
        if tid not in self._tensors:
            self._tensors[tid] = self.model.tensor(tid)
        return self._tensors[tid]

    def _region(self, r):
        g = self._lib.Region(tensor=r.tensor, state=r.state, buffer=r.buffer, offset=r.offset)
        g.box.ndim = len(r.lo)
        for k, (lo, hi, st) in enumerate(zip(r.lo, r.hi, r.strides)):
            g.box.lo[k], g.box.hi[k], g.strides[k] = lo, hi, st
        return g

    def fill(self, buffer, r):
        """Region r of a host tensor (its buffer) as the pattern says."""
        self._lib.lib.vps_fill_region(buffer.data_ptr(), C.byref(self._region(r)), C.byref(self._tensor(r.tensor)),
                                      STEP)

    def check(self, buffers, regions):
        """(wrong, dirty): the elements of the regions that differ from the
        pattern, and the nonzero elements of the host tensors (a rank's
        buffers) that no region covers (their padding)."""
        import torch
        wrong = dirty = 0
        covered = [torch.zeros(b.numel(), dtype=torch.bool) for b in buffers]
        for r in regions:
            wrong += self._lib.lib.vps_check_region(buffers[r.buffer].data_ptr(), C.byref(self._region(r)),
                                                    C.byref(self._tensor(r.tensor)), STEP)
            end = r.offset + sum((h - lo - 1) * s for lo, h, s in zip(r.lo, r.hi, r.strides)) + 1
            covered[r.buffer][r.offset:end] = True
        for b, cov in zip(buffers, covered):
            dirty += int((b[~cov] != 0).sum())
        return wrong, dirty


def end_rank(me, rank, pattern, buffers, regions, loaded, failed=0):
    """A rank's end, untimed: after a load (loaded), every element of its
    regions as the pattern says and its buffers' padding zero, or said;
    then every rank learns whether any failed (failed: what the caller
    found wrong besides, and said), so that none leaves the others
    hanging, and the process group ends. A failure ends the rank (exit 1)."""
    import torch
    import torch.distributed as dist
    wrong = dirty = 0
    if loaded:
        wrong, dirty = pattern.check(buffers, regions)
        if wrong or dirty:
            print("%s: load rank %d: %d wrong elements, %d nonzero padding elements after loading the checkpoint"
                  % (me, rank, wrong, dirty), file=sys.stderr)
    bad = torch.tensor([wrong + dirty + failed])
    dist.all_reduce(bad)
    dist.destroy_process_group()
    if bad.item():
        sys.stderr.flush()
        os._exit(1)


# ---- what DCP is told: vps's boxes ----

def box_key(r):
    return (r.tensor, r.state, tuple(r.lo), tuple(r.hi))


def writers(lay):
    """Who saves each distinct box {(tensor, state, lo, hi): rank}: a box
    several ranks hold alike (replicas) goes to one of them, the replicas
    taking turns box by box, as Megatron's fully parallel save splits the
    work. The boxes of a (tensor, state) must tile it without overlapping
    (DCP's rule for the saved shards); a layout whose boxes overlap
    otherwise is refused (ValueError)."""
    holders = {}
    for r in range(lay.world):
        for g in lay.rank(r).regions:
            holders.setdefault(box_key(g), []).append(r)
    turns, owner, by_pair = {}, {}, {}
    for box, ranks in sorted(holders.items()):
        group = tuple(ranks)
        k = turns.get(group, 0)
        turns[group] = k + 1
        owner[box] = group[k % len(group)]
        by_pair.setdefault(box[:2], []).append(box[2:])
    for (t, s), boxes in by_pair.items():
        for i, (lo, hi) in enumerate(boxes):
            for lo2, hi2 in boxes[i + 1:]:
                if all(max(a, b) < min(c, d) for a, b, c, d in zip(lo, lo2, hi, hi2)):
                    raise ValueError("tensor %d state %d: boxes %s..%s and %s..%s overlap" % (t, s, lo, hi, lo2, hi2))
    return owner


def tiling(owner, mine, rank):
    """{(tensor, state): [(lo, hi, rank)]}: every distinct box once, with its
    writer, except that the boxes of `mine` (this rank's, to load) name this
    rank: each rank's metadata tiles every tensor and names its own shards
    (replicas would overlap)."""
    out = {}
    for box, q in owner.items():
        out.setdefault(box[:2], []).append((box[2], box[3], rank if box in mine else q))
    return out


def state_dict(model, buffers, regions, layout_tiling, rank, where):
    """{"name/state": ShardedTensor} of the given regions of this rank: each
    a view of its buffer at the box's global offset in the logical tensor
    (on device `where`, "cpu" or "cuda:0"), every rank's shards of the
    tensor those of layout_tiling."""
    import torch
    import vps
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
    props, local = {}, {}
    for r in regions:
        pair = (r.tensor, r.state)
        view = buffers[r.buffer].as_strided([h - lo for lo, h in zip(r.lo, r.hi)], r.strides, r.offset)
        md = ShardMetadata([*r.lo], [h - lo for lo, h in zip(r.lo, r.hi)], "rank:%d/%s" % (rank, where))
        local.setdefault(pair, []).append(Shard(view, md))
        props[pair] = (model.tensor_shape(r.tensor), buffers[r.buffer].dtype)
    out = {}
    for pair, shards in local.items():
        shape, dtype = props[pair]
        meta = ShardedTensorMetadata(
            [ShardMetadata([*lo], [h - a for a, h in zip(lo, hi)], "rank:%d/%s" % (q, where))
             for lo, hi, q in layout_tiling[pair]],
            torch.Size(shape),
            TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False))
        key = "%s/%s" % (model.tensor_name(pair[0]), vps.STATES[pair[1]])
        out[key] = ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta)
    return out


# ---- the ranks: forked, timed from one signal until the last is done ----

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


def fork_ranks(me, mode, world, prefix, rank_main):
    """rank_main(rank, world, store, ready, go, done) in a forked process
    per rank, store the path of their gloo FileStore: each writes to ready
    when set up, waits on go (every rank starts at once), writes to done
    when its timed part is over, and returns what the parent collects.
    (seconds from go until the last done, [each rank's return value]); a
    failed rank (it said why) exits 1."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    tmp = tempfile.mkdtemp(prefix=prefix)
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
                print("%s: %s rank %d: %s: %s" % (me, mode, rank, type(e).__name__, e), file=sys.stderr)
                code = 1
            # what the rank started (Megatron's checkpoint writer starts a manager process by spawn), which
            # os._exit would leave running
            for child in multiprocessing.active_children():
                child.terminate()
                child.join()
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
    try:
        if failed or got < world or finished < world:
            sys.exit(1)  # the rank said why
        counts = []
        for rank in range(world):
            with open(os.path.join(tmp, "%d.out" % rank), "rb") as f:
                counts.append(pickle.load(f))
    finally:
        # the store and the ranks' results, also after a failed rank
        shutil.rmtree(tmp, ignore_errors=True)
    return t1 - t0, counts
