"""Models, layouts and what one rank holds, as vps computes them.

A trainer builds its flat buffers from a RankView instead of re-deriving
Megatron-LM's rules: which parameters this rank holds, under which names,
at which offsets of which buffer, and which logical box of each tensor every
region of a buffer is."""
from __future__ import annotations

import ctypes as C
import fnmatch
import os
from collections import namedtuple
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ._lib import (Box as _Box, Coords as _Coords, Devices, Model as _Model, Parallel as _Parallel,
                   Holders as _Holders, RankView as _RankView, Region as _Region, Tensor, Topology as _Topology,
                   call, lib)
from .errors import Error, InvalidInput, closed as _closed

__all__ = ["STATES", "PARAM", "MAIN_PARAM", "EXP_AVG", "EXP_AVG_SQ", "GRAD", "MODULE_BUFFER", "MOMENTUM_BUFFER",
           "BF16", "FP32", "INT16", "DTYPES", "OPTIMIZERS", "Buffer", "Param", "Region", "Holder", "Coords", "Model",
           "Layout", "RankView", "layout"]

STATES = ("param", "main_param", "exp_avg", "exp_avg_sq", "grad", "module_buffer", "momentum_buffer")
PARAM, MAIN_PARAM, EXP_AVG, EXP_AVG_SQ, GRAD, MODULE_BUFFER, MOMENTUM_BUFFER = range(7)
# int16: the low 16 bits of fp32 main params over bf16 ones (the precision-aware optimizer's)
BF16, FP32, INT16 = 0, 1, 2
DTYPES = ("bf16", "fp32", "int16")
DTYPE_SIZE = {BF16: 2, FP32: 4, INT16: 2}
OPTIMIZERS = ("adam", "sgd", "muon", "lion")

# Tensor kinds (enum vps_tensor_kind) that Megatron holds as 2-D weights;
# every other kind (norms, biases) is 1-D.
_MATRIX_KINDS = {0, 1, 2, 6, 16, 18, 20, 21, 23, 27,
                 29, 30, 32, 33, 35, 36, 37,  # MLA projections, shared experts
                 42}  # MTP eh_proj
_SPLIT_AXIS = 1


def _config_path(sub):
    roots = [r for r in os.environ.get("VPS_CONFIG_PATH", "").split(":") if r]
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
    if os.path.isdir(bundled):  # pip install put them beside the module
        roots.append(bundled)
    roots.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs"))
    try:
        from . import _prefix
        roots.append(os.path.join(_prefix.DATADIR, "configs"))
    except ImportError:
        pass
    return ":".join(os.path.join(r, sub) for r in roots)


def _word(table, v):
    return table[v] if isinstance(v, int) and 0 <= v < len(table) else v


class Buffer(namedtuple("Buffer", "id state dtype chunk expert sharded elements layerwise host")):
    """One flat buffer of a rank: a state of one model chunk, dense or expert, or the chunk's
    module buffers (state module_buffer). state and dtype are numbers (STATES and DTYPES
    name them). layerwise: the layer-wise optimizer's buffer (Muon or Lion with zero=1), its
    2-D weights each whole in one DP rank's shard; the chunk's other parameters are in the
    buffers without it. host: the part of an optimizer state that offload=F keeps in host
    memory (Megatron's HybridDeviceOptimizer); the buffer of the same state without it holds
    the rest, on the GPU."""
    __slots__ = ()

    def __repr__(self):
        return ("Buffer(id=%d, state=%s, dtype=%s, chunk=%d, expert=%s, sharded=%s, elements=%d%s%s)"
                % (self.id, _word(STATES, self.state), _word(DTYPES, self.dtype), self.chunk, self.expert,
                   self.sharded, self.elements, ", layerwise=True" if self.layerwise else "",
                   ", host=True" if self.host else ""))


class Param(namedtuple("Param", "index name local_name tensor chunk local_layer local_expert expert output_copy "
                                "offset elements bucket shape module_buffer layerwise")):
    """A parameter as Megatron's model chunk holds it: name is the global name, local_name the name
    inside its chunk (what named_parameters() gives; in a DTensor layout, family=dtensor, both are
    torchtitan's name and chunk is the model part), shape the local torch shape (a DTensor layout's
    local shard, without FSDP2's padding), offset and
    elements where it sits in its chunk's unsharded buffers (vocabulary padding included).
    With module_buffer it is a module's register_buffer (the router's expert_bias), held in
    the chunk's module_buffer buffer only. tensor is the logical tensor's id (Model.tensor_name).
    layerwise: in the chunk's layer-wise optimizer's buffers (Buffer.layerwise)."""
    __slots__ = ()


