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
import inspect
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

import vps  # noqa: E402  (without torch: the arguments are checked before it is imported)
from boxes import box_index  # noqa: E402


def heavy_imports():
    """torch, numpy and megatron-core, once the arguments are known good (a
    bad one is said at once), and once, before the ranks fork."""
    global mcore, np, torch, OptimizerConfig, DistributedOptimizer, LayerWiseDistributedOptimizer, \
        HybridDeviceOptimizer, DTYPE_OF
    import mcore
    import numpy as np
    import torch
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    DTYPE_OF = {torch.bfloat16: vps.BF16, torch.float32: vps.FP32, torch.int16: vps.INT16}

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
    # ---- optimizers but Adam: Megatron-Core builds each (get_megatron_optimizer) ----
    # SGD with momentum, without the distributed optimizer (its ZeRO-1 path
    # takes no SGD): Float16Optimizer's fp32 main params and torch's
    # momentum_buffer, whole on every DP rank
    ("tiny-gpt", "tp=2,pp=2,dp=2,zero=0,optimizer=sgd"),
    ("tiny-qwen3-moe", "ep=2,dp=2,zero=0,optimizer=sgd"),
    # Muon as the layer-wise optimizer: its 2-D weights in buffers of their
    # own, each whole on one DP rank (largest first onto the least loaded
    # shard), the rest under Adam's ZeRO-1 ranges of their own buffer
    ("tiny-llama", "tp=2,dp=2,zero=1,optimizer=muon"),
    # DP 4 and buckets that close at max(bucket, 0.9 x dp x the largest)
    ("tiny-llama", "dp=4,zero=1,optimizer=muon,bucket=300000"),
    # learned positions (a matrix Muon steps), tied embeddings over two
    # stages (Adam's, a bucket of their own)
    ("tiny-gpt", "tp=2,pp=2,dp=2,zero=1,optimizer=muon"),
    # DP 3: shards padded to lcm(64, lcm(3, 128) / 3)
    ("tiny-gpt", "dp=3,zero=1,optimizer=muon"),
    # Lion as Muon's scalar optimizer, with CP: the shards span dp x cp
    ("tiny-llama", "cp=2,dp=2,zero=1,optimizer=muon,scalar=lion"),
    # Lion as the layer-wise optimizer (Adam the scalar one), over VPP
    ("tiny-llama", "pp=2,vpp=2,dp=2,zero=1,optimizer=lion"),
    # experts: a layer-wise expert buffer sharded over expert DP
    ("tiny-qwen3-moe", "ep=2,dp=2,zero=1,optimizer=muon"),
    # a dp_cp group of one: nothing sharded, though expert DP is 2
    ("tiny-qwen3-moe", "tp=2,etp=1,zero=1,optimizer=muon"),
    # MLA, shared experts, an MTP layer and the routers' expert bias (a
    # module buffer, in no optimizer) under Muon, with EP
    ("tiny-deepseek", "tp=2,ep=2,dp=2,zero=1,optimizer=muon"),
    # Muon without the distributed optimizer: Float16Optimizers, every state
    # whole, Muon's and Adam's states in one buffer each
    ("tiny-llama", "tp=2,dp=2,zero=0,optimizer=muon"),
    # the precision-aware optimizer (TransformerEngine's FusedAdam): int16
    # main params by its state dict's rule, bf16 moments by the distributed
    # optimizer's own _get_state_key_dtype
    ("tiny-llama", "tp=2,dp=2,zero=1,precision_aware=1,exp_avg=bf16,exp_avg_sq=bf16"),
    ("tiny-qwen3-moe", "ep=2,dp=2,zero=1,precision_aware=1,exp_avg_sq=bf16"),
    # the CPU-offloaded optimizer (HybridDeviceOptimizer): each shard's first
    # parameters in its optimizer's order (matrices, then wd_mult=0's) in
    # host memory up to the fraction, by the hybrid optimizer's own split
    ("tiny-llama", "tp=2,dp=2,zero=1,offload=0.5"),
    ("tiny-gpt", "tp=2,dp=2,zero=1,offload=0.5"),
    ("tiny-deepseek", "tp=2,ep=2,dp=2,zero=1,offload=0.6"),
    ("tiny-qwen3-moe", "ep=2,pp=2,dp=2,vpp=2,zero=1,offload=0.3"),
]


