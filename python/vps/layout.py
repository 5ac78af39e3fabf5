"""Models, layouts and what one rank holds, as vps computes them.

A trainer builds its flat buffers from a RankView instead of re-deriving
Megatron-LM's rules: which parameters this rank holds, under which names,
at which offsets of which buffer, and which logical box of each tensor every
region of a buffer is."""
import ctypes as C
import os
from collections import namedtuple

from ._lib import Coords as _Coords, Devices, Error, Model as _Model, Parallel as _Parallel, RankView as _RankView, Tensor, call, lib

STATES = ("param", "main_param", "exp_avg", "exp_avg_sq", "grad", "module_buffer")
PARAM, MAIN_PARAM, EXP_AVG, EXP_AVG_SQ, GRAD, MODULE_BUFFER = range(6)
BF16, FP32 = 0, 1
DTYPE_SIZE = {BF16: 2, FP32: 4}

# Tensor kinds (enum vps_tensor_kind) that Megatron holds as 2-D weights;
# every other kind (norms, biases) is 1-D.
_MATRIX_KINDS = {0, 1, 2, 6, 16, 18, 20, 21, 23, 27,
                 29, 30, 32, 33, 35, 36, 37,  # MLA projections, shared experts
                 42}  # MTP eh_proj
_SPLIT_AXIS = 1


def _config_path(sub):
    roots = [r for r in os.environ.get("VPS_CONFIG_PATH", "").split(":") if r]
    roots.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs"))
    try:
        from . import _prefix
        roots.append(os.path.join(_prefix.DATADIR, "configs"))
    except ImportError:
        pass
    return ":".join(os.path.join(r, sub) for r in roots)


Buffer = namedtuple("Buffer", "id state dtype chunk expert sharded elements")
Buffer.__doc__ = ("One flat buffer of a rank: a state of one model chunk, dense or expert, or the chunk's "
                  "module buffers (state module_buffer).")
Param = namedtuple("Param", "index name local_name tensor chunk local_layer local_expert expert output_copy "
                   "offset elements bucket shape module_buffer")
Param.__doc__ = ("A parameter as Megatron's model chunk holds it: name is the global name, local_name the name "
                 "inside its chunk (what named_parameters() gives), shape the local torch shape, offset and "
                 "elements where it sits in its chunk's unsharded buffers (vocabulary padding included). "
                 "With module_buffer it is a module's register_buffer (the router's expert_bias), held in "
                 "the chunk's module_buffer buffer only.")
Region = namedtuple("Region", "tensor state buffer lo hi offset strides param")
Region.__doc__ = ("A box [lo, hi) of a logical tensor in a buffer: element i is at "
                  "offset + sum((i - lo) * strides). param indexes RankView.params.")
# cp last: code that unpacks the first three as (tp, dp, pp) keeps working
Coords = namedtuple("Coords", "tp dp pp etp ep edp cp")