class Region(namedtuple("Region", "tensor state buffer lo hi offset strides param name dtype")):
    """A box [lo, hi) of a logical tensor in a buffer: element i is at
    offset + sum((i - lo) * strides). tensor is the tensor's id, name its global name,
    state and dtype numbers (STATES and DTYPES name them); param indexes RankView.params."""
    __slots__ = ()

    def __repr__(self):
        return ("Region(%s, state=%s, buffer=%d, box=[%s], offset=%d, strides=%s, param=%d)"
                % (self.name, _word(STATES, self.state), self.buffer,
                   ", ".join("%d:%d" % lh for lh in zip(self.lo, self.hi)), self.offset, self.strides, self.param))


class Holder(namedtuple("Holder", "name state ranks buffer lo hi offset strides bytes")):
    """Who holds a (tensor, state) region, as vps-layout --tensor answers it: the tensor's name,
    the state's name, ranks (a range: every rank of it holds the region at the same buffer and
    offset), the buffer, the box [lo, hi), its offset and strides in the buffer, and its bytes."""
    __slots__ = ()

    def __repr__(self):
        r = self.ranks
        ranks = str(r.start) if len(r) == 1 else "%d-%d%s" % (r.start, r[-1], "" if r.step == 1 else ":%d" % r.step)
        return ("Holder(%s, state=%s, ranks=%s, buffer=%d, box=[%s], offset=%d, strides=%s, bytes=%d)"
                % (self.name, self.state, ranks, self.buffer,
                   ", ".join("%d:%d" % lh for lh in zip(self.lo, self.hi)), self.offset, self.strides, self.bytes))


# cp last: code that unpacks the first three as (tp, dp, pp) keeps working
Coords = namedtuple("Coords", "tp dp pp etp ep edp cp")
Coords.__doc__ = ("A rank's coordinates in its layout: tensor, data and pipeline parallel, expert tensor, expert "
                  "and expert data parallel, context parallel.")

# a state: its number (PARAM...) or its name ("param"...)
StateLike = Union[int, str]


class Model:
    """A model of configs/models by name, a vps model file or a Hugging Face config.json.
    Its fields (name, hidden, layers, heads, ffn, vocab, experts, ...) are
    attributes; a name no config has raises vps.NotFound."""

    def __init__(self, spec: str) -> None:
        self._m = _Model()
        call("vps_model_load", C.byref(self._m), spec.encode(), _config_path("models").encode(), what="model")
        self.spec = spec

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        v = getattr(self._m, name)
        return v.decode() if isinstance(v, bytes) else v

    @property
    def num_tensors(self) -> int:
        """How many logical tensors the model has (ids 0 to num_tensors - 1)."""
        return lib.vps_model_num_tensors(C.byref(self._m))

    def tensor(self, tid: int) -> Tensor:
        """The logical tensor tid: (name, kind, shape, split, axis, is_expert)."""
        t = Tensor()
        call("vps_model_tensor", C.byref(self._m), tid, C.byref(t))
        return t

    def tensor_name(self, tid: int) -> str:
        """The global (Megatron) name of logical tensor tid."""
        names = self.__dict__.setdefault("_names", {})
        if tid not in names:
            t = self.tensor(tid)
            buf = C.create_string_buffer(512)
            lib.vps_tensor_name(C.byref(t), buf, len(buf))
            names[tid] = buf.value.decode()
        return names[tid]

    def tensor_shape(self, tid: int) -> Tuple[int, ...]:
        """The whole logical shape of tensor tid."""
        t = self.tensor(tid)
        return tuple(t.shape[k] for k in range(t.ndim))

    def find(self, name: str) -> int:
        """The id of the tensor of this global name; vps.NotFound if none."""
        tid = C.c_uint32()
        call("vps_model_find_tensor", C.byref(self._m), name.encode(), C.byref(tid))
        return tid.value


def _parallel(model, spec):
    p = _Parallel()
    lib.vps_parallel_init(C.byref(p))
    hint = C.create_string_buffer(64)
    call("vps_parallel_load", C.byref(p), spec.encode(), _config_path("parallel").encode(), hint, len(hint),
         what="parallel")
    call("vps_parallel_validate", C.byref(p), C.byref(model._m), b"parallel")
    return p