class Mismatch(Exception):
    pass


def expect(what, megatron, ours):
    if megatron != ours:
        raise Mismatch("%s: Megatron-Core %s, vps %s" % (what, megatron, ours))


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


def bucket_bounds(params, elements, layerwise):
    """vps's buckets of one buffer: bucket b starts at its first parameter
    (a bucket's start is aligned, so its first parameter sits there; in a
    layer-wise bucket, the largest, in the first shard) and ends where the
    next starts, the last at the buffer's end; the unpadded size reaches
    the bucket's last parameter's end, or in a layer-wise bucket is the sum
    of its parameters (whose shards are padded apart)."""
    starts, ends, sums = {}, {}, {}
    for p in params:
        starts[p.bucket] = min(starts.get(p.bucket, p.offset), p.offset)
        ends[p.bucket] = max(ends.get(p.bucket, 0), p.offset + p.elements)
        sums[p.bucket] = sums.get(p.bucket, 0) + p.elements
    n = len(starts)
    if sorted(starts) != list(range(n)):
        raise Mismatch("vps buckets are not numbered 0..%d: %s" % (n - 1, sorted(starts)))
    out = []
    for b in range(n):
        hi = starts[b + 1] if b + 1 < n else elements
        out.append((starts[b], hi, sums[b] if layerwise else ends[b] - starts[b]))
    return out


# the optimizer states by Megatron-Core's names (the distributed optimizer's
# accessor calls the main parameter "param", TE's FusedAdam "master_param")
STATE_OF = {"param": vps.MAIN_PARAM, "master_param": vps.MAIN_PARAM, "exp_avg": vps.EXP_AVG,
            "exp_avg_sq": vps.EXP_AVG_SQ, "momentum_buffer": vps.MOMENTUM_BUFFER}


