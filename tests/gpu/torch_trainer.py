#!/usr/bin/env python3
"""A PyTorch process as a vps trainer: its GPU state is allocated by PyTorch's
caching allocator (interior pointers of its blocks), registered by device
pointer through libvps.so with ctypes, switched by vps-exec over ipc, and
checked element by element by the reference trainer's logic.

    torch_trainer.py [--cpu] LIBVPS REGISTRY RANK STAGED...

--cpu: the state in host memory (no GPU needed): the same ctypes path, which
make check runs so that this mirror of struct vps_trainer_opts cannot drift
from include/vps/trainer.h unseen.

Exits 0 when every switch is done and every element is right."""
import ctypes as C
import os
import re
import sys

import torch

_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "vps", "trainer.h")
with open(_HEADER) as _h:
    # the version of the struct this mirror follows, as the header declares it
    OPTS_VERSION = int(re.search(r"#define VPS_TRAINER_OPTS_VERSION (\d+)", _h.read()).group(1))


class Opts(C.Structure):
    _fields_ = [("version", C.c_uint), ("registry", C.c_char_p), ("rank", C.c_int64), ("steps_before", C.c_int64),
                ("steps_after", C.c_int64), ("global_batch", C.c_int64), ("micro_batch", C.c_int64),
                ("samples_log", C.c_char_p), ("timeout", C.c_double), ("cuda", C.c_bool),
                ("device", C.c_int), ("local_rank", C.c_int64),
                ("cuda_alloc", C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_size_t)), ("cuda_alloc_ctx", C.c_void_p),
                ("notice", C.CFUNCTYPE(None, C.c_void_p, C.c_char_p)), ("notice_ctx", C.c_void_p),
                ("plan_names", C.POINTER(C.c_char_p))]


class Result(C.Structure):
    _fields_ = [("switches", C.c_int64), ("wrong_elements", C.c_int64), ("dirty_padding", C.c_int64),
                ("step", C.c_int64), ("consumed_samples", C.c_int64), ("training_state_ok", C.c_bool)]


def main():
    args = sys.argv[1:]
    cuda = not (args and args[0] == "--cpu")
    if not cuda:
        args = args[1:]
    lib = C.CDLL(args[0])
    registry, rank, paths = args[1].encode(), int(args[2]), args[3:]
    if cuda:
        torch.cuda.init()
    lib.vps_staged_load.argtypes = [C.POINTER(C.c_void_p), C.c_char_p]
    lib.vps_trainer_run.argtypes = [C.POINTER(C.c_void_p), C.c_size_t, C.POINTER(Opts), C.POINTER(Result)]
    lib.vps_last_error.restype = C.c_char_p
    plans = (C.c_void_p * len(paths))()
    for i, p in enumerate(paths):
        h = C.c_void_p()
        if lib.vps_staged_load(C.byref(h), p.encode()):
            sys.exit(f"torch_trainer: {p}: {lib.vps_last_error().decode()}")
        plans[i] = h
    tensors = []

    @C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_size_t)
    def alloc(_ctx, n):
        # a slice of a larger tensor: a pointer inside the allocator's block
        t = torch.empty(n + 8192, dtype=torch.uint8, device="cuda")
        tensors.append(t)
        return t.data_ptr() + 4096

    names = (C.c_char_p * len(paths))(*[p.encode() for p in paths])
    o = Opts(version=OPTS_VERSION, registry=registry, rank=rank, steps_before=2, steps_after=1, micro_batch=1,
             timeout=120.0, cuda=cuda, device=torch.cuda.current_device() if cuda else -1, local_rank=0,
             cuda_alloc=alloc if cuda else C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_size_t)(),
             plan_names=names)
    r = Result()
    rc = lib.vps_trainer_run(plans, len(paths), C.byref(o), C.byref(r))
    if rc:
        sys.exit(f"torch_trainer: rank {rank}: {lib.vps_last_error().decode()}")
    where = (f"PyTorch tensors ({len(tensors)} allocations, first at {tensors[0].data_ptr() + 4096:#x})"
             if cuda else "host memory")
    # one write: under python -u print writes the newline apart, and the
    # other rank's line can fall between
    sys.stdout.write(f"torch_trainer: rank {rank}: {r.switches} switches of {where}, "
                     f"{r.wrong_elements} wrong elements, {r.dirty_padding} dirty padding, "
                     f"training state {'carried' if r.training_state_ok else 'LOST'}\n")
    sys.exit(0 if r.wrong_elements == 0 and r.dirty_padding == 0 and r.training_state_ok else 1)


if __name__ == "__main__":
    main()
