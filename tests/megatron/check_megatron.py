"""vps-layout against Megatron-Core's own code (make check-megatron).

For each configuration of the matrix below, megatron-core builds the model
on the CPU, one forked process per rank over gloo (tests/megatron/mcore.py:
the training path's process groups, model chunks, DistributedDataParallel
and the distributed optimizer's shard ranges), and each rank compares what
Megatron built with what vps computes for it (python/vps, vps_layout_rank):

  - the rank's coordinates (tp, cp, dp, pp, etp, ep, edp);
  - per model chunk and buffer (dense, expert): every parameter's name,
    registration order, shape, offset, size and bucket; the buffer's size;
    every bucket's bounds and its unpadded size (padding);
  - every element of every parameter in each optimizer state (main_param,
    exp_avg, exp_avg_sq; grad with grad=1): whether the rank holds it and
    where, against the distributed optimizer's shard ranges with ZeRO-1
    (each bucket's shard of this DP rank, vps's shard buffers being the
    buckets' shards one after the other) and the whole parameter without;
    the elements vps leaves out must be the vocabulary's padding rows;
  - the routers' expert_bias module buffers: names, order, sizes.

    check_megatron.py [-v] [-k SUBSTRING] [--timeout S]

Prints a line per configuration with -v, then `N configurations, every rank
equal to Megatron-Core`; exit 1 naming the first rank, parameter and field
that differs (or the rank's error), 2 on bad arguments.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)

import mcore  # noqa: E402  (imports torch and megatron-core once, before the ranks fork)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import vps  # noqa: E402

# (model, parallel configuration): each line says what it covers that the
# others do not. Worlds stay at 8 ranks or fewer (2 cores here and in CI).
MATRIX = [
    # GPT-3 shape: learned positions, LayerNorm and biases, tied embeddings;
    # PP 2 puts a shared_embedding copy of the word embeddings on the last
    # stage, in a bucket of its own under the distributed optimizer
    ("tiny-gpt", "tp=2,pp=2,dp=2,zero=1"),
    # tied with PP 1: no output_layer parameter at all; DP 3, so that buckets
    # end on multiples of lcm(3, 128), not of 128
    ("tiny-gpt", "tp=2,dp=3,zero=1"),
    # no distributed optimizer: no padding, whole parameters; buckets by size
    ("tiny-gpt", "tp=2,pp=2,dp=2,zero=0,bucket=300000"),
    # VPP with tied embeddings: the copy lives in the last chunk of the last stage
    ("tiny-gpt", "pp=2,vpp=2,dp=2,zero=1"),
    # LLaMA shape: GQA (8 heads, 4 groups), SwiGLU, RMSNorm, a padded vocabulary
    ("tiny-llama", "tp=2,dp=2,zero=1"),
    # TP equal to the number of groups, and PP
    ("tiny-llama", "tp=4,pp=2,zero=1"),
    # virtual pipeline chunks: a DDP per chunk, buckets only in chunk 0
    ("tiny-llama", "tp=2,pp=2,vpp=2,dp=2,zero=1"),
    # explicit buckets on the first stage's first chunk, none elsewhere
    ("tiny-llama", "pp=2,vpp=2,dp=2,zero=1,bucket=200000"),
    # uneven stages: 1 layer first and last, 3 each in the middle
    ("tiny-llama", "pp=4,first=1,last=1,dp=2,zero=1"),
    # context parallelism: the dense shards span dp x cp
    ("tiny-llama", "tp=2,cp=2,dp=2,zero=1"),
    # the training path's default bucket size (max(40M, 1M x dp x cp)) with CP
    ("tiny-llama", "cp=2,dp=2,zero=1,bucket=auto"),
    # explicit buckets without the distributed optimizer, with fp32 gradients held
    ("tiny-llama", "dp=2,zero=0,bucket=100000,grad=1"),
    # explicit small buckets with ZeRO-1 and gradients
    ("tiny-llama", "tp=2,dp=4,zero=1,bucket=150000,grad=1"),
    # MoE, sequential experts, EP 2: an expert buffer sharded over expert DP
    ("tiny-qwen3-moe", "tp=2,ep=2,dp=2,zero=1"),
    # ETP 1 under TP 2 with EP
    ("tiny-qwen3-moe", "tp=2,etp=1,ep=2,dp=2,zero=1"),
    # EP 1 and ETP != TP: core 0.19 puts the experts in an expert buffer anyway
    ("tiny-qwen3-moe", "tp=2,etp=1,dp=2,zero=1"),
    # EP 1 and ETP = TP: experts in the dense buffer
    ("tiny-qwen3-moe", "tp=2,dp=2,zero=1"),
    # ETP larger than TP
    ("tiny-qwen3-moe", "etp=2,ep=2,dp=4,zero=1"),
    # MoE with pipeline stages, without the distributed optimizer
    ("tiny-qwen3-moe", "pp=2,ep=2,dp=2,zero=0"),
    # MoE with CP: expert data parallelism spans CP
    ("tiny-qwen3-moe", "cp=2,ep=2,dp=2,zero=1"),
    # buckets closing on odd sizes (the q/k norms' 32 elements) over DP 3
    ("tiny-qwen3-moe", "dp=3,zero=1,bucket=30000"),
    # MoE with VPP and buckets
    ("tiny-qwen3-moe", "pp=2,vpp=2,ep=2,dp=2,zero=1,bucket=20000"),
    # DeepSeek-V3 shape: MLA with query compression and q/kv norms fused into
    # the up projections, dense first layers, shared experts, the routers'
    # expert_bias, an MTP layer
    ("tiny-deepseek", "tp=2,ep=2,dp=2,zero=1"),
    # the same over two stages: the MTP layer and its copy of the word
    # embeddings on the last
    ("tiny-deepseek", "pp=2,ep=2,dp=2,zero=1"),
    # DeepSeek-V2-Lite shape: MLA without query compression, with qk norm:
    # linear_q_proj carries the norm's layer_norm_weight
    ("models/tiny-deepseek-v2-lite.yaml", "tp=2,ep=2,dp=2,zero=1"),
]


class Mismatch(Exception):
    pass


def expect(what, megatron, ours):
    if megatron != ours:
        raise Mismatch("%s: Megatron-Core %s, vps %s" % (what, megatron, ours))


def box_index(lo, hi, offset, strides):
    """The buffer offsets of a region's box, as an array of the box's shape."""
    idx = np.full(tuple(h - l for l, h in zip(lo, hi)), offset, dtype=np.int64)
    for k, (l, h, s) in enumerate(zip(lo, hi, strides)):
        shape = [1] * len(lo)
        shape[k] = h - l
        idx += (np.arange(h - l, dtype=np.int64) * s).reshape(shape)
    return idx


def local_index(p, regions):
    """The local flat index (in the torch parameter) of every logical element
    the rank holds of parameter p, from its param-state regions: the
    bounding box's origin and an array over that box (-1 where not held)."""
    lo = [min(r.lo[k] for r in regions) for k in range(len(regions[0].lo))]
    hi = [max(r.hi[k] for r in regions) for k in range(len(regions[0].lo))]
    a = np.full(tuple(h - l for l, h in zip(lo, hi)), -1, dtype=np.int64)
    for r in regions:
        sl = tuple(slice(x - l, y - l) for x, y, l in zip(r.lo, r.hi, lo))
        if (a[sl] >= 0).any():
            raise Mismatch("%s: param regions overlap" % p.local_name)
        a[sl] = box_index(r.lo, r.hi, r.offset, r.strides) - p.offset
    return lo, a