class Optimizer:
    """Where Megatron-Core's optimizer keeps each parameter's states on this
    rank: kind[id(param)] is "range" (a distributed optimizer's ZeRO-1
    ranges), "owned" or "elsewhere" (the layer-wise optimizer's, whole on
    this DP rank or on another) or "whole" (a Float16Optimizer's, zero=0),
    and states[id(param)] the states it has, {vps state: vps dtype}, as the
    optimizer that steps it keeps them on whichever rank holds them."""

    def __init__(self, par, ddps):
        self.kind, self.states = {}, {}
        if par["precision_aware"]:
            self._precision_aware(par, ddps)
            return
        mcore.install_training_shims()
        opt = mcore.build_optimizer(par, ddps)
        label_of, found = {}, {}
        # model params whose states the hybrid optimizer would keep in host
        # memory; their parts' places in this rank's shard buffers
        self.offloaded = set()
        for label, o in self._leaves(opt, False):
            if par["offload"] > 0:
                self.offloaded |= self._offload(o, par["offload"])
            for p, kind, tensors in self._held(o, label.startswith("LayerWise")):
                self.kind[id(p)] = kind
                label_of[id(p)] = label
                if tensors is not None:
                    found.setdefault(label, {}).update({STATE_OF[k]: DTYPE_OF[v.dtype] for k, v in tensors.items()})
        # an optimizer's states as every rank sees them: a rank may hold none of its parameters
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, found)
        union = {}
        for f in gathered:
            for label, st in f.items():
                union.setdefault(label, {}).update(st)
        for chunk in ddps:
            for p in chunk.module.parameters():
                if id(p) not in self.kind and getattr(p, "is_managed_by_layer_wise_optimizer", False):
                    self.kind[id(p)] = "elsewhere"
                    label_of[id(p)] = self.layer_wise_label
        self.states = {k: union.get(label, {}) for k, label in label_of.items()}

    def _leaves(self, o, under_layer_wise):
        if isinstance(o, LayerWiseDistributedOptimizer):
            for c in o.chained_optimizers:
                self.layer_wise_label = "LayerWise/" + type(c.optimizer).__name__
                yield self.layer_wise_label, c
        elif hasattr(o, "chained_optimizers"):
            for c in o.chained_optimizers:
                yield from self._leaves(c, under_layer_wise)
        else:
            yield "%s/%s" % (type(o).__name__, type(o.optimizer).__name__), o

    @staticmethod
    def _held(o, layer_wise):
        """(model param, kind, its states here or None) for each parameter o steps."""
        if isinstance(o, DistributedOptimizer):
            if o.init_state_fn is not None:
                o.init_state_fn(o.optimizer, o.config)
            for p in (p for buf in o.buffers for p in buf.params):
                here = p in o.model_param_group_index_map
                st = o._get_main_param_and_optimizer_states(p) if here else None
                yield p, "range", {k: v for k, v in st.items() if v.dim()} if here else None
            return
        # Float16OptimizerWithFloat16Params: fp32 main params of its bf16 ones
        mains = [m for g in o.fp32_from_float16_groups for m in g]
        if o.init_state_fn is not None:
            o.init_state_fn(o.optimizer)
        else:
            # torch's SGD makes its momentum buffers at the first step
            for m in mains:
                m.grad = torch.zeros_like(m)
            o.optimizer.step()
        for g, mg in zip(o.float16_groups, o.fp32_from_float16_groups):
            for p, m in zip(g, mg):
                st = {k: v for k, v in o.optimizer.state[m].items() if isinstance(v, torch.Tensor) and v.dim()}
                st["param"] = m
                yield p, "owned" if layer_wise else "whole", st

    @staticmethod
    def _offload(o, fraction):
        """The model params of DistributedOptimizer o whose states
        --optimizer-cpu-offload moves to the host, by the hybrid optimizer's
        own split (_get_sub_optimizer_param_groups): it is handed o's
        parameter groups in o's order (each group's fp32 shards, then its
        16-bit ones, as _build_model_and_main_param_groups hands them to the
        hybrid optimizer it builds in their place) as stand-ins on the GPU,
        which needs CUDA (its streams) to be built for real."""
        class OnGpu:
            is_cuda = True

            def __init__(self, shard):
                self.shard, self.dtype = shard, torch.bfloat16

            def numel(self):
                return self.shard.numel()

            def detach(self):
                return self

            def clone(self):
                return self

            def float(self):
                return self

            def cpu(self):
                return self

            def pin_memory(self):
                # the host copy: a real CPU tensor (is_cuda false)
                return torch.zeros(self.shard.numel(), dtype=torch.bfloat16)

        model_of, groups = {}, []
        for gi, g in enumerate(o.optimizer.param_groups):
            fp32, f16 = o.shard_fp32_groups[gi], o.shard_fp32_from_float16_groups[gi]
            models = o.model_fp32_groups[gi] + o.model_float16_groups[gi]
            stand = [OnGpu(x) for x in fp32 + f16]
            model_of.update({id(x): m for x, m in zip(stand, models)})
            groups.append(dict(g, params=stand))
        me = types.SimpleNamespace(param_groups=groups, param_update_in_fp32=True)
        _, _, to_host, _, _ = HybridDeviceOptimizer._get_sub_optimizer_param_groups(me, fraction)
        return {id(model_of[id(x)]) for x in to_host}

    def _precision_aware(self, par, ddps):
        """TransformerEngine's FusedAdam under the distributed optimizer, which
        needs a GPU: the states are the distributed optimizer's own answer
        (optimizer_state_keys, _get_state_key_dtype) for the configuration's
        dtypes, and the main params its state dict's rule, read here from
        the installed source so that a change to it fails the check."""
        src = inspect.getsource(DistributedOptimizer.load_state_dict)
        rule = ('if self.config.store_param_remainders and self.config.bf16:\n'
                '                                    tensors["master_param"] = init_shard(torch.int16)')
        if rule not in src:
            raise Mismatch("DistributedOptimizer.load_state_dict no longer holds the main params as int16 "
                           "remainders (store_param_remainders and bf16): vps's precision_aware=1 rule is stale")
        if OptimizerConfig.__dataclass_fields__["store_param_remainders"].default is not True:
            raise Mismatch("OptimizerConfig.store_param_remainders is no longer on by default")
        bf16 = {True: torch.bfloat16, False: torch.float32}
        fake = types.SimpleNamespace(config=types.SimpleNamespace(
            optimizer="adam", muon_scalar_optimizer="adam", exp_avg_dtype=bf16[bool(par["exp_avg_bf16"])],
            exp_avg_sq_dtype=bf16[bool(par["exp_avg_sq_bf16"])]))
        keys = DistributedOptimizer.optimizer_state_keys.fget(fake)
        states = {STATE_OF[k]: DTYPE_OF[DistributedOptimizer._get_state_key_dtype(fake, k)] for k in keys}
        states[vps.MAIN_PARAM] = vps.INT16
        for chunk in ddps:
            for p in chunk.module.parameters():
                self.kind[id(p)] = "range"
                self.states[id(p)] = states


