#!/usr/bin/env python3
"""The trainers of every rank of one switch, in one Python process, with
their state in device memory of the CUDA stand-in (VPS_CUDA_LIBRARY, the
library libvps loads) and registered through the module by device pointer
(vps.Registry.add_cuda: vps_registry_add_cuda_ptr, the path PyTorch's CUDA
tensors take), without torch's CUDA. Each rank's buffers are interior
pointers of one allocation, as PyTorch's caching allocator hands them out.

    standin_trainer.py [--opened-by PIDFILE] [--host STATES] REGISTRY_PREFIX A.layout B.layout

vps-exec (--check) runs one executor per rank with --registry PREFIX-%r.
Exits 0 when the registrations read back as made, a host pointer and an
overrun are refused, and every rank's target holds exactly the logical
tensors the sources held.

With --opened-by, the trainers request the switch only once the
executors, whose pids PIDFILE lists in rank order, hold open every
allocation they will read: their rank's sources and targets and every
other rank's sources (a plan in which every rank reads from every other):
what vps-exec opens while the trainers train. Their reports must then say
that the pause opened nothing.

With --host, the buffers of the states listed (main_param,exp_avg,...)
are host memory (shared-memory objects, as State.allocate makes them)
and the others device memory, in one registry: optimizer state offloaded
to the host beside parameters on the GPU. A layout's own host buffers
(offload=F: the hybrid optimizer's host part of each shard) are host
memory whatever --host says."""
import ctypes as C
import os
import re
import sys
import time

import torch

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "python"))

import vps  # noqa: E402
from vps.registry import CUDA, HOST, SOURCE, TARGET, Registry  # noqa: E402
from vps.state import TORCH_DTYPE, State, assemble  # noqa: E402

ERR = C.c_char * 256
F = C.CFUNCTYPE


class Api(C.Structure):
    """struct vps_cuda_api (lib/gpu/cuda/vps_cuda.h), the calls used here."""
    _fields_ = [("abi", C.c_int), ("has_nccl", C.c_int),
                ("init", F(C.c_int, C.c_int, C.c_char_p)),
                ("device_count", F(C.c_int, C.POINTER(C.c_int), C.c_char_p)),
                ("ipc_handle", C.c_void_p), ("ipc_open", C.c_void_p), ("ipc_close", C.c_void_p),
                ("alloc", F(C.c_int, C.POINTER(C.c_void_p), C.c_size_t, C.c_char_p)),
                ("release", C.c_void_p),
                ("to_device", F(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t, C.c_char_p)),
                ("to_host", F(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t, C.c_char_p)),
                ("fill", F(C.c_int, C.c_void_p, C.c_int, C.c_size_t, C.c_char_p))]


# the ABI the Api mirror above follows: VPS_CUDA_ABI of lib/gpu/cuda/vps_cuda.h,
# read from the header so that a bump there that this mirror has not
# followed fails here by name
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib", "gpu", "cuda",
                       "vps_cuda.h")) as _h:
    CUDA_ABI = int(re.search(r"#define VPS_CUDA_ABI (\d+)", _h.read()).group(1))


def gpu():
    lib = C.CDLL(os.environ["VPS_CUDA_LIBRARY"])
    lib.vps_cuda_api_get.restype = C.POINTER(Api)
    api = lib.vps_cuda_api_get().contents
    assert api.abi == CUDA_ABI, "the stand-in's ABI is %d, this mirror's %d" % (api.abi, CUDA_ABI)
    return api


def check(api, rc, err, what):
    if rc:
        sys.exit("standin_trainer: %s: %s" % (what, err.value.decode()))


class Rank:
    """One rank's buffers: one device allocation, each buffer 256-byte
    aligned inside it after a first gap, and a CPU copy to fill and read."""

    def __init__(self, api, reg, layout, rank, role, host=()):
        self.api, self.state = api, State(layout, rank)
        self.state.buffers = [torch.zeros(b.elements, dtype=TORCH_DTYPE[b.dtype]) for b in self.state.view.buffers]
        self.on_host = [b.host or vps.STATES[b.state] in host for b in self.state.view.buffers]
        sizes = [t.numel() * t.element_size() for t in self.state.buffers]
        at, self.addr = 512, []
        for n in sizes:
            self.addr.append(at)
            at += (n + 255) // 256 * 256
        self.base = C.c_void_p()
        err = ERR()
        check(api, api.alloc(C.byref(self.base), at, err), err, "alloc")
        check(api, api.fill(self.base, 0, at, err), err, "fill")
        self.addr = [self.base.value + a for a in self.addr]
        self.offsets = [a - self.base.value for a in self.addr]
        for i, (b, a) in enumerate(zip(self.state.view.buffers, self.addr)):
            if self.on_host[i]:
                self.addr[i] = reg.alloc_host(role, b.id, b.state, b.dtype, b.elements)
            else:
                reg.add_cuda(role, b.id, b.state, b.dtype, b.elements, a)

    def upload(self):
        err = ERR()
        for t, a, host in zip(self.state.buffers, self.addr, self.on_host):
            if host:
                C.memmove(a, t.data_ptr(), t.numel() * t.element_size())
            else:
                check(self.api, self.api.to_device(a, t.data_ptr(), t.numel() * t.element_size(), err), err,
                      "to_device")

    def download(self):
        err = ERR()
        for t, a, host in zip(self.state.buffers, self.addr, self.on_host):
            if host:
                C.memmove(t.data_ptr(), a, t.numel() * t.element_size())
            else:
                check(self.api, self.api.to_host(t.data_ptr(), a, t.numel() * t.element_size(), err), err, "to_host")


