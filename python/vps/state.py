"""A rank's training state under one layout, as torch tensors, and the switch.

State.allocate() makes every flat buffer of the rank's view (host memory in
shared-memory objects the registry owns, or CUDA memory from PyTorch's
allocator) and registers it; param() gives each parameter as a view of its
buffer in Megatron's local shape; switch() moves the whole state to another
layout through vps-exec and returns the new State.

Needs PyTorch: without it, importing this module (or vps.State) raises
ModuleNotFoundError saying how to get it."""
from __future__ import annotations

import contextlib
import ctypes as C
import gc
import time
from typing import Callable, Dict, Iterable, Iterator, Mapping, Optional, Tuple, Union

from ._lib import import_torch
from .errors import CheckFailed, Error, InvalidInput, closed as _closed
from .layout import BF16, DTYPE_SIZE, FP32, INT16, MODULE_BUFFER, PARAM, STATES, Layout, Model, Param, RankView, \
    Region, StateLike, _state_number
from .registry import FAILED, REQUESTED, RUNNING, SOURCE, TARGET, Registry, Training

torch = import_torch("vps.State (and vps.switch, vps.assemble, vps.correspondence, vps.region_index)")

__all__ = ["TORCH_DTYPE", "State", "switch", "assemble", "correspondence", "region_index"]

TORCH_DTYPE = {BF16: torch.bfloat16, FP32: torch.float32, INT16: torch.int16}