def compare_rank(rank, lay, model, par, chunks, ddps, opt):
    """Every field of what Megatron built on this rank against vps's view of
    it; raises Mismatch at the first difference. Returns counts."""
    view = lay.rank(rank)
    expect("rank %d coordinates" % rank, mcore.coords(), {k: getattr(view.coords, k) for k in mcore.coords()})
    nparams = nelems = 0
    tp_rank = view.coords.tp
    dp_cp = par["dp"] * par["cp"]
    regions = {}
    for r in view.regions:
        regions.setdefault((r.param, r.state), []).append(r)
    for v, (chunk, ddp) in enumerate(zip(chunks, ddps)):
        gpt = chunk.module
        names = {id(p): n for n, p in gpt.named_parameters()}
        where = "rank %d chunk %d" % (rank, v)
        # DDP's buffers by (expert, layer-wise): each parameter's group as its BufferKey says
        theirs_by = {}
        for expert, bufs in ((False, ddp.buffers), (True, ddp.expert_parallel_buffers)):
            for buf in bufs:
                lw = bool(getattr(buf.params[0], "is_managed_by_layer_wise_optimizer", False))
                if (expert, lw) in theirs_by:
                    raise Mismatch("%s: two %s buffers with layerwise=%s" % (where, "expert" if expert else "dense", lw))
                theirs_by[(expert, lw)] = buf
        for expert in (False, True):
            for lw in (False, True):
                ours = [p for p in view.params
                        if p.chunk == v and p.expert == expert and p.layerwise == lw and not p.module_buffer]
                w = "%s %s%s buffer" % (where, "expert" if expert else "dense", " layer-wise" if lw else "")
                buf = theirs_by.get((expert, lw))
                expect(w + " count", 1 if buf is not None else 0, 1 if ours else 0)
                if buf is None:
                    continue
                n, e = compare_buffer(w, view, v, expert, lw, buf, ours, gpt, names, regions, model, par, opt,
                                      tp_rank, dp_cp)
                nparams += n
                nelems += e
        # module buffers: the routers' expert_bias, in module order
        theirs = [(n, tuple(b.shape)) for n, b in gpt.named_buffers() if n.endswith(".expert_bias")]
        ours = [(p.local_name, (p.elements,)) for p in view.params if p.chunk == v and p.module_buffer]
        expect(where + " module buffers (expert_bias)", theirs, ours)
    return nparams, nelems


