"""The trainer's registry: how a training process publishes its buffers to
vps-exec(1) and asks for a switch (vps-formats(5), THE TRAINER REGISTRY)."""
from __future__ import annotations

import ctypes as C
import weakref
from typing import TYPE_CHECKING, List, Optional, Tuple

from ._lib import EntryInfo, Training as _Training, call, lib
from .errors import closed as _closed

if TYPE_CHECKING:
    from .layout import Layout

__all__ = ["SOURCE", "TARGET", "HOST", "CUDA", "IDLE", "REQUESTED", "RUNNING", "DONE", "FAILED", "Training",
           "Registry"]

# an entry's role: a buffer of the state the trainer runs, or one a switch fills
SOURCE, TARGET = 0, 1
# where an entry's memory is
HOST, CUDA = 0, 1
# a registry's switch state (Registry.state)
IDLE, REQUESTED, RUNNING, DONE, FAILED = range(5)


class Training:
    """The scalars that travel with a switch: the executor copies source rank
    0's into every rank of the new layout. Training(step=..., consumed_samples=...,
    scheduler_step=..., global_batch=..., micro_batch=..., grad_accum=..., dp=...),
    each 0 when not given."""
    FIELDS = ("step", "consumed_samples", "scheduler_step", "global_batch", "micro_batch", "grad_accum", "dp")
    step: int
    consumed_samples: int
    scheduler_step: int
    global_batch: int
    micro_batch: int
    grad_accum: int
    dp: int

    def __init__(self, **kw: int) -> None:
        for k in self.FIELDS:
            setattr(self, k, int(kw.pop(k, 0)))
        if kw:
            raise TypeError("unknown training fields: %s" % ", ".join(kw))

    def __repr__(self):
        return "Training(%s)" % ", ".join("%s=%d" % (k, getattr(self, k)) for k in self.FIELDS)


