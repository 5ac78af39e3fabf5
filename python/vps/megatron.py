"""A Megatron-Core job made switchable.

Megatron-Core keeps a rank's training state in its own objects: each model
chunk's DistributedDataParallel holds the bf16 parameters in one flat buffer
per (chunk, dense or expert), and the DistributedOptimizer holds an fp32
main parameter and Adam's two moments per piece of parameter that the rank's
ZeRO-1 shard covers. vps lays out the same state as flat buffers of the
same order (tests/megatron checks every rank against Megatron-Core's own
code), so a Job points Megatron's tensors into vps's buffers and the switch
moves them:

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
fp32 main parameters, exp_avg and exp_avg_sq, and the modules' buffers that
are training state (the routers' expert_bias); gradients are rebuilt by
the next step and stay Megatron's. What is carried: the training scalars
(vps.Training), of which `step` is also Adam's step count.

The pause holds the transfer and the hand-over. Job.prepare does the rest
while the job trains: it allocates and registers the next configuration's
buffers (vps-exec maps them before the request), makes or takes from the
cache the next configuration's process groups, and calls build under a
skeleton (below): Megatron's constructors make the model chunks, DDP and
the optimizer without initialising a weight or allocating a state buffer,
and their tensors are pointed into the buffers the switch will fill. The
switch then moves the state, installs the next configuration's groups and
random-number states, gives Adam its step and the gradient buffers their
memory, and returns build's objects. Job.switch without a prepare does it
all in the pause (build given).

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
and evicts in the same order, since every rank makes the same calls.
Groups on NCCL are connected when made (an all-reduce on each, in the
order they were made), so that their communicators are not made in the
first step after the switch.

The skeleton (while build runs in Job.prepare): tensors allocated without
a device, parameters as they are registered, and the copies of parameters
the DistributedOptimizer makes for its main parameters are on the meta
device; DDP's parameter buffer is the next State's, and its gradient buffer
is given memory only in the pause (after the old one is freed). What
prepare holds until the switch is the next State (the state the switch
moves, on this rank in the next layout), Megatron's small tensors (its
scalars, the routers' token counts) and the largest parameter's bytes for
a moment; a tensor the skeleton left on the meta device is refused with
vps.CheckFailed, naming it.

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

Supported: the DistributedOptimizer (ZeRO-1, zero=1 in vps's terms) over
torch's Adam/AdamW (tests/megatron/check_switch.py trains with it on the
CPU) or a fused Adam that keeps exp_avg and exp_avg_sq per parameter and
its step per group (Apex's, TransformerEngine's: GPU only, not exercised
by the tests here), bf16 parameters with fp32 main parameters, dense and
expert buffers, the routers' expert_bias, any number of model chunks
(VPP). Not supported, and refused with vps.Error: Megatron's
Float16Optimizer (zero=0), the precision-aware optimizer (moments and
master weights kept by TransformerEngine's FusedAdam), optimizer state
offloaded to the host (optimizer_cpu_offload), parameters of other dtypes,
layouts that move gradients (grad=1).

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
from .layout import BF16, DTYPES, EXP_AVG, EXP_AVG_SQ, FP32, MAIN_PARAM, MODULE_BUFFER, PARAM, STATES, Layout
from .registry import SOURCE, TARGET, Registry, Training

torch = import_torch("vps.megatron")
from torch.overrides import TorchFunctionMode  # noqa: E402
from . import state as _state  # noqa: E402 (needs torch)

__all__ = ["initialize_groups", "cached_configurations", "CACHED_CONFIGURATIONS", "distributed_optimizers", "Job",
           "MOMENTS"]

# the optimizer's name for each moment vps moves
MOMENTS = {EXP_AVG: "exp_avg", EXP_AVG_SQ: "exp_avg_sq"}

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
_counts = collections.Counter()  # made, reused, evicted


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
    in cached_configurations.counts how many were made, reused and evicted
    so far."""
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
    - in DDP's buffer (_ParamAndGradBuffer.__init__): the parameters made
      real first (DDP points them into its buffer, which a meta tensor
      cannot be pointed at), as views of one placeholder the size of the
      largest, never read; its parameter buffer the next State's buffer of
      that chunk; its gradient buffer given memory for the views DDP makes
      of it, then none until the switch (Job.switch gives it back);
    - in the DistributedOptimizer's constructor, the copies of parameters it
      makes for its main parameters on the meta device (Job.prepare points
      them into the next State)."""

    def __init__(self, targets, device):
        super().__init__()
        self.targets = targets  # [(chunk, expert, tensor)]: the next State's parameter buffers, in the view's order
        self.device = device
        self.target_storages = {_storage(t) for _, _, t in targets}
        self.used = set()
        self.chunk = -1
        self.window = None  # inside a DDP buffer's constructor: its parameter buffer, gradient, placeholders
        self.optimizer = 0  # inside the DistributedOptimizer's constructor
        self.grads = []  # (tensor, nbytes): the gradient buffers to give memory in the pause

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALLOCATE:
            if self.window is not None and func is torch.zeros:
                return self._ddp_zeros(args, kwargs)
            if kwargs.get("device") is None:
                kwargs["device"] = META
        elif func is torch.Tensor.clone and self.optimizer and _storage(args[0]) in self.target_storages:
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
        if w["param"] is None and dtype == torch.bfloat16:
            t = self._target(w["expert"], n)
            if t is not None:
                w["param"] = t
                return t
        t = torch.empty(n, dtype=dtype, device=self.device)
        w["made"].append(t)
        return t

    def _target(self, expert, n):
        """The next State's parameter buffer for the DDP buffer being made:
        DDP makes a chunk's dense buffer, then its expert one, chunk after
        chunk. None where the sizes differ: DDP makes its own, and the Job's
        check says how it differs."""
        for i, (chunk, exp, t) in enumerate(self.targets):
            if i in self.used or exp != expert or (expert and chunk != self.chunk) or (not expert and chunk <= self.chunk):
                continue
            if t.numel() != n:
                return None
            self.used.add(i)
            if not expert:
                self.chunk = chunk
            return t
        return None

    def ddp_buffer(self, init):
        def __init__(buf, ddp_config, param_dtype, grad_dtype, params_with_names, *args, **kwargs):
            params = [p for p, _ in params_with_names]
            self.window = w = {"expert": bool(params) and not getattr(params[0], "allreduce", True), "param": None,
                               "made": [], "scratch": set()}
            try:
                meta = [p for p in params if p.is_meta]
                if meta:
                    scratch = torch.empty(max(p.numel() for p in meta), dtype=param_dtype, device=self.device)
                    w["scratch"].add(_storage(scratch))
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
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    mode = _Skeleton(targets, device)
    inits = [(pgb._ParamAndGradBuffer, pgb._ParamAndGradBuffer.__init__, mode.ddp_buffer),
             (DistributedOptimizer, DistributedOptimizer.__init__, mode.optimizer_init)]
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
        elif type(obj).__module__.startswith(("megatron.", "torch.nn", "torch.optim")) and hasattr(obj, "__dict__"):
            stack.extend(("%s.%s" % (path, k), v) for k, v in vars(obj).items()
                         if not k.startswith("_forward") and not k.startswith("_backward"))
    return None


def distributed_optimizers(optimizer) -> list:
    """The DistributedOptimizers in Megatron's optimizer (a ChainedOptimizer
    holds one for the dense parameters and one for the experts')."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    opts = list(getattr(optimizer, "chained_optimizers", None) or [optimizer])
    for o in opts:
        if not isinstance(o, DistributedOptimizer):
            raise Unsupported("%s: vps moves the DistributedOptimizer's state (ZeRO-1, "
                              "use_distributed_optimizer=True) only" % type(o).__name__)
        if o.config.use_precision_aware_optimizer:
            raise Unsupported("the precision-aware optimizer keeps its moments and master "
                              "weights inside TransformerEngine's FusedAdam, where vps cannot point them")
        if getattr(o.config, "optimizer_cpu_offload", False):
            raise Unsupported("optimizer_cpu_offload: the HybridDeviceOptimizer keeps its own host copies of the "
                              "main parameters and their moments, which vps.megatron does not point into vps's "
                              "buffers yet (vps-exec moves host and GPU memory in one switch over ipc)")
    return [o for o in opts if not o.is_stub_optimizer]


