"""libvps.so through ctypes: finding it, the structs it shares, the error rule.

Every struct here mirrors one of include/vps/*.h; its size is compared with
libvps's own (vps_abi_size) when the library loads, so a header that changes
without this file fails at import, not with misread memory."""
import ctypes as C
import os
import sys

from . import errors
from .errors import Error, closed  # noqa: F401 (where the module's files took them from)

_HERE = os.path.dirname(os.path.abspath(__file__))


MAX_DIMS = 4


class Model(C.Structure):
    _fields_ = [("name", C.c_char * 64), ("hidden", C.c_int64), ("layers", C.c_int64), ("heads", C.c_int64),
                ("query_groups", C.c_int64), ("head_dim", C.c_int64), ("ffn", C.c_int64), ("vocab", C.c_int64),
                ("vocab_divisor", C.c_int64), ("norm", C.c_int), ("activation", C.c_int), ("position", C.c_int),
                ("max_positions", C.c_int64), ("bias", C.c_bool), ("qkv_bias", C.c_bool),
                ("tied_embeddings", C.c_bool), ("qk_norm", C.c_bool), ("experts", C.c_int64), ("moe_ffn", C.c_int64),
                ("first_dense", C.c_int64), ("shared_ffn", C.c_int64), ("router_bias", C.c_bool),
                ("kv_lora_rank", C.c_int64), ("q_lora_rank", C.c_int64), ("qk_head_dim", C.c_int64),
                ("qk_pos_dim", C.c_int64), ("v_head_dim", C.c_int64), ("mtp_layers", C.c_int64)]


class Parallel(C.Structure):
    _fields_ = [(k, C.c_int64) for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "first", "last",
                                         "bucket")] + \
        [("grad", C.c_bool), ("grouped_gemm", C.c_bool)] + \
        [(k, C.c_int64) for k in ("family", "dp_replicate", "dp_shard")] + \
        [("optimizer", C.c_int32), ("scalar_optimizer", C.c_int32), ("precision_aware", C.c_bool),
         ("exp_avg_bf16", C.c_bool), ("exp_avg_sq_bf16", C.c_bool), ("offload", C.c_double)]


class Device(C.Structure):
    _fields_ = [("node", C.c_int32), ("gpu", C.c_int32)]


class Devices(C.Structure):
    _fields_ = [("packed", C.c_bool), ("gpus_per_node", C.c_int64), ("first_node", C.c_int64),
                ("list", C.POINTER(Device)), ("n", C.c_int64), ("order", C.POINTER(C.c_int64))]


class Tensor(C.Structure):
    _fields_ = [("id", C.c_uint32), ("kind", C.c_int), ("layer", C.c_int32), ("expert", C.c_int32),
                ("ndim", C.c_int), ("shape", C.c_int64 * MAX_DIMS), ("split", C.c_int), ("axis", C.c_int),
                ("is_expert", C.c_bool), ("mtp", C.c_int32), ("module_buffer", C.c_bool)]


class Box(C.Structure):
    _fields_ = [("ndim", C.c_int), ("lo", C.c_int64 * MAX_DIMS), ("hi", C.c_int64 * MAX_DIMS)]


class Region(C.Structure):
    _fields_ = [("tensor", C.c_uint32), ("state", C.c_uint8), ("dtype", C.c_uint8), ("buffer", C.c_uint32),
                ("box", Box), ("offset", C.c_int64), ("strides", C.c_int64 * MAX_DIMS)]


class Holder(C.Structure):
    _fields_ = [("region", Region), ("base", C.c_int64), ("stride", C.c_int64), ("count", C.c_int64)]


class Holders(C.Structure):
    _fields_ = [("v", C.POINTER(Holder)), ("n", C.c_size_t), ("cap", C.c_size_t)]


class Coords(C.Structure):
    _fields_ = [(k, C.c_int64) for k in ("tp", "cp", "dp", "pp", "etp", "ep", "edp")]


class Buffer(C.Structure):
    _fields_ = [("id", C.c_uint32), ("state", C.c_uint8), ("dtype", C.c_uint8), ("chunk", C.c_int32),
                ("expert", C.c_bool), ("sharded", C.c_bool), ("layerwise", C.c_bool), ("host", C.c_bool),
                ("elements", C.c_int64)]


class Param(C.Structure):
    _fields_ = [("tensor", C.c_uint32), ("chunk", C.c_int32), ("local_layer", C.c_int32),
                ("local_expert", C.c_int32), ("output_copy", C.c_bool), ("expert", C.c_bool), ("layerwise", C.c_bool),
                ("offset", C.c_int64), ("elements", C.c_int64), ("bucket", C.c_int32),
                ("ndim", C.c_int32), ("shape", C.c_int64 * MAX_DIMS)]


class RankView(C.Structure):
    _fields_ = [("rank", C.c_int64), ("device", Device), ("coords", Coords),
                ("buffers", C.POINTER(Buffer)), ("nbuffers", C.c_size_t),
                ("params", C.POINTER(Param)), ("nparams", C.c_size_t),
                ("regions", C.POINTER(Region)), ("nregions", C.c_size_t),
                ("region_param", C.POINTER(C.c_uint32)), ("region_names", C.POINTER(C.c_char_p))]