def padding_rows(name, shape, vocab, tp_rank):
    """The local flat indices of the vocabulary padding of an embedding or
    output weight (rows past the vocabulary in Megatron's padded one)."""
    if not (name.endswith("word_embeddings.weight") or name.endswith("output_layer.weight")):
        return np.zeros(0, dtype=np.int64)
    rows, cols = shape
    first = max(0, vocab - tp_rank * rows)
    return np.arange(first * cols, rows * cols, dtype=np.int64) if first < rows else np.zeros(0, dtype=np.int64)


def bucket_bounds(params, elements):
    """vps's buckets of one buffer: bucket b starts at its first parameter
    (a bucket's start is aligned, so its first parameter sits there) and
    ends where the next starts, the last at the buffer's end; the unpadded
    size reaches the bucket's last parameter's end."""
    starts, ends = {}, {}
    for p in params:
        starts[p.bucket] = min(starts.get(p.bucket, p.offset), p.offset)
        ends[p.bucket] = max(ends.get(p.bucket, 0), p.offset + p.elements)
    n = len(starts)
    if sorted(starts) != list(range(n)):
        raise Mismatch("vps buckets are not numbered 0..%d: %s" % (n - 1, sorted(starts)))
    out = []
    for b in range(n):
        hi = starts[b + 1] if b + 1 < n else elements
        out.append((starts[b], hi, ends[b] - starts[b]))
    return out