class Registry:
    """Registry(name, layout, rank): the registry /dev/shm/NAME of a trainer
    running rank `rank` of `layout` (None and -1 for a joining device). A stale
    registry of a trainer that is gone is replaced; a live one is refused.

    After close(), every method but close() raises vps.InvalidInput, and so
    does every State whose host buffers it held (they are unmapped). A
    Registry is a context manager: `with vps.Registry(...) as reg:` closes
    it at the end."""

    def __init__(self, name: str, layout: Optional[Layout], rank: int, max_entries: int = 4096) -> None:
        self.name = name
        self._h = C.c_void_p()
        # the States whose host buffers live in this registry's objects
        self._states = weakref.WeakSet()
        call("vps_registry_create", C.byref(self._h), name.encode(), layout.hash if layout else 0, rank,
             max_entries, 1)

    @staticmethod
    def unlink(name: str) -> None:
        """Remove the registry NAME and the buffers it made when its trainer is
        gone (a launcher cleaning up after a killed rank); a live trainer's
        (vps.Busy), or anything not a registry of this user's, is refused with
        vps.Error. An absent NAME is not an error."""
        call("vps_registry_unlink", name.encode())

    @staticmethod
    def check_room(nbytes: int) -> None:
        """Whether /dev/shm has nbytes free for host buffers about to be
        allocated; vps.OutOfMemory "/dev/shm: needs N MiB, M MiB free
        (docker: --shm-size)" when not. alloc_host reserves what it makes
        (and says the same when it cannot): this only says it before anything
        is made, with the whole need."""
        call("vps_registry_check_room", nbytes)

    def close(self) -> None:
        """Unmap and remove the registry and the buffers it allocated. Views
        taken of a State's host buffers must be dropped first. Closing a
        closed registry does nothing."""
        for s in list(getattr(self, "_states", ())):
            s._unmapped()
        if getattr(self, "_h", None) and lib:
            lib.vps_registry_close(self._h)
        self._h = C.c_void_p()

    @property
    def closed(self) -> bool:
        """Whether close() removed the registry."""
        return not getattr(self, "_h", None)

    def _handle(self):
        if self.closed:
            raise _closed("registry %s" % getattr(self, "name", "?"))
        return self._h

    def _hold(self, state):
        self._states.add(state)

    def __repr__(self):
        return "Registry(%r%s)" % (getattr(self, "name", "?"), ", closed" if self.closed else "")

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    @property
    def layout_hash(self) -> int:
        """The hash of the layout the trainer runs (0: none)."""
        return lib.vps_registry_layout_hash(self._handle())

    @property
    def rank(self) -> int:
        """The rank the trainer runs (-1: none)."""
        return lib.vps_registry_rank(self._handle())

    def set_target(self, layout: Layout, rank: int) -> None:
        """Say which layout and rank the next switch moves the trainer to."""
        call("vps_registry_set_target", self._handle(), layout.hash, rank)

    def alloc_host(self, role: int, buffer: int, state: int, dtype: int, elements: int) -> int:
        """A new shared-memory object for one buffer, its pages reserved,
        registered; returns its address. A /dev/shm too small raises
        vps.OutOfMemory, with nothing made."""
        p = C.c_void_p()
        call("vps_registry_alloc_host", self._handle(), role, buffer, state, dtype, elements, C.byref(p))
        return p.value

    def free_host(self, address: int) -> None:
        """Unmap and remove a shared-memory object alloc_host made (refused
        while a registered entry uses it)."""
        call("vps_registry_free_host", self._handle(), address)

    def add_host(self, role: int, buffer: int, state: int, dtype: int, elements: int, shm_name: str,
                 offset: int = 0) -> None:
        """Register host memory at offset of the shared-memory object shm_name."""
        call("vps_registry_add_host", self._handle(), role, buffer, state, dtype, elements, shm_name.encode(), offset)

    def add_cuda(self, role: int, buffer: int, state: int, dtype: int, elements: int, address: int) -> None:
        """Register GPU memory by device pointer (an interior pointer of a
        cudaMalloc block, as PyTorch's caching allocator hands out)."""
        call("vps_registry_add_cuda_ptr", self._handle(), role, buffer, state, dtype, elements, address)

    def entries(self) -> List[EntryInfo]:
        """The registered entries, in order (vps-formats(5) names their fields)."""
        out = []
        for i in range(lib.vps_registry_num_entries(self._handle())):
            e = EntryInfo()
            call("vps_registry_entry", self._handle(), i, C.byref(e))
            out.append(e)
        return out

    def reset(self, layout: Optional[Layout], rank: int) -> None:
        """Between switches: forget every entry, and run `layout` as `rank` now."""
        call("vps_registry_reset", self._handle(), layout.hash if layout else 0, rank)

    def request(self) -> int:
        """Ask the executor for the switch to the target; returns its sequence number."""
        seq = C.c_uint64()
        call("vps_registry_request", self._handle(), C.byref(seq))
        return seq.value

    def wait(self, seq: int, timeout: float) -> None:
        """Wait for switch seq; raises vps.PeerFailed (with the executor's
        message) when it failed, vps.Timeout when it did not end in time."""
        call("vps_registry_wait", self._handle(), seq, float(timeout))

    def expect_executor(self, pid: int) -> None:
        """The vps-exec this trainer started for the switch in flight, or
        else the next one requested, is process `pid`: the wait for that
        switch raises vps.PeerFailed once it has exited while no executor
        holds the registry (it died before opening it), rather than waiting
        out its timeout."""
        call("vps_registry_expect_executor", self._handle(), int(pid))

    def state(self) -> Tuple[int, int]:
        """(IDLE, REQUESTED, RUNNING, DONE or FAILED, the switch's sequence number)."""
        seq = C.c_uint64()
        return lib.vps_registry_state(self._handle(), C.byref(seq)), seq.value

    @property
    def training(self) -> Optional[Training]:
        """The training scalars the registry holds (a switch carries them), or None."""
        t = _Training()
        lib.vps_registry_get_training(self._handle(), C.byref(t))
        return Training(**{k: getattr(t, k) for k in Training.FIELDS}) if t.valid else None

    @training.setter
    def training(self, tr: Training) -> None:
        t = _Training(**{k: getattr(tr, k) for k in Training.FIELDS})
        t.valid = 1
        lib.vps_registry_set_training(self._handle(), C.byref(t))
