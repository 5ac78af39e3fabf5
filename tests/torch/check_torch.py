"""vps's DTensor layouts against PyTorch's own code (make check-torch).

For each configuration of the matrix below, torchtitan (pinned, see
tests/torch/titan.py) builds the model on the CPU, one forked process per
rank over gloo: its own model definitions, its pipeline split, its
parallelize function (tensor and expert parallel placements, then FSDP2's
fully_shard with HSDP where dp_replicate > 1). Every parameter of the full
model is first set to values unique within its logical tensor (so a shard
in the wrong place cannot match); each rank sets its gradients from its own
parameters (grad = sin(1000 p), elementwise, so replicas agree and no
collective runs: the placements do not depend on how gradients were made,
and the matrix stays quick; tests/torch/check_switch.py trains through
FSDP2's backward on gloo) and takes
one torch.optim.AdamW step, which makes Adam's exp_avg and exp_avg_sq
(DTensors of the parameter's placement) and step. Each rank then compares
what PyTorch holds with vps's view of the rank (python/vps, vps_layout_rank
of the family=dtensor layout):

  - its coordinates (tp, cp, dp, pp, ep) against torchtitan's meshes;
  - its parameters in optimizer order: fully qualified name, local shard
    shape, and FSDP2's padded storage (padded_sharded_param_size) against
    the main_param buffer's size; Adam's states against theirs (no padding);
  - every element of the local shard of the parameter (before the step),
    exp_avg and exp_avg_sq (after it) against the logical tensor at the
    place vps's regions give it; every local element is in exactly one
    region; step is a plain 0-dim tensor equal to 1 (the training step vps
    carries with a switch, not a sharded state);
  - the MoE layers' expert_bias_E buffers, whole on every rank.

    check_torch.py [-v] [-k SUBSTRING] [--full] [--timeout S]

Prints a line per configuration with -v, then `N configurations, every rank
equal to PyTorch's placements`; exit 1 naming the first rank, parameter and
field that differs (or the rank's error), 2 on bad arguments.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ranks  # noqa: E402
import titan  # noqa: E402  (torchtitan and its shims, imported once before the ranks fork)
import vps  # noqa: E402
from boxes import box_index  # noqa: E402
from ranks import RankError  # noqa: E402

# (model, mesh): what each line covers that the others do not. Worlds stay
# at 8 ranks or fewer (2 cores here and in CI); --full adds FULL.
MATRIX = [
    # FSDP2 alone, even shards
    ("llama3-debug", "dp_shard=2"),
    # uneven shards: 2048 vocabulary rows and 256-wide norms over 3
    ("llama3-debug", "dp_shard=3"),
    # HSDP: two replicas of two shards
    ("llama3-debug", "dp_replicate=2,dp_shard=2"),
    # FSDP over TP: _StridedShard, FSDP chunks of each TP slice; SP norms replicated
    ("llama3-debug", "dp_shard=2,tp=2"),
    # TP and pipeline stages (torchtitan's split: 3 layers and the embedding, 3 and the output)
    ("llama3-debug", "tp=2,pp=2"),
    # qwen3: GQA (4 heads, 2 groups, head 32 > dim/heads), q/k norms, tied embeddings
    ("qwen3-tiny", "dp_shard=2,tp=2"),
    # MoE with expert parallelism: experts Shard(0) over ep, FSDP over efsdp
    ("qwen3-moe-e8", "dp_shard=4,ep=2"),
    # FSDP of 6 experts over 4: chunks of 2, 2, 2 and an empty one
    ("qwen3-moe-e6", "dp_shard=4"),
    # context parallelism: FSDP2 shards over dp_shard x cp flattened
    ("qwen3-tiny", "dp_shard=2,cp=2"),
    # 8-rank worlds of the small model (8 ranks of llama3-debug need ~4 GB): FSDP 8, HSDP 2x4
    ("qwen3-tiny", "dp_shard=8"),
    ("qwen3-tiny", "dp_replicate=2,dp_shard=4"),
]
FULL = [
    ("llama3-debug", "dp_shard=2,tp=2,pp=2"),
    ("qwen3-moe-e8", "dp_shard=2,tp=2"),
    ("qwen3-moe-e8", "dp_replicate=2,dp_shard=2,ep=2"),
    # the FSDP mesh outnumbers the experts: their Shard(1)
    ("qwen3-moe-e4", "dp_shard=8"),
]

# torchtitan's parameters as boxes of vps's logical tensors (Megatron's
# names): (vps name with {L}, which half of a gated fc1 or None, stacked experts)
FQN = {
    "tok_embeddings.weight": ("embedding.word_embeddings.weight", None),
    "attention.qkv_linear.wqkv.weight": ("decoder.layers.{L}.self_attention.linear_qkv.weight", None),
    "attention.wo.weight": ("decoder.layers.{L}.self_attention.linear_proj.weight", None),
    "attention.q_norm.weight": ("decoder.layers.{L}.self_attention.q_layernorm.weight", None),
    "attention.k_norm.weight": ("decoder.layers.{L}.self_attention.k_layernorm.weight", None),
    "attention_norm.weight": ("decoder.layers.{L}.self_attention.linear_qkv.layer_norm_weight", None),
    "feed_forward.w1.weight": ("decoder.layers.{L}.mlp.linear_fc1.weight", 0),
    "feed_forward.w3.weight": ("decoder.layers.{L}.mlp.linear_fc1.weight", 1),
    "feed_forward.w2.weight": ("decoder.layers.{L}.mlp.linear_fc2.weight", None),
    "moe.router.gate.weight": ("decoder.layers.{L}.mlp.router.weight", None),
    "moe.routed_experts.inner_experts.w1_EFD": ("decoder.layers.{L}.mlp.experts.local_experts.{E}.linear_fc1.weight", 0),
    "moe.routed_experts.inner_experts.w3_EFD": ("decoder.layers.{L}.mlp.experts.local_experts.{E}.linear_fc1.weight", 1),
    "moe.routed_experts.inner_experts.w2_EDF": ("decoder.layers.{L}.mlp.experts.local_experts.{E}.linear_fc2.weight", None),
    "moe.expert_bias_E": ("decoder.layers.{L}.mlp.router.expert_bias", None),
    "norm.weight": ("decoder.final_layernorm.weight", None),
    "lm_head.weight": ("output_layer.weight", None),
}


class Mismatch(Exception):
    pass


def expect(what, torch_has, ours):
    if torch_has != ours:
        raise Mismatch("%s: PyTorch %s, vps %s" % (what, torch_has, ours))


def logical_names(fqn, dense_ffn_norm):
    """The vps tensor name pattern, half, and layer of a torchtitan name."""
    layer = None
    rest = fqn
    if fqn.startswith("layers."):
        _, n, rest = fqn.split(".", 2)
        layer = int(n)
    if rest == "ffn_norm.weight":
        name = ("decoder.layers.{L}.mlp.linear_fc1.layer_norm_weight" if dense_ffn_norm(layer)
                else "decoder.layers.{L}.pre_mlp_layernorm.weight")
        return name, None, layer
    if rest not in FQN:
        raise Mismatch("%s: no logical tensor for this torchtitan parameter" % fqn)
    name, half = FQN[rest]
    return name, half, layer


class Logical:
    """Every logical tensor of the model, every element of the model unique:
    the elements' running count over the tensors in order, from 1 (exact in
    fp32 below 2^24 elements), and each parameter's full value read from
    them."""

    def __init__(self, model):
        self.model = model
        self.values = {}
        self.first = [1]
        for t in range(model.num_tensors):
            self.first.append(self.first[-1] + int(np.prod(model.tensor_shape(t))))
        if self.first[-1] >= 2 ** 24:
            raise ValueError("%s: %d elements, too many to tell apart in fp32" % (model.name, self.first[-1]))

    def tensor(self, name):
        if name not in self.values:
            tid = self.model.find(name)
            shape = self.model.tensor_shape(tid)
            n = int(np.prod(shape))
            v = torch.arange(self.first[tid], self.first[tid] + n, dtype=torch.float64)
            self.values[name] = v.to(torch.float32).reshape(shape)
        return self.values[name]

    def param(self, fqn, shape, dense_ffn_norm):
        """The full parameter fqn of shape, from the logical tensors."""
        name, half, layer = logical_names(fqn, dense_ffn_norm)
        if "{E}" in name:
            parts = [self.tensor(name.format(L=layer, E=e)) for e in range(shape[0])]
            parts = [p[half] if half is not None else p for p in parts]
            return torch.stack(parts).reshape(shape)
        t = self.tensor(name.format(L=layer))
        return (t[half] if half is not None else t).reshape(shape)


def fill(model, logical, dense_ffn_norm):
    with torch.no_grad():
        for fqn, p in model.named_parameters():
            p.copy_(logical.param(fqn, tuple(p.shape), dense_ffn_norm))
        for fqn, b in model.named_buffers():
            if fqn.endswith("expert_bias_E"):
                b.copy_(logical.param(fqn, tuple(b.shape), dense_ffn_norm))


def fsdp_padded(parts):
    """FSDP2's padded sharded storage size of every parameter, by id."""
    from torch.distributed.fsdp import FSDPModule
    out = {}
    for part in parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                group = m._get_fsdp_state()._fsdp_param_group
                for fp in group.fsdp_params if group else []:
                    out[id(fp.sharded_param)] = int(np.prod(fp.padded_sharded_param_size))
    return out