def compare_rank(rank, lay, model, par, chunks, ddps):
    """Every field of what Megatron built on this rank against vps's view of
    it; raises Mismatch at the first difference. Returns counts."""
    view = lay.rank(rank)
    expect("rank %d coordinates" % rank, mcore.coords(), {k: getattr(view.coords, k) for k in mcore.coords()})
    nparams = nelems = 0
    tp_rank = view.coords.tp
    regions = {}
    for r in view.regions:
        regions.setdefault((r.param, r.state), []).append(r)
    states = [vps.MAIN_PARAM, vps.EXP_AVG, vps.EXP_AVG_SQ] + ([vps.GRAD] if par["grad"] else [])
    for v, (chunk, ddp) in enumerate(zip(chunks, ddps)):
        gpt = chunk.module
        names = {id(p): n for n, p in gpt.named_parameters()}
        where = "rank %d chunk %d" % (rank, v)
        groups = [(False, ddp.buffers), (True, ddp.expert_parallel_buffers)]
        for expert, bufs in groups:
            ours = [p for p in view.params if p.chunk == v and p.expert == expert and not p.module_buffer]
            w = "%s %s buffer" % (where, "expert" if expert else "dense")
            expect(w + " count", len(bufs), 1 if ours else 0)
            if not bufs:
                continue
            buf = bufs[0]
            expect(w + " param dtype", buf.param_dtype, torch.bfloat16)
            expect(w + " grad dtype", buf.grad_dtype, torch.float32)
            # registration order (DDP keeps named_parameters()'s in a buffer)
            order = {id(p): i for i, (_, p) in enumerate(gpt.named_parameters())}
            theirs = sorted(buf.params, key=lambda p: order[id(p)])
            for i, (tp_, op) in enumerate(zip(theirs, ours)):
                expect("%s parameter %d name" % (w, i), names[id(tp_)], op.local_name)
            if len(theirs) != len(ours):
                n = min(len(theirs), len(ours))
                more = [names[id(p)] for p in theirs[n:]] or [p.local_name for p in ours[n:]]
                raise Mismatch("%s: Megatron-Core registers %d parameters, vps %d; from parameter %d: %s"
                               % (w, len(theirs), len(ours), n, ", ".join(more[:3])))
            for i, (tp_, op) in enumerate(zip(theirs, ours)):
                s, e, b = buf.param_index_map[tp_]
                pw = "%s %s" % (w, op.local_name)
                expect(pw + " shape", tuple(tp_.shape), tuple(op.shape))
                expect(pw + " offset", s, op.offset)
                expect(pw + " elements", e - s, op.elements)
                expect(pw + " bucket", b, op.bucket)
            pbuf = view.buffer(vps.PARAM, v, expert)
            expect(w + " elements", buf.numel, view.buffers[pbuf].elements)
            mb = [(bk.offset, bk.offset + bk.grad_data.numel(), bk.numel_unpadded) for bk in buf.buckets]
            expect(w + " buckets (start, end, unpadded)", mb, bucket_bounds(ours, view.buffers[pbuf].elements))
            zero = bool(par["zero"])
            dp = buf.data_parallel_group.size()
            if zero:
                ranges = mcore.gbuf_ranges(buf)
                bases = np.cumsum([0] + [bk.grad_data.numel() // dp for bk in buf.buckets]).tolist()
                shard_total = bases[-1]
            for tp_, op in zip(theirs, ours):
                pw = "%s %s" % (w, op.local_name)
                s, e, b = buf.param_index_map[tp_]
                numel = e - s
                lo, a = local_index(op, regions.get((op.index, vps.PARAM), []) or _missing(pw))
                held = a[a >= 0]
                covered = np.zeros(numel, dtype=bool)
                covered[held] = True
                if covered.sum() != held.size:
                    raise Mismatch("%s: an element in two param regions" % pw)
                pad = padding_rows(names[id(tp_)], tuple(tp_.shape), model.vocab, tp_rank)
                expect(pw + " elements no param region covers (vocabulary padding)",
                       _ranges(np.flatnonzero(~covered)), _ranges(pad))
                # where Megatron keeps each element of the parameter in the
                # optimizer states (-1: not on this rank), in vps's terms:
                # the bucket shards one after the other with ZeRO-1, the
                # whole parameter at its buffer offset without
                want = np.full(numel, -1, dtype=np.int64)
                if zero:
                    rm = ranges[b]["param_map"].get(tp_)
                    if rm is not None:
                        want[rm["param"].start:rm["param"].end] = \
                            bases[b] + rm["gbuf_local"].start + np.arange(rm["param"].end - rm["param"].start)
                else:
                    want[:] = s + np.arange(numel)
                want[~covered] = -1
                for st in states:
                    sw = "%s %s" % (pw, vps.STATES[st])
                    sbuf = view.buffer(st, v, expert)
                    sharded = zero and st != vps.GRAD
                    expect(sw + " buffer sharded", sharded, view.buffers[sbuf].sharded)
                    # main_grad is a view of DDP's grad buffer at the parameter's index
                    w_st = want if sharded or not zero else np.where(covered, s + np.arange(numel), -1)
                    got = _state_offsets(numel, lo, a, regions.get((op.index, st), []), sw)
                    if (got != w_st).any():
                        k = int(np.argmax(got != w_st))
                        raise Mismatch("%s element %d: Megatron-Core %s, vps %s" % (sw, k, _at(w_st[k], sharded),
                                                                                 _at(got[k], sharded)))
                    nelems += int((got >= 0).sum())
                nparams += 1
            for st in states:
                sbuf = view.buffer(st, v, expert)
                total = shard_total if zero and st != vps.GRAD else buf.numel
                expect("%s %s elements" % (w, vps.STATES[st]), total, view.buffers[sbuf].elements)
        # module buffers: the routers' expert_bias, in module order
        theirs = [(n, tuple(b.shape)) for n, b in gpt.named_buffers() if n.endswith(".expert_bias")]
        ours = [(p.local_name, (p.elements,)) for p in view.params if p.chunk == v and p.module_buffer]
        expect(where + " module buffers (expert_bias)", theirs, ours)
    return nparams, nelems


def _missing(what):
    raise Mismatch("%s: vps holds no param region of it" % what)


def _state_offsets(numel, lo, a, regs, what):
    """Where each local element of a parameter sits in one state's buffer
    (-1: not held), from the state's regions of it."""
    off = np.full(numel, -1, dtype=np.int64)
    for r in regs:
        sl = tuple(slice(x - l, y - l) for x, y, l in zip(r.lo, r.hi, lo))
        loc = a[sl]
        if loc.shape != tuple(y - x for x, y in zip(r.lo, r.hi)) or (loc < 0).any():
            raise Mismatch("%s: a region %s..%s outside the parameter's param regions" % (what, r.lo, r.hi))
        loc = loc.ravel()
        if (off[loc] >= 0).any():
            raise Mismatch("%s: an element held twice" % what)
        off[loc] = box_index(r.lo, r.hi, r.offset, r.strides).ravel()
    return off


def _at(offset, sharded):
    return "not held" if offset < 0 else "at %d of the %s" % (offset, "shard buffer" if sharded else "buffer")


def _ranges(idx):
    """Sorted indices as [start, end) runs, for messages."""
    if len(idx) == 0:
        return []
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(idx, cut)]


def check(model_name, spec, timeout, vps_spec=None):
    """Megatron builds (model_name, spec) on every rank; each rank compares
    with vps's layout of spec (or of vps_spec, to see a difference named).
    Returns the layout, and the first failing rank and what failed, or None
    and every rank's counts."""
    if model_name.endswith(".yaml"):
        model_name = os.path.join(HERE, model_name)
    par = vps.layout(model_name, spec).parallel
    lay = vps.layout(model_name, vps_spec or spec)
    model = lay.model
    world = par["tp"] * par["cp"] * par["dp"] * par["pp"]
    if lay.world != world:
        raise ValueError("%s has a world of %d ranks, %s of %d" % (vps_spec, lay.world, spec, world))

    def rank_fn(rank):
        mcore.init_parallel(par)
        config = mcore.transformer_config(model, par)
        chunks = mcore.build_chunks(model, par, config)
        ddps = mcore.wrap_ddp(chunks, config, par)
        try:
            return compare_rank(rank, lay, model, par, chunks, ddps)
        except Mismatch as e:
            return e

    results = mcore.run_ranks(lay.world, rank_fn, timeout=timeout)
    for r, res in enumerate(results):
        if isinstance(res, (Mismatch, mcore.RankError)):
            return lay, r, res
    return lay, None, results


def main():
    ap = argparse.ArgumentParser(prog="check_megatron.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per configuration")
    ap.add_argument("-k", metavar="SUBSTRING", help="only the configurations whose 'model spec' contains it")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a configuration may take (default 300)")
    ap.add_argument("--vps", metavar="SPEC", help="compare the one configuration -k selects with vps's layout of "
                    "SPEC instead (of the same world): how a difference is reported")
    args = ap.parse_args()
    mcore.install_cpu_shims()
    todo = [(m, s) for m, s in MATRIX if not args.k or args.k in "%s %s" % (m, s)]
    if not todo:
        print("check_megatron.py: -k %s: no configuration matches" % args.k, file=sys.stderr)
        return 2
    if args.vps and len(todo) != 1:
        print("check_megatron.py: --vps: -k selects %d configurations, not one" % len(todo), file=sys.stderr)
        return 2
    start = time.monotonic()
    for m, s in todo:
        t0 = time.monotonic()
        try:
            lay, bad, res = check(m, s, args.timeout, args.vps)
        except (vps.Error, ValueError) as e:
            print("check_megatron.py: %s %s: %s" % (m, args.vps or s, e), file=sys.stderr)
            return 2
        if bad is not None:
            print("check-megatron: %s %s (megatron-core %s%s): %s"
                  % (os.path.basename(m), s, mcore.VERSION, ", vps " + args.vps if args.vps else "", res),
                  file=sys.stderr)
            if isinstance(res, mcore.RankError):
                print(res.trace, file=sys.stderr)
            return 1
        if args.verbose:
            print("%-15s %-44s %2d ranks, %5d parameters, %9d state elements  %.1f s"
                  % (m, s, lay.world, sum(n for n, _ in res), sum(e for _, e in res), time.monotonic() - t0))
    if args.verbose:
        print("megatron-core %s, torch %s, %.0f s" % (mcore.VERSION, torch.__version__, time.monotonic() - start))
    print("%d configurations, every rank equal to Megatron-Core" % len(todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