class State:
    """The buffers of `rank` under `layout`: buffers[i] is a 1-D tensor of
    view.buffers[i]'s dtype and elements, on `device`.

    A State is closed once free() gave its memory back (vps.switch frees the
    one it leaves), and a State of host buffers once its Registry is closed
    (they are unmapped): then every method but free() raises
    vps.InvalidInput.

    A State is a context manager: at the end of `with vps.State.allocate(...)
    as state:` it is freed, and its registry, when it still runs the state's
    layout and rank, is reset to run nothing first (vps-exec must not reach
    freed memory)."""

    layout: Layout
    rank: int
    view: RankView
    device: torch.device
    buffers: list

    def __init__(self, layout: Layout, rank: int, device: Union[str, torch.device] = "cpu") -> None:
        self.layout = layout
        self.rank = rank
        self.view = layout.rank(rank)
        self._hash = layout.hash
        self.device = torch.device(device)
        self.buffers = []
        self._host = {}  # buffer id -> (address, shared-memory name), host memory only
        self._registry = None
        self._gone = None  # why the state is closed, once it is

    def __repr__(self):
        return "State(rank %d of %s on %s%s)" % (self.rank, self.view.layout.describe() if not self.layout.closed
                                                else "a closed layout", self.device,
                                                ", closed: " + self._gone if self._gone else "")

    @property
    def closed(self) -> bool:
        """Whether free() gave the memory back, or a closed registry unmapped it."""
        return self._gone is not None

    def __enter__(self) -> "State":
        return self

    def __exit__(self, *exc) -> None:
        if self.closed:
            return
        reg = self._registry
        if reg is not None and not reg.closed and (reg.layout_hash, reg.rank) == (self._hash, self.rank):
            reg.reset(None, -1)
        self.free()

    def _live(self):
        if self._gone:
            raise _closed("state of rank %d (%s)" % (self.rank, self._gone))

    def _unmapped(self):
        """Registry.close(): the host buffers are gone with the registry's objects."""
        if self._host and not self._gone:
            self.buffers = []
            self._host = {}
            self._gone = "its registry %s was closed, which unmapped its host buffers" % self._registry.name

    @classmethod
    def allocate(cls, registry: Registry, layout: Layout, rank: int, role: int = SOURCE,
                 device: Union[str, torch.device] = "cpu") -> "State":
        """Allocate and register (as `role`) every buffer of the rank, zeroed:
        on `device`, but the layout's host buffers (offload=F), which are host
        memory wherever the rest is. Host buffers live in /dev/shm: one too small for them all raises
        vps.OutOfMemory "/dev/shm: needs N MiB, M MiB free (docker:
        --shm-size)" before any is made."""
        s = cls(layout, rank, device)
        # the layout's host buffers (offload=F) are host memory on a GPU job too
        return s._make(registry, role, [s.device.type == "cpu" or b.host for b in s.view.buffers],
                       lambda b: torch.zeros(b.elements, dtype=TORCH_DTYPE[b.dtype], device=s.device))

    def _make(self, registry: Registry, role: int, on_host, gpu) -> "State":
        """Make and register every buffer: b in shared memory where
        on_host[b.id], else gpu(b), a CUDA tensor registered by its pointer.
        On a failure what was made is freed and the error raised."""
        self._registry = registry
        if any(on_host):
            registry._handle()
            registry.check_room(sum(b.elements * DTYPE_SIZE[b.dtype] for b, h in zip(self.view.buffers, on_host)
                                    if h))
            registry._hold(self)
        try:
            for b, host in zip(self.view.buffers, on_host):
                if host:
                    t = self._shared(registry, role, b)
                else:
                    t = gpu(b)
                    registry.add_cuda(role, b.id, b.state, b.dtype, b.elements, t.data_ptr())
                self.buffers.append(t)
        except BaseException:
            try:
                self.free()
            except Error:
                # the buffers made before stay registered (an entry is not
                # unregistered alone): Registry.reset or close removes them;
                # what stopped the allocation is the error to raise
                pass
            raise
        return self

    def _shared(self, registry: Registry, role: int, b) -> torch.Tensor:
        """Buffer b in a shared-memory object the registry makes and
        registers, zeroed."""
        addr = registry.alloc_host(role, b.id, b.state, b.dtype, b.elements)
        self._host[b.id] = (addr, registry.entries()[-1].shm_name.decode())
        nbytes = b.elements * torch.tensor([], dtype=TORCH_DTYPE[b.dtype]).element_size()
        raw = torch.frombuffer((C.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)
        t = raw.view(TORCH_DTYPE[b.dtype])
        t.zero_()
        return t

    @classmethod
    def adopt(cls, registry: Registry, layout: Layout, rank: int,
              tensors: Mapping[Union[int, Tuple[StateLike, int, bool], Tuple[StateLike, int, bool, bool]], torch.Tensor],
              role: int = SOURCE) -> "State":
        """Register GPU buffers a trainer already has (Megatron's DDP buffers,
        say): tensors maps a buffer index of the rank's view, or its
        (state, chunk, expert) or (state, chunk, expert, layerwise) with state
        a name or number, to a contiguous
        CUDA tensor of the buffer's dtype and elements, registered by its
        CUDA IPC handle and offset. Host memory cannot be adopted: vps-exec
        maps host buffers through the shared-memory objects that allocate()
        makes, and so does adopt() for the layout's host buffers (offload=F),
        which are left out of tensors and come back zeroed."""
        s = cls(layout, rank, "cuda")
        given = {}
        for key, t in tensors.items():
            if isinstance(key, tuple):
                st, chunk, expert, layerwise = key if len(key) == 4 else key + (False,)
                b = s.view.buffer(_state_number(st), chunk, expert, layerwise)
                if b is None:
                    raise InvalidInput("rank %d holds no %s buffer of chunk %d%s%s"
                                       % (rank, st, chunk, " (experts)" if expert else "",
                                          " (layer-wise)" if layerwise else ""))
                key = b
            given[key] = t
        what = ["buffer %d (%s, chunk %d%s)" % (b.id, STATES[b.state], b.chunk, ", host" if b.host else "")
                for b in s.view.buffers]
        for b in s.view.buffers:
            if b.host and b.id in given:
                raise InvalidInput("%s: the layout's host buffers are shared memory adopt() makes; leave it out"
                                   % what[b.id])
            if not b.host and b.id not in given:
                raise InvalidInput("%s: no tensor given" % what[b.id])
        for b in s.view.buffers:
            if b.host:
                continue
            t = given[b.id]
            if t.device.type != "cuda":
                raise InvalidInput("%s: a %s tensor; host buffers come from State.allocate (shared memory)"
                                   % (what[b.id], t.device.type))
            if t.dtype != TORCH_DTYPE[b.dtype] or t.numel() != b.elements or not t.is_contiguous():
                raise InvalidInput("%s: the layout says %d %s elements, contiguous; the tensor is %s %s%s" % (
                    what[b.id], b.elements, TORCH_DTYPE[b.dtype], list(t.shape), t.dtype,
                    "" if t.is_contiguous() else ", not contiguous"))
        return s._make(registry, role, [b.host for b in s.view.buffers], lambda b: given[b.id].view(-1))
        registry._handle()
        registry.check_room(sum(b.elements * DTYPE_SIZE[b.dtype] for b in s.view.buffers if b.host))
        registry._hold(s)
        try:
            for b in s.view.buffers:
                if b.host:
                    s.buffers.append(s._shared(registry, role, b))
                else:
                    s.buffers.append(given[b.id].view(-1))
                    registry.add_cuda(role, b.id, b.state, b.dtype, b.elements, s.buffers[-1].data_ptr())
        except BaseException:
            try:
                s.free()
            except Error:
                pass
            raise
        return s

    def register(self, registry: Registry, role: int = SOURCE) -> None:
        """Register the buffers again (after Registry.reset)."""
        self._live()
        for b, t in zip(self.view.buffers, self.buffers):
            if b.id in self._host:
                registry.add_host(role, b.id, b.state, b.dtype, b.elements, self._host[b.id][1])
            else:
                registry.add_cuda(role, b.id, b.state, b.dtype, b.elements, t.data_ptr())

    def free(self) -> None:
        """Give the memory back. Views taken of the buffers must be dropped
        first: host buffers are unmapped. The State is closed after it;
        freeing a closed State does nothing. Host buffers still registered
        (before Registry.reset) are refused with vps.Error, the State kept."""
        try:
            for b in sorted(self._host):
                self._registry.free_host(self._host[b][0])
                del self._host[b]
        finally:
            if not self._host:
                self.buffers = []
                if not self._gone:
                    self._gone = "freed"

    # ---- what the trainer reads and writes ----
    def buffer(self, state: StateLike, chunk: int = 0, expert: bool = False,
               layerwise: bool = False, host: bool = False) -> Optional[torch.Tensor]:
        """The buffer of (state, chunk, dense or expert, the layer-wise optimizer's or not,
        the host part of an offloaded optimizer state or not), or None."""
        self._live()
        b = self.view.buffer(_state_number(state), chunk, expert, layerwise, host)
        return None if b is None else self.buffers[b]

    def param(self, p: Union[Param, str], state: Optional[StateLike] = None) -> torch.Tensor:
        """Parameter p (a Param or its global name) in Megatron's local shape,
        a view of its unsharded buffer of `state` (a number or a name:
        "param", "main_param", "exp_avg", "exp_avg_sq", "grad"; by default
        "param", or "module_buffer" for a module buffer)."""
        self._live()
        if isinstance(p, str):
            p = self.view.param(p)
        state = _state_number((MODULE_BUFFER if p.module_buffer else PARAM) if state is None else state)
        b = self.view.buffer(state, p.chunk, p.expert, p.layerwise)
        if b is None or self.view.buffers[b].sharded or p.module_buffer != (state == MODULE_BUFFER):
            raise InvalidInput("%s: the rank holds no whole %s buffer for it" % (p.name, STATES[state]))
        return self.buffers[b][p.offset:p.offset + p.elements].view(p.shape)

    def index(self, region: Region) -> torch.Tensor:
        """Buffer positions of a region's elements, shaped as its box."""
        self._live()
        return region_index(region, self.device)

    def pieces(self, states: Optional[Iterable[int]] = None) -> Iterator[Tuple[Region, torch.Tensor]]:
        """(region, values) for every region of the given states (all by
        default): what this rank holds, in logical coordinates."""
        self._live()
        for r in self.view.regions:
            if states is None or r.state in states:
                yield r, self.buffers[r.buffer][self.index(r)]

    def load(self, full: Callable[[int, int], torch.Tensor]) -> None:
        """Write the rank's part of whole logical tensors: full(tensor, state)
        returns tensor's logical value for that state."""
        self._live()
        for r in self.view.regions:
            box = tuple(slice(lo, hi) for lo, hi in zip(r.lo, r.hi))
            v = full(r.tensor, r.state)[box]
            self.buffers[r.buffer][self.index(r)] = v.to(self.buffers[r.buffer].dtype).to(self.device)


def region_index(r: Region, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
    """The buffer positions of region r's elements, an int64 tensor shaped
    as its box: buffer[region_index(r)] is the box's values."""
    idx = torch.full([h - l for l, h in zip(r.lo, r.hi)], r.offset, dtype=torch.int64, device=device)
    for k, (lo, hi, st) in enumerate(zip(r.lo, r.hi, r.strides)):
        shape = [1] * len(r.lo)
        shape[k] = hi - lo
        idx += torch.arange(hi - lo, dtype=torch.int64, device=device).view(shape) * st
    return idx


def correspondence(a_view: RankView, a_buffer: int, b_view: RankView, b_buffer: int,
                   device: Union[str, torch.device] = "cpu") -> Tuple[torch.Tensor, torch.Tensor]:
    """Where the same logical elements sit in two buffers (of one rank or of
    two ranks, of one layout or two): (a_positions, b_positions), 1-D, for
    every element both hold."""
    by_tensor = {}
    for r in b_view.regions:
        if r.buffer == b_buffer:
            by_tensor.setdefault(r.tensor, []).append(r)
    a_pos, b_pos = [], []
    for ra in a_view.regions:
        if ra.buffer != a_buffer:
            continue
        for rb in by_tensor.get(ra.tensor, ()):
            lo = [max(x, y) for x, y in zip(ra.lo, rb.lo)]
            hi = [min(x, y) for x, y in zip(ra.hi, rb.hi)]
            if any(x >= y for x, y in zip(lo, hi)):
                continue
            a_pos.append(_sub_index(ra, lo, hi, device))
            b_pos.append(_sub_index(rb, lo, hi, device))
    if not a_pos:
        e = torch.zeros(0, dtype=torch.int64, device=device)
        return e, e
    return torch.cat(a_pos), torch.cat(b_pos)


def _sub_index(r, lo, hi, device):
    off = r.offset + sum((l - rl) * st for l, rl, st in zip(lo, r.lo, r.strides))
    return region_index(r._replace(lo=tuple(lo), hi=tuple(hi), offset=off), device).reshape(-1)


def assemble(model: Model, pieces: Iterable[Tuple[Region, torch.Tensor]],
             dtype: Optional[torch.dtype] = None) -> Dict[Tuple[int, int], torch.Tensor]:
    """Whole logical tensors from every rank's pieces: {(tensor, state):
    tensor}. Every element a piece gives must agree with every other piece
    that gives it (replicas are equal), and every element must be given,
    else vps.CheckFailed."""
    full, seen = {}, {}
    for r, v in pieces:
        key = (r.tensor, r.state)
        if key not in full:
            shape = model.tensor_shape(r.tensor)
            full[key] = torch.zeros(shape, dtype=dtype or v.dtype)
            seen[key] = torch.zeros(shape, dtype=torch.bool)
        box = tuple(slice(lo, hi) for lo, hi in zip(r.lo, r.hi))
        v = v.to("cpu", full[key].dtype)
        have = seen[key][box]
        if not torch.equal(full[key][box][have], v[have]):
            raise CheckFailed("%s %s: replicas differ" % (model.tensor_name(r.tensor), STATES[r.state]))
        full[key][box] = v
        seen[key][box] = True
    for key, s in seen.items():
        missing = (~s).sum().item()
        if missing:
            raise CheckFailed("%s %s: %d elements held by no rank"
                              % (model.tensor_name(key[0]), STATES[key[1]], missing))
    return full


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector held off while the job stands
    still (a full collection over PyTorch's and a framework's objects takes
    tens of milliseconds, at whichever allocation tips it over), as it was
    after; the collections owed run once the job trains again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def sources_again(registry: Registry, state: Optional[State]) -> None:
    """The registry reset to hold `state` (None: nothing) as the sources
    again, every target it held forgotten."""
    registry.reset(state.layout if state else None, state.rank if state else -1)
    if state:
        state.register(registry, SOURCE)


def withdraw(registry: Registry, state: State, target: State, bind=None) -> None:
    """A target made ahead forgotten and freed: the objects bound to it
    emptied (bind.release()), and the registry runs `state` again (a Job's
    prepared configuration discarded); a target a failed switch freed
    already is left as it is."""
    if bind is not None:
        bind.release()
    if not target.closed:
        sources_again(registry, state)
        target.free()


@paused_gc()
def switch(registry: Registry, state: Optional[State], layout: Layout, rank: int, *,
           training: Optional[Training] = None, timeout: float = 600.0,
           device: Union[str, torch.device, None] = None,
           target: Optional[State] = None, clocks: Optional[dict] = None,
           free: bool = True, meanwhile: Optional[Callable[[], None]] = None
           ) -> Tuple[Optional[State], Optional[Training]]:
    """Move the rank's state to `rank` of `layout` (-1: this device leaves;
    state None: this device joins and holds nothing yet): allocate the new
    buffers (on `device`, by default the state's, else the host), hand the
    training scalars over, request the switch and wait up to `timeout`
    seconds for vps-exec. Returns (new State or None, Training carried from
    source rank 0).

    target is the new State made ahead, while the job trained:
    State.allocate(registry, layout, rank, vps.TARGET) and
    registry.set_target(layout, rank), so that vps-exec maps its buffers
    before the request and the pause allocates nothing; it is what switch
    returns, or frees when the switch fails. clocks, a dict, is given the
    wall clocks (time.time()) of the request (requested), the end of the
    wait (done) and of the old buffers' release (freed), to set beside
    vps-exec's report. With free=False the State before is not freed: the
    caller frees it (State.free) when the pause is over; the registry no
    longer holds its buffers. meanwhile, a callable, is called once the
    request is made, before the wait: what the caller does while the
    executors move the state (it must not touch the buffers); what it
    raises is raised with the switch under way, as on a timeout.

    When the executors fail the switch (vps.PeerFailed with their message),
    the registry runs the old state again, whose buffers they never write,
    and the new buffers are freed; the next call starts from a clean
    registry, served by the executors started for it (a retry). When the
    wait times out (vps.Timeout) the switch may still be under way: nothing
    is undone, and the error carries seq, to wait on again with
    registry.wait(seq, timeout). A closed registry or state raises
    vps.InvalidInput before anything is done. Python's garbage collector
    is held off until it returns (paused_gc)."""
    registry._handle()
    if state is not None:
        state._live()
    if target is not None:
        target._live()
        if target._registry is not registry or (target._hash, target.rank) != (layout.hash, rank) or rank < 0:
            raise InvalidInput("the target given is %r, of %s; the switch goes to rank %d of %s" % (
                target, target._registry, rank, layout.describe()))
    if registry.state()[0] == FAILED:
        # a switch a former call left under way (its wait timed out) failed
        # since: forget its targets and declare the sources again
        sources_again(registry, state)
        if target is not None:
            target.register(registry, TARGET)
    if training is not None:
        registry.training = training
    dev = device or (state.device if state else "cpu")
    new = target if target is not None else State.allocate(registry, layout, rank, TARGET, dev) if rank >= 0 else None
    seq, waited = None, False
    try:
        registry.set_target(layout, rank)
        if clocks is not None:
            clocks["requested"] = time.time()
        seq = registry.request()
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException as e:
                e.seq = seq
                raise
        waited = True
        registry.wait(seq, timeout)
        if clocks is not None:
            clocks["done"] = time.time()
    except Error as e:
        e.seq = seq
        if (seq is not None and not waited) or registry.state()[0] in (REQUESTED, RUNNING):
            raise
        sources_again(registry, state)
        if new:
            new.free()
        raise
    carried = registry.training
    registry.reset(layout if new else None, rank)
    if state and free:
        state.free()
    if clocks is not None:
        clocks["freed"] = time.time()
    if new:
        new.register(registry, SOURCE)
    return new, carried