def check_elements(what, local, regions, logical_of, exact):
    """Every element of the flat local tensor against the logical tensors
    at vps's regions, and every local element in exactly one region."""
    seen = np.zeros(local.numel(), dtype=np.int64)
    flat = local.reshape(-1)
    for r in regions:
        idx = torch.from_numpy(box_index(r.lo, r.hi, r.offset, r.strides))
        if idx.numel() and (idx.min() < 0 or idx.max() >= flat.numel()):
            raise Mismatch("%s: region %s..%s lies outside the local tensor of %d" % (what, r.lo, r.hi, flat.numel()))
        want = logical_of(r)[tuple(slice(a, b) for a, b in zip(r.lo, r.hi))]
        got = flat[idx]
        bad = got != want if exact else ~torch.isclose(got, want, rtol=1e-6, atol=1e-12)
        if bad.any():
            k = int(bad.reshape(-1).nonzero()[0])
            raise Mismatch("%s: %d of %d elements of %s %s..%s differ (first: PyTorch %r, vps's place %r)" % (
                what, int(bad.sum()), bad.numel(), r.name, r.lo, r.hi, float(got.reshape(-1)[k]),
                float(want.reshape(-1)[k])))
        np.add.at(seen, idx.reshape(-1).numpy(), 1)
    if (seen != 1).any():
        k = int(np.nonzero(seen != 1)[0][0])
        raise Mismatch("%s: local element %d is in %d of vps's regions (every one must be in one)" % (
            what, k, seen[k]))