class Layout:
    """A parallel configuration applied to a model on packed devices (or read
    from a layout file written by vps-layout(1)). Its hash is what vps-plan and
    vps-exec know it by: the same model, configuration and devices give the
    same hash in every process. After close(), every method but close()
    raises vps.InvalidInput; RankViews taken before stay valid. A Layout is
    a context manager: `with vps.layout(...) as lay:` closes it at the end."""

    def __init__(self, handle: int, model: Optional[Model] = None) -> None:
        self._h = C.c_void_p(handle)
        self.model = model

    @classmethod
    def new(cls, model: Union[Model, str], parallel: str, gpus_per_node: int = 8, first_node: int = 0) -> "Layout":
        """The layout of model under parallel on packed devices: what vps.layout() returns."""
        if isinstance(model, str):
            model = Model(model)
        p = _parallel(model, parallel)
        d = Devices()
        lib.vps_devices_packed(C.byref(d), gpus_per_node, first_node)
        h = C.c_void_p()
        try:
            call("vps_layout_new", C.byref(h), C.byref(model._m), C.byref(p), C.byref(d), b"layout")
        finally:
            lib.vps_devices_release(C.byref(d))
        return cls(h.value, model)

    @classmethod
    def load(cls, path: str) -> "Layout":
        """The layout in a file vps-layout -o wrote."""
        h = C.c_void_p()
        call("vps_layout_load", C.byref(h), path.encode())
        lay = cls(h.value)
        m = Model.__new__(Model)
        m._m = _Model.from_buffer_copy(lib.vps_layout_model(lay._h).contents)
        m.spec = path
        lay.model = m
        return lay

    def close(self) -> None:
        """Free the layout. Closing a closed layout does nothing."""
        if getattr(self, "_h", None) and lib:
            lib.vps_layout_free(self._h)
        self._h = None

    def __enter__(self) -> "Layout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    @property
    def closed(self) -> bool:
        """Whether close() freed the layout."""
        return not getattr(self, "_h", None)

    def _handle(self):
        if self.closed:
            raise _closed("layout of %s" % (self.model.spec if self.model else "?"))
        return self._h

    def __repr__(self):
        if self.closed:
            return "Layout(closed)"
        return "Layout(%s, %s, world %d, hash 0x%016x)" % (self.model.name, self.describe(), self.world, self.hash)

    @property
    def hash(self) -> int:
        """What vps-plan, vps-exec and the registry know the layout by (64 bits)."""
        return lib.vps_layout_hash(self._handle())

    @property
    def world(self) -> int:
        """How many ranks the layout has."""
        return lib.vps_layout_world(self._handle())

    @property
    def parallel(self) -> Dict[str, int]:
        """The parallel configuration, a dict: tp, pp, dp, cp, ep, etp, vpp, zero, ..., family (0
        Megatron's, 1 a DTensor mesh's), optimizer (a number OPTIMIZERS names)."""
        p = lib.vps_layout_parallel(self._handle()).contents
        return {k: getattr(p, k) for k, _ in p._fields_}

    def state_dtype(self, state: StateLike) -> int:
        """The dtype (a number DTYPES names) the layout holds a state in: fp32 but for the
        params (bf16) and, with precision_aware=1, main_param (int16) and the moments asked
        for in bf16."""
        return lib.vps_layout_state_dtype(self._handle(), _state_number(state))

    def states_of(self, tensor: Union[str, int]) -> List[int]:
        """The states (numbers STATES names) the layout holds a tensor (a global name or an id)
        in: param, main_param, grad with grad=1 and its optimizer's; module_buffer alone for a
        module buffer; main_param, exp_avg and exp_avg_sq in a DTensor layout."""
        m = self.model
        t = m.tensor(m.find(tensor) if isinstance(tensor, str) else tensor)
        return [s for s in range(len(STATES)) if lib.vps_layout_tensor_has_state(self._handle(), C.byref(t), s)]

    def optimizer_of(self, tensor: Union[str, int]) -> Optional[str]:
        """The optimizer (a name of OPTIMIZERS) that steps a tensor (a global name or an id):
        with Muon or Lion, the 2-D weights but the embeddings and the output layer are theirs
        and the rest their scalar optimizer's. None for a module buffer."""
        m = self.model
        t = m.tensor(m.find(tensor) if isinstance(tensor, str) else tensor)
        o = lib.vps_layout_tensor_optimizer(self._handle(), C.byref(t))
        return OPTIMIZERS[o] if o >= 0 else None

    def describe(self) -> str:
        """The parallel configuration as a spec ("tp=2,pp=2,dp=2,zero=1")."""
        buf = C.create_string_buffer(256)
        lib.vps_parallel_format(lib.vps_layout_parallel(self._handle()), buf, len(buf))
        return buf.value.decode()

    def coords(self, r: int) -> Coords:
        """Rank r's coordinates (tp, dp, pp, etp, ep, edp, cp), without its view."""
        if not 0 <= r < self.world:
            raise InvalidInput("rank %d is outside the layout's world of %d" % (r, self.world))
        c = _Coords()
        lib.vps_layout_coords(self._handle(), r, C.byref(c))
        return Coords(*(getattr(c, k) for k in Coords._fields))

    def rank(self, r: int) -> "RankView":
        """What rank r holds: its RankView."""
        if not 0 <= r < self.world:
            raise InvalidInput("rank %d is outside the layout's world of %d" % (r, self.world))
        v = _RankView()
        call("vps_layout_rank", self._handle(), r, C.byref(v))
        try:
            return RankView(self, v)
        finally:
            lib.vps_rank_view_release(C.byref(v))

    def holders(self, tensor: str, state: Optional[StateLike] = None,
                box: Optional[Sequence[Tuple[int, int]]] = None) -> List[Holder]:
        """Who holds a tensor, the Python form of vps-layout --tensor: a list of
        Holder, one per region of each (tensor, state) pair, with the ranks that
        hold it at the same buffer and offset (a range, never enumerated).

        tensor is a global name or an fnmatch glob ("decoder.layers.17.*fc1*");
        state a state's name or number (default: every state the layout holds);
        box, a sequence of (lo, hi) per axis, keeps only what intersects it,
        clipped to it. A name no tensor has, a glob nothing matches, a state the
        layout does not hold and a box outside the tensor raise vps.InvalidInput."""
        h = self._handle()
        m = self.model
        st = None if state is None else _state_number(state)
        if st is not None and not lib.vps_layout_has_state(h, st):
            raise InvalidInput("this layout holds no %s (%s)" % (STATES[st], _why_not(st, self.parallel)))
        if any(c in tensor for c in "*?["):
            ids = [i for i in range(m.num_tensors) if fnmatch.fnmatchcase(m.tensor_name(i), tensor)]
            if not ids:
                raise InvalidInput("%s has no tensor matching '%s'" % (m.name, tensor))
        else:
            try:
                ids = [m.find(tensor)]
            except Error:
                raise InvalidInput("%s has no tensor named '%s' (a glob such as 'decoder.layers.0.*' lists "
                                    "names)" % (m.name, tensor)) from None
        want = None
        if box is not None:
            want = _Box()
            want.ndim = len(box)
            if not 1 <= want.ndim <= len(want.lo):
                raise InvalidInput("box: 1 to %d axes, not %d" % (len(want.lo), want.ndim))
            for k, (lo, hi) in enumerate(box):
                if not 0 <= lo < hi:
                    raise InvalidInput("box: axis %d: %d:%d is empty or negative" % (k, lo, hi))
                want.lo[k], want.hi[k] = lo, hi
        out = []
        found = _Holders()
        try:
            for tid in ids:
                t = m.tensor(tid)
                name = m.tensor_name(tid)
                if want is not None:
                    if t.ndim != want.ndim:
                        if len(ids) > 1:
                            continue
                        raise InvalidInput("box: %d axes, %s has %d" % (want.ndim, name, t.ndim))
                    for k in range(t.ndim):
                        if want.hi[k] > t.shape[k]:
                            raise InvalidInput("box: axis %d: %d:%d is outside %s, 0:%d"
                                               % (k, want.lo[k], want.hi[k], name, t.shape[k]))
                for s in range(len(STATES)) if st is None else (st,):
                    if not lib.vps_layout_tensor_has_state(h, C.byref(t), s):
                        continue
                    found.n = 0
                    call("vps_layout_holders", h, tid, s, C.byref(want) if want is not None else None,
                         C.byref(found))
                    for i in range(found.n):
                        x = found.v[i]
                        part = x.region
                        if want is not None:
                            b = _Box()
                            if not lib.vps_box_intersect(C.byref(x.region.box), C.byref(want), C.byref(b)):
                                continue
                            part = _Region()
                            lib.vps_region_restrict(C.byref(x.region), C.byref(b), C.byref(part))
                        nd = part.box.ndim
                        lo, hi = tuple(part.box.lo[:nd]), tuple(part.box.hi[:nd])
                        volume = 1
                        for a, z in zip(lo, hi):
                            volume *= z - a
                        out.append(Holder(name, STATES[s], range(x.base, x.base + x.stride * x.count, x.stride or 1),
                                          part.buffer, lo, hi, part.offset, tuple(part.strides[:nd]),
                                          volume * DTYPE_SIZE[lib.vps_layout_state_dtype(h, s)]))
        finally:
            lib.vps_holders_release(C.byref(found))
        return out


