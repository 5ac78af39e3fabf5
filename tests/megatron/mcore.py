"""Megatron-Core on the CPU, for tests: a vps model built by megatron-core
itself, one process per rank under gloo, the way Megatron-LM's training
path builds it (megatron/training/training.py get_model and
gpt_builders.py gpt_builder of core_v0.19.0), with the DDP wrapping and the
distributed optimizer's shard ranges of Megatron's own classes.

    import mcore
    mcore.install_cpu_shims()
    results = mcore.run_ranks(world, fn)          # fn(rank) in a forked process per rank

    # in fn, on each rank:
    mcore.init_parallel(par)                      # Megatron's process groups
    config = mcore.transformer_config(model, par)
    chunks = mcore.build_chunks(model, par, config)
    ddp = mcore.wrap_ddp(chunks, config, par)     # DistributedDataParallel per chunk
    opt = mcore.build_optimizer(par, ddp)         # get_megatron_optimizer (install_training_shims first)

model is a vps.Model and par the layout's parallel dictionary
(vps.Layout.parallel). Megatron's buffer and optimizer code runs unmodified;
the shims (install_cpu_shims) only say where tensors live and stand in for
TransformerEngine's modules, which need a GPU. See tests/megatron/README.md.
"""
import contextlib
import copy
import logging
import os
import sys
import warnings

# the forked ranks (RankError among them), shared with tests/torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
warnings.filterwarnings("ignore")
# torch and megatron-core warn on import that CUDA, TransformerEngine and
# Apex are absent: all three are, on purpose
logging.disable(logging.WARNING)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.extensions import transformer_engine_spec_provider  # noqa: E402
from megatron.core.models.backends import LocalSpecProvider  # noqa: E402
from megatron.core.models.gpt import GPTModel, gpt_layer_specs  # noqa: E402
from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer  # noqa: E402
from megatron.core.optimizer.layer_wise_optimizer import (  # noqa: E402
    LayerWiseDistributedOptimizer, tag_params_for_buffer_routing)
from megatron.core.post_training.modelopt.layers import Linear as ReplicatedLinear  # noqa: E402
from megatron.core.tensor_parallel import set_defaults_if_not_set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.tensor_parallel import random as tensor_parallel_random  # noqa: E402
from megatron.core.tensor_parallel.layers import ColumnParallelLinear  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer import multi_latent_attention  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.transformer.torch_norm import WrappedTorchNorm  # noqa: E402
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402

from importlib.metadata import version  # noqa: E402

import ranks  # noqa: E402
from ranks import RankError  # noqa: E402,F401  (mcore.RankError, as the checks name it)

# megatron.core.__version__ carries the git commit of the current directory
VERSION = version("megatron-core")

# ---- shims -----------------------------------------------------------------


class LayerNormColumnParallelLinear(ColumnParallelLinear):
    """What TELayerNormColumnParallelLinear registers and computes, built
    from Megatron's ColumnParallelLinear: the norm's layer_norm_weight (and
    layer_norm_bias for LayerNorm) before the linear's weight and bias, as
    TransformerEngine's LayerNormLinear.__init__ registers them, and the norm
    (in fp32, as TE's kernels compute it) before the linear. TE's fused
    module is the only one of the TE spec without a Megatron-Core
    equivalent; registration order fixes the DDP buffer's order, so it has
    to be TE's."""

    def __init__(self, input_size, output_size, *, config, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        linear = dict(self._parameters)
        self._parameters.clear()
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size, dtype=config.params_dtype))
        if config.normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(input_size, dtype=config.params_dtype))
        for p in self._parameters.values():
            # as TE marks its norms' parameters: their gradients are summed over TP under SP
            setattr(p, "sequence_parallel", config.sequence_parallel)
        self._parameters.update(linear)

    def forward(self, input_, *args, **kwargs):
        x = input_.float()
        w = self.layer_norm_weight.float()
        if self.config.layernorm_zero_centered_gamma:
            w = w + 1
        eps = self.config.layernorm_epsilon
        if self.config.normalization == "LayerNorm":
            x = F.layer_norm(x, (x.shape[-1],), w, self.layer_norm_bias.float(), eps)
        else:
            x = F.rms_norm(x, (x.shape[-1],), w, eps)
        return super().forward(x.to(input_.dtype), *args, **kwargs)


