"""torchtitan on PyTorch 2.11's CPU, for tests/torch/check_torch.py.

torchtitan 0.3.0 (pinned in python/requirements-test.txt, installed with
--no-deps) targets PyTorch's nightly. Importing its model definitions and
parallelize functions on 2.11 needs three shims, each for something the
layouts do not depend on:

  - torch.distributed.fsdp.DataParallelMeshDims: a nightly dataclass that
    torchtitan passes to fully_shard only under its full_dtensor and
    spmd_types backends; the harness runs the partial_dtensor backend,
    which never passes one, so an empty dataclass of that name suffices;
  - torchtitan.trainer: imported by Decoder.Config.update_from_config only
    to test isinstance(config, Trainer.Config), but importing it imports
    the data loaders (torchdata, datasets); a module with an empty
    Trainer.Config stands in, and the harness passes a plain config;
  - torchtitan.tools.utils.device_type: "cuda" whenever the PyTorch build
    has CUDA, even without a GPU; the harness builds its meshes on "cpu".

What a CPU cannot build is refused by name (REFUSED below). And one rule
of torchtitan cannot run on 2.11: with expert parallelism,
apply_fsdp_to_decoder gives the routed experts their own FSDP mesh per
parameter (ShardPlacementResult, a nightly API). apply_fsdp_ep applies
the same placement the way PyTorch 2.11 can (torchtitan 0.2's way): the
experts' module wrapped first on the efsdp mesh, then the block on the
dense one.
"""
import contextlib
import dataclasses
import sys
import types

import torch
import torch.distributed.fsdp as _fsdp

if not hasattr(_fsdp, "DataParallelMeshDims"):
    @dataclasses.dataclass
    class DataParallelMeshDims:
        shard: object = None
        replicate: object = None

    _fsdp.DataParallelMeshDims = DataParallelMeshDims

if "torchtitan.trainer" not in sys.modules:
    _trainer = types.ModuleType("torchtitan.trainer")

    class Trainer:
        class Config:
            pass

    _trainer.Trainer = Trainer
    sys.modules["torchtitan.trainer"] = _trainer

import torchtitan.tools.utils as _tt_utils  # noqa: E402

_tt_utils.device_type = "cpu"
_tt_utils.device_module = torch.cpu

import torchtitan.distributed.parallel_dims as _tt_pd  # noqa: E402

_tt_pd.device_type = "cpu"

from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import Shard  # noqa: E402
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed import pipeline_parallel as _tt_pp  # noqa: E402
from torchtitan.models import llama3 as _llama3  # noqa: E402
from torchtitan.models import qwen3 as _qwen3  # noqa: E402

import torchtitan  # noqa: E402

VERSION = getattr(torchtitan, "__version__", "0.3.0")

# What torchtitan can apply but a CPU cannot build, and why: the harness
# refuses these configurations by name instead of skipping them silently.
REFUSED = {
    "float8": "float8 training (torchao's Float8Linear) needs CUDA's float8 matrix multiply (sm89+)",
    "mxfp8": "MX formats need Blackwell GPUs (torchao's MXLinear)",
    "nvfp4": "NVFP4 needs Blackwell GPUs",
    "deepep": "DeepEP's token dispatch is a CUDA kernel library",
    "symm_mem": "FSDP's symmetric-memory collectives need CUDA (sm90+)",
}


def _causal_attention(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, score_mod=None, scale=None,
                      enable_gqa=False, out_transform=None, **kwargs):
    """FlexAttention.forward's causal attention through PyTorch's
    scaled_dot_product_attention (the argument names are the original's:
    torchtitan's TP plan maps q_BLNH, k_BLNH and v_BLNH by name)."""
    if attention_masks is not None or score_mod is not None or out_transform is not None:
        raise NotImplementedError("the CPU training shim computes causal attention only (one document a sample)")
    out = torch.nn.functional.scaled_dot_product_attention(
        q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2), is_causal=True, scale=scale,
        enable_gqa=enable_gqa)
    return out.transpose(1, 2)


def install_training_shims():
    """What training torchtitan's models on the CPU needs beyond importing
    them (tests/torch/check_switch.py); neither changes a parameter, a
    placement or a state:

      - FlexAttention computes causal attention with PyTorch's
        scaled_dot_product_attention: 2.11's flex_attention has no backward
        on the CPU, and torchtitan's mask builder passes create_block_mask a
        nightly argument (separate_full_blocks). Every sample is one
        document (positions 0..S-1), where torchtitan's block-causal
        document mask is the causal mask; FlexAttention has no parameters;
      - sum_reductions(model) has FSDP2 reduce gradients with SUM: torchtitan
        turns FSDP2's division off (gradient divide factor 1, the loss is
        divided by the global token count), for which FSDP2 reduce-scatters
        with NCCL's PREMUL_SUM(1/1), which gloo lacks; its SUM then divide
        by 1 is the same sum (set_force_sum_reduction_for_comms).

    And what torchtitan's Trainer sets from its configuration: the
    partial_dtensor backend (torchtitan.distributed.utils.set_spmd_backend),
    whose loss reads a TP-sharded output (loss parallel)."""
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.common.attention import FlexAttention
    FlexAttention.forward = _causal_attention
    set_spmd_backend("partial_dtensor")


