"""A PyTorch-native job made switchable: FSDP2, HSDP, TP and PP as torchtitan
lays them out.

A DTensor job (torchtitan's, or any built with PyTorch's fully_shard and
parallelize_module the same way) keeps each parameter's local shard in a
tensor of its own: FSDP2's padded sharded storage, fp32, under the
parameter's DTensor, and torch's Adam keeps exp_avg and exp_avg_sq as
DTensors of the parameter's placement. vps's family=dtensor layouts lay out
the same state, a buffer per parameter and state (docs/layout.md; tests/
torch checks every rank against torchtitan's own code), so a Job points
those tensors into vps's buffers and the switch moves them:

    import vps, vps.dtensor

    def build(layout):                     # the new configuration, as torchtitan builds it
        ...                                # its device mesh; the model on the meta device,
        return model, optimizer            # parallelized; its optimizer

    reg = vps.Registry("vps-%d" % rank, layout, rank)
    job = vps.dtensor.Job(reg, layout, rank, model, optimizer)
    ...train...
    job.prepare(new_layout, rank, build)   # while the job trains, as soon as the next one is known
    ...train...
    model, optimizer, carried = job.switch(new_layout, rank, vps.Training(
        step=step, consumed_samples=n, global_batch=gb), build)

with one vps-exec(1) beside each rank. What moves: every parameter's local
shard (the fp32 parameter FSDP2 shards: main_param) and Adam's exp_avg and
exp_avg_sq; gradients are rebuilt by the next step and stay PyTorch's.
What is carried: the training scalars (vps.Training), of which `step` is
also Adam's step count (torch keeps it per parameter, the same for all).

Where the buffers live: on the GPU the Job registers the tensors the job
already has (State.adopt: FSDP2's padded storage, Adam's local moments,
by their CUDA IPC handles), no copy. On the host vps-exec reaches only
shared memory: the Job allocates vps's buffers there (State.allocate) and
copies the values in, once. From then on every one of those tensors is a
view of a vps buffer. build makes the new configuration's model on the
meta device (or anywhere) and its optimizer, and the Job hands them the
buffers the switch fills, no copy: in Job.prepare, while the job trains
(the pause then holds the transfer and Adam's step), or, for a switch not
prepared, in the pause after the transfer. A parameter on the buffers'
device keeps its object and has its local tensor pointed at the buffer;
one on another device (meta) is replaced by a DTensor of the same
placement over the buffer, in every module that holds it, in FSDP2's
records and in the optimizer's groups. The model and optimizer before are
emptied (their tensors hold no elements), since their memory is gone.

A world that grows or shrinks: DeviceMesh and DTensor's collectives find
their process groups in torch.distributed's global map, which the worlds of
vps.elastic stay out of; init_world makes torch.distributed's default group
anew on the job's store for the new world, in build (processes that join
call Job.join, those that leave get (None, None, carried)). Such a switch
is not prepared: the job trains on the old world's group until the pause.

Supported: torch.optim.Adam and AdamW (foreach, fused or neither; not
amsgrad), one or several optimizers (torchtitan's OptimizersContainer, a
list), one or several model parts (pipeline stages), fp32 parameters as
FSDP2 keeps them (its mixed precision computes in bf16 from them), FSDP2,
HSDP, TP/SP and FSDP2 x TP placements. Refused with vps.Error: other
optimizers, parameters of other dtypes, layouts of the megatron family,
and module buffers (MoE's expert_bias_E: the layout moves them, this Job
does not yet).

Needs PyTorch: without torch, importing it raises ModuleNotFoundError
saying how to get it."""
from __future__ import annotations

import datetime
import math
from typing import Callable, Optional, Tuple

from ._lib import import_torch
from .errors import CheckFailed, Error, InvalidInput, Unsupported
from .layout import EXP_AVG, EXP_AVG_SQ, MAIN_PARAM, STATES, Layout
from .registry import TARGET, Registry, Training

torch = import_torch("vps.dtensor")
from torch.distributed.tensor import DTensor  # noqa: E402

from . import state as _state  # noqa: E402 (needs torch)

__all__ = ["Job", "MOMENTS", "init_world", "optimizers"]