class Norm:
    """TENorm's place: torch's LayerNorm or RMSNorm, as Megatron's
    WrappedTorchNorm makes it, also under sequence parallelism (which
    WrappedTorchNorm refuses; Megatron's MoE layer trains under TP only with
    it): a norm computes the same on a piece of the sequence, and TE marks
    its parameters sequence_parallel, whose gradients finalize_model_grads
    then sums over TP."""

    def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
        if not config.sequence_parallel:
            return WrappedTorchNorm(config, hidden_size, eps, **kwargs)
        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = WrappedTorchNorm(plain, hidden_size, eps, **kwargs)
        for p in norm.parameters():
            setattr(p, "sequence_parallel", True)
        return norm


class CoreAttention(DotProductAttention):
    """TEDotProductAttention's place: Megatron's local attention, which has no
    parameters either, shown the configuration without context parallelism
    because it cannot compute CP attention and refuses to be built with it,
    and without MLA's k_channels/v_channels, which only TE's takes; what a
    rank registers is the same."""

    def __init__(self, config, *args, k_channels=None, v_channels=None, **kwargs):
        if config.context_parallel_size != 1:
            config = copy.copy(config)
            config.context_parallel_size = 1
        super().__init__(config, *args, **kwargs)


class CPUSpecProvider(LocalSpecProvider):
    """The TE backend's answers with Megatron-Core's local modules: norms fused
    into the following column-parallel linear (TESpecProvider's
    fuse_layernorm_and_linear), MLA's down projections replicated (TELinear
    with parallel_mode "duplicated"), everything else the local module the
    TE spec's counterpart registers the same parameters as."""

    def linear(self):
        return ReplicatedLinear

    def fuse_layernorm_and_linear(self):
        return True

    def column_parallel_layer_norm_linear(self):
        return LayerNormColumnParallelLinear

    def layer_norm(self, rms_norm=False, for_qk=False, has_residual=False):
        return Norm

    def core_attention(self):
        return CoreAttention


def _cuda_to_cpu(self, *args, **kwargs):
    return self


_module_shims_installed = False


def install_module_shims():
    """TransformerEngine's modules replaced by Megatron-Core's own (below), the
    part of install_cpu_shims that a GPU without TransformerEngine needs too
    (tests/gpu/megatron_job.py): module choices, no placement."""
    global _module_shims_installed
    if _module_shims_installed:
        return
    gpt_layer_specs.TESpecProvider = CPUSpecProvider
    gpt_layer_specs.TENorm = Norm
    transformer_engine_spec_provider.TESpecProvider = CPUSpecProvider
    multi_latent_attention.TELinear = ReplicatedLinear
    _module_shims_installed = True


_shims_installed = False


def install_cpu_shims():
    """Make Megatron-Core build on a machine without a GPU. Each shim is a
    placement or a module choice, never a change to what is computed:

    - torch.cuda.current_device() answers "cpu": DDP's _ParamAndGradBuffer
      allocates param_data/grad_data with device=torch.cuda.current_device(),
      and the buffers are what the tests read;
    - Tensor.cuda() returns the tensor: LanguageModule.setup_embeddings_and_
      output_layer moves the tied embedding copy to the GPU before its
      all-reduce over the embedding group, which gloo does on the CPU;
    - the TE layer spec's backend is CPUSpecProvider and its TENorm
      Megatron's WrappedTorchNorm, through Norm (gpt_layer_specs and the MLA resolver's
      get_backend look them up by name): TransformerEngine needs a GPU, and
      the TE spec, not the local one, is what vps lays out (Megatron's
      default; the local spec registers input_layernorm ahead of
      linear_proj);
    - MLA's TELinear is Megatron's replicated Linear: MLASelfAttention builds
      its down projections with parallel_mode "duplicated" only for a class
      it knows as TELinear (None without TE), and would otherwise split them
      over TP as ColumnParallelLinear, which TE runs never do."""
    global _shims_installed
    if _shims_installed:
        return
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = _cuda_to_cpu
    install_module_shims()
    _shims_installed = True


class _HostEvent:
    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass


class _HostStream:
    """torch.cuda's stream for a machine without one: the CPU runs every
    operation in order, so there is nothing to wait for."""

    def record_event(self, event=None):
        return _HostEvent()

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass


