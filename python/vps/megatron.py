"""A Megatron-Core job made switchable.

Megatron-Core keeps a rank's training state in its own objects: each model
chunk's DistributedDataParallel holds the bf16 parameters in one flat buffer
per (chunk, dense or expert, layer-wise or not), and the optimizer an fp32
main parameter and its states per parameter or piece of one: the
DistributedOptimizer (ZeRO-1) each piece of parameter that the rank's shard
covers, the Float16Optimizer (zero=0) every parameter whole, and the
layer-wise distributed optimizer (Muon or Lion with
--use-distributed-optimizer) the 2-D weights this DP rank owns, whole, with
a DistributedOptimizer, its scalar optimizer, for the rest. vps lays out
the same state as flat buffers of the same order (tests/megatron checks
every rank against Megatron-Core's own code), so a Job points Megatron's
tensors into vps's buffers and the switch moves them:

    import vps, vps.megatron

    def build(layout):                          # Megatron's own constructors
        vps.megatron.initialize_groups(layout)  # initialize_model_parallel for the layout, cached
        model = ...                             # model chunks in DistributedDataParallel
        optimizer = get_megatron_optimizer(config, model)
        return model, optimizer

    model, optimizer = build(layout)
    reg = vps.Registry("vps-%d" % rank, layout, rank)
    job = vps.megatron.Job(reg, layout, rank, model, optimizer)
    job.prepare(new_layout, rank, build)        # as soon as the next configuration is known
    ...train...
    model, optimizer, carried = job.switch(new_layout, rank, vps.Training(
        step=iteration, consumed_samples=n, scheduler_step=scheduler.num_steps,
        global_batch=gb, micro_batch=mb))

with one vps-exec(1) beside each rank. What moves: the bf16 parameters, the
fp32 main parameters, the optimizers' states (Adam's exp_avg and
exp_avg_sq, Lion's exp_avg, Muon's and SGD's momentum_buffer), and the
modules' buffers that are training state (the routers' expert_bias);
gradients are rebuilt by the next step and stay Megatron's. What is
carried: the training scalars (vps.Training), of which `step` is also
Adam's step count (Adam's, the scalar optimizer's under Muon and Lion; SGD,
Lion and Muon keep none).

The pause holds the transfer, and the hand-over runs beside it. Job.prepare
does the rest while the job trains: it allocates and registers the next
configuration's buffers (vps-exec maps them before the request), makes or
takes from the cache the next configuration's process groups, and calls
build under a skeleton (below): Megatron's constructors make the model
chunks, DDP and the optimizer without initialising a weight or allocating a
state buffer, and their tensors are pointed into the buffers the switch
will fill. The switch then requests the move and, while the executors move
the state, gives the gradients' memory before back, installs the next
configuration's groups and random-number states and gives Adam its step and
the gradient buffers their memory (none of it state vps moves: a failed
switch undoes it), and returns build's objects once the state is in.
Job.switch without a prepare does it all in the pause (build given). What
else the next configuration needs made with its groups before the switch
(vps.megatron_training makes its data sets) is made in a
Job.prepared_groups() block.

Process groups (initialize_groups): Megatron keeps its groups in module
globals of megatron.core.parallel_state, which every constructor and every
step reads. initialize_groups keeps, per configuration (the layout's tp,
pp, vpp, cp, ep, etp, the keyword arguments, the default group), the
values of all of those globals after initialize_model_parallel made them,
and installs them again when the configuration comes back: the same group
objects, so a model built for a configuration always runs on the groups it
captured (DDP, the optimizer, the buckets and the modules keep their
groups from the constructors; nothing else in Megatron-Core holds a group
across steps, and the random-number tracker, which holds no group, is kept
per configuration too). At most CACHED_CONFIGURATIONS configurations are
kept: making one more destroys the groups of the least recently installed,
never those of a configuration a Job runs or has prepared. Every rank makes
and evicts in the same order, since every rank makes the same calls. The
groups a job started with, made by initialize_model_parallel itself
(Megatron's initialize_megatron), join the cache by adopt_groups (layout,
**kwargs): coming back to that configuration then installs them, where it
would make a second set and never destroy the first.
Groups on NCCL are connected when made (an all-reduce on each, in the
order they were made), so that their communicators are not made in the
first step after the switch.

The skeleton (while build runs in Job.prepare): tensors allocated without
a device, parameters as they are registered, and the copies of parameters
the DistributedOptimizer and the Float16Optimizer make for their main
parameters are on the meta device; DDP's parameter buffers are the next
State's, and its gradient buffers are given memory only in the pause (after
the old ones are freed). What prepare holds until the switch is the next
State (the state the switch moves, on this rank in the next layout),
Megatron's small tensors (its scalars, the routers' token counts) and the
largest parameter's bytes (for a moment; without the distributed optimizer,
whose DDP keeps no parameter buffer, until the switch); a tensor the
skeleton left on the meta device is refused with vps.CheckFailed, naming
it.

Where the buffers live: a GPU job's parameter buffers are DDP's own
(State.adopt registers them by their CUDA IPC handles, no copy); its main
parameters and moments, which Megatron keeps one tensor per piece, are
gathered once into flat buffers of vps's layout when the Job is made. On
the host, vps-exec reaches only shared memory, so the Job allocates vps's
buffers there (State.allocate) and copies Megatron's values in, once. From
then on every one of those Megatron tensors is a view of a vps buffer.
Megatron's objects of the configuration before are emptied by the switch
(their tensors hold no elements, their gradient buffers no memory), since
their memory is gone.

Supported (the layout's optimizer= and scalar= must be what Megatron
built; tests/megatron/check_switch.py trains each on the CPU): the
DistributedOptimizer (ZeRO-1, zero=1 in vps's terms) over torch's
Adam/AdamW or a fused Adam that keeps exp_avg and exp_avg_sq per parameter
and its step per group (Apex's, TransformerEngine's: GPU only, not
exercised by the tests here); the Float16Optimizer (zero=0: every main
parameter and state whole) over any of them, SGD with momentum
(optimizer=sgd) among them, which only it runs; Muon and Lion as
the layer-wise distributed optimizer (optimizer=muon|lion, zero=1) with
Adam's or Lion's scalar optimizer (scalar=); bf16 parameters with fp32
main parameters and states, dense and expert buffers, the routers'
expert_bias, any number of model chunks (VPP); Adam's states offloaded to
the host (optimizer_cpu_offload, offload=F: the HybridDeviceOptimizer's
fp32 copies and states in the layout's host buffers, which are host
memory beside the GPU ones, as it split them). Not supported, and refused
with vps.Error naming why: the precision-aware optimizer (int16 remainders
and 16-bit moments, kept by TransformerEngine's FusedAdam, which needs a
GPU), SGD without momentum (no state to move, where the layout holds one), an
optimizer whose states vps does not describe (AdaptiveMuon's second
moment), parameters of other dtypes, layouts that move gradients
(grad=1).

Needs PyTorch (and Megatron-Core for the job itself): without torch,
importing it raises ModuleNotFoundError saying how to get it."""
from __future__ import annotations

import ast
import collections
import contextlib
import copy
import inspect
import queue
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

from ._lib import import_torch
from .errors import CheckFailed, Error, InvalidInput, Unsupported
from .layout import BF16, DTYPES, EXP_AVG, EXP_AVG_SQ, FP32, MAIN_PARAM, MODULE_BUFFER, MOMENTUM_BUFFER, OPTIMIZERS, \
    PARAM, STATES, Layout
from .registry import TARGET, Registry, Training

torch = import_torch("vps.megatron")
from torch.overrides import TorchFunctionMode  # noqa: E402
from . import state as _state  # noqa: E402 (needs torch)

__all__ = ["initialize_groups", "adopt_groups", "cached_configurations", "CACHED_CONFIGURATIONS", "optimizers",
           "distributed_optimizers", "Job", "MOMENTS"]

# the optimizers' name for each state vps moves beside the main parameter
MOMENTS = {EXP_AVG: "exp_avg", EXP_AVG_SQ: "exp_avg_sq", MOMENTUM_BUFFER: "momentum_buffer"}

# how many configurations' process groups initialize_groups keeps
CACHED_CONFIGURATIONS = 4


# ---- process groups, one set per configuration, cached ----

class _Groups:
    """A configuration's process groups: the values of parallel_state's
    globals after initialize_model_parallel made them, and the groups it
    made (which this rank belongs to)."""
    __slots__ = ("key", "values", "made")

    def __init__(self, key, values, made):
        self.key, self.values, self.made = key, values, made


_cache = collections.OrderedDict()  # key -> _Groups, the least recently installed first
_jobs = weakref.WeakSet()  # the Jobs, whose configurations are not evicted
_pristine_values = {}
_groups_seconds = [0.0]  # what initialize_groups has spent, for the Jobs' clocks
_counts = collections.Counter()  # made, reused, adopted, evicted