class Training(C.Structure):
    _fields_ = [(k, C.c_int64) for k in ("step", "consumed_samples", "scheduler_step", "global_batch",
                                         "micro_batch", "grad_accum", "dp", "valid")]


class Topology(C.Structure):
    _fields_ = [("name", C.c_char * 64), ("gpus_per_node", C.c_int64), ("intra_node_bandwidth", C.c_double),
                ("inter_node_bandwidth", C.c_double), ("memory_bandwidth", C.c_double), ("latency", C.c_double),
                ("gpu_memory", C.c_int64)]


class EntryInfo(C.Structure):
    _fields_ = [("role", C.c_int), ("buffer", C.c_uint32), ("state", C.c_int), ("dtype", C.c_int),
                ("elements", C.c_int64), ("bytes", C.c_uint64), ("where", C.c_int),
                ("shm_name", C.c_char * 72), ("offset", C.c_uint64), ("device", C.c_int),
                ("ipc_handle", C.c_ubyte * 64), ("released", C.c_int)]


_MIRRORS = {"vps_model": Model, "vps_parallel": Parallel, "vps_devices": Devices, "vps_tensor": Tensor,
            "vps_box": Box, "vps_region": Region, "vps_coords": Coords, "vps_buffer": Buffer, "vps_param": Param,
            "vps_rank_view": RankView, "vps_holder": Holder, "vps_holders": Holders,
            "vps_registry_training": Training, "vps_registry_entry_info": EntryInfo, "vps_topology": Topology}

P = C.POINTER
VP = C.c_void_p
RC = C.c_int
# name: (restype, argtypes); RC results are checked by call()
_PROTOS = {
    "vps_last_error": (C.c_char_p, []),
    "vps_strerror": (C.c_char_p, [C.c_int]),
    "vps_result_name": (C.c_char_p, [C.c_int]),
    "vps_version": (C.c_char_p, []),
    "vps_abi_size": (C.c_size_t, [C.c_char_p]),
    "vps_state_name": (C.c_char_p, [C.c_int]),
    "vps_dtype_name": (C.c_char_p, [C.c_int]),
    "vps_model_load": (RC, [P(Model), C.c_char_p, C.c_char_p]),
    "vps_topology_load": (RC, [P(Topology), C.c_char_p, C.c_char_p]),
    "vps_model_num_tensors": (C.c_uint32, [P(Model)]),
    "vps_model_tensor": (RC, [P(Model), C.c_uint32, P(Tensor)]),
    "vps_model_find_tensor": (RC, [P(Model), C.c_char_p, P(C.c_uint32)]),
    "vps_model_parameters": (C.c_int64, [P(Model)]),
    "vps_tensor_name": (C.c_size_t, [P(Tensor), C.c_char_p, C.c_size_t]),
    "vps_tensor_local_name": (C.c_size_t, [P(Tensor), C.c_int64, C.c_int64, C.c_char_p, C.c_size_t]),
    "vps_layout_param_name": (C.c_size_t, [VP, P(Param), C.c_char_p, C.c_size_t]),
    "vps_parallel_init": (None, [P(Parallel)]),
    "vps_parallel_load": (RC, [P(Parallel), C.c_char_p, C.c_char_p, C.c_char_p, C.c_size_t]),
    "vps_parallel_validate": (RC, [P(Parallel), P(Model), C.c_char_p]),
    "vps_parallel_format": (None, [P(Parallel), C.c_char_p, C.c_size_t]),
    "vps_devices_packed": (None, [P(Devices), C.c_int64, C.c_int64]),
    "vps_devices_release": (None, [P(Devices)]),
    "vps_layout_new": (RC, [P(VP), P(Model), P(Parallel), P(Devices), C.c_char_p]),
    "vps_layout_load": (RC, [P(VP), C.c_char_p]),
    "vps_layout_free": (None, [VP]),
    "vps_layout_model": (P(Model), [VP]),
    "vps_layout_parallel": (P(Parallel), [VP]),
    "vps_layout_world": (C.c_int64, [VP]),
    "vps_layout_hash": (C.c_uint64, [VP]),
    "vps_layout_coords": (None, [VP, C.c_int64, P(Coords)]),
    "vps_layout_rank": (RC, [VP, C.c_int64, P(RankView)]),
    "vps_rank_view_release": (None, [P(RankView)]),
    "vps_layout_has_state": (C.c_bool, [VP, C.c_int]),
    "vps_layout_tensor_has_state": (C.c_bool, [VP, P(Tensor), C.c_int]),
    "vps_layout_holders": (RC, [VP, C.c_uint32, C.c_int, P(Box), P(Holders)]),
    "vps_holders_release": (None, [P(Holders)]),
    "vps_box_intersect": (C.c_bool, [P(Box), P(Box), P(Box)]),
    "vps_region_restrict": (None, [P(Region), P(Box), P(Region)]),
    "vps_state_dtype": (C.c_int, [C.c_int]),
    "vps_layout_state_dtype": (C.c_int, [VP, C.c_int]),
    "vps_layout_tensor_optimizer": (C.c_int, [VP, P(Tensor)]),
    "vps_optimizer_name": (C.c_char_p, [C.c_int]),
    "vps_registry_create": (RC, [P(VP), C.c_char_p, C.c_uint64, C.c_int64, C.c_uint32, C.c_int]),
    "vps_registry_close": (None, [VP]),
    "vps_registry_unlink": (RC, [C.c_char_p]),
    "vps_registry_check_room": (RC, [C.c_uint64]),
    "vps_registry_name": (C.c_char_p, [VP]),
    "vps_registry_layout_hash": (C.c_uint64, [VP]),
    "vps_registry_rank": (C.c_int64, [VP]),
    "vps_registry_target_hash": (C.c_uint64, [VP]),
    "vps_registry_target_rank": (C.c_int64, [VP]),
    "vps_registry_set_target": (RC, [VP, C.c_uint64, C.c_int64]),
    "vps_registry_alloc_host": (RC, [VP, C.c_int, C.c_uint32, C.c_int, C.c_int, C.c_int64, P(VP)]),
    "vps_registry_free_host": (RC, [VP, VP]),
    "vps_registry_add_host": (RC, [VP, C.c_int, C.c_uint32, C.c_int, C.c_int, C.c_int64, C.c_char_p, C.c_uint64]),
    "vps_registry_add_cuda_ptr": (RC, [VP, C.c_int, C.c_uint32, C.c_int, C.c_int, C.c_int64, VP]),
    "vps_registry_num_entries": (C.c_uint32, [VP]),
    "vps_registry_entry": (RC, [VP, C.c_uint32, P(EntryInfo)]),
    "vps_registry_reset": (RC, [VP, C.c_uint64, C.c_int64]),
    "vps_registry_request": (RC, [VP, P(C.c_uint64)]),
    "vps_registry_wait": (RC, [VP, C.c_uint64, C.c_double]),
    "vps_registry_expect_executor": (RC, [VP, C.c_int]),
    "vps_registry_state": (C.c_int, [VP, P(C.c_uint64)]),
    "vps_registry_failure": (C.c_char_p, [VP]),
    "vps_registry_get_training": (None, [VP, P(Training)]),
    "vps_registry_set_training": (None, [VP, P(Training)]),
}