class _HostPlacement(TorchFunctionMode):
    """Every tensor Megatron-Core places on a GPU (device="cuda", an index,
    .cuda(), .to("cuda")) is placed on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, int, torch.device)):
            args = (args[0], _host(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)


def _host(device):
    if isinstance(device, int) or (isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"):
        return torch.device("cpu")
    return device


_tensor_type = torch.Tensor.type


def _cuda_type_name(self, *args, **kwargs):
    name = _tensor_type(self, *args, **kwargs)
    if args or kwargs or not name.startswith("torch.") or name.startswith("torch.cuda."):
        return name
    return "torch.cuda." + name[len("torch."):]


_training_shims_installed = False


def _split_as_on_a_gpu(split):
    def on_a_gpu(self, offload_fraction):
        # the host copies by id, each held until the split is done: an id
        # is another object's once its own is gone
        host = {}
        T = torch.Tensor
        saved = T.is_cuda, T.pin_memory, T.cpu, T.float, T.detach, T.clone

        def cpu(t, *args, **kwargs):
            r = saved[2](t, *args, **kwargs)
            host[id(r)] = r
            return r

        def where_it_was(method):
            # a copy of a host copy is on the host too
            def same_place(t, *args, **kwargs):
                r = method(t, *args, **kwargs)
                if id(t) in host:
                    host[id(r)] = r
                return r
            return same_place
        T.is_cuda = property(lambda t: id(t) not in host)
        T.pin_memory = lambda t, *args, **kwargs: t
        T.cpu = cpu
        T.float, T.detach, T.clone = (where_it_was(m) for m in saved[3:])
        try:
            return split(self, offload_fraction)
        finally:
            T.is_cuda, T.pin_memory, T.cpu, T.float, T.detach, T.clone = saved
    return on_a_gpu


def install_training_shims():
    """What Megatron-Core's optimizer, schedules and gradient reduction need
    beyond install_cpu_shims to train on a machine without a GPU. Each is a
    placement, never a change to what is computed:

    - tensors Megatron creates on "cuda" (MixedPrecisionOptimizer's
      _scale_one, the schedules' and p2p communication's buffers) are
      created on the CPU (a TorchFunctionMode, _HostPlacement);
    - Tensor.type() names a CPU tensor's type as its CUDA type
      ("torch.cuda.BFloat16Tensor"): the DistributedOptimizer's constructor
      and clip_grad_by_total_norm_fp32 accept only those names;
    - the CUDA generator is a CPU generator of its own: the RNG tracker
      (model_parallel_cuda_manual_seed, CudaRNGStatesTracker.fork) saves and
      restores the CUDA generator's state around dropout, which these tests
      set to 0;
    - torch.cuda.current_stream() is a stream with nothing to wait for, and
      torch.cuda.synchronize() and torch.cuda.stream() do nothing: DDP's
      gradient reduction orders its collectives against the current stream;
    - the HybridDeviceOptimizer (optimizer_cpu_offload) sorts its
      parameters by Tensor.is_cuda, and a CPU has none: while it sorts them
      (_get_sub_optimizer_param_groups), the tensors it is handed and its fp32
      copies of them are on the GPU, the copies it makes with .cpu() (and
      every copy of those) on the host, and pin_memory() returns its tensor, so
      that it splits them as on a GPU: its CPU optimizer steps the host
      copies, its other one the rest; torch.cuda.Stream() is the host stream;
    - torch.compile compiles nothing (torch._dynamo.config.disable): the
      router's expert-bias accounting (Router._apply_expert_bias) is
      compiled with jit_fuser, which inductor turns into C++ on a CPU, tens
      of seconds a rank on a busy machine; run as written it computes the
      same (integer counts).
    """
    global _training_shims_installed
    if _training_shims_installed:
        return
    install_cpu_shims()
    _HostPlacement().__enter__()
    torch.Tensor.type = _cuda_type_name
    generator = torch.Generator()
    torch.cuda.get_rng_state = torch.cuda.random.get_rng_state = lambda device="cuda": generator.get_state()
    torch.cuda.manual_seed = lambda seed: generator.manual_seed(seed)
    tensor_parallel_random._set_cuda_rng_state = \
        lambda new_state, device=-1, graph_safe=False: generator.set_state(new_state)
    stream = _HostStream()
    torch.cuda.current_stream = lambda device=None: stream
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.Stream = lambda *args, **kwargs: stream
    HybridDeviceOptimizer._get_sub_optimizer_param_groups = _split_as_on_a_gpu(
        HybridDeviceOptimizer._get_sub_optimizer_param_groups)
    torch._dynamo.config.disable = True
    _training_shims_installed = True


def install_checkpoint_shims():
    """Megatron-LM's distributed checkpoint (torch_dist) on torch's Adam,
    without Apex, TransformerEngine or psutil:

    - megatron-core 0.19.2's writer measures its memory for a debug log with
      psutil, which the wheel does not declare as a dependency (not even in
      its training extra) and the test environment leaves out; the
      measurement is 0 bytes here;
    - load_checkpoint handles torch's Adam (Megatron's choice without Apex
      and TransformerEngine, whose FusedAdams keep Adam's step per group)
      as 0.19.2 does not. Before the load, a DistributedOptimizer over
      torch's Adam that has not stepped yet is given its state with the
      optimizer's own _init_optimizer_states_with_dummy_values (what
      Megatron does before loading its fsdp_dtensor format): state_dict()
      reads Adam's step from every parameter's state, which torch's Adam
      makes at its first step, so a fresh job could not load a checkpoint.
      After the load, each parameter's step is the one the checkpoint's
      param_groups carry, a tensor of its own: the dp_reshardable format
      keeps the step it finds in the optimizer (LocalNonpersistentObject)
      and copies it over the loaded one (_set_main_param_and_optimizer_
      states), and load_state_dict gives every parameter one shared step
      tensor, which torch's Adam would increment once per parameter.
      And the fully_reshardable format, which saves no step per parameter
      and skips it when it loads, fails there with KeyError 'step':
      _set_main_param_and_optimizer_states asks the loaded tensors for
      every tensor of the parameter's state, Adam's step included; it is
      asked only for those the checkpoint has. Every other value is the
      checkpoint's, as Megatron loads it."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.training import training
    if not filesystem_async.HAVE_PSUTIL:
        filesystem_async._process_memory = lambda: 0
    load = training.load_checkpoint

    def torch_adams(optimizer):
        for o in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
            if isinstance(o, DistributedOptimizer) and isinstance(o.optimizer, torch.optim.Adam):
                yield o

    def load_checkpoint(model, optimizer, *args, **kwargs):
        for o in torch_adams(optimizer):
            if not o.optimizer.state:
                o._init_optimizer_states_with_dummy_values()
        out = load(model, optimizer, *args, **kwargs)
        for o in torch_adams(optimizer):
            for group in o.optimizer.param_groups:
                for p in group["params"]:
                    state = o.optimizer.state.get(p)
                    if state and "step" in group:
                        state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)
        return out
    training.load_checkpoint = load_checkpoint
    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_loaded_states(self, model_param, tensors):
        state = {}
        if isinstance(self.optimizer, torch.optim.Adam) and "step" not in tensors:
            group, order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state.get(self.optimizer.param_groups[group]["params"][order], {})
        step = state.pop("step", None)
        try:
            set_states(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step
    DistributedOptimizer._set_main_param_and_optimizer_states = set_loaded_states


_pretrain_shims_installed = False


def install_pretrain_shims():
    """What Megatron-LM's own training loop (megatron.training: pretrain,
    initialize_megatron, setup_model_and_optimizer, train) needs beyond
    install_training_shims to run on a machine without a GPU. None changes
    what is computed:

    - pretrain() calls initialize_megatron with allow_no_cuda=True,
      Megatron's own switch for a run without CUDA;
    - torch.cuda.device_count() answers 1: _initialize_distributed makes
      Megatron's process groups only when it sees a device;
    - torch.cuda.Stream() is a stream with nothing to wait for: the model
      builders make one to wrap the chunks in DDP;
    - set_jit_fusion_options does nothing: it compiles TorchScript fusions
      for the GPU by running them (half a minute here), and the jobs that
      run on the CPU turn the fusions off;
    - compile_helpers does nothing: the wheel ships the dataset helpers
      built (helpers_cpp), and not the Makefile that builds them, which
      initialize_megatron runs make on;
    - the GPU architecture validate_args asks for (get_device_arch_version)
      is Hopper's, 9 (its checks are for the GPU's kernels; they ask for
      CUDA_DEVICE_MAX_CONNECTIONS=1 with TP, which jobs set as on a GPU);
    - torch.compile does nothing (torch._dynamo.config.disable, PyTorch's
      switch for it): Megatron compiles the MoE router's and dispatcher's
      fused functions (jit_fuser), which on the CPU means a minute of C++
      compilation at the first MoE step; the functions run as written."""
    global _pretrain_shims_installed
    if _pretrain_shims_installed:
        return
    install_training_shims()
    install_checkpoint_shims()
    import functools
    from megatron.core.datasets import utils as dataset_utils
    from megatron.training import arguments, training
    arguments.get_device_arch_version = lambda: 9
    torch._dynamo.config.disable = True
    training.initialize_megatron = functools.partial(training.initialize_megatron, allow_no_cuda=True)
    training.set_jit_fusion_options = lambda *a, **k: None
    torch.cuda.device_count = lambda: 1
    torch.cuda.Stream = lambda *a, **k: _HostStream()
    dataset_utils.compile_helpers = lambda: None
    _pretrain_shims_installed = True


# ---- the model -------------------------------------------------------------


def padded_vocab(model, tp):
    """The vocabulary Megatron-LM's training path builds the model with
    (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding:
    make_vocab_size_divisible_by times TP)."""
    multiple = model.vocab_divisor * tp
    return -(-model.vocab // multiple) * multiple


def layer_counts(model, par):
    """num_layers_in_first/last_pipeline_stage as the parallel spec gives
    them (0: not set)."""
    return (par["first"] or None), (par["last"] or None)


def transformer_config(model, par, **overrides):
    """Megatron's TransformerConfig (MLATransformerConfig for MLA) of a vps
    model under a parallel configuration: the arguments Megatron-LM's
    core_transformer_config_from_args would pass for the same model with
    --bf16 --transformer-impl transformer_engine."""
    if par["grouped_gemm"]:
        raise ValueError("grouped_gemm=1: TEGroupedMLP exists only in TransformerEngine, which needs a GPU")
    moe = model.experts > 0
    rms = model.norm == 0
    first, last = layer_counts(model, par)
    kw = dict(
        num_layers=model.layers,
        hidden_size=model.hidden,
        num_attention_heads=model.heads,
        num_query_groups=model.query_groups,
        kv_channels=model.head_dim,
        ffn_hidden_size=model.ffn or model.moe_ffn,
        normalization="RMSNorm" if rms else "LayerNorm",
        gated_linear_unit=model.activation == 0,
        activation_func=F.silu if model.activation == 0 else F.gelu,
        add_bias_linear=bool(model.bias),
        add_qkv_bias=bool(model.qkv_bias),
        qk_layernorm=bool(model.qk_norm),
        tensor_model_parallel_size=par["tp"],
        pipeline_model_parallel_size=par["pp"],
        virtual_pipeline_model_parallel_size=par["vpp"] if par["vpp"] > 1 else None,
        context_parallel_size=par["cp"],
        expert_model_parallel_size=par["ep"],
        expert_tensor_parallel_size=par["etp"],
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
        sequence_parallel=False,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        bf16=True,
        use_cpu_initialization=True,
        perform_initialization=False,
        transformer_impl="transformer_engine",
        mtp_num_layers=model.mtp_layers or None,
    )
    if moe:
        kw.update(
            num_moe_experts=model.experts,
            moe_ffn_hidden_size=model.moe_ffn,
            moe_router_topk=2,
            moe_layer_freq=[0] * model.first_dense + [1] * (model.layers - model.first_dense),
            moe_shared_expert_intermediate_size=model.shared_ffn or None,
        )
        if model.router_bias:
            # the expert bias is meant for sigmoid scores (DeepSeek-V3)
            kw.update(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")
    cls = TransformerConfig
    if model.kv_lora_rank > 0:
        cls = MLATransformerConfig
        kw.update(
            q_lora_rank=model.q_lora_rank or None,
            kv_lora_rank=model.kv_lora_rank,
            qk_head_dim=model.qk_head_dim,
            qk_pos_emb_head_dim=model.qk_pos_dim,
            v_head_dim=model.v_head_dim,
            rope_type="rope",
        )
    kw.update(overrides)
    return cls(**kw)


def position_type(model):
    return "learned_absolute" if model.position == 1 else "rope"


def layer_spec(model, config, vp_stage):
    """gpt_builder's choice (gpt_builders.py, --transformer-impl
    transformer_engine): the decoder block spec for MoE models, one layer
    spec for dense ones; the MTP block from the decoder's last layer."""
    if model.experts > 0:
        spec = gpt_layer_specs.get_gpt_decoder_block_spec(
            config, use_transformer_engine=True, normalization=config.normalization, vp_stage=vp_stage)
    else:
        spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            None, False, config.qk_layernorm, config.multi_latent_attention)
    mtp = None
    if config.mtp_num_layers:
        last = gpt_layer_specs.get_gpt_decoder_layer_specs(
            config, use_transformer_engine=True, normalization=config.normalization, vp_stage=vp_stage)[-1]
        mtp = gpt_layer_specs.get_gpt_mtp_block_spec(config, last, use_transformer_engine=True, vp_stage=vp_stage)
    return spec, mtp


def build_chunks(model, par, config):
    """This rank's model chunks (one per virtual pipeline stage), as
    get_model builds them: GPTModel with the chunk's pre/post processing,
    the default tensor-parallel attributes set, wrapped in Float16Module.
    The modules stay on the CPU (get_model moves them to the GPU)."""
    vpp = par["vpp"]
    chunks = []
    for v in range(vpp):
        vp_stage = v if vpp > 1 else None
        spec, mtp = layer_spec(model, config, vp_stage)
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=padded_vocab(model, par["tp"]),
            max_sequence_length=model.max_positions or 4096,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            parallel_output=True,
            share_embeddings_and_output_weights=bool(model.tied_embeddings),
            position_embedding_type=position_type(model),
            mtp_block_spec=mtp,
            vp_stage=vp_stage,
        )
        for p in gpt.parameters():
            set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        chunks.append(Float16Module(config, gpt))
    return chunks


def bucket_size(par, dp_cp):
    """The DDP bucket size of the training path (training.py
    resolve_ddp_bucket_size): none without --overlap-grad-reduce (vps
    bucket=0), --ddp-bucket-size when given (bucket=N), otherwise
    max(40,000,000, 1,000,000 x the dp_cp group's size) (bucket=auto)."""
    b = par["bucket"]
    if b == 0:
        return None
    if b > 0:
        return b
    return max(40000000, 1000000 * dp_cp)


def ddp_config(par):
    """get_megatron_ddp_config's defaults for --bf16 (fp32 gradient
    accumulation and reduction), with the distributed optimizer for zero=1
    and --overlap-grad-reduce whenever buckets are asked for."""
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=par["bucket"] != 0,
        use_distributed_optimizer=bool(par["zero"]),
        bucket_size=bucket_size(par, parallel_state.get_data_parallel_world_size(with_context_parallel=True)),
    )