def _inner(chunk):
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _unwrapped_names(chunk):
    """Parameter -> its name inside the innermost module (GPTModel), which
    is the name vps's view gives as local_name."""
    return {p: n for n, p in _inner(chunk).named_parameters()}


class _Piece:
    """One parameter's share of the optimizer state on this rank: its range
    in the flattened parameter and where it starts in vps's sharded
    buffers."""
    __slots__ = ("param", "main", "lo", "hi", "at")

    def __init__(self, param, main, lo, hi, at):
        self.param, self.main, self.lo, self.hi, self.at = param, main, lo, hi, at


class _Binding:
    """Which Megatron tensor is which part of which vps buffer, on one rank:
    computed from Megatron's objects (DDP's param_index_map, the
    distributed optimizer's range maps) and checked against vps's view."""

    def __init__(self, view, model, optimizer):
        self.view = view
        self.model = list(model)
        self.optimizer = optimizer
        self.opts = distributed_optimizers(optimizer)
        self.handed, self.grads = [], []
        self.steps, self.step_slots, self.step_groups = [], {}, []
        for b in view.buffers:
            if b.state not in (PARAM, MAIN_PARAM, EXP_AVG, EXP_AVG_SQ, MODULE_BUFFER):
                raise Unsupported("the layout moves %s buffers (chunk %d); vps.megatron moves parameters, "
                                  "main parameters, Adam's moments and module buffers" % (STATES[b.state], b.chunk))
            if b.layerwise or b.dtype != (BF16 if b.state == PARAM else FP32):
                raise Unsupported("the layout's %s buffer of chunk %d is %s; vps.megatron binds the "
                                  "DistributedOptimizer's Adam in fp32 (optimizer=adam, no precision_aware)"
                                  % (STATES[b.state], b.chunk, "the layer-wise optimizer's" if b.layerwise
                                     else DTYPES[b.dtype]))
        if len(self.model) != 1 + max([b.chunk for b in view.buffers] + [0]):
            raise CheckFailed("%d model chunks; the layout has %d on rank %d" % (
                len(self.model), 1 + max(b.chunk for b in view.buffers), view.rank))
        self.ddp_buffers = {}  # (chunk, expert) -> Megatron's _ParamAndGradBuffer
        for c, chunk in enumerate(self.model):
            names = _unwrapped_names(chunk)
            for expert, bufs in ((False, chunk.buffers), (True, chunk.expert_parallel_buffers)):
                if not bufs:
                    continue
                if len(bufs) != 1:
                    raise Unsupported("chunk %d holds %d %s buffers (parameters of several "
                                      "dtypes); vps lays out one" % (c, len(bufs), "expert" if expert else "dense"))
                self._check_params(c, expert, bufs[0], names)
                self.ddp_buffers[(c, expert)] = bufs[0]
        for b in view.buffers:
            if b.state == PARAM and (b.chunk, b.expert) not in self.ddp_buffers:
                raise CheckFailed("rank %d chunk %d: the layout has a %s buffer, Megatron none" % (
                    view.rank, b.chunk, "expert" if b.expert else "dense"))
        self.module_buffers = self._module_buffers()
        self.pieces = {}  # (chunk, expert) -> [_Piece]
        self.shard_elements = {}  # (chunk, expert) -> the rank's ZeRO-1 shard of the buffer
        for o in self.opts:
            self._optimizer_pieces(o)
        for key in self.ddp_buffers:
            self._check_shards(key)

    def _where(self, chunk, expert):
        return "rank %d chunk %d %s buffer" % (self.view.rank, chunk, "expert" if expert else "dense")

    def _check_params(self, c, expert, buf, names):
        w = self._where(c, expert)
        if buf.param_data is None:
            raise Unsupported("%s: no param_data (DDP keeps one only for the distributed "
                              "optimizer)" % w)
        if buf.param_dtype != torch.bfloat16:
            raise Unsupported("%s: %s parameters; vps lays out bf16" % (w, buf.param_dtype))
        ours = {p.local_name: p for p in self.view.params
                if p.chunk == c and p.expert == expert and not p.module_buffer}
        pb = self.view.buffers[self.view.buffer(PARAM, c, expert)]
        if buf.param_data.numel() != pb.elements:
            raise CheckFailed("%s: Megatron's has %d elements, the layout's %d" % (
                w, buf.param_data.numel(), pb.elements))
        for p, (start, end, _) in buf.param_index_map.items():
            name = names.get(p, "?")
            mine = ours.pop(name, None)
            if mine is None:
                raise CheckFailed("%s: Megatron's parameter %s is not in the layout" % (w, name))
            if (start, end - start) != (mine.offset, mine.elements) or tuple(p.shape) != tuple(mine.shape):
                raise CheckFailed("%s: %s %s at %d (%d elements) in Megatron's buffer, %s at %d (%d) in "
                                  "the layout" % (w, name, list(p.shape), start, end - start, list(mine.shape),
                                            mine.offset, mine.elements))
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

    def _optimizer_pieces(self, opt):
        for g, buf in enumerate(opt.buffers):
            chunk = opt.gbuf_idx_to_model_idx_map[g]
            expert = any(buf is b for b in self.model[chunk].expert_parallel_buffers)
            if self.ddp_buffers.get((chunk, expert)) is not buf:
                raise CheckFailed("%s: the optimizer's buffer %d is not the model's" % (
                    self._where(chunk, expert), g))
            (ranges,) = opt.gbuf_ranges[g].values()
            dp = buf.data_parallel_group.size()
            base, pieces = 0, self.pieces.setdefault((chunk, expert), [])
            for bucket, rm in zip(buf.buckets, ranges):
                for p, r in rm["param_map"].items():
                    pieces.append(_Piece(p, opt._get_main_param_and_optimizer_states(p)["param"],
                                         r["param"].start, r["param"].end, base + r["gbuf_local"].start))
                base += bucket.grad_data.numel() // dp
            self.shard_elements[(chunk, expert)] = base

    def _check_shards(self, key):
        """Every region vps gives a parameter in the sharded states lies
        inside the piece Megatron's range map gives it (padding rows are in
        Megatron's pieces and in no region)."""
        chunk, expert = key
        w = self._where(chunk, expert)
        by_param = {p.local_name: p for p in self.view.params if p.chunk == chunk and p.expert == expert}
        names = _unwrapped_names(self.model[chunk])
        pieces = {names[pc.param]: pc for pc in self.pieces.get(key, [])}
        for st in (MAIN_PARAM,) + tuple(MOMENTS):
            b = self.view.buffer(st, chunk, expert)
            vb = self.view.buffers[b]
            if not vb.sharded:
                raise Unsupported("%s: the layout's %s is whole (zero=0); Megatron's "
                                  "DistributedOptimizer shards it" % (w, STATES[st]))
            if vb.elements != self.shard_elements.get(key, 0):
                raise CheckFailed("%s: %s shard of %d elements in the layout, %d in Megatron's range map" % (
                    w, STATES[st], vb.elements, self.shard_elements.get(key, 0)))
            for r in self.view.regions:
                if r.buffer != b:
                    continue
                name = self.view.params[r.param].local_name
                pc = pieces.get(name)
                last = r.offset + sum((h - l - 1) * s for l, h, s in zip(r.lo, r.hi, r.strides))
                if pc is None or r.offset < pc.at or last >= pc.at + pc.hi - pc.lo:
                    raise CheckFailed("%s: %s of %s at %d..%d of the shard; Megatron's piece %s" % (
                        w, STATES[st], name, r.offset, last,
                        "is absent" if pc is None else "is %d..%d" % (pc.at, pc.at + pc.hi - pc.lo - 1)))
        for name in pieces:
            if name not in by_param:
                raise CheckFailed("%s: the optimizer holds %s, the layout does not" % (w, name))

    @property
    def device(self):
        return next(iter(self.ddp_buffers.values())).param_data.device

    # ---- the optimizer's step count ----
    def adam_step(self, every=True):
        """Adam's step count (the same for every parameter), 0 before the
        first step; with every=False, the count of each optimizer's first
        parameter that has one (the pause's check)."""
        steps = set()
        for o in self.opts:
            inner = o.optimizer
            for group in inner.param_groups:
                for p in group["params"]:
                    s = inner.state.get(p, {}).get("step", group.get("step"))
                    if s is not None:
                        steps.add(int(s.item() if torch.is_tensor(s) else s))
                        if not every:
                            break
                if steps and not every:
                    break
        if len(steps) > 1:
            raise CheckFailed("the optimizer's parameters have taken different numbers of steps: %s"
                              % sorted(steps))
        return steps.pop() if steps else 0

    # ---- the values, into vps's buffers (once, when a Job is made) ----
    def copy_into(self, buffers):
        """Megatron's values into vps's buffers: buffers[i] is the tensor of
        the view's buffer i."""
        def buffer(st, c, expert):
            return buffers[self.view.buffer(st, c, expert)]
        with torch.no_grad():
            for (c, expert), buf in self.ddp_buffers.items():
                dst = buffer(PARAM, c, expert)
                if dst.data_ptr() != buf.param_data.data_ptr():
                    dst.copy_(buf.param_data)
            for t, p in self.module_buffers:
                buffer(MODULE_BUFFER, p.chunk, False)[p.offset:p.offset + p.elements] = t.detach().view(-1)
            for (c, expert), pieces in self.pieces.items():
                main = buffer(MAIN_PARAM, c, expert)
                moments = {st: buffer(st, c, expert) for st in MOMENTS}
                for pc in pieces:
                    n = pc.hi - pc.lo
                    main[pc.at:pc.at + n] = pc.main.detach().view(-1)
                    have = self._optimizer_state(pc.main)
                    for st, t in moments.items():
                        v = have.get(MOMENTS[st])
                        t[pc.at:pc.at + n] = 0 if v is None else v.detach().view(-1)

    def _optimizer_state(self, main):
        for o in self.opts:
            if main in o.optimizer.state:
                return o.optimizer.state[main]
        return {}

    # ---- Megatron's tensors as views of vps's buffers ----
    def point(self, state):
        """Point every Megatron tensor that holds moved state at its part of
        state's buffers, and give Adam a step count (start() sets it)."""
        with torch.no_grad():
            for (c, expert), buf in self.ddp_buffers.items():
                flat = state.buffer(PARAM, c, expert)
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
            for (c, expert), pieces in self.pieces.items():
                main = state.buffer(MAIN_PARAM, c, expert)
                moments = {MOMENTS[st]: state.buffer(st, c, expert) for st in MOMENTS}
                for pc in pieces:
                    n = pc.hi - pc.lo
                    self._data(pc.main, main[pc.at:pc.at + n].view(pc.main.shape))
                    self._adam_state(pc.main, {k: t[pc.at:pc.at + n].view(pc.main.shape)
                                               for k, t in moments.items()})
            for (dtype, dev), states in self.step_slots.items():
                # every parameter's step an element of one tensor: the pause sets them with one fill
                steps = torch.zeros(len(states), dtype=dtype, device=dev)
                self.steps.append(steps)
                for i, st in enumerate(states):
                    st["step"] = steps[i]
            self.step_slots = {}
            for o in self.opts:
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
        count, and memory to the gradient buffers the skeleton left without
        (grads: (tensor, bytes)), zeroed."""
        with _plain():
            self._start(step, grads)

    def _start(self, step, grads):
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

    def _adam_state(self, main, moments):
        for o in self.opts:
            inner = o.optimizer
            for group in inner.param_groups:
                if not any(p is main for p in group["params"]):
                    continue
                st = inner.state[main]
                st.update(moments)
                if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
                    # torch keeps the step per parameter, a float of the default dtype's width, on the
                    # host unless capturable or fused; point() makes them one tensor's elements
                    dev = torch.device(main.device if group.get("capturable") or group.get("fused") else "cpu")
                    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                    self.step_slots.setdefault((dtype, dev), []).append(st)
                else:
                    # Apex's and TransformerEngine's FusedAdam keep it per group
                    if not any(g is group for g in self.step_groups):
                        self.step_groups.append(group)
                self.handed.append((st, None))
                return
        raise CheckFailed("a main parameter the optimizer's range map names is in none of its groups")

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
        emptied: release() drops Megatron's views of it)."""
        with _plain():
            for buf in self.grads:
                g = buf.grad_data
                if g is not None and not g.is_meta:
                    g.untyped_storage().resize_(0)

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


