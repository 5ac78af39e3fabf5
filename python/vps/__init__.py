"""vps: switch a running training job between parallel configurations.

Pure ctypes over libvps.so: the one `pip install .` of the source tree
built and put beside the module, the one make install put in PREFIX/lib,
the build tree's, or $VPS_LIBRARY. What a training loop adds, in order:

    lay = vps.layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1")
    reg = vps.Registry("vps-%d" % rank, lay, rank)
    state = vps.State.allocate(reg, lay, rank)        # every flat buffer, registered
    w = state.param("decoder.layers.0.mlp.linear_fc1.weight")   # a view, Megatron's shape
    ...train...
    state, carried = vps.switch(reg, state, vps.layout(model, "tp=4,dp=2,zero=1"), rank,
                                training=vps.Training(step=k, consumed_samples=n, global_batch=g))

with one vps-exec(1) beside each rank. See man vps(7), examples/torch/minimal.py
(the smallest job that switches) and examples/torch/.

Failures raise vps.Error, or the subclass of its result code (vps.NotFound,
vps.Timeout, vps.PeerFailed, vps.Stale, vps.Busy, ...). The torch parts
(State, switch, assemble, correspondence, region_index, and the modules
vps.megatron, vps.dtensor and vps.elastic) need PyTorch; without it they raise
ModuleNotFoundError saying how to get it, and the rest works."""
from importlib.util import find_spec as _find_spec

from ._lib import version
from .errors import (CODES, BadFormat, Busy, CheckFailed, CudaError, Error, InternalError, InvalidInput, NcclError,
                     NotFound, OutOfMemory, PeerFailed, Stale, SystemFailure, Timeout, Unsupported)
from .layout import (BF16, DTYPES, EXP_AVG, EXP_AVG_SQ, FP32, GRAD, INT16, MAIN_PARAM, MODULE_BUFFER, MOMENTUM_BUFFER,
                     OPTIMIZERS, PARAM, STATES, Buffer, Coords, Holder, Layout, Model, Param, RankView, Region, Topology,
                     layout, topology)
from .ports import free_port
from .registry import CUDA, HOST, SOURCE, TARGET, Registry, Training

__version__ = version()

_TORCH = ("State", "switch", "assemble", "correspondence", "region_index", "TORCH_DTYPE")
_SUBMODULES = ("elastic", "megatron", "dtensor", "hf")

# `from vps import *` takes the torch parts only where torch is there to
# import: without it they raise, and the rest must still import
__all__ = ["version", "__version__", "Error", "InvalidInput", "CheckFailed", "SystemFailure", "OutOfMemory",
           "BadFormat", "CudaError", "NcclError", "Timeout", "PeerFailed", "Unsupported", "NotFound", "Stale", "Busy",
           "InternalError", "CODES", "layout", "Layout", "Model", "RankView", "Buffer", "Param", "Region", "Holder",
           "Coords", "STATES", "PARAM", "MAIN_PARAM", "EXP_AVG", "EXP_AVG_SQ", "GRAD", "MODULE_BUFFER",
           "MOMENTUM_BUFFER", "BF16", "FP32", "INT16", "DTYPES", "OPTIMIZERS", "Registry", "Training", "SOURCE",
           "TARGET", "HOST", "CUDA", "free_port", "topology", "Topology"] + \
    (list(_TORCH) if _find_spec("torch") is not None else [])


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module("." + name, __name__)
    if name in _TORCH:
        from . import state
        return getattr(state, name)
    raise AttributeError("module 'vps' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | set(_TORCH) | set(_SUBMODULES))