OPTIMIZERS = ("adam", "sgd", "muon", "lion")  # vps's enum vps_optimizer


def optimizer_name(par, key="optimizer"):
    return OPTIMIZERS[par[key]]


def layer_wise(par):
    """Whether Megatron-LM runs the configuration's optimizer as the
    layer-wise distributed optimizer: an emerging optimizer (Muon, Lion) with
    --use-distributed-optimizer, which validate_args turns into it
    (training/arguments.py, "emerging optimizer check")."""
    return optimizer_name(par) in ("muon", "lion") and bool(par["zero"])


def wrap_ddp(chunks, config, par):
    """DistributedDataParallel around each chunk as get_model and
    wrap_model_chunks_with_ddp do: bucketing only in the first chunk of the
    first pipeline stage; with the distributed optimizer the parameter
    layout computed by DistributedOptimizer.compute_full_param_layout for
    the dp_cp and expert-DP group sizes, and handed to DDP; with the
    layer-wise optimizer the parameters tagged for its buffers
    (tag_params_for_buffer_routing) and the layout of
    LayerWiseDistributedOptimizer.compute_full_param_layout."""
    dc = ddp_config(par)
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    disable = [i > 0 for i in range(len(chunks))]
    sizes = [None if (d or pp_rank > 0) else dc.bucket_size for d in disable]
    compute = DistributedOptimizer.compute_full_param_layout
    if layer_wise(par):
        tag_params_for_buffer_routing(chunks)
        compute = LayerWiseDistributedOptimizer.compute_full_param_layout
    out = []
    for chunk, size, dis in zip(chunks, sizes, disable):
        kw = {}
        if dc.use_distributed_optimizer:
            params = [p for p in chunk.parameters() if p.requires_grad]
            kw["full_param_layout"] = compute(
                params, size,
                parallel_state.get_data_parallel_world_size(with_context_parallel=True, partial_data_parallel=True),
                dc,
                expert_data_parallel_world_size=parallel_state.get_expert_data_parallel_world_size(
                    partial_expert_data_parallel=True),
            )
        out.append(DistributedDataParallel(config=config, ddp_config=dc, module=chunk, disable_bucketing=dis, **kw))
    return out