def compare_buffer(w, view, v, expert, lw, buf, ours, gpt, names, regions, model, par, opt, tp_rank, dp_cp):
    """One DDP buffer (its parameters, buckets, padding) and every state of
    its parameters against vps's buffers of (chunk v, expert, lw)."""
    nelems = 0
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
    pbuf = view.buffer(vps.PARAM, v, expert, lw)
    expect(w + " elements", buf.numel, view.buffers[pbuf].elements)
    mb = [(bk.offset, bk.offset + bk.grad_data.numel(), bk.numel_unpadded) for bk in buf.buckets]
    expect(w + " buckets (start, end, unpadded)", mb, bucket_bounds(ours, view.buffers[pbuf].elements, lw))
    dp = buf.data_parallel_group.size()
    d = buf.data_parallel_group.rank()
    zero = any(opt.kind[id(p)] == "range" for p in theirs)
    if zero:
        ranges = mcore.gbuf_ranges(buf)
    # vps's shard buffer: the buckets' shards of this DP rank one after the other
    bases = np.cumsum([0] + [bk.grad_data.numel() // dp for bk in buf.buckets]).tolist()
    shard_total = bases[-1]
    # the layer-wise optimizer shards only over a dp_cp group of more than one rank
    lw_sharded = lw and dp_cp > 1
    held_states = {}
    # offload: this rank's part of each parameter in the shard buffer, and
    # where vps keeps it: its host buffer packs the offloaded parts in shard
    # order, the GPU one keeps the others, in the same order
    part, moved = {}, {}
    if zero and par["offload"] > 0:
        for p in theirs:
            rm = ranges[buf.param_index_map[p][2]]["param_map"].get(p)
            if rm is not None:
                part[id(p)] = (bases[buf.param_index_map[p][2]] + rm["gbuf_local"].start,
                               rm["param"].end - rm["param"].start, id(p) in opt.offloaded)
        host_at = 0
        for start, n, host in sorted(part.values()):
            moved[start] = host_at - start if host else -host_at
            host_at += n if host else 0
        host_elements = host_at
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
        kind = opt.kind[id(tp_)]
        states = dict(opt.states[id(tp_)])
        if par["grad"]:
            states[vps.GRAD] = vps.FP32
        vps_states = [st for st in lay_states(view, op) if st != vps.PARAM]
        expect(pw + " states (optimizer %s)" % view.layout.optimizer_of(op.tensor),
               sorted(vps.STATES[x] for x in states), sorted(vps.STATES[x] for x in vps_states))
        # where Megatron keeps each element of the parameter in each state
        # (-1: not on this rank), in vps's terms
        whole = np.where(covered, s + np.arange(numel), -1)
        for st, dtype in sorted(states.items()):
            sw = "%s %s" % (pw, vps.STATES[st])
            sbuf = view.buffer(st, v, expert, lw)
            if st == vps.GRAD:
                # main_grad is a view of DDP's grad buffer at the parameter's index
                sharded, want = False, whole
            elif kind == "range":
                sharded = True
                want = np.full(numel, -1, dtype=np.int64)
                rm = ranges[b]["param_map"].get(tp_)
                if rm is not None:
                    want[rm["param"].start:rm["param"].end] = \
                        bases[b] + rm["gbuf_local"].start + np.arange(rm["param"].end - rm["param"].start)
                want[~covered] = -1
            elif kind == "whole" or not lw_sharded:
                sharded, want = False, whole
            else:
                bk = buf.buckets[b]
                size = bk.grad_data.numel() // dp
                if kind == "owned" and not bk.offset + d * size <= s < e <= bk.offset + (d + 1) * size:
                    raise Mismatch("%s: the layer-wise optimizer gives this rank a parameter outside its shard" % sw)
                sharded = True
                want = np.where(covered, bases[b] + (s - bk.offset - d * size) + np.arange(numel), -1) \
                    if kind == "owned" else np.full(numel, -1, dtype=np.int64)
            if kind == "range" and id(tp_) in part and st != vps.GRAD:
                start, _, host = part[id(tp_)]
                want = np.where(want >= 0, want + moved[start], -1)
                sbuf = view.buffer(st, v, expert, lw, host=host)
                sw += " (%s)" % ("offloaded to the host" if host else "on the GPU")
            if sbuf is None:
                raise Mismatch("%s: vps has no %s buffer" % (sw, vps.STATES[st]))
            expect(sw + " buffer sharded", sharded, view.buffers[sbuf].sharded)
            expect(sw + " dtype", vps.DTYPES[dtype], vps.DTYPES[view.buffers[sbuf].dtype])
            held_states[st] = sharded
            regs = regions.get((op.index, st), [])
            if any(r.buffer != sbuf for r in regs):
                raise Mismatch("%s: vps keeps a part of it in buffer %s, not %d"
                               % (sw, sorted({r.buffer for r in regs}), sbuf))
            got = _state_offsets(numel, lo, a, regs, sw)
            if (got != want).any():
                k = int(np.argmax(got != want))
                raise Mismatch("%s element %d: Megatron-Core %s, vps %s" % (sw, k, _at(want[k], sharded),
                                                                         _at(got[k], sharded)))
            nelems += int((got >= 0).sum())
    ours_states = sorted(vps.STATES[b.state] for b in view.buffers
                         if b.chunk == v and b.expert == expert and b.layerwise == lw and not b.host
                         and b.state not in (vps.PARAM, vps.MODULE_BUFFER))
    expect(w + " state buffers", sorted(vps.STATES[x] for x in held_states), ours_states)
    for st, sharded in held_states.items():
        sbuf = view.buffer(st, v, expert, lw)
        hbuf = view.buffer(st, v, expert, lw, host=True)
        if part and st != vps.GRAD:
            expect("%s %s host elements" % (w, vps.STATES[st]), host_elements,
                   view.buffers[hbuf].elements if hbuf is not None else None)
            expect("%s %s elements on the GPU" % (w, vps.STATES[st]), shard_total - host_elements,
                   view.buffers[sbuf].elements)
            continue
        expect("%s %s host buffer" % (w, vps.STATES[st]), None, hbuf)
        expect("%s %s elements" % (w, vps.STATES[st]), shard_total if sharded else buf.numel,
               view.buffers[sbuf].elements)
    return len(ours), nelems


def lay_states(view, op):
    """The states vps holds a parameter in."""
    cache = view.__dict__.setdefault("_states", {})
    if op.tensor not in cache:
        cache[op.tensor] = view.layout.states_of(op.tensor)
    return cache[op.tensor]


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


def layouts(model_name, spec, vps_spec=None):
    """Megatron's parallel sizes of (model_name, spec) and vps's layout of
    spec (or of vps_spec: the same world, else ValueError)."""
    if model_name.endswith(".yaml"):
        model_name = os.path.join(HERE, model_name)
    par = vps.layout(model_name, spec).parallel
    lay = vps.layout(model_name, vps_spec or spec)
    world = par["tp"] * par["cp"] * par["dp"] * par["pp"]
    if lay.world != world:
        raise ValueError("%s has a world of %d ranks, %s of %d" % (vps_spec, lay.world, spec, world))
    return par, lay


def check(model_name, spec, timeout, vps_spec=None):
    """Megatron builds (model_name, spec) on every rank; each rank compares
    with vps's layout of spec (or of vps_spec, to see a difference named).
    Returns the layout, and the first failing rank and what failed, or None
    and every rank's counts."""
    par, lay = layouts(model_name, spec, vps_spec)
    model = lay.model

    def rank_fn(rank):
        mcore.init_parallel(par)
        config = mcore.transformer_config(model, par)
        chunks = mcore.build_chunks(model, par, config)
        ddps = mcore.wrap_ddp(chunks, config, par)
        try:
            opt = Optimizer(par, ddps)
            return compare_rank(rank, lay, model, par, chunks, ddps, opt)
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
    ap.add_argument("-k", metavar="SUBSTRING", help="only the configurations whose 'model spec' contains it "
                    "(the one it names in full, when it does)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a configuration may take (default 300)")
    ap.add_argument("--vps", metavar="SPEC", help="compare the one configuration -k selects with vps's layout of "
                    "SPEC instead (of the same world): how a difference is reported")
    args = ap.parse_args()
    todo = [(m, s) for m, s in MATRIX if not args.k or args.k in "%s %s" % (m, s)]
    # a configuration named in full is that one, not every one it begins
    exact = [(m, s) for m, s in todo if args.k == "%s %s" % (m, s)]
    todo = exact or todo
    if not todo:
        print("check_megatron.py: -k %s: no configuration matches" % args.k, file=sys.stderr)
        return 2
    if args.vps and len(todo) != 1:
        print("check_megatron.py: --vps: -k selects %d configurations, not one" % len(todo), file=sys.stderr)
        return 2
    for m, s in todo:
        try:
            layouts(m, s, args.vps)
        except (vps.Error, ValueError) as e:
            print("check_megatron.py: %s %s: %s" % (m, args.vps or s, e), file=sys.stderr)
            return 2
    heavy_imports()
    mcore.install_cpu_shims()
    start = time.monotonic()
    for m, s in todo:
        t0 = time.monotonic()
        lay, bad, res = check(m, s, args.timeout, args.vps)
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