class Model:
    """A model of configs/models by name, a vps model file or a Hugging Face config.json."""

    def __init__(self, spec):
        self._m = _Model()
        call("vps_model_load", C.byref(self._m), spec.encode(), _config_path("models").encode(), what="model")
        self.spec = spec

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        v = getattr(self._m, name)
        return v.decode() if isinstance(v, bytes) else v

    @property
    def num_tensors(self):
        return lib.vps_model_num_tensors(C.byref(self._m))

    def tensor(self, tid):
        """The logical tensor tid: (name, kind, shape, split, axis, is_expert)."""
        t = Tensor()
        call("vps_model_tensor", C.byref(self._m), tid, C.byref(t))
        return t

    def tensor_name(self, tid):
        t = self.tensor(tid)
        buf = C.create_string_buffer(256)
        lib.vps_tensor_name(C.byref(t), buf, len(buf))
        return buf.value.decode()

    def tensor_shape(self, tid):
        t = self.tensor(tid)
        return tuple(t.shape[k] for k in range(t.ndim))

    def find(self, name):
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
    same hash in every process."""

    def __init__(self, handle, model=None):
        self._h = C.c_void_p(handle)
        self.model = model

    @classmethod
    def new(cls, model, parallel, gpus_per_node=8, first_node=0):
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
    def load(cls, path):
        h = C.c_void_p()
        call("vps_layout_load", C.byref(h), path.encode())
        lay = cls(h.value)
        m = Model.__new__(Model)
        m._m = _Model.from_buffer_copy(lib.vps_layout_model(lay._h).contents)
        m.spec = path
        lay.model = m
        return lay

    def close(self):
        if getattr(self, "_h", None) and lib:
            lib.vps_layout_free(self._h)
        self._h = None

    def __del__(self):
        self.close()

    @property
    def hash(self):
        return lib.vps_layout_hash(self._h)

    @property
    def world(self):
        return lib.vps_layout_world(self._h)

    @property
    def parallel(self):
        p = lib.vps_layout_parallel(self._h).contents
        return {k: getattr(p, k) for k, _ in p._fields_}

    def describe(self):
        buf = C.create_string_buffer(256)
        lib.vps_parallel_format(lib.vps_layout_parallel(self._h), buf, len(buf))
        return buf.value.decode()

    def coords(self, r):
        """Rank r's coordinates (tp, dp, pp, etp, ep, edp, cp), without its view."""
        if not 0 <= r < self.world:
            raise Error(1, "rank %d is outside the layout's world of %d" % (r, self.world))
        c = _Coords()
        lib.vps_layout_coords(self._h, r, C.byref(c))
        return Coords(*(getattr(c, k) for k in Coords._fields))

    def rank(self, r):
        """What rank r holds: its RankView."""
        if not 0 <= r < self.world:
            raise Error(1, "rank %d is outside the layout's world of %d" % (r, self.world))
        v = _RankView()
        call("vps_layout_rank", self._h, r, C.byref(v))
        try:
            return RankView(self, v)
        finally:
            lib.vps_rank_view_release(C.byref(v))


def layout(model, parallel, gpus_per_node=8, first_node=0):
    """vps.layout(model, "tp=2,pp=2,dp=2,zero=1"): the Layout of a model (a
    Model or a name) under a parallel configuration (a spec, a name of
    configs/parallel or a file)."""
    return Layout.new(model, parallel, gpus_per_node, first_node)


class RankView:
    """What one rank holds under a layout (a copy of vps_layout_rank's answer)."""

    def __init__(self, lay, v):
        m = lay.model
        par = lay.parallel
        self.layout = lay
        self.rank = v.rank
        self.coords = Coords(*(getattr(v.coords, k) for k in Coords._fields))
        self.buffers = [Buffer(b.id, b.state, b.dtype, b.chunk, b.expert, b.sharded, b.elements)
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
            self.params.append(Param(i, gname, lname, p.tensor, p.chunk, p.local_layer, p.local_expert, p.expert,
                                     p.output_copy, p.offset, p.elements, p.bucket,
                                     _local_shape(t, p.elements, par["etp"] if p.expert else par["tp"]),
                                     t.module_buffer))
        self.regions = []
        for i, r in enumerate(v.regions[:v.nregions]):
            nd = r.box.ndim
            self.regions.append(Region(r.tensor, r.state, r.buffer, tuple(r.box.lo[:nd]), tuple(r.box.hi[:nd]),
                                       r.offset, tuple(r.strides[:nd]), v.region_param[i]))
        self._by_name = {p.name: p for p in self.params}

    def param(self, name):
        """The parameter of this global name."""
        p = self._by_name.get(name)
        if p is None:
            raise Error(1, "rank %d holds no parameter %s under %s" % (self.rank, name, self.layout.describe()))
        return p

    def buffer(self, state, chunk=0, expert=False):
        """Index of the buffer of (state, chunk, dense or expert), or None."""
        for b in self.buffers:
            if b.state == state and b.chunk == chunk and b.expert == expert:
                return b.id
        return None

    def regions_of(self, state=None, buffer=None):
        return [r for r in self.regions if (state is None or r.state == state)
                and (buffer is None or r.buffer == buffer)]


def _local_shape(t, elements, tp):
    if t.kind not in _MATRIX_KINDS:
        return (elements,)
    cols = t.shape[t.ndim - 1]
    if t.split == _SPLIT_AXIS and t.axis == t.ndim - 1:
        cols //= tp
    if cols <= 0 or elements % cols:
        raise Error(1, "tensor %d: %d local elements are not rows of %d" % (t.id, elements, cols))
    return (elements // cols, cols)