def optimizer_config(par):
    """The OptimizerConfig Megatron-LM's training path gives the configuration's
    optimizer (--bf16, --optimizer, --use-distributed-optimizer, which an
    emerging optimizer turns into the layer-wise one, --muon-scalar-optimizer)."""
    lw = layer_wise(par)
    return OptimizerConfig(optimizer=optimizer_name(par), lr=1e-4, bf16=True, params_dtype=torch.bfloat16,
                           use_distributed_optimizer=bool(par["zero"]) and not lw,
                           use_layer_wise_distributed_optimizer=lw,
                           muon_scalar_optimizer=optimizer_name(par, "scalar_optimizer"))


def build_optimizer(par, ddps):
    """Megatron's optimizer of the DDP-wrapped chunks (get_megatron_optimizer),
    on the CPU under install_training_shims. Not for the precision-aware
    optimizer, which is TransformerEngine's FusedAdam."""
    if par["precision_aware"]:
        raise ValueError("precision_aware=1: Megatron-Core builds it only over TransformerEngine's FusedAdam")
    return get_megatron_optimizer(optimizer_config(par), ddps, use_gloo_process_groups=False)


def gbuf_ranges(buffer):
    """The distributed optimizer's shard ranges of one DDP buffer on this
    rank, from its own class method (the constructor insists on CUDA
    parameters; the ranges are what it builds first): per bucket, each
    parameter's {"gbuf_world", "gbuf_local", "param", ...} Ranges."""
    (ranges,) = DistributedOptimizer._build_gbuf_range_map(buffer).values()
    return ranges