def object_name(handle):
    """The stand-in's shared-memory object behind a handle (tests/standin/cuda.c,
    struct handle: magic, bytes, pid, pad, then the name)."""
    return bytes(handle[24:64]).split(b"\0")[0].decode()


def mappings(pid):
    """What process pid maps, and its children (a pid of timeout(1) names
    the executor it runs); None when it is gone."""
    try:
        kids = open("/proc/%d/task/%d/children" % (pid, pid)).read().split()
        return open("/proc/%d/maps" % pid).read() + "".join(mappings(int(k)) or "" for k in kids)
    except OSError:
        return None


def wait_opened(pidfile, need, timeout=60.0):
    """Until each executor (pids in PIDFILE, rank order) maps every object of
    need[rank], as an opened stand-in handle is mapped."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            pids = [int(x) for x in open(pidfile).read().split()]
        except (OSError, ValueError):
            pids = []
        if len(pids) == len(need):
            missing = []
            for pid, names in zip(pids, need):
                maps = mappings(pid)
                if maps is None:
                    sys.exit("standin_trainer: executor %d is gone before the request" % pid)
                missing += [n for n in names if "/dev/shm/" + n not in maps]
            if not missing:
                return
        time.sleep(0.05)
    sys.exit("standin_trainer: the executors did not open %s within %.0f s" % (missing if pids else "(no pids)", timeout))


def logical(model):
    """Every (tensor, state)'s value: distinct numbers, exact in bf16."""
    cache = {}

    def full(tensor, state):
        key = (tensor, state)
        if key not in cache:
            shape = model.tensor_shape(tensor)
            n = 1
            for d in shape:
                n *= d
            g = torch.Generator().manual_seed(1000 * tensor + state)
            cache[key] = torch.randint(-120, 120, (n,), generator=g).to(torch.float32).view(shape) / 8
        return cache[key]
    return full


def main():
    args = sys.argv[1:]
    pidfile, host_states = None, ()
    if args[:1] == ["--opened-by"]:
        pidfile, args = args[1], args[2:]
    if args[:1] == ["--host"]:
        host_states, args = args[1].split(","), args[2:]
        if not set(host_states) <= set(vps.STATES):
            sys.exit("standin_trainer: --host %s: not states (%s)" % (",".join(host_states), ", ".join(vps.STATES)))
    prefix, a_path, b_path = args[:3]
    a, b = vps.Layout.load(a_path), vps.Layout.load(b_path)
    api = gpu()
    full = logical(a.model)
    regs, src, dst = [], [], []
    for r in range(a.world):
        reg = Registry("%s-%d" % (prefix, r), a, r)
        regs.append(reg)
        src.append(Rank(api, reg, a, r, SOURCE, host_states))
        dst.append(Rank(api, reg, b, r, TARGET, host_states))
        reg.set_target(b, r)
        # the entries read back as registered: GPU memory at its offset, host memory where asked
        for e, off, on_host in zip(reg.entries(), src[r].offsets + dst[r].offsets, src[r].on_host + dst[r].on_host):
            assert (e.where, e.offset) == ((HOST, 0) if on_host else (CUDA, off)), (e.where, e.offset, off)
        src[r].state.load(full)
        src[r].upload()
    # what is not device memory from this allocator, or overruns it
    host = torch.zeros(16)
    for bad, what in ((host.data_ptr(), "is not device memory"),
                      ([x for x, h in zip(src[0].addr, src[0].on_host) if not h][-1], "overrun their GPU allocation")):
        try:
            regs[0].add_cuda(SOURCE, 999, 0, 1, 1 << 30 if "overrun" in what else 16, bad)
            sys.exit("standin_trainer: registering %#x (%s) was not refused" % (bad, what))
        except vps.Error as e:
            assert e.name == "VPS_EINPUT" and what in e.message, (e.name, e.message)
    if pidfile:
        srcs = [sorted({object_name(e.ipc_handle) for e in reg.entries() if e.role == SOURCE}) for reg in regs]
        dsts = [sorted({object_name(e.ipc_handle) for e in reg.entries() if e.role == TARGET}) for reg in regs]
        wait_opened(pidfile, [srcs[r] + dsts[r] + [n for q in range(a.world) if q != r for n in srcs[q]]
                              for r in range(a.world)])
    seqs = [reg.request() for reg in regs]
    for reg, seq in zip(regs, seqs):
        reg.wait(seq, 120.0)
    for d in dst:
        d.download()
    got = assemble(b.model, (p for d in dst for p in d.state.pieces()), torch.float32)
    wrong = 0
    for (tensor, state), v in got.items():
        wrong += int((v != full(tensor, state).to(v.dtype)).sum())
    offloaded = sum(h for r in src + dst for h in r.on_host) if not host_states else 0
    print("standin_trainer: %d ranks, %d logical tensors switched in device memory registered by pointer%s%s; "
          "%d wrong elements" % (a.world, len(got),
                                 ", %s in host memory" % ",".join(host_states) if host_states else "",
                                 ", %d offloaded buffers in host memory" % offloaded if offloaded else "", wrong))
    # the executors may still hold the targets open: their memory goes
    # when this process exits, as a CUDA context's does
    for reg in regs:
        reg.close()
    sys.exit(0 if wrong == 0 and got else 1)


if __name__ == "__main__":
    main()
