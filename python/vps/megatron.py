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
        vps.megatron.initialize_groups(layout)  # initialize_model_parallel for the layout
        model = ...                             # model chunks in DistributedDataParallel
        optimizer = get_megatron_optimizer(config, model)
        return model, optimizer

    model, optimizer = build(layout)
    reg = vps.Registry("vps-%d" % rank, layout, rank)
    job = vps.megatron.Job(reg, layout, rank, model, optimizer)
    ...train...
    model, optimizer, carried = job.switch(new_layout, rank, vps.Training(
        step=iteration, consumed_samples=n, scheduler_step=scheduler.num_steps,
        global_batch=gb, micro_batch=mb), build)

with one vps-exec(1) beside each rank. What moves: the bf16 parameters, the
fp32 main parameters, exp_avg and exp_avg_sq; gradients are rebuilt by the
next step and stay Megatron's. What is carried: the training scalars
(vps.Training), of which `step` is also Adam's step count.

Where the buffers live: a GPU job's parameter buffers are DDP's own
(State.adopt registers them by their CUDA IPC handles, no copy); its main
parameters and moments, which Megatron keeps one tensor per piece, are
gathered once into flat buffers of vps's layout when the Job is made. On
the host, vps-exec reaches only shared memory, so the Job allocates vps's
buffers there (State.allocate) and copies Megatron's values in, once. From
then on every one of those Megatron tensors is a view of a vps buffer, and
after a switch the new model and optimizer are handed the target buffers
the switch filled: no copy. Megatron's objects of the configuration before
are emptied (their tensors hold no elements), since their memory is gone.