def layout(model: Union[Model, str], parallel: str, gpus_per_node: int = 8, first_node: int = 0) -> Layout:
    """vps.layout(model, "tp=2,pp=2,dp=2,zero=1"): the Layout of a model (a
    Model or a name) under a parallel configuration (a spec, a name of
    configs/parallel or a file), on nodes of gpus_per_node devices from
    first_node. A model or configuration no file has raises vps.NotFound,
    one that is invalid vps.InvalidInput."""
    return Layout.new(model, parallel, gpus_per_node, first_node)


class Topology(namedtuple("Topology", "name gpus_per_node intra_node_bandwidth inter_node_bandwidth "
                                       "memory_bandwidth latency gpu_memory path")):
    """A cluster's links as vps-plan --topology weighs them: bandwidths in
    bytes per second in one direction for one GPU (NVLink, its share of the
    NICs, a local copy), the latency of a message in seconds, gpus_per_node
    and gpu_memory (bytes, 0: not said) as the file says; path: what was
    asked for, the argument to pass to vps-plan(1) --topology."""


def topology(spec: str) -> Topology:
    """vps.topology("a800-testbed"): a topology of configs/topologies by
    name, or a topology file (vps-formats(5)). One no file has raises
    vps.NotFound, a file that is not one vps.BadFormat or vps.InvalidInput."""
    t = _Topology()
    call("vps_topology_load", C.byref(t), spec.encode(), _config_path("topologies").encode(), what="topology")
    return Topology(t.name.decode(errors="replace"), t.gpus_per_node, t.intra_node_bandwidth, t.inter_node_bandwidth,
                    t.memory_bandwidth, t.latency, t.gpu_memory, spec)