def sum_reductions(model):
    """FSDP2's gradient reductions with SUM on gloo (install_training_shims)."""
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)


@contextlib.contextmanager
def fused_qkv_kept(model):
    """DCP's get_state_dict on torchtitan's model: while it reads, the
    fused QKV linears' save hook (FusedQKVLinear._split_qkv_on_save, which
    renames wqkv.weight into Hugging Face's wq, wk and wv for torchtitan's
    checkpoints) is off. DCP maps every key of the model's state_dict to
    the module path of its parameter, and a fused linear has no wq; without
    the hook the key is the parameter's own name and its value the
    parameter itself."""
    from torchtitan.models.common.attention import FusedQKVLinear
    taken = []
    for m in model.modules():
        if isinstance(m, FusedQKVLinear):
            for k, h in list(m._state_dict_hooks.items()):
                if h is FusedQKVLinear._split_qkv_on_save:
                    taken.append((m, k, h))
                    del m._state_dict_hooks[k]
    try:
        yield
    finally:
        for m, k, h in taken:
            m._state_dict_hooks[k] = h


def qwen3_moe(experts, layers=2, dim=64, moe_hidden=32, heads=4, kv_heads=2, head_dim=16, vocab=256):
    """torchtitan's qwen3 MoE model (its debugmodel_moe's definition,
    _build_qwen3_moe_layers) at a size two CPU cores build in a second."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3.model import Qwen3Model
    spec = _qwen3.model_registry("debugmodel_moe", attn_backend="flex")
    spec.model = Qwen3Model.Config(
        vocab_size=vocab, dim=dim, norm=_qwen3._qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_qwen3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_qwen3._LINEAR_INIT),
        layers=_qwen3._build_qwen3_moe_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
            moe_hidden_dim=moe_hidden, num_experts=experts, top_k=2, attn_backend="flex",
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=256, theta=1000000.0), moe_comm_backend="standard"))
    return spec


def qwen3_dense(layers=2, dim=64, hidden=96, heads=4, kv_heads=2, head_dim=32, vocab=256):
    """torchtitan's dense qwen3 (its debugmodel's definition,
    _build_qwen3_layers, tied embeddings) at a small size."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3.model import Qwen3Model
    spec = _qwen3.model_registry("debugmodel", attn_backend="flex")
    spec.model = Qwen3Model.Config(
        vocab_size=vocab, dim=dim, norm=_qwen3._qwen3_norm(dim), enable_weight_tying=True,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=_qwen3._EMBEDDING_SKIP_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_qwen3._LINEAR_INIT),
        layers=_qwen3._build_qwen3_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
            hidden_dim=hidden, attn_backend="flex",
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=256, theta=1000000.0)))
    return spec