Supported: the DistributedOptimizer (ZeRO-1, zero=1 in vps's terms) over
torch's Adam/AdamW (tests/megatron/check_switch.py trains with it on the
CPU) or a fused Adam that keeps exp_avg and exp_avg_sq per parameter and
its step per group (Apex's, TransformerEngine's: GPU only, not exercised
by the tests here), bf16 parameters with fp32 main parameters, dense and
expert buffers, any number of model chunks (VPP). Not supported, and
refused with vps.Error: Megatron's Float16Optimizer (zero=0), the
precision-aware optimizer (moments and master weights kept by
TransformerEngine's FusedAdam), parameters of other dtypes, layouts that
move gradients (grad=1) or module buffers (the routers' expert_bias).

Needs PyTorch (and Megatron-Core for the job itself): without torch,
importing it raises ModuleNotFoundError saying how to get it."""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from ._lib import import_torch
from .errors import CheckFailed, InvalidInput, Unsupported
from .layout import EXP_AVG, EXP_AVG_SQ, MAIN_PARAM, PARAM, STATES, Layout
from .registry import Registry, Training

torch = import_torch("vps.megatron")
from . import state as _state  # noqa: E402 (needs torch)

__all__ = ["initialize_groups", "distributed_optimizers", "Job", "MOMENTS"]

# the optimizer's name for each moment vps moves
MOMENTS = {EXP_AVG: "exp_avg", EXP_AVG_SQ: "exp_avg_sq"}

_groups_made = []


def initialize_groups(layout: Layout, **kwargs) -> None:
    """Megatron's process groups for a layout: parallel_state.
    initialize_model_parallel with its tp, pp, vpp, cp, ep and etp (and
    kwargs), after destroying the groups of the configuration before.
    Every rank calls it, in the same order (torch.distributed's rule for
    making groups). The groups a previous call made are destroyed too:
    Megatron's destroy_model_parallel only forgets them, and under NCCL
    each holds a communicator."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    par = layout.parallel
    parallel_state.destroy_model_parallel()
    while _groups_made:
        dist.destroy_process_group(_groups_made.pop())
    before = set(_process_groups())
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par["tp"],
        pipeline_model_parallel_size=par["pp"],
        virtual_pipeline_model_parallel_size=par["vpp"] if par["vpp"] > 1 else None,
        context_parallel_size=par["cp"],
        expert_model_parallel_size=par["ep"],
        expert_tensor_parallel_size=par["etp"],
        **kwargs)
    _groups_made.extend(g for g in _process_groups() if g not in before)


def _process_groups():
    from torch.distributed import distributed_c10d as c10d
    default = c10d._get_default_group()
    return [g for g in c10d._world.pg_map if g is not default]


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
    return [o for o in opts if not o.is_stub_optimizer]


def _unwrapped_names(chunk):
    """Parameter -> its name inside the innermost module (GPTModel), which
    is the name vps's view gives as local_name."""
    inner = chunk
    while hasattr(inner, "module"):
        inner = inner.module
    return {p: n for n, p in inner.named_parameters()}


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
        for b in view.buffers:
            if b.state not in (PARAM, MAIN_PARAM, EXP_AVG, EXP_AVG_SQ):
                raise Unsupported("the layout moves %s buffers (chunk %d); vps.megatron moves "
                                  "parameters, main parameters and Adam's moments" % (STATES[b.state], b.chunk))
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
    def adam_step(self):
        """Adam's step count (the same for every parameter), 0 before the
        first step."""
        steps = set()
        for o in self.opts:
            inner = o.optimizer
            for group in inner.param_groups:
                for p in group["params"]:
                    s = inner.state.get(p, {}).get("step", group.get("step"))
                    if s is not None:
                        steps.add(int(s.item() if torch.is_tensor(s) else s))
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
    def hand(self, state, step):
        """Point every Megatron tensor that holds moved state at its part of
        state's buffers, and give Adam `step`."""
        self.handed = []
        with torch.no_grad():
            for (c, expert), buf in self.ddp_buffers.items():
                flat = state.buffer(PARAM, c, expert)
                self._set(buf, "param_data", flat)
                for bucket in buf.buckets:
                    n = bucket.grad_data.numel()
                    self._set(bucket, "param_data", flat[bucket.offset:bucket.offset + n])
                for p, (start, end, _) in buf.param_index_map.items():
                    self._data(p, flat[start:end].view(p.shape))
            for groups in self._bucket_groups():
                for g in groups:
                    # its cached shards are views of the buffers before
                    g.cached_param_buffer_shard_list = [None] * len(g.buckets)
            for (c, expert), pieces in self.pieces.items():
                main = state.buffer(MAIN_PARAM, c, expert)
                moments = {MOMENTS[st]: state.buffer(st, c, expert) for st in MOMENTS}
                for pc in pieces:
                    n = pc.hi - pc.lo
                    self._data(pc.main, main[pc.at:pc.at + n].view(pc.main.shape))
                    self._adam_state(pc.main, {k: t[pc.at:pc.at + n].view(pc.main.shape)
                                               for k, t in moments.items()}, step)
            for o in self.opts:
                # the model parameters' shards Megatron sliced when it was built
                for groups, model_groups in ((o.shard_float16_groups, o.model_float16_groups),
                                             (o.shard_fp32_groups, o.model_fp32_groups)):
                    for shards, params in zip(groups, model_groups):
                        for i, (shard, p) in enumerate(zip(shards, params)):
                            r = o._get_model_param_range_map(p)["param"]
                            if shard is not None:
                                self._data(shard, p.detach().view(-1)[r.start:r.end])

    def _bucket_groups(self):
        for chunk in self.model:
            yield getattr(chunk, "bucket_groups", [])
            yield getattr(chunk, "expert_parallel_bucket_groups", [])
        for o in self.opts:
            for groups in getattr(o, "per_model_bucket_groups", {}).values():
                yield groups

    def _adam_state(self, main, moments, step):
        for o in self.opts:
            inner = o.optimizer
            for group in inner.param_groups:
                if not any(p is main for p in group["params"]):
                    continue
                st = inner.state[main]
                st.update(moments)
                if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
                    # torch keeps the step per parameter, a float of the default dtype's width, on the
                    # host unless capturable or fused
                    dev = main.device if group.get("capturable") or group.get("fused") else "cpu"
                    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                    st["step"] = torch.tensor(float(step), dtype=dtype, device=dev)
                else:
                    # Apex's and TransformerEngine's FusedAdam keep it per group
                    group["step"] = step
                self.handed.append((st, None))
                return
        raise CheckFailed("a main parameter the optimizer's range map names is in none of its groups")

    def _set(self, obj, attr, tensor):
        setattr(obj, attr, tensor)
        self.handed.append((obj, attr))

    def _data(self, t, view):
        t.data = view
        self.handed.append((t, "data"))

    def release(self):
        """Empty every Megatron tensor handed a part of vps's buffers: the
        buffers are about to be freed (host memory is unmapped)."""
        for obj, attr in getattr(self, "handed", []):
            if attr is None:
                obj.clear()
            elif attr == "data":
                obj.data = torch.empty(0, dtype=obj.dtype, device=obj.device)
            else:
                old = getattr(obj, attr)
                setattr(obj, attr, torch.empty(0, dtype=old.dtype, device=old.device))
        self.handed = []

    def sync_params(self):
        """Finish the parameter all-gather of the last optimizer step where
        DDP defers it to the next forward (overlap_param_gather): until
        then the bf16 parameters outside this rank's shard are stale."""
        for chunk in self.model:
            if chunk.ddp_config.overlap_param_gather:
                chunk.start_param_sync(force_sync=True)


class Job:
    """A rank of a Megatron-Core job, its state in vps's buffers.

    Job(registry, layout, rank, model, optimizer): model is the list of
    DDP-wrapped model chunks and optimizer Megatron's optimizer (a
    DistributedOptimizer or the ChainedOptimizer get_megatron_optimizer
    returns), built for `layout`. Megatron's parameter buffers, main
    parameters and moments become views of vps's buffers, registered with
    `registry` (see the module's text for where each lives). The layout is
    checked against what Megatron built: every parameter's name, shape and
    offset, every buffer's size, every ZeRO-1 piece; vps.CheckFailed names
    the first that differs, vps.Unsupported what vps.megatron does not move."""

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
        bind.hand(state, step)
        self.state, self._bind = state, bind
        self.model, self.optimizer = bind.model, optimizer

    @property
    def step(self) -> int:
        """Adam's step count, which a switch carries as Training.step."""
        return self._bind.adam_step()

    def switch(self, layout: Layout, rank: int, training: Training, build: Optional[Callable[[Layout], Tuple]], *,
               timeout: float = 600.0) -> Tuple[Optional[list], object, Optional[Training]]:
        """Move the job to `rank` of `layout` between two steps, and return
        (model, optimizer, carried): build(layout) makes the new
        configuration's model chunks and optimizer with Megatron's
        constructors (after vps.megatron.initialize_groups(layout), or
        whatever makes the job's process groups), the Job hands them the
        buffers the switch filled, and carried is the vps.Training of
        source rank 0. training.step must be the optimizer's step count
        (Megatron's iteration, when no step was skipped). The model and
        optimizer before are emptied. For a leaving device (rank -1), build
        is not called: (None, None, carried).

        When the executors fail the switch, vps.Error is raised and the job
        goes on as it was (see vps.switch); timeout is vps.switch's."""
        step = self._bind.adam_step()
        if training.step != step:
            raise InvalidInput("training.step is %d, the optimizer has taken %d steps: vps carries one "
                               "count, Adam's bias correction and the iteration" % (training.step, step))
        self._bind.sync_params()
        new, carried = _state.switch(self.registry, self.state, layout, rank, training=training, timeout=timeout)
        self._bind.release()
        self.model = self.optimizer = self._bind = None
        self.layout, self.rank, self.state = layout, rank, new
        if new is None:
            return None, None, carried
        model, optimizer = build(layout)
        self.attach(model, optimizer, carried.step)
        return self.model, self.optimizer, carried

    def attach(self, model: List[torch.nn.Module], optimizer, step: int) -> None:
        """Hand Megatron's model chunks and optimizer, built for the job's
        layout, the job's buffers as they are (no copy), with Adam at
        `step`. Job.switch does it with build's objects; call it again if
        build failed after the switch."""
        bind = _Binding(self.state.view, model, optimizer)
        if bind.device != self.state.device and not (bind.device.type == self.state.device.type == "cuda"):
            raise InvalidInput("the model is on %s, the job's buffers on %s" % (bind.device, self.state.device))
        bind.hand(self.state, step)
        self._bind, self.model, self.optimizer = bind, bind.model, optimizer

    def close(self) -> None:
        """Empty Megatron's tensors and free the buffers (the registry still
        has to be closed)."""
        if self._bind:
            self._bind.release()
        if self.state:
            self.registry.reset(None, -1)
            self.state.free()
        self._bind = self.state = self.model = self.optimizer = None