def _candidates():
    env = os.environ.get("VPS_LIBRARY")
    if env:
        return [env]
    bundled = os.path.join(_HERE, "libvps.so")  # pip install: built and put beside the module
    if os.path.exists(bundled):
        return [bundled]
    out = []
    try:
        from . import _prefix  # an installed module: written by make install
        out.append(os.path.join(_prefix.LIBDIR, "libvps.so"))
    except ImportError:
        out.append(os.path.join(_HERE, "..", "..", "build", "libvps.so"))  # the build tree
    out.append("libvps.so")
    return out


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = C.CDLL(path)
            break
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    else:
        raise ImportError("vps: libvps.so not found; build it with make (or pip install the source tree), or set "
                          "VPS_LIBRARY. Tried: " +
                          "; ".join(tried))
    for name, (res, args) in _PROTOS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError("vps: %s has no %s; the module and the library are of different versions"
                              % (path, name)) from None
        f.restype, f.argtypes = res, args
    for name, mirror in _MIRRORS.items():
        theirs = lib.vps_abi_size(name.encode())
        if theirs != C.sizeof(mirror):
            raise ImportError("vps: %s: struct %s is %d bytes there and %d in python/vps/_lib.py; the module and "
                              "the library are of different versions" % (path, name, theirs, C.sizeof(mirror)))
    errors._bind(lib)
    return lib


lib = _load()


def version() -> str:
    """The version of the libvps.so the module loaded (its vps_version():
    VPS_VERSION_STRING of include/vps/base.h)."""
    return lib.vps_version().decode()


def import_torch(what):
    """torch, for a part of the module that needs it; without it, an
    ImportError that says which part and how to get PyTorch."""
    try:
        import torch
    except ImportError as e:
        raise ModuleNotFoundError(
            "%s needs PyTorch, which %s cannot import (%s): run it with a Python that has torch (make venv makes "
            "build/venv, whose build/venv/bin/python has it) or pip install torch; the rest of vps (layouts, "
            "registries, errors) works without it" % (what, sys.executable, e), name="torch") from e
    return torch


def call(name, *args, what=None):
    """Call a libvps function that returns vps_result_t; raise Error on failure.
    what names the argument whose value the call reads: the library's message
    says what is wrong with the value, and the error says which one it was."""
    rc = getattr(lib, name)(*args)
    if rc:
        msg = lib.vps_last_error().decode(errors="replace") or lib.vps_strerror(rc).decode()
        raise Error(rc, "%s: %s" % (what, msg) if what else msg)