def run_rank(rank, world, model_name, mesh_spec, lay):
    mesh = dict((k, int(v)) for k, v in (kv.split("=") for kv in mesh_spec.split(",")))
    spec = titan.model_spec(model_name)
    pd = titan.parallel_dims(mesh, world)
    vmodel = lay.model
    logical = Logical(vmodel)
    moe_layers = set()

    def dense_ffn_norm(layer):
        return layer not in moe_layers

    def fill_model(model):
        for name, mod in model.layers.items():
            if getattr(mod, "moe_enabled", False):
                moe_layers.add(int(name))
        fill(model, logical, dense_ffn_norm)

    parts = titan.build(spec, pd, mesh, fill_model)
    view = lay.rank(rank)
    # coordinates
    meshes = pd.get_all_one_dimensional_meshes()
    theirs = {k: (meshes[m].get_local_rank() if m in meshes else 0)
              for k, m in (("tp", "tp"), ("cp", "cp"), ("dp", "batch"), ("pp", "pp"), ("ep", "ep"))}
    expect("rank %d coordinates" % rank, theirs, {k: getattr(view.coords, k) for k in theirs})
    params = [(n, p) for part in parts for n, p in part.named_parameters()]
    ours = [p for p in view.params if not p.module_buffer]
    if len(params) != len(ours):
        raise Mismatch("rank %d parameters: PyTorch %s, vps %s" % (rank, [n for n, _ in params],
                                                                  [p.local_name for p in ours]))
    padded = fsdp_padded(parts)
    bufs = {b.id: b for b in view.buffers}
    regions = {}
    for r in view.regions:
        regions.setdefault((r.param, r.state), []).append(r)
    before = {}
    for (n, p), op in zip(params, ours):
        where = "rank %d %s" % (rank, n)
        expect("rank %d parameter %d name" % (rank, op.index), n, op.local_name)
        local = p.to_local() if hasattr(p, "to_local") else p
        expect(where + " local shape", tuple(local.shape), tuple(op.shape))
        expect(where + " dtype", local.dtype, torch.float32)
        before[id(p)] = local.detach().clone()
    opt = torch.optim.AdamW([p for _, p in params], lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    with torch.no_grad():
        for _, p in params:
            p.grad = torch.sin(p.detach() * 1000)
    opt.step()
    nelem = 0
    for (n, p), op in zip(params, ours):
        where = "rank %d %s" % (rank, n)
        st = opt.state[p]
        mine = {b.state: b for b in view.buffers if any(r.buffer == b.id for r in regions.get((op.index, b.state), []))}
        for state in (vps.MAIN_PARAM, vps.EXP_AVG, vps.EXP_AVG_SQ):
            rs = regions.get((op.index, state), [])
            if state == vps.MAIN_PARAM:
                local, size = before[id(p)], padded.get(id(p))
                if size is None:
                    raise Mismatch(where + ": not an FSDP2 parameter")
            else:
                t = st["exp_avg" if state == vps.EXP_AVG else "exp_avg_sq"]
                expect(where + " %s placements" % vps.STATES[state], getattr(t, "placements", None),
                       getattr(p, "placements", None))
                local = t.to_local() if hasattr(t, "to_local") else t
                size = local.numel()
            if not rs:
                expect(where + " %s elements" % vps.STATES[state], local.numel(), 0)
                continue
            buf = bufs[rs[0].buffer]
            expect(where + " %s buffer size" % vps.STATES[state], size, buf.elements)
            if any(r.buffer != buf.id for r in rs):
                raise Mismatch(where + ": regions of one state in two buffers")

            def logical_of(r, state=state):
                base = logical.tensor(r.name)
                if state == vps.MAIN_PARAM:
                    return base
                g = torch.sin(base * 1000)
                if state == vps.EXP_AVG:
                    return torch.lerp(torch.zeros_like(g), g, 0.1)
                return torch.zeros_like(g).mul_(0.95).addcmul_(g, g, value=0.05)
            check_elements("%s %s" % (where, vps.STATES[state]), local.contiguous(), rs, logical_of,
                           exact=state == vps.MAIN_PARAM)
            nelem += local.numel()
        step = st["step"]
        if isinstance(step, torch.distributed.tensor.DTensor) or step.dim() != 0 or float(step) != 1.0:
            raise Mismatch("%s step: %r, not a plain 0-dim tensor equal to the training step" % (where, step))
        del mine
    # module buffers
    theirs_b = [(n, b) for part in parts for n, b in part.named_buffers() if n.endswith("expert_bias_E")]
    ours_b = [p for p in view.params if p.module_buffer]
    expect("rank %d module buffers" % rank, [n for n, _ in theirs_b], [p.local_name for p in ours_b])
    for (n, b), op in zip(theirs_b, ours_b):
        # a DTensor replicated over tp where TP is on (moe_sharding.py)
        b = b.to_local() if hasattr(b, "to_local") else b
        expect("rank %d %s placements" % (rank, n), getattr(b, "placements", None), None)
        check_elements("rank %d %s" % (rank, n), b, regions.get((op.index, vps.MODULE_BUFFER), []),
                       lambda r: logical.tensor(r.name), exact=True)
    return len(params), nelem


def run_ranks(world, fn, timeout):
    """fn(rank) in world forked processes forming a gloo world; results in
    rank order, or RuntimeError naming the first rank that failed (one that
    found a mismatch before one that broke)."""
    results, failed = ranks.gloo_ranks(world, fn, timeout, prefix="vps-torch-")
    results = [RankError(r, failed or "exited without a result", "") if out is None else out
               for r, out in enumerate(results)]
    errors = [x for x in results if isinstance(x, RankError)]
    if errors:
        mism = [e for e in errors if e.what.startswith("Mismatch")]
        e = (mism or errors)[0]
        raise RuntimeError("rank %d: %s\n%s" % (e.rank, e.what, e.trace if not mism else ""))
    if failed:
        raise RuntimeError(failed)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-v", action="store_true", help="a line per configuration")
    ap.add_argument("-k", metavar="SUBSTRING", help="only the configurations whose model or mesh contains it")
    ap.add_argument("--full", action="store_true", help="the fuller matrix too (8-rank worlds, more MoE meshes)")
    ap.add_argument("--timeout", type=int, default=300, metavar="S", help="seconds a configuration may take")
    args = ap.parse_args()
    matrix = MATRIX + (FULL if args.full else [])
    if args.k in titan.REFUSED:
        print("check_torch.py: %s: not built on a CPU: %s" % (args.k, titan.REFUSED[args.k]), file=sys.stderr)
        return 2
    if args.k:
        matrix = [c for c in matrix if args.k in c[0] or args.k in c[1]]
    if not matrix:
        print("check_torch.py: -k %s matches no configuration" % args.k, file=sys.stderr)
        return 2
    models = [os.path.join(TOP, "configs", "models"), os.path.join(HERE, "models")]
    start = time.monotonic()
    for model_name, mesh in matrix:
        t0 = time.monotonic()
        path = next(p for p in (os.path.join(d, model_name + ".yaml") for d in models) if os.path.exists(p))
        lay = vps.Layout.new(vps.Model(path), mesh + ",family=dtensor")
        world = lay.world
        try:
            results = run_ranks(world, lambda r: run_rank(r, world, model_name, mesh, lay), args.timeout)
        except RuntimeError as e:
            print("check_torch.py: %s %s: %s" % (model_name, mesh, e), file=sys.stderr)
            return 1
        if args.v:
            print("%s %s: %d ranks, %d parameters, %d local elements, equal (%.1f s)" % (
                model_name, mesh, world, sum(r[0] for r in results), sum(r[1] for r in results),
                time.monotonic() - t0))
    if args.v:
        print("not built on a CPU: %s" % "; ".join("%s (%s)" % kv for kv in sorted(titan.REFUSED.items())))
    print("%d configurations, every rank equal to PyTorch's placements (torchtitan %s, torch %s; %.0f s)" % (
        len(matrix), titan.VERSION, torch.__version__.split("+")[0], time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