# the optimizer's name for each moment vps moves
MOMENTS = {EXP_AVG: "exp_avg", EXP_AVG_SQ: "exp_avg_sq"}
# a weight's buffers in a rank's view: every weight's main_param, then every
# weight's exp_avg, then every exp_avg_sq (lib/model/dtensor.c)
_WEIGHT_STATES = (MAIN_PARAM, EXP_AVG, EXP_AVG_SQ)
_FAMILY_DTENSOR = 1


def init_world(store, name, rank: int, size: int, backend: str = "gloo", timeout: float = 300.0) -> None:
    """torch.distributed's default group made anew, for world `name` of
    `size` processes (this one `rank`), on the job's store (keys under
    vps/world/NAME/torch/; vps.elastic.Job.store is one): the group before,
    and every group made from it, is destroyed first. A DTensor job calls it
    in build when a switch changes the number of processes: DeviceMesh
    (init_device_mesh) and DTensor's collectives need the world in
    torch.distributed's global map. Every process of the new world calls
    it; one that does not come within `timeout` seconds fails it."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend, store=dist.PrefixStore("vps/world/%s/torch/" % name, store), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout))


def optimizers(optimizer) -> list:
    """The torch optimizers in `optimizer`: itself, the elements of a list,
    or the .optimizers of torchtitan's OptimizersContainer. Each must be
    torch's Adam or AdamW without amsgrad (vps.Unsupported otherwise)."""
    if isinstance(optimizer, (list, tuple)):
        opts = list(optimizer)
    elif isinstance(getattr(optimizer, "optimizers", None), (list, tuple)):
        opts = list(optimizer.optimizers)
    else:
        opts = [optimizer]
    for o in opts:
        # AdamW is a subclass of Adam in torch 2
        if not isinstance(o, torch.optim.Adam):
            raise Unsupported("%s: vps.dtensor moves the state of torch's Adam and AdamW (exp_avg, exp_avg_sq, "
                              "step)" % type(o).__name__)
        if any(g.get("amsgrad") for g in o.param_groups):
            raise Unsupported("amsgrad keeps a third moment (max_exp_avg_sq) that the layout does not move")
    return opts


def _parts(model) -> list:
    parts = list(model) if isinstance(model, (list, tuple)) else [model]
    for m in parts:
        if not isinstance(m, torch.nn.Module):
            raise InvalidInput("the model: a torch.nn.Module or a list of them (model parts), not %s"
                               % type(m).__name__)
    return parts


def _local(p):
    return p._local_tensor if isinstance(p, DTensor) else p


def _fsdp_params(parts) -> dict:
    """id(sharded parameter) -> FSDP2's FSDPParam, over every FSDP module of the parts."""
    from torch.distributed.fsdp import FSDPModule
    out = {}
    for part in parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                group = m._get_fsdp_state()._fsdp_param_group
                for fp in group.fsdp_params if group else []:
                    out[id(fp.sharded_param)] = fp
    return out


class _Entry:
    """One parameter of the rank: PyTorch's objects and its buffers in vps's view."""
    __slots__ = ("name", "chunk", "param", "fsdp", "shape", "buffers", "opt", "group")

    def __init__(self, name, chunk, param, fsdp, shape, buffers, opt, group):
        self.name, self.chunk, self.param, self.fsdp, self.shape = name, chunk, param, fsdp, shape
        self.buffers, self.opt, self.group = buffers, opt, group