class RankView:
    """What one rank holds under a layout (a copy of vps_layout_rank's answer):
    rank, coords, buffers (Buffer), params (Param) and regions (Region)."""

    layout: Layout
    rank: int
    coords: Coords
    buffers: List[Buffer]
    params: List[Param]
    regions: List[Region]

    def __init__(self, lay: Layout, v: _RankView) -> None:
        m = lay.model
        par = lay.parallel
        self.layout = lay
        self.rank = v.rank
        self.coords = Coords(*(getattr(v.coords, k) for k in Coords._fields))
        self.buffers = [Buffer(b.id, b.state, b.dtype, b.chunk, b.expert, b.sharded, b.elements, b.layerwise,
                               b.host)
                        for b in v.buffers[:v.nbuffers]]
        self.params = []
        name = C.create_string_buffer(256)
        for i, p in enumerate(v.params[:v.nparams]):
            t = m.tensor(p.tensor)
            lib.vps_tensor_name(C.byref(t), name, len(name))
            gname = name.value.decode()
            lib.vps_layout_param_name(self.layout._h, C.byref(p), name, len(name))
            lname = name.value.decode()
            if p.output_copy:
                gname = lname
            if p.ndim:
                # a DTensor layout: a parameter is named by its module path
                # (w1 and w3 share linear_fc1's tensor), shaped as its shard
                gname = lname
                shape = tuple(p.shape[:p.ndim])
            else:
                shape = _local_shape(t, p.elements, par["etp"] if p.expert else par["tp"])
            self.params.append(Param(i, gname, lname, p.tensor, p.chunk, p.local_layer, p.local_expert, p.expert,
                                     p.output_copy, p.offset, p.elements, p.bucket, shape, t.module_buffer,
                                     p.layerwise))
        self.regions = []
        for i, r in enumerate(v.regions[:v.nregions]):
            nd = r.box.ndim
            self.regions.append(Region(r.tensor, r.state, r.buffer, tuple(r.box.lo[:nd]), tuple(r.box.hi[:nd]),
                                       r.offset, tuple(r.strides[:nd]), v.region_param[i], m.tensor_name(r.tensor),
                                       v.buffers[r.buffer].dtype))
        self._by_name = {p.name: p for p in self.params}

    def __repr__(self):
        return "RankView(rank %d of %s: %d buffers, %d params, %d regions)" % (
            self.rank, self.layout.describe() if not self.layout.closed else "a closed layout", len(self.buffers),
            len(self.params), len(self.regions))

    def param(self, name: str) -> Param:
        """The parameter of this global name; vps.InvalidInput if the rank holds none."""
        p = self._by_name.get(name)
        if p is None:
            raise InvalidInput("rank %d holds no parameter %s under %s" % (self.rank, name, self.layout.describe()))
        return p

    def buffer(self, state: StateLike, chunk: int = 0, expert: bool = False,
               layerwise: bool = False, host: bool = False) -> Optional[int]:
        """Index of the buffer of (state, chunk, dense or expert, the layer-wise optimizer's
        or not, in host memory or not), or None."""
        for b in self.buffers:
            if (b.state == state and b.chunk == chunk and b.expert == expert and b.layerwise == layerwise
                    and b.host == host):
                return b.id
        return None

    def regions_of(self, what: Union[StateLike, None] = None, buffer: Optional[int] = None, *,
                   state: Optional[StateLike] = None, tensor: Union[str, int, None] = None) -> List[Region]:
        """The regions of a state, of a buffer and of a tensor, each None for
        any: regions_of(vps.MAIN_PARAM), regions_of("exp_avg", buffer=2),
        regions_of("decoder.layers.0.mlp.linear_fc1.weight", state="param").
        what is a state (a number or a name) or a tensor's global name; state
        and tensor (a name or an id) say which explicitly; buffer indexes
        buffers. A name that is neither a state nor a tensor of the model, and
        a number out of range, raise vps.InvalidInput."""
        if isinstance(what, str) and what not in STATES:
            if tensor is not None:
                raise InvalidInput("regions_of: %s is not a state (%s)" % (what, ", ".join(STATES)))
            tensor = what
        elif what is not None:
            if state is not None:
                raise InvalidInput("regions_of: two states given, %r and %r" % (what, state))
            state = what
        if state is not None:
            state = _state_number(state)
        if buffer is not None and not (isinstance(buffer, int) and 0 <= buffer < len(self.buffers)):
            raise InvalidInput("regions_of: buffer %r: rank %d has buffers 0 to %d"
                               % (buffer, self.rank, len(self.buffers) - 1))
        model = self.layout.model
        if isinstance(tensor, str):
            try:
                tensor = model.find(tensor)
            except Error:
                raise InvalidInput("regions_of: %r is neither a state (%s) nor a tensor of %s"
                                   % (tensor, ", ".join(STATES), model.name)) from None
        elif tensor is not None and not (isinstance(tensor, int) and 0 <= tensor < model.num_tensors):
            raise InvalidInput("regions_of: tensor %r: not a name nor an id of %s (0 to %d)"
                               % (tensor, model.name, model.num_tensors - 1))
        return [r for r in self.regions if (state is None or r.state == state)
                and (buffer is None or r.buffer == buffer) and (tensor is None or r.tensor == tensor)]