def _parallel_state():
    from megatron.core import parallel_state
    return parallel_state


def _pristine():
    """parallel_state's globals as the module defines them (read from its
    source: the literal each `_NAME = ...` at its top level assigns), that
    is before any group is made: every name a configuration sets."""
    if not _pristine_values:
        ps = _parallel_state()
        for node in ast.parse(inspect.getsource(ps)).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.startswith("_") and not t.id.startswith("__"):
                    try:
                        _pristine_values[t.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass  # not a literal: code, not a configuration's state
    return _pristine_values


def _shallow(v):
    # initialize_model_parallel fills some containers in place
    return copy.copy(v) if isinstance(v, (dict, list, set)) else v


def _snapshot() -> Dict[str, object]:
    ps = _parallel_state()
    return {n: _shallow(getattr(ps, n)) for n in _pristine()}


def _install(values: Dict[str, object]) -> None:
    ps = _parallel_state()
    for n, v in values.items():
        setattr(ps, n, _shallow(v))


def _same(a: Dict[str, object], b: Dict[str, object]) -> bool:
    return all(a[n] is b[n] or (isinstance(a[n], (dict, list, set)) and a[n] == b[n]) for n in a)


def _installed() -> Optional[_Groups]:
    """The cached configuration whose groups are installed, or None."""
    now = _snapshot()
    for g in reversed(_cache.values()):
        if _same(g.values, now):
            return g
    return None


def _process_groups():
    from torch.distributed import distributed_c10d as c10d
    default = c10d._get_default_group()
    return [g for g in c10d._world.pg_map if g is not default]


def _group_key(layout: Layout, kwargs) -> tuple:
    from torch.distributed import distributed_c10d as c10d
    par = layout.parallel
    return (c10d._get_default_group(), tuple(par[k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp")),
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


def initialize_groups(layout: Layout, **kwargs) -> None:
    """Megatron's process groups for a layout: parallel_state.
    initialize_model_parallel with its tp, pp, vpp, cp, ep and etp (and
    kwargs), or the same groups again when they were made for the same
    configuration before (see the module's text: the cache, and what it
    keeps). Every rank calls it, in the same order (torch.distributed's rule
    for making groups)."""
    t = time.monotonic()
    key = _group_key(layout, kwargs)
    g = _cache.get(key)
    if g is not None:
        _cache.move_to_end(key)
        _install(g.values)
        _counts["reused"] += 1
    else:
        par = layout.parallel
        _install(_pristine())
        before = set(_process_groups())
        _parallel_state().initialize_model_parallel(
            tensor_model_parallel_size=par["tp"],
            pipeline_model_parallel_size=par["pp"],
            virtual_pipeline_model_parallel_size=par["vpp"] if par["vpp"] > 1 else None,
            context_parallel_size=par["cp"],
            expert_model_parallel_size=par["ep"],
            expert_tensor_parallel_size=par["etp"],
            **kwargs)
        made = [p for p in _process_groups() if p not in before]
        _connect(made)
        g = _cache[key] = _Groups(key, _snapshot(), made)
        _counts["made"] += 1
        _evict(g)
    _groups_seconds[0] += time.monotonic() - t


def adopt_groups(layout: Layout, **kwargs) -> None:
    """The process groups installed now, made for layout's configuration by
    parallel_state.initialize_model_parallel outside initialize_groups
    (Megatron's initialize_megatron, as the job started), kept in the cache
    as initialize_groups(layout, **kwargs) keeps the groups it makes (the
    same kwargs: they are the cache's key): a switch back to layout
    installs them, and they are destroyed when evicted (the groups that
    parallel_state's globals hold). Nothing is done when layout's
    configuration is cached already. vps.InvalidInput when the groups
    installed are not layout's sizes, or none are."""
    key = _group_key(layout, kwargs)
    if key in _cache:
        return
    ps, par = _parallel_state(), layout.parallel
    if not ps.model_parallel_is_initialized():
        raise InvalidInput("adopt_groups: no process groups are installed (initialize_model_parallel)")
    have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_virtual_pipeline_model_parallel_world_size() or 1, ps.get_context_parallel_world_size(),
            ps.get_expert_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size())
    want = tuple(par[k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp"))
    if have != want:
        raise InvalidInput("adopt_groups: the groups installed are tp, pp, vpp, cp, ep, etp = %s; %s is %s"
                           % (have, layout.describe(), want))
    values = _snapshot()
    g = _cache[key] = _Groups(key, values, _groups_in(values))
    _counts["adopted"] += 1
    for job in _jobs:
        # a Job made before holds these groups from now on: never evicted while it runs on them
        if job._groups is None and job.layout is not None and job.layout.hash == layout.hash:
            job._groups = g
    _evict(g)


def _groups_in(values: Dict[str, object]) -> list:
    """The process groups that parallel_state's globals hold (in lists,
    tuples and dicts too), each once, not the default one."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    default = c10d._get_default_group()
    found, stack = {}, list(values.values())
    while stack:
        v = stack.pop()
        if isinstance(v, dist.ProcessGroup):
            if v is not default:
                found[id(v)] = v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set)):
            stack.extend(v)
    return list(found.values())


def _connect(groups) -> None:
    """Make the communicators of NCCL groups now: torch makes one at its
    group's first collective, which would be the first step after the
    switch. One all-reduce per group, in the order every rank made them,
    each finished before the next (one total order: no rank waits on a group
    whose other members wait on one it has not reached)."""
    import torch.distributed as dist
    for g in groups:
        if "nccl" in str(dist.get_backend(g)).lower():
            dist.all_reduce(torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device())), group=g)
            torch.cuda.synchronize()


def _evict(keep: _Groups) -> None:
    import torch.distributed as dist
    held = {id(keep)}
    for job in list(_jobs):
        held.update(id(g) for g in job._held_groups())
    for key in list(_cache):
        if len(_cache) <= CACHED_CONFIGURATIONS:
            break
        g = _cache[key]
        if id(g) in held:
            continue
        del _cache[key]
        for p in g.made:
            dist.destroy_process_group(p)
        _counts["evicted"] += 1


def cached_configurations() -> List[dict]:
    """The configurations whose process groups initialize_groups keeps, the
    least recently installed first: dicts of tp, pp, vpp, cp, ep, etp; and
    in cached_configurations.counts how many were made, reused, adopted
    (adopt_groups) and evicted so far."""
    return [dict(zip(("tp", "pp", "vpp", "cp", "ep", "etp"), k[1])) for k in _cache]


cached_configurations.counts = _counts


# ---- the random-number states, one set per configuration ----

def _rng_state():
    """torch's generators and Megatron's RNG tracker (which build seeds for
    its configuration: model_parallel_cuda_manual_seed)."""
    from megatron.core.tensor_parallel import random as tpr
    tracker = tpr._CUDA_RNG_STATE_TRACKER
    try:
        cuda = torch.cuda.get_rng_state()
    except (RuntimeError, AssertionError, AttributeError):
        cuda = None  # no CUDA
    return (torch.get_rng_state(), cuda, tracker, tpr._CUDA_RNG_STATE_TRACKER_INITIALIZED,
            dict(tracker.get_states()) if tracker is not None else None,
            set(tracker.seeds_) if tracker is not None else None)


def _set_rng_state(s) -> None:
    from megatron.core.tensor_parallel import random as tpr
    cpu, cuda, tracker, initialized, states, seeds = s
    torch.set_rng_state(cpu)
    if cuda is not None:
        tpr._set_cuda_rng_state(cuda)
    tpr._CUDA_RNG_STATE_TRACKER, tpr._CUDA_RNG_STATE_TRACKER_INITIALIZED = tracker, initialized
    if tracker is not None:
        tracker.set_states(dict(states))
        tracker.seeds_ = set(seeds)


# ---- the skeleton: Megatron's constructors without weights or state buffers ----

META = torch.device("meta")


def _same_device(a: torch.device, b: torch.device) -> bool:
    """torch.device("cuda") names the current device: the job's buffers say
    "cuda" where Megatron's parameters say "cuda:0"."""
    def index(d):
        return torch.cuda.current_device() if d.type == "cuda" and d.index is None else d.index
    return a.type == b.type and index(a) == index(b)
_ALLOCATE = {torch.empty, torch.empty_strided, torch.empty_permuted, torch.zeros, torch.ones, torch.full, torch.rand,
             torch.randn, torch.randint, torch.randperm}


def _storage(t) -> int:
    return 0 if t.is_meta else t.untyped_storage().data_ptr()


def _numel(args) -> int:
    size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
    n = 1
    for d in size:
        n *= int(d)
    return n


class _Skeleton(TorchFunctionMode):
    """What build's constructors allocate, while Job.prepare runs it:

    - parameters, and tensors made without a device (the CPU
      initialisation's master weights), on the meta device: no memory, and
      every initialisation does nothing;
    - in DDP's buffers (_ParamAndGradBuffer.__init__): the parameters made
      real first (DDP points them into its buffer, which a meta tensor
      cannot be pointed at), as views of one placeholder the size of the
      largest, never read; the parameter buffer (made for the distributed
      optimizers only) the next State's buffer of that chunk, dense or
      expert, layer-wise or not; the gradient buffer given memory for the
      views DDP makes of it, then none until the switch (Job.switch gives it
      back);
    - in the DistributedOptimizer's and the Float16Optimizer's constructors
      (zero=0, and the layer-wise optimizer's), the copies of parameters
      they make for their main parameters on the meta device (Job.prepare
      points them into the next State)."""

    def __init__(self, targets, device):
        super().__init__()
        # the next State's parameter buffers: (chunk, expert, layerwise) -> tensor
        self.targets = targets
        self.device = device
        # what parameters are views of: the targets, and the placeholders
        self.param_storages = {_storage(t) for t in targets.values()}
        self.used = set()
        self.chunk = -1  # the DDP model chunk being made
        self.window = None  # inside a DDP buffer's constructor: its parameter buffer, gradient, placeholders
        self.optimizer = 0  # inside an optimizer's constructor
        self.grads = []  # (tensor, nbytes): the gradient buffers to give memory in the pause

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALLOCATE:
            if self.window is not None and func is torch.zeros:
                return self._ddp_zeros(args, kwargs)
            if kwargs.get("device") is None:
                kwargs["device"] = META
        elif func is torch.Tensor.clone and self.optimizer and _storage(args[0]) in self.param_storages:
            return torch.empty_like(args[0], device=META)
        elif func is torch.Tensor.copy_ and self.window is not None and _storage(args[1]) in self.window["scratch"]:
            return args[0]  # a placeholder's bytes: there are none to keep
        elif args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            if func in (torch.Tensor.cuda, torch.Tensor.cpu):
                return args[0]
            if func is torch.Tensor.to:
                kwargs.pop("device", None)
                args = tuple(a for a in args if not isinstance(a, (str, int, torch.device)))
            elif (func is torch.Tensor.type or getattr(func, "__name__", None) == "type") and len(args) == 1 \
                    and not kwargs:
                # the type a real parameter has (the DistributedOptimizer checks it); on the host,
                # tests/megatron/mcore.py names host tensors so too
                return "torch.cuda." + torch._C.TensorBase.type(torch.empty(0, dtype=args[0].dtype)).split(".")[-1]
        return func(*args, **kwargs)

    def _ddp_zeros(self, args, kwargs):
        n, dtype = _numel(args), kwargs.get("dtype")
        w = self.window
        if w["param"] is None and w["distributed"] and dtype == torch.bfloat16:
            # the parameter buffer, which DDP makes first
            key = (self.chunk, w["expert"], w["layerwise"])
            t = self.targets.get(key)
            if t is not None and key not in self.used and t.numel() == n:
                self.used.add(key)
                w["param"] = t
                return t
            # another size: DDP makes its own, and the Job's check says how it differs
        t = torch.empty(n, dtype=dtype, device=self.device)
        w["made"].append(t)
        return t

    def ddp(self, init):
        def __init__(ddp, *args, **kwargs):
            self.chunk += 1
            init(ddp, *args, **kwargs)
        return __init__

    def ddp_buffer(self, init):
        def __init__(buf, ddp_config, param_dtype, grad_dtype, params_with_names, *args, **kwargs):
            params = [p for p, _ in params_with_names]
            first = params[0] if params else None
            self.window = w = {"expert": first is not None and not getattr(first, "allreduce", True),
                               "layerwise": bool(getattr(first, "is_managed_by_layer_wise_optimizer", False)),
                               "distributed": ddp_config.use_distributed_optimizer, "param": None, "made": [],
                               "scratch": set()}
            try:
                meta = [p for p in params if p.is_meta]
                if meta:
                    scratch = torch.empty(max(p.numel() for p in meta), dtype=param_dtype, device=self.device)
                    w["scratch"].add(_storage(scratch))
                    # without a parameter buffer (zero=0) the parameters stay views of it until the
                    # Job points them into the next State: the Float16Optimizer copies them
                    self.param_storages.add(_storage(scratch))
                    for p in meta:
                        _materialize(p, scratch[:p.numel()].view(p.shape))
                init(buf, ddp_config, param_dtype, grad_dtype, params_with_names, *args, **kwargs)
            finally:
                self.window = None
            g = buf.grad_data
            if any(g is t for t in w["made"]):
                nbytes = g.untyped_storage().nbytes()
                g.untyped_storage().resize_(0)
                self.grads.append((g, nbytes))
        return __init__

    def optimizer_init(self, init):
        def __init__(opt, *args, **kwargs):
            self.optimizer += 1
            try:
                init(opt, *args, **kwargs)
            finally:
                self.optimizer -= 1
        return __init__

    def hybrid_init(self, init):
        # the HybridDeviceOptimizer sorts its parameters by where their copies
        # are (is_cuda): a meta copy is on no GPU, so its copies are real,
        # made while the job trains and dropped when the Job points them
        def __init__(opt, *args, **kwargs):
            outer, self.optimizer = self.optimizer, 0
            try:
                init(opt, *args, **kwargs)
            finally:
                self.optimizer = outer
        return __init__


def _plain():
    """No torch function dispatch (modes, subclasses) for the hand-over's
    few operations on tensors whose places are set: in the pause, each
    dispatch through Python is time the job stands still."""
    return torch._C.DisableTorchFunction()


# Tensor.data's setter itself: `t.data = x` on a Parameter costs tens of microseconds more (Python's
# attribute machinery, torch function dispatch), which a pause of a few hundred tensors notices
_set_data = torch._C.TensorBase.data.__set__


def _materialize(t, view) -> None:
    """Give a meta tensor a real one's contents, keeping it the same object
    (every reference to it, the optimizer's state keys among them, stays
    right): a meta tensor cannot take real data (.data =)."""
    new = torch.nn.Parameter(view, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else \
        view.detach().requires_grad_(t.requires_grad)
    new.__dict__.update(t.__dict__)
    torch.utils.swap_tensors(t, new)


def _meta_parameter(module, name, param):
    if param is None or param.is_meta:
        return None
    p = torch.nn.Parameter(torch.empty_like(param, device=META), requires_grad=param.requires_grad)
    p.__dict__.update(param.__dict__)
    return p


@contextlib.contextmanager
def _skeleton(targets, device):
    import torch.distributed as dist
    from megatron.core.distributed import param_and_grad_buffer as pgb
    from megatron.core.distributed.distributed_data_parallel import DistributedDataParallel
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    mode = _Skeleton(targets, device)
    inits = [(DistributedDataParallel, DistributedDataParallel.__init__, mode.ddp),
             (pgb._ParamAndGradBuffer, pgb._ParamAndGradBuffer.__init__, mode.ddp_buffer),
             (DistributedOptimizer, DistributedOptimizer.__init__, mode.optimizer_init),
             (Float16OptimizerWithFloat16Params, Float16OptimizerWithFloat16Params.__init__, mode.optimizer_init),
             (HybridDeviceOptimizer, HybridDeviceOptimizer.__init__, mode.hybrid_init)]
    collectives = {name: getattr(dist, name) for name in ("all_reduce", "broadcast")}

    def skip_meta(f):
        # GPTModel's constructor all-reduces the tied embeddings over the embedding group: the
        # switch gives them their values
        def collective(tensor, *args, **kwargs):
            return None if tensor.is_meta else f(tensor, *args, **kwargs)
        return collective
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(_meta_parameter)
    try:
        for cls, init, wrap in inits:
            cls.__init__ = wrap(init)
        for name, f in collectives.items():
            setattr(dist, name, skip_meta(f))
        with mode:
            yield mode
    finally:
        hook.remove()
        for cls, init, _ in inits:
            cls.__init__ = init
        for name, f in collectives.items():
            setattr(dist, name, f)


# the modules whose objects _meta_left looks inside
_WALKED = ("megatron.", "torch.nn", "torch.optim", "emerging_optimizers.")


def _meta_left(model, optimizer) -> Optional[str]:
    """Where a tensor the job uses is still on the meta device, or None:
    the model chunks' parameters, buffers and tensor attributes, DDP's
    buffers and buckets, the optimizers' attributes, groups and state."""
    seen = set()
    stack = [("model[%d]" % i, m) for i, m in enumerate(model)] + [("optimizer", optimizer)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_meta:
                return path
        elif isinstance(obj, dict):
            stack.extend(("%s[%s]" % (path, k if isinstance(k, (str, int)) else type(k).__name__), v)
                         for k, v in obj.items() if not isinstance(v, (str, int, float, bool, type(None))))
            stack.extend(("%s key" % path, k) for k in obj if isinstance(k, torch.Tensor))
        elif isinstance(obj, (list, tuple)):
            stack.extend(("%s[%d]" % (path, i), v) for i, v in enumerate(obj))
        elif type(obj).__module__.startswith(_WALKED) and hasattr(obj, "__dict__"):
            stack.extend(("%s.%s" % (path, k), v) for k, v in vars(obj).items()
                         if not k.startswith("_forward") and not k.startswith("_backward"))
    return None


def optimizers(optimizer) -> list:
    """The optimizers inside Megatron's optimizer that keep the state vps
    moves, in order, through ChainedOptimizers and the
    LayerWiseDistributedOptimizer: DistributedOptimizers (ZeRO-1 pieces of
    the main parameters and states) and Float16OptimizerWithFloat16Params
    (whole main parameters: zero=0, and the layer-wise optimizer's on the
    rank that owns them); stubs (no parameters here) left out. Anything else
    raises vps.Unsupported, saying why."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    out, todo = [], [optimizer]
    while todo:
        o = todo.pop(0)
        chained = getattr(o, "chained_optimizers", None)
        if chained is not None:
            todo[:0] = list(chained)
            continue
        config = getattr(o, "config", None)
        offloaded = config is not None and getattr(config, "optimizer_cpu_offload", False)
        if offloaded and not isinstance(o, DistributedOptimizer):
            raise Unsupported("optimizer_cpu_offload without the distributed optimizer: Megatron-LM builds the "
                              "HybridDeviceOptimizer under the DistributedOptimizer only")
        if config is not None and config.use_precision_aware_optimizer and not offloaded:
            raise Unsupported("the precision-aware optimizer keeps its moments and master weights inside "
                              "TransformerEngine's FusedAdam (int16 remainders, bf16 moments), which needs a GPU: "
                              "vps.megatron binds fp32 states only")
        if not isinstance(o, (DistributedOptimizer, Float16OptimizerWithFloat16Params)):
            raise Unsupported("%s: vps moves the state of Megatron's DistributedOptimizer and "
                              "Float16OptimizerWithFloat16Params (bf16 parameters, fp32 main parameters)"
                              % type(o).__name__)
        if not o.is_stub_optimizer:
            out.append(o)
    return out


def distributed_optimizers(optimizer) -> list:
    """The DistributedOptimizers in Megatron's optimizer (a ChainedOptimizer
    holds one for the dense parameters and one for the experts'); vps.
    Unsupported when it holds another kind (optimizers() gives them all)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    opts = optimizers(optimizer)
    for o in opts:
        if not isinstance(o, DistributedOptimizer):
            raise Unsupported("%s: not a DistributedOptimizer (ZeRO-1, use_distributed_optimizer=True)"
                              % type(o).__name__)
    return opts


def _hybrid(opt):
    """The HybridDeviceOptimizer of a DistributedOptimizer built with
    optimizer_cpu_offload, or None."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    return opt.optimizer if isinstance(opt.optimizer, HybridDeviceOptimizer) else None


def _kind(inner) -> Optional[str]:
    """Which optimizer of vps's (OPTIMIZERS) a torch optimizer is, by the
    names of its classes (emerging_optimizers need not be installed); None
    for one whose states vps does not describe."""
    names = {c.__name__ for c in type(inner).__mro__}
    if "AdaptiveMuon" in names:
        return None  # a second moment of its own
    if names & {"TensorParallelMuon", "Muon"}:
        return "muon"
    if names & {"Adam", "AdamW", "FusedAdam"}:
        return "adam"
    if "SGD" in names:
        return "sgd"
    if "Lion" in names:
        return "lion"
    return None


def _inner(chunk):
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _unwrapped_names(chunk):
    """Parameter -> its name inside the innermost module (GPTModel), which
    is the name vps's view gives as local_name."""
    return {p: n for n, p in _inner(chunk).named_parameters()}


def _layerwise(buf) -> bool:
    """Whether a DDP buffer is the layer-wise optimizer's (its parameters
    tagged by tag_params_for_buffer_routing)."""
    return bool(buf.params) and bool(getattr(next(iter(buf.params)), "is_managed_by_layer_wise_optimizer", False))


class _Piece:
    """One parameter's share of the optimizer state on this rank: its range
    [lo, hi) in the flattened parameter, where it starts in vps's state
    buffers of its (chunk, expert, layerwise) (at), its main parameter, the
    torch optimizer and param group that step it, which of vps's optimizers
    that is (kind), and the states it keeps there ({vps state: its name},
    from MOMENTS); host: in the layout's host buffers (offload=F: Megatron's
    HybridDeviceOptimizer keeps its states in host memory), at `at` there."""
    __slots__ = ("param", "main", "lo", "hi", "at", "inner", "group", "kind", "states", "host")

    def __init__(self, param, main, lo, hi, at, inner, group, kind, states, host=False):
        self.param, self.main, self.lo, self.hi, self.at = param, main, lo, hi, at
        self.inner, self.group, self.kind, self.states, self.host = inner, group, kind, states, host


class _Binding:
    """Which Megatron tensor is which part of which vps buffer, on one rank:
    computed from Megatron's objects (DDP's param_index_map, the
    distributed optimizer's range maps, the Float16Optimizers' main
    parameters) and checked against vps's view. Buffers are keyed (chunk,
    expert, layerwise), as the view's are."""

    def __init__(self, view, model, optimizer):
        self.view = view
        self.model = list(model)
        self.optimizer = optimizer
        self.opts = optimizers(optimizer)
        self.handed, self.grads = [], []
        self.steps, self.step_slots, self.step_groups = [], {}, []
        for b in view.buffers:
            if b.state != MODULE_BUFFER and b.state not in (PARAM, MAIN_PARAM) and b.state not in MOMENTS:
                raise Unsupported("the layout moves %s buffers (chunk %d); vps.megatron moves parameters, main "
                                  "parameters, the optimizers' states and module buffers" % (STATES[b.state], b.chunk))
            if b.dtype != (BF16 if b.state == PARAM else FP32):
                raise Unsupported("the layout's %s buffer of chunk %d is %s (%s): vps.megatron binds bf16 "
                                  "parameters and fp32 states; the precision-aware optimizer's remainders and "
                                  "16-bit moments live in TransformerEngine's FusedAdam, which needs a GPU" % (
                                      STATES[b.state], b.chunk, DTYPES[b.dtype],
                                      "precision_aware=1" if b.state == MAIN_PARAM else "a 16-bit state"))
        if len(self.model) != 1 + max([b.chunk for b in view.buffers] + [0]):
            raise CheckFailed("%d model chunks; the layout has %d on rank %d" % (
                len(self.model), 1 + max(b.chunk for b in view.buffers), view.rank))
        self.ddp_buffers = {}  # (chunk, expert, layerwise) -> Megatron's _ParamAndGradBuffer
        for c, chunk in enumerate(self.model):
            for expert, bufs in ((False, chunk.buffers), (True, chunk.expert_parallel_buffers)):
                for buf in bufs:
                    key = (c, expert, _layerwise(buf))
                    if key in self.ddp_buffers:
                        raise Unsupported("%s: Megatron has two (parameters of several dtypes); vps lays out one"
                                          % self._where(key))
                    self.ddp_buffers[key] = buf
        ours = {(b.chunk, b.expert, b.layerwise) for b in view.buffers if b.state == PARAM}
        for key in sorted(ours ^ set(self.ddp_buffers)):
            raise CheckFailed("%s: %s%s" % (
                self._where(key), "the layout has one, Megatron none" if key in ours else
                "Megatron has one, the layout none", " (the layer-wise distributed optimizer's: Muon or Lion with "
                "zero=1)" if key[2] else ""))
        self.params = {}  # model parameter -> (key, start, end, bucket, the layout's Param)
        for key, buf in self.ddp_buffers.items():
            self._check_params(key, buf, _unwrapped_names(self.model[key[0]]))
        self.module_buffers = self._module_buffers()
        self._states = {}  # tensor id -> the states the layout holds it in
        self.pieces = {}  # (chunk, expert, layerwise) -> [_Piece]
        self.sharding = {}  # (chunk, expert, layerwise) -> "range" (DistributedOptimizer) or "whole"
        self.adam = []  # the (torch optimizer, group)s of Adam's pieces: its step count
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        for o in self.opts:
            if isinstance(o, DistributedOptimizer):
                self._range_pieces(o)
            else:
                self._whole_pieces(o)
        for key in self.ddp_buffers:
            self._check_states(key)

    def _where(self, key):
        c, expert, lw = key
        return "rank %d chunk %d %s%s buffer" % (self.view.rank, c, "layer-wise " if lw else "",
                                                 "expert" if expert else "dense")

    def _check_params(self, key, buf, names):
        w = self._where(key)
        if buf.param_dtype != torch.bfloat16:
            raise Unsupported("%s: %s parameters; vps lays out bf16" % (w, buf.param_dtype))
        pb = self.view.buffers[self.view.buffer(PARAM, *key)]
        ours = {p.local_name: p for p in self.view.params
                if (p.chunk, p.expert, p.layerwise) == key and not p.module_buffer}
        if buf.numel != pb.elements:
            raise CheckFailed("%s: Megatron's has %d elements, the layout's %d" % (w, buf.numel, pb.elements))
        for p, (start, end, bucket) in buf.param_index_map.items():
            name = names.get(p, "?")
            mine = ours.pop(name, None)
            if mine is None:
                raise CheckFailed("%s: Megatron's parameter %s is not in the layout" % (w, name))
            if (start, end - start) != (mine.offset, mine.elements) or tuple(p.shape) != tuple(mine.shape):
                raise CheckFailed("%s: %s %s at %d (%d elements) in Megatron's buffer, %s at %d (%d) in "
                                  "the layout" % (w, name, list(p.shape), start, end - start, list(mine.shape),
                                            mine.offset, mine.elements))
            self.params[p] = (key, start, end, bucket, mine)
        if ours:
            raise CheckFailed("%s: the layout's %s is not in Megatron's buffer" % (w, sorted(ours)[0]))

    def _module_buffers(self):
        """[(Megatron's buffer tensor, the layout's Param)]: the module buffers
        vps moves (the routers' expert_bias), each found by its name in its
        chunk; a layout that has one Megatron has not, or of another shape
        or dtype, is refused."""
        out = []
        by_chunk = {}
        for p in self.view.params:
            if p.module_buffer:
                by_chunk.setdefault(p.chunk, []).append(p)
        for c, params in sorted(by_chunk.items()):
            theirs = dict(_inner(self.model[c]).named_buffers())
            b = self.view.buffers[self.view.buffer(MODULE_BUFFER, c, False)]
            for p in params:
                t = theirs.get(p.local_name)
                w = "rank %d chunk %d module buffer %s" % (self.view.rank, c, p.local_name)
                if t is None:
                    raise CheckFailed("%s: the layout moves it, Megatron's model has none" % w)
                # Float16Module makes it bf16, and the router fp32 again at its first forward
                # (_maintain_float32_expert_bias): a view of vps's fp32 buffer is what it would make
                dtypes = (_state.TORCH_DTYPE[b.dtype], torch.bfloat16)
                if tuple(t.shape) != tuple(p.shape) or t.dtype not in dtypes:
                    raise CheckFailed("%s: %s %s in Megatron's model, %s %s in the layout" % (
                        w, t.dtype, list(t.shape), _state.TORCH_DTYPE[b.dtype], list(p.shape)))
                out.append((t, p))
        return out

    def _key_of(self, buf):
        for key, b in self.ddp_buffers.items():
            if b is buf:
                return key
        return None

    def _piece(self, p, main, lo, hi, at, inner, group, host=False):
        """A _Piece of parameter p, after checking that the optimizer that
        steps it is the one the layout gives it, keeping the states the
        layout holds it in."""
        key, mine = self.params[p][0], self.params[p][4]
        kind = _kind(inner)
        if kind is None:
            raise Unsupported("%s: %s keeps states vps does not describe (it describes %s)" % (
                mine.name, type(inner).__name__, ", ".join(OPTIMIZERS)))
        want = self.view.layout.optimizer_of(mine.tensor)
        if kind != want:
            raise CheckFailed("%s: Megatron steps it with %s (%s), the layout with %s" % (
                mine.name, type(inner).__name__, kind, want))
        if kind == "sgd" and not group.get("momentum"):
            raise Unsupported("%s: SGD without momentum (sgd_momentum=0) keeps no momentum_buffer, which the "
                              "layout holds for it" % mine.name)
        if mine.tensor not in self._states:
            self._states[mine.tensor] = self.view.layout.states_of(mine.tensor)
        states = {st: MOMENTS[st] for st in self._states[mine.tensor] if st in MOMENTS}
        if kind == "adam" and not any(i is inner and g is group for i, g in self.adam):
            self.adam.append((inner, group))
        self.pieces.setdefault(key, []).append(_Piece(p, main, lo, hi, at, inner, group, kind, states, host))

    def _range_pieces(self, opt):
        """A DistributedOptimizer's pieces: its range map's, each in the
        rank's ZeRO-1 shard of its bucket (vps's shard buffers are the
        buckets' shards one after the other)."""
        for g, buf in enumerate(opt.buffers):
            key = self._key_of(buf)
            if key is None:
                raise CheckFailed("rank %d: the optimizer's buffer %d is none of the model's" % (self.view.rank, g))
            self.sharding[key] = "range"
            (ranges,) = opt.gbuf_ranges[g].values()
            dp = buf.data_parallel_group.size()
            hybrid = _hybrid(opt)
            if hybrid is not None:
                sub_of = {id(q): (sub, grp) for sub in hybrid.sub_optimizers for grp in sub.param_groups
                          for q in grp["params"]}
            base, found = 0, []
            for bucket, rm in zip(buf.buckets, ranges):
                for p, r in rm["param_map"].items():
                    group_index, order = opt.model_param_group_index_map[p]
                    group = opt.optimizer.param_groups[group_index]
                    main, inner, host = group["params"][order], opt.optimizer, False
                    if hybrid is not None:
                        # its fp32 copy of the shard (on the host, or the GPU) and the sub-optimizer stepping it
                        host = main in hybrid.gpu_params_map_cpu_copy
                        main = hybrid.param_to_inner_param[main]
                        inner, group = sub_of[id(main)]
                    found.append((base + r["gbuf_local"].start, p, main, r["param"].start, r["param"].end,
                                  inner, group, host))
                base += bucket.grad_data.numel() // dp
            # vps's host buffer packs the offloaded pieces in shard order; the GPU one keeps the rest
            host_at = 0
            for at, p, main, lo, hi, inner, group, host in sorted(found, key=lambda f: f[0]):
                self._piece(p, main, lo, hi, host_at if host else at - host_at, inner, group, host)
                host_at += hi - lo if host else 0

    def _whole_pieces(self, opt):
        """A Float16OptimizerWithFloat16Params's pieces: whole parameters, at
        their offset in the buffer (zero=0), or, the layer-wise optimizer's
        with its state buffers sharded, in the rank's shard of their bucket,
        which must hold them whole."""
        if any(opt.fp32_from_fp32_groups):
            raise Unsupported("the %s steps fp32 parameters; vps lays out bf16 ones" % type(opt).__name__)
        for group, params, mains in zip(opt.optimizer.param_groups, opt.float16_groups, opt.fp32_from_float16_groups):
            for p, main in zip(params, mains):
                where = self.params.get(p)
                if where is None:
                    raise CheckFailed("rank %d: a parameter the %s steps is in no DDP buffer of the model"
                                      % (self.view.rank, type(opt).__name__))
                key, s, e, b, mine = where
                self.sharding.setdefault(key, "whole")
                at = s
                sb = self.view.buffer(MAIN_PARAM, *key)
                if key[2] and sb is not None and self.view.buffers[sb].sharded:
                    buf = self.ddp_buffers[key]
                    dp, d = buf.data_parallel_group.size(), buf.data_parallel_group.rank()
                    bk = buf.buckets[b]
                    size = bk.grad_data.numel() // dp
                    if not bk.offset + d * size <= s < e <= bk.offset + (d + 1) * size:
                        raise CheckFailed("%s: Megatron's layer-wise optimizer steps %s on this rank, outside the "
                                          "rank's shard of its bucket" % (self._where(key), mine.name))
                    at = sum(x.grad_data.numel() // dp for x in buf.buckets[:b]) + s - bk.offset - d * size
                self._piece(p, main, 0, e - s, at, opt.optimizer, group)

    def _check_states(self, key):
        """Every state buffer vps gives (chunk, expert, layerwise) has
        Megatron's size (the rank's shards of the buckets, or the whole
        buffer), and every region of a parameter in it lies inside the
        piece Megatron's optimizer keeps of that parameter, in a state that
        optimizer keeps (padding rows are in Megatron's pieces and in no
        region)."""
        w = self._where(key)
        buf = self.ddp_buffers[key]
        names = _unwrapped_names(self.model[key[0]])
        pieces = {names[pc.param]: pc for pc in self.pieces.get(key, [])}
        dp = buf.data_parallel_group.size()
        shard = sum(bk.grad_data.numel() // dp for bk in buf.buckets)
        for vb in self.view.buffers:
            if (vb.chunk, vb.expert, vb.layerwise) != key or vb.state in (PARAM, MODULE_BUFFER):
                continue
            st = vb.state
            if self.sharding.get(key) == "range" and not vb.sharded:
                raise Unsupported("%s: the layout's %s is whole (zero=0); Megatron's DistributedOptimizer "
                                  "shards it" % (w, STATES[st]))
            if self.sharding.get(key) == "whole" and vb.sharded and not vb.layerwise:
                raise Unsupported("%s: the layout's %s is sharded (zero=1); Megatron's Float16Optimizer keeps "
                                  "it whole (zero=0)" % (w, STATES[st]))
            want = shard if vb.sharded else buf.numel
            offloaded = sum(pc.hi - pc.lo for pc in pieces.values() if pc.host)
            if offloaded or vb.host:
                want = offloaded if vb.host else want - offloaded
            if vb.elements != want:
                raise CheckFailed("%s: %s %s of %d elements in the layout, %d in Megatron's" % (
                    w, STATES[st], "host part" if vb.host else "GPU part" if offloaded else "shard" if vb.sharded
                    else "buffer", vb.elements, want))
            for r in self.view.regions:
                if r.buffer != vb.id:
                    continue
                name = self.view.params[r.param].local_name
                pc = pieces.get(name)
                last = r.offset + sum((h - l - 1) * s for l, h, s in zip(r.lo, r.hi, r.strides))
                if pc is None or (st != MAIN_PARAM and st not in pc.states) or r.offset < pc.at \
                        or last >= pc.at + pc.hi - pc.lo or pc.host != vb.host:
                    raise CheckFailed("%s: %s of %s at %d..%d of the %s; Megatron's piece %s" % (
                        w, STATES[st], name, r.offset, last, "shard" if vb.sharded else "buffer",
                        "is absent" if pc is None else "has no %s (%s)" % (STATES[st], pc.kind)
                        if st != MAIN_PARAM and st not in pc.states else "is in %s memory" % (
                            "host" if pc.host else "GPU") if pc.host != vb.host
                        else "is %d..%d" % (pc.at, pc.at + pc.hi - pc.lo - 1)))
        for pc in pieces.values():
            for st in (MAIN_PARAM,) + tuple(pc.states):
                if self.view.buffer(st, *key) is None:
                    raise CheckFailed("%s: Megatron's %s keeps a %s of %s, the layout no such buffer" % (
                        w, pc.kind, STATES[st], names[pc.param]))

    @property
    def device(self):
        return next(iter(self.ddp_buffers.values())).grad_data.device

    # ---- Adam's step count ----
    def adam_step(self, every=True):
        """Adam's step count (the same for every parameter it steps), 0
        before its first step, None when Adam steps nothing here (SGD, Lion
        and Muon keep no count); with every=False, the count of the first
        parameter that has one (the pause's check)."""
        if not self.adam:
            return None
        steps = set()
        for inner, group in self.adam:
            for p in group["params"]:
                s = inner.state.get(p, {}).get("step", group.get("step"))
                if s is not None:
                    steps.add(int(s.item() if torch.is_tensor(s) else s))
                    if not every:
                        return steps.pop()
        if len(steps) > 1:
            raise CheckFailed("the optimizer's parameters have taken different numbers of steps: %s"
                              % sorted(steps))
        return steps.pop() if steps else 0

    # ---- the values, into vps's buffers (once, when a Job is made) ----
    def copy_into(self, buffers):
        """Megatron's values into vps's buffers: buffers[i] is the tensor of
        the view's buffer i."""
        def buffer(st, key, host=False):
            return buffers[self.view.buffer(st, *key, host=host)]
        with torch.no_grad():
            for key, buf in self.ddp_buffers.items():
                dst = buffer(PARAM, key)
                if buf.param_data is None:
                    # no parameter buffer (zero=0): the parameters are tensors of their own
                    for p, (start, end, _) in buf.param_index_map.items():
                        dst[start:end] = p.detach().view(-1)
                elif dst.data_ptr() != buf.param_data.data_ptr():
                    dst.copy_(buf.param_data)
            for t, p in self.module_buffers:
                buffer(MODULE_BUFFER, (p.chunk, False, False))[p.offset:p.offset + p.elements] = t.detach().view(-1)
            for key, pieces in self.pieces.items():
                for pc in pieces:
                    n = pc.hi - pc.lo
                    buffer(MAIN_PARAM, key, pc.host)[pc.at:pc.at + n] = pc.main.detach().view(-1)
                    have = pc.inner.state.get(pc.main, {})
                    # the hybrid optimizer files its fp32 copy in its sub-optimizers' states as master_param
                    extra = sorted(k for k, v in have.items() if torch.is_tensor(v) and v.dim() and
                                   k not in pc.states.values() and v is not pc.main)
                    if extra:
                        raise Unsupported("%s keeps %s of %s, which the layout does not hold" % (
                            type(pc.inner).__name__, ", ".join(extra), self.params[pc.param][4].name))
                    for st, name in pc.states.items():
                        v = have.get(name)
                        buffer(st, key, pc.host)[pc.at:pc.at + n] = 0 if v is None else v.detach().view(-1)

    # ---- Megatron's tensors as views of vps's buffers ----
    def point(self, state):
        """Point every Megatron tensor that holds moved state at its part of
        state's buffers, and give Adam a step count (start() sets it)."""
        with torch.no_grad():
            for key, buf in self.ddp_buffers.items():
                flat = state.buffer(PARAM, *key)
                if buf.param_data is not None:
                    if buf.param_data is not flat:
                        self._set(buf, "param_data", flat)
                    for bucket in buf.buckets:
                        n = bucket.grad_data.numel()
                        self._set(bucket, "param_data", flat[bucket.offset:bucket.offset + n])
                for p, (start, end, _) in buf.param_index_map.items():
                    self._data(p, flat[start:end].view(p.shape))
                self.grads.append(buf)
            for groups in self._bucket_groups():
                for g in groups:
                    # its cached shards are views of the buffers before
                    g.cached_param_buffer_shard_list = [None] * len(g.buckets)
                    g.cached_grad_buffer_shard_list = [None] * len(g.buckets)
            for t, p in self.module_buffers:
                flat = state.buffer(MODULE_BUFFER, p.chunk, False)
                self._data(t, flat[p.offset:p.offset + p.elements].view(p.shape))
            for key, pieces in self.pieces.items():
                flats = {(st, host): state.buffer(st, *key, host=host) for st in (MAIN_PARAM,) + tuple(MOMENTS)
                         for host in (False, True) if self.view.buffer(st, *key, host=host) is not None}
                for pc in pieces:
                    a, n = pc.at, pc.hi - pc.lo
                    self._data(pc.main, flats[MAIN_PARAM, pc.host][a:a + n].view(pc.main.shape))
                    self._hand_states(pc, {name: flats[st, pc.host][a:a + n].view(pc.main.shape)
                                           for st, name in pc.states.items()})
            for (dtype, dev), states in self.step_slots.items():
                # every parameter's step an element of one tensor: the pause sets them with one fill
                steps = torch.zeros(len(states), dtype=dtype, device=dev)
                self.steps.append(steps)
                for i, st in enumerate(states):
                    st["step"] = steps[i]
            self.step_slots = {}
            from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
            for o in self.opts:
                if not isinstance(o, DistributedOptimizer):
                    continue
                if _hybrid(o) is not None:
                    # the hybrid optimizer's own view of its sub-optimizers' states, which it makes
                    # after each step (Megatron's checkpoints read it)
                    _hybrid(o)._sync_sub_optimizers_state_to_hdo()
                # the model parameters' shards Megatron sliced when it was built
                for groups, model_groups in ((o.shard_float16_groups, o.model_float16_groups),
                                             (o.shard_fp32_groups, o.model_fp32_groups)):
                    for shards, params in zip(groups, model_groups):
                        for i, (shard, p) in enumerate(zip(shards, params)):
                            r = o._get_model_param_range_map(p)["param"]
                            if shard is not None:
                                self._data(shard, p.detach().view(-1)[r.start:r.end])

    def start(self, step, grads=()):
        """What the pause gives a job pointed at its buffers: Adam's step
        count (none without Adam), and memory to the gradient buffers the
        skeleton left without (grads: (tensor, bytes)), zeroed."""
        with _plain():
            self._start(step, grads)

    def _start(self, step, grads):
        if step is not None:
            for t in self.steps:
                t.fill_(step)
            for group in self.step_groups:
                group["step"] = step
        for g, nbytes in grads:
            g.untyped_storage().resize_(nbytes)
            g.zero_()

    def _bucket_groups(self):
        for chunk in self.model:
            yield getattr(chunk, "bucket_groups", [])
            yield getattr(chunk, "expert_parallel_bucket_groups", [])
        for o in self.opts:
            for groups in getattr(o, "per_model_bucket_groups", {}).values():
                yield groups

    def _hand_states(self, pc, views):
        """The optimizer's states of a piece's main parameter become the
        views: the optimizer finds them as if it had made them (Adam, Lion,
        Muon and SGD with momentum make them at their first step, when they
        have none) and updates them in place."""
        st = pc.inner.state[pc.main]
        st.update(views)
        if pc.kind == "adam":
            if isinstance(pc.inner, (torch.optim.Adam, torch.optim.AdamW)):
                # torch keeps the step per parameter, a float of the default dtype's width, on the
                # host unless capturable or fused; point() makes them one tensor's elements
                dev = torch.device(pc.main.device if pc.group.get("capturable") or pc.group.get("fused") else "cpu")
                dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                self.step_slots.setdefault((dtype, dev), []).append(st)
            elif not any(g is pc.group for g in self.step_groups):
                # Apex's and TransformerEngine's FusedAdam keep it per group
                self.step_groups.append(pc.group)
        self.handed.append((st, None))

    def _set(self, obj, attr, tensor):
        setattr(obj, attr, tensor)
        self.handed.append((obj, attr))

    def _data(self, t, view):
        if t.is_meta:
            _materialize(t, view)
        else:
            _set_data(t, view)
        self.handed.append((t, "data"))

    def release(self):
        """Empty every Megatron tensor handed a part of vps's buffers (they
        are about to be freed: host memory is unmapped), and the gradient
        buffers, whose memory goes back at once (their storage emptied,
        whatever else still holds a view of it)."""
        with _plain():
            self._release()

    def _release(self):
        empty = {}

        def nothing(t):
            key = (t.dtype, t.device)
            if key not in empty:
                empty[key] = torch.empty(0, dtype=t.dtype, device=t.device)
            return empty[key]
        for obj, attr in self.handed:
            if attr is None:
                obj.clear()
            elif attr == "data":
                _set_data(obj, nothing(obj))
                obj.grad = None
            else:
                setattr(obj, attr, nothing(getattr(obj, attr)))
        for buf in self.grads:
            g = buf.grad_data
            if g is None or g.is_meta:
                continue
            for bucket in buf.buckets:
                bucket.grad_data = nothing(g)
            for p in buf.param_index_map:
                p.main_grad = nothing(g)
            buf.grad_data = nothing(g)
            g.untyped_storage().resize_(0)
        for groups in self._bucket_groups():
            for bg in groups:
                bg.cached_grad_buffer_shard_list = [None] * len(bg.buckets)
        self.handed, self.grads, self.steps, self.step_groups = [], [], [], []

    def free_grads(self):
        """Give the gradient buffers' memory back at once (their storage
        emptied: release() drops Megatron's views of it). Returns what
        start(None, freed) gives back, zeroed."""
        freed = []
        with _plain():
            for buf in self.grads:
                g = buf.grad_data
                if g is not None and not g.is_meta:
                    storage = g.untyped_storage()
                    if storage.nbytes():
                        freed.append((g, storage.nbytes()))
                        storage.resize_(0)
        return freed

    def sync_params(self):
        """Finish the parameter all-gather of the last optimizer step where
        DDP defers it to the next forward (overlap_param_gather): until
        then the bf16 parameters outside this rank's shard are stale."""
        for chunk in self.model:
            if chunk.ddp_config.overlap_param_gather:
                chunk.start_param_sync(force_sync=True)


def _let_go(bind, state):
    """Empty the objects of the configuration before a switch and free its
    buffers (which the registry no longer holds)."""
    bind.release()
    state.free()


class _After:
    """A thread of the Job's that does what can wait until the job trains
    again (_let_go), one piece of work at a time; wait() waits for it to be
    done and raises what it raised. Started once: starting a thread waits
    for it to run, which on a busy machine is a wait in the pause."""

    def __init__(self):
        self._work = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._error = []
        self._thread = threading.Thread(target=self._run, args=(self._work, self._idle, self._error),
                                        name="vps.megatron", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(work, idle, error):
        while True:
            item = work.get()
            if item is None:
                return
            try:
                item[0](*item[1:])
            except BaseException as e:  # raised by wait(), in the Job's next call
                error.append(e)
            finally:
                idle.set()

    def give(self, fn, *args):
        self._idle.clear()
        self._work.put((fn,) + args)

    def wait(self):
        self._idle.wait()
        if self._error:
            raise self._error.pop()

    def stop(self):
        self._work.put(None)
        self._thread.join()


class _Next:
    """A configuration Job.prepare made ready: its State (registered as the
    switch's target), build's objects pointed into it, its process groups'
    and random-number states, the gradient buffers to give memory, and how
    long each part took."""
    __slots__ = ("layout", "rank", "target", "bind", "groups", "entry", "rng", "grads", "seconds")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class _HandOver:
    """What a switch to a prepared configuration hands the job, done while
    the executors move the state (vps.switch calls it once the request is
    made): the gradients' memory before given back, then the next
    configuration's process groups and random-number states installed and
    its gradient buffers given memory, with Adam's step. None of it is
    state vps moves, and none of it waits for the transfer: on a GPU the
    host does it beside the copies, and on a machine whose ranks call the
    switch apart, the early ones do it while they wait for the last. A
    switch that fails gets the job's own back (undo); a hand-over that
    fails is undone and made again after the transfer (finish)."""

    def __init__(self, bind, nxt, step, clocks):
        self.bind, self.nxt, self.step, self.clocks = bind, nxt, step, clocks
        self.freed = self.running = None
        self.done = False

    def __call__(self):
        if self.nxt is None:
            return
        t = time.monotonic()
        try:
            self._hand()
        except Exception:  # made again in the pause, where a failure is the switch's
            self.undo()
        self.clocks["meanwhile"] = time.monotonic() - t

    def _hand(self):
        self.freed = self.bind.free_grads()
        self.running = _snapshot(), _rng_state()
        _install(self.nxt.groups)
        _set_rng_state(self.nxt.rng)
        self.nxt.bind.start(self.step, self.nxt.grads)
        self.done = True

    def undo(self):
        if self.running is not None:
            _install(self.running[0])
            _set_rng_state(self.running[1])
            self.running = None
        if self.done:
            self.nxt.bind.free_grads()
            self.done = False
        if self.freed:
            self.bind.start(None, self.freed)
            self.freed = None

    def finish(self, step):
        """After the transfer: what the hand-over left, with the step the
        switch carried (source rank 0's: the same as the job's, unless it
        failed its check)."""
        if not self.done:
            self._hand()
        elif step != self.step:
            self.nxt.bind.start(step)


class Job:
    """A rank of a Megatron-Core job, its state in vps's buffers.

    Job(registry, layout, rank, model, optimizer): model is the list of
    DDP-wrapped model chunks and optimizer Megatron's optimizer (what
    get_megatron_optimizer returns: a DistributedOptimizer, a
    Float16Optimizer, the layer-wise distributed optimizer, or a
    ChainedOptimizer of them), built for `layout`. Megatron's parameter
    buffers, main parameters, optimizer states and moved module buffers
    become views of vps's buffers, registered with `registry` (see the
    module's text for where each lives). The layout is checked against what
    Megatron built: every parameter's name, shape and offset, every
    buffer's size, the optimizer that steps each parameter, every piece of
    it the optimizer keeps on this rank and its states; vps.CheckFailed
    names the first that differs, vps.Unsupported what vps.megatron does
    not move.

    Job.clocks is what the last switch took (see switch)."""

    def __init__(self, registry: Registry, layout: Layout, rank: int, model: List[torch.nn.Module],
                 optimizer) -> None:
        self.registry, self.layout, self.rank = registry, layout, rank
        bind = _Binding(layout.rank(rank), model, optimizer)
        step = bind.adam_step()
        if bind.device.type == "cuda":
            # DDP's parameter buffers as they are (zero=0 has none: the parameters are gathered too);
            # the optimizer's pieces gathered into flat buffers
            ddp = [bind.ddp_buffers[(b.chunk, b.expert, b.layerwise)] if b.state == PARAM else None
                   for b in bind.view.buffers]
            # the layout's host buffers (offload=F) are shared memory adopt makes
            tensors = {i: d.param_data if d is not None and d.param_data is not None else
                       torch.zeros(b.elements, dtype=_state.TORCH_DTYPE[b.dtype], device=bind.device)
                       for i, (b, d) in enumerate(zip(bind.view.buffers, ddp)) if not b.host}
            state = _state.State.adopt(registry, layout, rank, tensors)
            bind.copy_into(state.buffers)
        else:
            state = _state.State.allocate(registry, layout, rank)
            bind.copy_into(state.buffers)
        bind.point(state)
        bind.start(step)
        self.state, self._bind = state, bind
        self.model, self.optimizer = bind.model, optimizer
        self._groups = _installed()
        self._next = None
        self.clocks = None
        self._after = _After()
        _jobs.add(self)

    @property
    def step(self) -> Optional[int]:
        """Adam's step count, which a switch carries as Training.step (and
        gives Adam after it); None when Adam steps nothing on this rank:
        SGD, Lion and Muon keep no count."""
        return self._bind.adam_step()

    @property
    def prepared(self) -> Optional[Tuple[Layout, int]]:
        """The (layout, rank) Job.prepare made ready, or None."""
        return (self._next.layout, self._next.rank) if self._next else None

    def _held_groups(self):
        return [g for g in (self._groups, self._next.entry if self._next else None) if g is not None]

    def prepare(self, layout: Layout, rank: int, build: Callable[[Layout], Tuple]) -> None:
        """Make rank `rank` of `layout` ready while the job trains, so that
        the switch to it pauses for the transfer and the hand-over only:
        allocate and register its buffers (vps-exec maps them before the
        request), and call build(layout) under the skeleton (see the
        module's text) with the job's process groups and random-number
        states put aside: build makes the configuration's groups
        (vps.megatron.initialize_groups(layout), cached), its model chunks,
        DDP and optimizer with Megatron's constructors, as for the Job, and
        they are pointed into those buffers. The job goes on training on
        its own objects and groups until Job.switch(layout, rank, ...).

        Every rank calls it at the same point of its loop (process groups
        are made by all ranks together). What it holds until the switch is
        the configuration's moved state, which the switch needs anyway; a
        configuration prepared before is discarded (Job.discard)."""
        self._live()
        if rank < 0:
            raise InvalidInput("rank %d: a leaving device has nothing to prepare" % rank)
        self.discard()
        seconds = {}
        t = time.monotonic()
        target = _state.State.allocate(self.registry, layout, rank, TARGET, self.state.device)
        try:
            self.registry.set_target(layout, rank)
            seconds["target"] = time.monotonic() - t
            targets = {(b.chunk, b.expert, b.layerwise): target.buffers[b.id] for b in target.view.buffers
                       if b.state == PARAM}
            running, rng = _snapshot(), _rng_state()
            groups_before, t = _groups_seconds[0], time.monotonic()
            try:
                _install(_pristine())
                with _skeleton(targets, target.device) as sk:
                    model, optimizer = build(layout)
                nxt_groups, nxt_rng = _snapshot(), _rng_state()
            finally:
                _install(running)
                _set_rng_state(rng)
            seconds["groups"] = _groups_seconds[0] - groups_before
            seconds["build"] = time.monotonic() - t - seconds["groups"]
            t = time.monotonic()
            bind = _Binding(target.view, model, optimizer)
            if not _same_device(bind.device, target.device):
                raise InvalidInput("build made the model on %s, the job's buffers are on %s" % (
                    bind.device, target.device))
            bind.point(target)
            left = _meta_left(bind.model, optimizer)
            if left:
                bind.release()
                raise CheckFailed("%s is on the meta device after build: Megatron made it in a way the "
                                  "skeleton does not know, and vps does not move it" % left)
            entry = next((g for g in reversed(_cache.values()) if _same(g.values, nxt_groups)), None)
            seconds["attach"] = time.monotonic() - t
        except BaseException:
            _state.withdraw(self.registry, self.state, target)
            raise
        self._next = _Next(layout=layout, rank=rank, target=target, bind=bind, groups=nxt_groups, entry=entry,
                           rng=nxt_rng, grads=sk.grads, seconds=seconds)

    @contextlib.contextmanager
    def prepared_groups(self):
        """A block run as the configuration Job.prepare made ready: its
        process groups and random-number states installed, the job's own
        again after it; what the block draws from the random-number
        generators stays drawn for the switch. For what else the next
        configuration needs made with its groups before the switch (its
        data sets, as vps.megatron_training builds them). Every rank enters
        it at the same point of its loop, as for prepare."""
        self._live()
        nxt = self._next
        if nxt is None:
            raise InvalidInput("no configuration is prepared (Job.prepare)")
        running, rng = _snapshot(), _rng_state()
        _install(nxt.groups)
        _set_rng_state(nxt.rng)
        try:
            yield
            nxt.rng = _rng_state()
        finally:
            _install(running)
            _set_rng_state(rng)

    def discard(self) -> None:
        """Forget the configuration Job.prepare made ready, if any: its
        buffers are freed (its process groups stay cached)."""
        self._after.wait()
        nxt, self._next = self._next, None
        if nxt is not None:
            _state.withdraw(self.registry, self.state, nxt.target, nxt.bind)

    @_state.paused_gc()
    def switch(self, layout: Layout, rank: int, training: Training, build: Optional[Callable[[Layout], Tuple]] = None,
               *, timeout: float = 600.0) -> Tuple[Optional[list], object, Optional[Training]]:
        """Move the job to `rank` of `layout` between two steps, and return
        (model, optimizer, carried): the objects Job.prepare(layout, rank,
        build) made, handed the buffers the switch filled (without a
        prepare, build is given and the Job prepares in the pause), and
        carried, the vps.Training of source rank 0. training.step must be
        Adam's step count where Adam steps parameters (Megatron's iteration,
        when no step was skipped; Job.step). The model and optimizer before are emptied. For a leaving
        device (rank -1): (None, None, carried).

        Job.clocks then holds the switch's clocks: called, requested,
        done (the executors' done seen), freed (the buffers before freed),
        switched (vps's switch returned) and returned (time.time() wall
        clocks, to set beside vps-exec's report), the seconds of the pause
        spent making process groups (groups), in build (build) and handing
        over (attach: the objects before emptied, the next ones started);
        meanwhile, the seconds of the hand-over done while the executors
        moved the state (the gradients' memory before given back, the next
        configuration's groups, random-number states, gradient memory and
        Adam's step); ahead, what Job.prepare took before the pause
        (target, groups, build, attach).

        When the executors fail the switch, vps.Error is raised and the job
        goes on as it was (see vps.switch; a prepared configuration is
        discarded); timeout is vps.switch's."""
        clocks = {"called": time.time(), "groups": 0.0, "build": 0.0, "attach": 0.0, "meanwhile": 0.0,
                  "ahead": None}
        self._live()
        step = self._bind.adam_step(every=False)
        if step is not None and training.step != step:
            raise InvalidInput("training.step is %d, the optimizer has taken %d steps: vps carries one "
                               "count, Adam's bias correction and the iteration" % (training.step, step))
        nxt = self._next
        if nxt is not None and (nxt.layout.hash, nxt.rank) != (layout.hash, rank):
            self.discard()
            nxt = None
        if rank >= 0 and nxt is None:
            if build is None:
                raise InvalidInput("rank %d of %s was not prepared (Job.prepare), and no build was given" % (
                    rank, layout.describe()))
            self.prepare(layout, rank, build)
            nxt = self._next
            clocks.update({k: nxt.seconds[k] for k in ("groups", "build")})
            clocks["attach"] = nxt.seconds["attach"] + nxt.seconds["target"]
        elif nxt is not None:
            clocks["ahead"] = dict(nxt.seconds)
        self._bind.sync_params()
        hand = _HandOver(self._bind, nxt, training.step, clocks)
        try:
            new, carried = _state.switch(self.registry, self.state, layout, rank, training=training,
                                         timeout=timeout, target=nxt.target if nxt else None, clocks=clocks,
                                         free=False, meanwhile=hand)
        except BaseException:
            hand.undo()
            if nxt is not None and nxt.target.closed:
                # the switch failed and freed the target: the job runs its state again
                nxt.bind.release()
                self._next = None
            raise
        clocks["switched"] = time.time()
        t = time.monotonic()
        old_bind, old_state = self._bind, self.state
        self.model = self.optimizer = self._bind = self._next = None
        self.layout, self.rank, self.state = layout, rank, new
        if new is None:
            old_bind.free_grads()
            self._groups = None
            _let_go(old_bind, old_state)
            clocks["attach"] += time.monotonic() - t
            clocks["returned"] = time.time()
            self.clocks = clocks
            return None, None, carried
        hand.finish(carried.step)
        self._groups = nxt.entry
        self._bind, self.model, self.optimizer = nxt.bind, nxt.bind.model, nxt.bind.optimizer
        # what the configuration before held goes once the job trains again
        self._after.give(_let_go, old_bind, old_state)
        clocks["attach"] += time.monotonic() - t
        clocks["returned"] = time.time()
        self.clocks = clocks
        return self.model, self.optimizer, carried

    def attach(self, model: List[torch.nn.Module], optimizer, step: int) -> None:
        """Hand Megatron's model chunks and optimizer, built for the job's
        layout with their own memory, the job's buffers as they are (no
        copy), with Adam at `step` (the job's objects must be emptied
        first: they hold the same buffers)."""
        self._live()
        if self._bind is not None:
            self._bind.release()
        bind = _Binding(self.state.view, model, optimizer)
        if not _same_device(bind.device, self.state.device):
            raise InvalidInput("the model is on %s, the job's buffers on %s" % (bind.device, self.state.device))
        bind.point(self.state)
        bind.start(step)
        self._bind, self.model, self.optimizer = bind, bind.model, optimizer
        self._groups = _installed()

    def _live(self):
        self._after.wait()
        if self.state is None:
            raise InvalidInput("the job is closed, or left the job (rank -1)")

    def close(self) -> None:
        """Empty Megatron's tensors and free the buffers (the registry still
        has to be closed)."""
        self._after.wait()
        if self.state is not None:
            self.discard()
        if self._bind:
            self._bind.release()
        if self.state:
            self.registry.reset(None, -1)
            self.state.free()
        self._bind = self.state = self.model = self.optimizer = self._groups = None
        self._after.stop()
        _jobs.discard(self)