class Job:
    """A rank of a Megatron-Core job, its state in vps's buffers.

    Job(registry, layout, rank, model, optimizer): model is the list of
    DDP-wrapped model chunks and optimizer Megatron's optimizer (a
    DistributedOptimizer or the ChainedOptimizer get_megatron_optimizer
    returns), built for `layout`. Megatron's parameter buffers, main
    parameters, moments and moved module buffers become views of vps's
    buffers, registered with `registry` (see the module's text for where
    each lives). The layout is checked against what Megatron built: every
    parameter's name, shape and offset, every buffer's size, every ZeRO-1
    piece; vps.CheckFailed names the first that differs, vps.Unsupported
    what vps.megatron does not move.

    Job.clocks is what the last switch took (see switch)."""

    def __init__(self, registry: Registry, layout: Layout, rank: int, model: List[torch.nn.Module],
                 optimizer) -> None:
        self.registry, self.layout, self.rank = registry, layout, rank
        bind = _Binding(layout.rank(rank), model, optimizer)
        step = bind.adam_step()
        if bind.device.type == "cuda":
            # DDP's parameter buffers as they are; the optimizer's pieces gathered into flat buffers
            tensors = [bind.ddp_buffers[(b.chunk, b.expert)].param_data if b.state == PARAM else
                       torch.zeros(b.elements, dtype=_state.TORCH_DTYPE[b.dtype], device=bind.device)
                       for b in bind.view.buffers]
            bind.copy_into(tensors)
            state = _state.State.adopt(registry, layout, rank, dict(enumerate(tensors)))
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
    def step(self) -> int:
        """Adam's step count, which a switch carries as Training.step."""
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
            targets = [(b.chunk, b.expert, target.buffers[b.id]) for b in target.view.buffers if b.state == PARAM]
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
            if bind.device != target.device:
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
            self._unregister(target)
            raise
        self._next = _Next(layout=layout, rank=rank, target=target, bind=bind, groups=nxt_groups, entry=entry,
                           rng=nxt_rng, grads=sk.grads, seconds=seconds)

    def _unregister(self, target):
        """Forget target's registration and free it; the registry runs the
        job's state again."""
        self.registry.reset(self.layout, self.rank)
        self.state.register(self.registry, SOURCE)
        target.free()

    def discard(self) -> None:
        """Forget the configuration Job.prepare made ready, if any: its
        buffers are freed (its process groups stay cached)."""
        self._after.wait()
        nxt, self._next = self._next, None
        if nxt is not None:
            nxt.bind.release()
            if not nxt.target.closed:
                self._unregister(nxt.target)

    def switch(self, layout: Layout, rank: int, training: Training, build: Optional[Callable[[Layout], Tuple]] = None,
               *, timeout: float = 600.0) -> Tuple[Optional[list], object, Optional[Training]]:
        """Move the job to `rank` of `layout` between two steps, and return
        (model, optimizer, carried): the objects Job.prepare(layout, rank,
        build) made, handed the buffers the switch filled (without a
        prepare, build is given and the Job prepares in the pause), and
        carried, the vps.Training of source rank 0. training.step must be
        the optimizer's step count (Megatron's iteration, when no step was
        skipped). The model and optimizer before are emptied. For a leaving
        device (rank -1): (None, None, carried).

        Job.clocks then holds the switch's clocks: called, requested,
        done (the executors' done seen), freed (the buffers before freed),
        switched (vps's switch returned) and returned (time.time() wall
        clocks, to set beside vps-exec's report), and the seconds of the pause spent making
        process groups (groups), in build (build) and handing over (attach:
        the objects before emptied, the next ones started); ahead, what
        Job.prepare took before the pause (target, groups, build, attach).

        When the executors fail the switch, vps.Error is raised and the job
        goes on as it was (see vps.switch; a prepared configuration is
        discarded); timeout is vps.switch's."""
        clocks = {"called": time.time(), "groups": 0.0, "build": 0.0, "attach": 0.0, "ahead": None}
        self._live()
        step = self._bind.adam_step(every=False)
        if training.step != step:
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
        try:
            new, carried = _state.switch(self.registry, self.state, layout, rank, training=training,
                                         timeout=timeout, target=nxt.target if nxt else None, clocks=clocks,
                                         free=False)
        except Error:
            if nxt is not None and nxt.target.closed:
                # the switch failed and freed the target: the job runs its state again
                nxt.bind.release()
                self._next = None
            raise
        clocks["switched"] = time.time()
        t = time.monotonic()
        old_bind, old_state = self._bind, self.state
        # the gradients' memory back before the next configuration's is given
        old_bind.free_grads()
        self.model = self.optimizer = self._bind = self._next = None
        self.layout, self.rank, self.state = layout, rank, new
        if new is None:
            self._groups = None
            _let_go(old_bind, old_state)
            clocks["attach"] += time.monotonic() - t
            clocks["returned"] = time.time()
            self.clocks = clocks
            return None, None, carried
        attach = time.monotonic() - t
        t = time.monotonic()
        _install(nxt.groups)
        _set_rng_state(nxt.rng)
        self._groups = nxt.entry
        clocks["groups"] += time.monotonic() - t
        t = time.monotonic()
        nxt.bind.start(carried.step, nxt.grads)
        self._bind, self.model, self.optimizer = nxt.bind, nxt.bind.model, nxt.bind.optimizer
        # what the configuration before held goes once the job trains again
        self._after.give(_let_go, old_bind, old_state)
        clocks["attach"] += attach + time.monotonic() - t
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
        if bind.device != self.state.device and not (bind.device.type == self.state.device.type == "cuda"):
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