def _why_not(st: int, par: Dict[str, int]) -> str:
    """Why a layout lacks a state, for messages (the words of vps-layout --tensor)."""
    if st == MODULE_BUFFER:
        return "the model has no module buffers"
    if par["family"] == 1:
        return "family=dtensor holds main_param, exp_avg and exp_avg_sq"
    if st == GRAD:
        return "grad=1 adds it"
    if OPTIMIZERS[par["optimizer"]] in ("muon", "lion"):
        return "neither %s nor %s keeps one" % (OPTIMIZERS[par["optimizer"]], OPTIMIZERS[par["scalar_optimizer"]])
    return "%s keeps none" % OPTIMIZERS[par["optimizer"]]


def _state_number(state: StateLike) -> int:
    """A state's number from its name or number; anything else raises vps.InvalidInput."""
    if isinstance(state, str):
        if state not in STATES:
            raise InvalidInput("%s: not a state (%s)" % (state, ", ".join(STATES)))
        return STATES.index(state)
    if not isinstance(state, int) or isinstance(state, bool) or not 0 <= state < len(STATES):
        raise InvalidInput("%r: not a state (0 to %d: %s)" % (state, len(STATES) - 1, ", ".join(STATES)))
    return state


def _local_shape(t, elements, tp):
    if t.kind not in _MATRIX_KINDS:
        return (elements,)
    cols = t.shape[t.ndim - 1]
    if t.split == _SPLIT_AXIS and t.axis == t.ndim - 1:
        cols //= tp
    if cols <= 0 or elements % cols:
        raise InvalidInput("tensor %d: %d local elements are not rows of %d" % (t.id, elements, cols))
    return (elements // cols, cols)