def llama3_tiny(layers=2, dim=64, heads=4, kv_heads=2, vocab=256):
    """torchtitan's llama3 (its debugmodel's definition, _build_llama3_layers,
    untied) at a size 8 CPU ranks train in a second a step."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.llama3.model import Llama3Model
    spec = _llama3.model_registry("debugmodel", attn_backend="flex")
    spec.model = Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_llama3._output_linear_init(dim)),
        layers=_llama3._build_llama3_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads,
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=32),
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=256, theta=500000, scaling="llama"),
            attn_backend="flex"))
    return spec


def model_spec(name):
    """torchtitan's ModelSpec of one of the harness's models."""
    if name == "llama3-debug":
        return _llama3.model_registry("debugmodel", attn_backend="flex")
    if name == "qwen3-tiny":
        return qwen3_dense()
    if name == "llama3-tiny":
        return llama3_tiny()
    if name.startswith("qwen3-moe-e"):
        return qwen3_moe(int(name[len("qwen3-moe-e"):]))
    raise ValueError("unknown model %s" % name)


def parallel_dims(mesh, world):
    return ParallelDims(dp_replicate=mesh.get("dp_replicate", 1), dp_shard=mesh.get("dp_shard", 1),
                        cp=mesh.get("cp", 1), tp=mesh.get("tp", 1), pp=mesh.get("pp", 1), ep=mesh.get("ep", 1),
                        world_size=world, spmd_backend="partial_dtensor")


def on_meta(spec, mesh, world):
    """The model as torchtitan's Trainer builds it before it materializes
    it: the parallel dimensions of mesh (dp_replicate, dp_shard, tp; one
    model part) over torch.distributed's default group of `world`
    processes, their device meshes, the model built on the meta device and
    parallelized by the model's parallelize function (TP and SP
    placements, FSDP2's fully_shard, HSDP). Returns (parallel dims, model):
    nothing is allocated for the parameters (tests/torch/check_switch.py
    materializes them or hands them vps's buffers; so does
    scripts/bench/ckpt_dtensor.py)."""
    pd = parallel_dims(mesh, world)
    par = ParallelismConfig(spmd_backend="partial_dtensor", tensor_parallel_degree=mesh.get("tp", 1),
                            data_parallel_shard_degree=mesh.get("dp_shard", 1),
                            data_parallel_replicate_degree=mesh.get("dp_replicate", 1))
    training = TrainingConfig()
    spec.model.update_from_config(config=types.SimpleNamespace(parallelism=par, training=training))
    pd.build_mesh()
    with torch.device("meta"):
        model = spec.model.build()
    model = spec.parallelize_fn(model, parallel_dims=pd, training=training, parallelism=par,
                                compile_config=CompileConfig(), ac_config=None, dump_folder="/tmp")
    return pd, model


def apply_fsdp_ep(model, pd, training):
    """apply_fsdp_to_decoder's placement under expert parallelism, on
    PyTorch 2.11: routed experts FSDP-sharded over efsdp (Shard(1) when
    efsdp x ep outnumbers the experts), every other parameter over fsdp."""
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, training.mixed_precision_param),
                              reduce_dtype=getattr(torch, training.mixed_precision_reduce), cast_forward_inputs=False)
    dp = pd.get_mesh(["dp_replicate", "fsdp"] if pd.dp_replicate_enabled else ["fsdp"])
    edp = pd.get_optional_mesh(["dp_replicate", "efsdp"] if pd.dp_replicate_enabled else ["efsdp"])
    if model.tok_embeddings is not None:
        fully_shard(model.tok_embeddings, mesh=dp, mp_policy=mp)
    if model.norm is not None and model.lm_head is not None:
        fully_shard([model.norm, model.lm_head], mesh=dp, mp_policy=mp)
    for block in model.layers.values():
        if getattr(block, "moe_enabled", False):
            experts = block.moe.routed_experts.inner_experts
            placement = Shard(1) if edp["efsdp"].size() * pd.ep > experts.num_experts else Shard(0)
            fully_shard(experts, mesh=edp, mp_policy=mp, shard_placement_fn=lambda p, s=placement: s)
        fully_shard(block, mesh=dp, mp_policy=mp)
    fully_shard(model, mesh=dp, mp_policy=mp)


def build(spec, pd, mesh, fill):
    """The model parts this rank holds, parallelized as torchtitan does:
    built on the CPU, fill(model) setting every parameter (the full
    tensors, identical on every rank), split into pipeline stages by
    torchtitan's own rule (_generate_llm_fqn_per_model_part,
    _get_pp_rank_to_stage_indices_mapping, _split_module), each part given its TP/EP placements and FSDP
    by the model's parallelize function."""
    par = ParallelismConfig(spmd_backend="partial_dtensor", tensor_parallel_degree=mesh.get("tp", 1),
                            expert_parallel_degree=mesh.get("ep", 1), pipeline_parallel_degree=mesh.get("pp", 1),
                            data_parallel_shard_degree=mesh.get("dp_shard", 1),
                            data_parallel_replicate_degree=mesh.get("dp_replicate", 1))
    training = TrainingConfig()
    cfg = types.SimpleNamespace(parallelism=par, training=training)
    spec.model.update_from_config(config=cfg)
    pd.build_mesh()
    model = spec.model.build()
    fill(model)
    if pd.pp_enabled:
        stages, layers, inw, outw = _tt_pp._get_pipeline_metadata(pd, par, spec.model)
        names = _tt_pp._generate_llm_fqn_per_model_part(stages, layers, inw, outw)
        # _pipeline_module_split's model chunks without its PipelineStage
        # objects (their get_mesh argument is the nightly's)
        pp_mesh = pd.get_mesh("pp")
        mine = _tt_pp._get_pp_rank_to_stage_indices_mapping(pp_mesh.get_local_rank(), pp_mesh.size(),
                                                            par.pipeline_parallel_schedule, len(names))
        parts = [_tt_pp._split_module(model, names[s]) for s in mine]
    else:
        parts = [model]
    out = []
    for part in parts:
        if pd.ep_enabled:
            part.parallelize(pd)
            apply_fsdp_ep(part, pd, training)
        else:
            part = spec.parallelize_fn(part, parallel_dims=pd, training=training, parallelism=par,
                                       compile_config=CompileConfig(), ac_config=None, dump_folder="/tmp")
        # Decoder.init_states re-ties the embeddings after parallelization
        # (distributing each module's parameter untied them); its weight
        # initialization is left out, fill having set every value
        if getattr(part, "enable_weight_tying", False):
            part.tok_embeddings.weight = part.lm_head.weight
        out.append(part)
    return out