class _Binding:
    """Which PyTorch tensor is which vps buffer, on one rank: each parameter
    of the model parts in named_parameters() order against the view's
    weights in order (name, part, local shape, FSDP2's padded storage
    against main_param's size, the local shard against the moments'), and
    each parameter's optimizer."""

    def __init__(self, view, model, optimizer):
        self.view = view
        self.parts = _parts(model)
        self.opts = optimizers(optimizer)
        self.handed = []
        rank = view.rank
        if view.layout.parallel["family"] != _FAMILY_DTENSOR:
            raise InvalidInput("%s is a Megatron layout: vps.dtensor moves DTensor layouts (family=dtensor; "
                               "vps.megatron moves Megatron-Core's)" % view.layout.describe())
        weights = [p for p in view.params if not p.module_buffer]
        if len(weights) != len(view.params):
            mb = next(p for p in view.params if p.module_buffer)
            raise Unsupported("rank %d holds module buffers (%s): vps.dtensor moves parameters and Adam's moments"
                              % (rank, mb.local_name))
        nparts = 1 + max([p.chunk for p in weights] + [0])
        if len(self.parts) != nparts:
            raise CheckFailed("%d model parts; the layout has %d on rank %d" % (len(self.parts), nparts, rank))
        ours = [(k, n, p) for k, part in enumerate(self.parts) for n, p in part.named_parameters()]
        owner = {}
        for o in self.opts:
            for g in o.param_groups:
                for p in g["params"]:
                    owner[id(p)] = (o, g)
        fsdp = _fsdp_params(self.parts)
        nw = len(weights)
        self.entries = []
        for i, vp in enumerate(weights):
            if i >= len(ours):
                raise CheckFailed("rank %d: the layout's %s (part %d) is not in the model" % (rank, vp.local_name,
                                                                                              vp.chunk))
            k, n, p = ours[i]
            if (k, n) != (vp.chunk, vp.local_name):
                raise CheckFailed("rank %d parameter %d: the model's is %s of part %d, the layout's %s of part %d"
                                  % (rank, i, n, k, vp.local_name, vp.chunk))
            where = "rank %d %s" % (rank, n)
            local = _local(p)
            if p.dtype != torch.float32:
                raise Unsupported("%s: a %s parameter; vps lays out fp32 ones (FSDP2's sharded parameter, whose "
                                  "mixed precision computes in bf16 from it)" % (where, p.dtype))
            if tuple(local.shape) != tuple(vp.shape):
                raise CheckFailed("%s: a local shard of %s, the layout's %s" % (where, list(local.shape),
                                                                               list(vp.shape)))
            bufs = tuple(s * nw + i for s in range(len(_WEIGHT_STATES)))
            for st, b in zip(_WEIGHT_STATES, bufs):
                if view.buffers[b].state != st:
                    raise CheckFailed("rank %d buffer %d: %s, not %s's %s" % (rank, b, STATES[view.buffers[b].state],
                                                                              n, STATES[st]))
            fp = fsdp.get(id(p))
            main = math.prod(fp.padded_sharded_param_size) if fp else local.numel()
            if view.buffers[bufs[0]].elements != main:
                raise CheckFailed("%s: %s of %d elements, the layout's main_param %d" % (
                    where, "FSDP2's padded sharded storage" if fp else "the local tensor", main,
                    view.buffers[bufs[0]].elements))
            for st, b in zip(_WEIGHT_STATES[1:], bufs[1:]):
                if view.buffers[b].elements != local.numel():
                    raise CheckFailed("%s: a local shard of %d elements, the layout's %s %d" % (
                        where, local.numel(), STATES[st], view.buffers[b].elements))
            if fp is not None and fp.fsdp_placement.dim != 0 and local.shape != fp.padded_sharded_param_size:
                raise CheckFailed("%s: FSDP2 pads a Shard(%d) parameter" % (where, fp.fsdp_placement.dim))
            if id(p) not in owner:
                raise CheckFailed("%s is in no group of the optimizer" % where)
            self.entries.append(_Entry(n, k, p, fp, tuple(vp.shape), bufs, *owner.pop(id(p))))
        if len(ours) > nw:
            k, n, _ = ours[nw]
            raise CheckFailed("rank %d: the model's %s (part %d) is not in the layout" % (rank, n, k))
        if owner:
            raise CheckFailed("rank %d: the optimizer holds %d parameters that are not the model's"
                              % (rank, len(owner)))

    @property
    def device(self):
        return _local(self.entries[0].param).device if self.entries else torch.device("cpu")

    # ---- the optimizer's step count ----
    def adam_step(self) -> int:
        """Adam's step count (the same for every parameter), 0 before the first step."""
        steps = set()
        for e in self.entries:
            s = e.opt.state.get(e.param, {}).get("step")
            if s is not None:
                steps.add(int(s.item() if torch.is_tensor(s) else s))
        if len(steps) > 1:
            raise CheckFailed("the optimizer's parameters have taken different numbers of steps: %s" % sorted(steps))
        return steps.pop() if steps else 0

    # ---- the values, into vps's buffers (once, when a Job is made) ----
    def sources(self) -> dict:
        """buffer index -> the tensor that holds its values now (contiguous,
        flat), or None where the optimizer has no state yet (zeros)."""
        out = {}
        for e in self.entries:
            main = e.fsdp._sharded_param_data if e.fsdp else _local(e.param)
            out[e.buffers[0]] = main.detach().reshape(-1)
            st = e.opt.state.get(e.param, {})
            for b, key in zip(e.buffers[1:], MOMENTS.values()):
                v = st.get(key)
                out[b] = None if v is None else _local(v).detach().reshape(-1)
        return out

    # ---- PyTorch's tensors as views of vps's buffers ----
    def hand(self, state, step: int) -> None:
        """Point every parameter's local shard and Adam's moments at state's
        buffers, and give Adam `step`."""
        self.handed = []
        with torch.no_grad():
            for e in self.entries:
                main = state.buffers[e.buffers[0]]
                if e.fsdp is not None:
                    dim = e.fsdp.fsdp_placement.dim
                    local = main.view(e.fsdp.padded_sharded_param_size).narrow(dim, 0, e.shape[dim])
                else:
                    local = main.view(e.shape)
                p = self._point(e, main, local)
                st = e.opt.state[p]
                for b, key in zip(e.buffers[1:], MOMENTS.values()):
                    v = state.buffers[b].view(e.shape)
                    st[key] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                                 stride=p.stride()) if isinstance(p, DTensor) else v
                # torch keeps the step per parameter, a float of the default dtype's width, on the host
                # unless capturable or fused
                dev = local.device if e.group.get("capturable") or e.group.get("fused") else "cpu"
                dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                st["step"] = torch.tensor(float(step), dtype=dtype, device=dev)
                self.handed.append(st)

    def set_step(self, step: int) -> None:
        """Adam's step count, in every state hand() made (a prepared
        configuration learns it in the pause)."""
        with torch.no_grad():
            for obj in self.handed:
                if isinstance(obj, dict):
                    obj["step"].fill_(float(step))

    def _point(self, e, main, local):
        """The parameter's local tensor `local` (FSDP2's storage `main`): the
        same object where it is on local's device, else a new parameter of
        the same placement put wherever the old one was."""
        p = e.param
        if _local(p).device == local.device:
            if isinstance(p, DTensor):
                p._local_tensor = local
            else:
                p.data = local
            if e.fsdp is not None:
                e.fsdp._sharded_param_data = main
            self.handed.append(p)
            return p
        if e.fsdp is not None:
            new = torch.nn.Parameter(e.fsdp.to_sharded_dtensor(local), requires_grad=p.requires_grad)
            e.fsdp.sharded_param = new
            e.fsdp._sharded_param_data = main
            e.fsdp._setattr_on_modules(new)
        else:
            t = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                   stride=p.stride()) if isinstance(p, DTensor) else local
            new = torch.nn.Parameter(t, requires_grad=p.requires_grad)
        # every module that holds it (tied weights: several)
        for part in self.parts:
            for m in part.modules():
                for name, q in list(m._parameters.items()):
                    if q is p:
                        m._parameters[name] = new
        params = e.group["params"]
        params[next(i for i, q in enumerate(params) if q is p)] = new
        e.opt.state[new] = e.opt.state.pop(p, {})
        e.param = new
        self.handed.append(new)
        return new

    def release(self) -> None:
        """Empty every tensor handed a part of vps's buffers: the buffers are
        about to be freed (host memory is unmapped)."""
        for obj in self.handed:
            if isinstance(obj, dict):
                obj.clear()
            elif isinstance(obj, DTensor):
                obj._local_tensor = torch.empty(0, dtype=obj.dtype, device=obj._local_tensor.device)
            else:
                obj.data = torch.empty(0, dtype=obj.dtype, device=obj.device)
        for e in self.entries:
            if e.fsdp is not None:
                e.fsdp._sharded_param_data = torch.empty(0, dtype=torch.float32, device=e.fsdp._sharded_param_data.device)
        self.handed = []