# ---- process groups --------------------------------------------------------


def init_parallel(par):
    """Megatron's process groups for the parallel configuration (rank order
    tp-cp-ep-dp-pp), over the gloo world the process joined."""
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par["tp"],
        pipeline_model_parallel_size=par["pp"],
        virtual_pipeline_model_parallel_size=par["vpp"] if par["vpp"] > 1 else None,
        context_parallel_size=par["cp"],
        expert_model_parallel_size=par["ep"],
        expert_tensor_parallel_size=par["etp"],
        create_gloo_process_groups=False,
    )


def coords():
    """This rank's coordinates as Megatron's process groups give them, in
    vps's names."""
    ps = parallel_state
    return dict(tp=ps.get_tensor_model_parallel_rank(), cp=ps.get_context_parallel_rank(),
                dp=ps.get_data_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
                etp=ps.get_expert_tensor_parallel_rank(), ep=ps.get_expert_model_parallel_rank(),
                edp=ps.get_expert_data_parallel_rank())


def run_ranks(world, fn, timeout=300, watch=None):
    """fn(rank) in world forked processes that form a gloo world (the parent
    has imported torch and megatron-core once; a fork costs no import). Each
    fn's return value, or the exception it raised as a RankError, in rank
    order. A rank that dies or outlives timeout seconds fails them all, and
    so does watch() (called while they run) returning a reason."""
    results, failed = ranks.gloo_ranks(world, fn, timeout, watch=watch,
                                       teardown=parallel_state.destroy_model_parallel, prefix="vps-mcore-")
    if failed:
        # what a rank that failed first said is the cause more often than not
        first = next((out for out in results if isinstance(out, RankError)), None)
        if first:
            failed += "\n(rank %d had failed: %s)\n%s" % (first.rank, first.what, first.trace)
        raise RuntimeError(failed)
    for r, out in enumerate(results):
        if out is None:
            raise RuntimeError("rank %d exited without a result" % r)
    return results