class _Next:
    """A configuration Job.prepare made ready: its State (registered as the
    switch's target) and build's model and optimizer pointed into it."""
    __slots__ = ("layout", "rank", "target", "bind", "model", "optimizer")

    def __init__(self, layout, rank, target, bind, model, optimizer):
        self.layout, self.rank, self.target, self.bind = layout, rank, target, bind
        self.model, self.optimizer = model, optimizer


class Job:
    """A rank of a PyTorch DTensor job, its state in vps's buffers.

    Job(registry, layout, rank, model, optimizer): model is the module (or
    the list of model parts, pipeline stages) and optimizer torch's Adam or
    AdamW (or a list of them, or torchtitan's OptimizersContainer), built
    for `layout` (family=dtensor). Every parameter's local shard and Adam's
    moments become views of vps's buffers, registered with `registry` (see
    the module's text for where each lives). The layout is checked against
    what PyTorch built: every parameter's name, part and local shape, FSDP2's
    padded storage against the main_param buffer; vps.CheckFailed names the
    first that differs, vps.Unsupported what vps.dtensor does not move."""

    def __init__(self, registry: Registry, layout: Layout, rank: int, model, optimizer) -> None:
        self.registry, self.layout, self.rank = registry, layout, rank
        bind = _Binding(layout.rank(rank), model, optimizer)
        step = bind.adam_step()
        src = bind.sources()
        if bind.device.type == "cuda":
            # the job's own tensors registered (flat: reshape copied only what was not contiguous); a
            # moment the optimizer has not made yet, made here
            tensors = {b: torch.zeros(bind.view.buffers[b].elements, dtype=torch.float32, device=bind.device)
                       if t is None else t for b, t in src.items()}
            state = _state.State.adopt(registry, layout, rank, tensors)
        elif bind.device.type == "cpu":
            state = _state.State.allocate(registry, layout, rank)
            with torch.no_grad():
                for b, t in src.items():
                    if t is not None:
                        state.buffers[b].copy_(t)
        else:
            raise InvalidInput("the model's parameters are on %s: a Job is made of a model whose values are "
                               "there (cpu or cuda); build's model may be on the meta device" % bind.device)
        bind.hand(state, step)
        self.state, self._bind = state, bind
        self.model, self.optimizer = model, optimizer
        self._next = None

    @property
    def step(self) -> int:
        """Adam's step count, which a switch carries as Training.step."""
        return self._bind.adam_step()

    @property
    def prepared(self) -> Optional[Tuple[Layout, int]]:
        """The (layout, rank) Job.prepare made ready, or None."""
        return (self._next.layout, self._next.rank) if self._next else None

    def prepare(self, layout: Layout, rank: int, build: Callable[[Layout], Tuple]) -> None:
        """Make rank `rank` of `layout` ready while the job trains, so that
        the switch to it pauses for the transfer and the hand-over only:
        its buffers allocated and registered (vps-exec maps them before the
        request), build(layout) called now (the device mesh, the model on
        the meta device, its optimizer) and its parameters and Adam's
        moments pointed into those buffers, which the switch fills. The job
        goes on training on its own objects until Job.switch(layout, rank,
        ...). Every process of the world calls it at the same point of its
        loop (the device mesh's groups are made by all of them together).

        Only a switch within the job's world is prepared: one that changes
        the number of processes makes the new world's default group in
        build (init_world), and the job trains on the old one until the
        pause. A configuration prepared before is discarded."""
        self._open()
        if rank < 0:
            raise InvalidInput("rank %d: a leaving process has nothing to prepare" % rank)
        if layout.world != self.layout.world:
            raise InvalidInput("%s is a world of %d processes, the job's %d: a switch that changes the world is "
                               "not prepared (build makes its default group, init_world, in the pause)" % (
                                   layout.describe(), layout.world, self.layout.world))
        self.discard()
        target = _state.State.allocate(self.registry, layout, rank, TARGET, self.state.device)
        bind = None
        try:
            self.registry.set_target(layout, rank)
            model, optimizer = build(layout)
            bind = _Binding(target.view, model, optimizer)
            if bind.device.type not in ("meta", target.device.type):
                raise InvalidInput("build made the model on %s, the job's buffers are on %s: build it on the meta "
                                   "device or on the buffers'" % (bind.device, target.device))
            # Adam's step is the switch's, set in the pause
            bind.hand(target, 0)
        except BaseException:
            if bind is not None:
                bind.release()
            _state.withdraw(self.registry, self.state, target)
            raise
        self._next = _Next(layout, rank, target, bind, model, optimizer)

    def discard(self) -> None:
        """Forget the configuration Job.prepare made ready, if any: its
        buffers are freed and build's model and optimizer emptied."""
        nxt, self._next = self._next, None
        if nxt is not None:
            _state.withdraw(self.registry, self.state, nxt.target, nxt.bind)

    def _open(self):
        if self.state is None:
            raise InvalidInput("the job is closed, or left its last switch")

    @_state.paused_gc()
    def switch(self, layout: Layout, rank: int, training: Training,
               build: Optional[Callable[[Layout], Tuple]] = None, *,
               timeout: float = 600.0) -> Tuple[object, object, Optional[Training]]:
        """Move the job to `rank` of `layout` between two steps, and return
        (model, optimizer, carried): the model and optimizer Job.prepare
        made for it, or, where it was not prepared, build(layout)'s, made
        in the pause: the new configuration's model (on the meta device:
        nothing is allocated for the parameters, or anywhere) and its
        optimizer, after making the device mesh (and, when the number of
        processes changes, the world: init_world); the Job hands them the
        buffers the switch filled, and carried is the vps.Training of
        source rank 0. training.step must be the optimizer's step count.
        The model and optimizer before are emptied. For a leaving process
        (rank -1), build is not called: (None, None, carried).

        When the executors fail the switch, vps.Error is raised and the job
        goes on as it was (see vps.switch; a prepared configuration is
        discarded); timeout is vps.switch's."""
        self._open()
        step = self._bind.adam_step()
        if training.step != step:
            raise InvalidInput("training.step is %d, the optimizer has taken %d steps: vps carries one count, "
                               "Adam's bias correction and the training step" % (training.step, step))
        nxt = self._next
        if nxt is not None and (nxt.layout.hash, nxt.rank) != (layout.hash, rank):
            self.discard()
            nxt = None
        if rank >= 0 and nxt is None and build is None:
            raise InvalidInput("rank %d of %s was not prepared (Job.prepare), and no build was given" % (
                rank, layout.describe()))
        if self.state.device.type == "cuda":
            # the last optimizer step's kernels may still be writing the buffers vps-exec reads
            torch.cuda.synchronize(self.state.device)
        try:
            new, carried = _state.switch(self.registry, self.state, layout, rank, training=training,
                                         timeout=timeout, target=nxt.target if nxt else None)
        except Error:
            if nxt is not None and nxt.target.closed:
                # the switch failed and freed the target: the job runs its state again
                nxt.bind.release()
                self._next = None
            raise
        self._bind.release()
        self.model = self.optimizer = self._bind = self._next = None
        self.layout, self.rank, self.state = layout, rank, new
        if new is None:
            return None, None, carried
        if nxt is not None:
            nxt.bind.set_step(carried.step)
            self._bind, self.model, self.optimizer = nxt.bind, nxt.model, nxt.optimizer
            return self.model, self.optimizer, carried
        model, optimizer = build(layout)
        self.attach(model, optimizer, carried.step)
        return self.model, self.optimizer, carried

    @classmethod
    def join(cls, registry: Registry, layout: Layout, rank: int, build: Callable[[Layout], Tuple], *,
             timeout: float = 600.0, device=None) -> Tuple["Job", Training]:
        """A process that holds nothing yet (it joins a running job, its
        registry made with layout None and rank -1) takes part in the switch
        to `rank` of `layout`: it receives its state (on `device`, by
        default the host), build(layout) makes its model and optimizer as
        Job.switch's build does, and it returns (job, carried): job.model
        and job.optimizer train on from carried.step."""
        new, carried = _state.switch(registry, None, layout, rank, timeout=timeout, device=device)
        job = cls.__new__(cls)
        job.registry, job.layout, job.rank, job.state = registry, layout, rank, new
        job._bind = job.model = job.optimizer = job._next = None
        model, optimizer = build(layout)
        job.attach(model, optimizer, carried.step)
        return job, carried

    def attach(self, model, optimizer, step: int) -> None:
        """Hand the model (or model parts) and optimizer, built for the job's
        layout, the job's buffers as they are (no copy), with Adam at
        `step`. Job.switch does it with build's objects; call it again if
        build failed after the switch."""
        bind = _Binding(self.state.view, model, optimizer)
        if bind.device.type not in ("meta", self.state.device.type):
            raise InvalidInput("the model is on %s, the job's buffers on %s: build the model on the meta device "
                               "or on the buffers'" % (bind.device, self.state.device))
        bind.hand(self.state, step)
        self._bind, self.model, self.optimizer = bind, model, optimizer

    def close(self) -> None:
        """Empty PyTorch's tensors and free the buffers (the registry still
        has to be closed)."""
        if self.state:
            self.discard()
        if self._bind:
            self._bind.release()
        if self.state:
            self.registry.reset(None, -1)
            self.state.free()
        self._bind = self.state = self.model = self.optimizer = None
