"""vps: switch a running training job between parallel configurations.

Pure ctypes over libvps.so (found in the build tree, where make install put
it, or at $VPS_LIBRARY). What a training loop adds, in order:

    lay = vps.layout("tiny-llama", "tp=2,pp=2,dp=2,zero=1")
    reg = vps.Registry("vps-%d" % rank, lay, rank)
    state = vps.State.allocate(reg, lay, rank)        # every flat buffer, registered
    w = state.param("decoder.layers.0.mlp.linear_fc1.weight")   # a view, Megatron's shape
    ...train...
    state, training = vps.switch(reg, state, vps.layout(model, "tp=4,dp=2,zero=1"), rank,
                                 vps.Training(step=k, consumed_samples=n, global_batch=g))

with one vps-exec(1) beside each rank. See man vps(7) and examples/torch/.
The torch parts (State, switch, assemble, correspondence) need PyTorch; the
layout queries do not."""
from ._lib import CODES, Error
from .layout import (BF16, DTYPES, EXP_AVG, EXP_AVG_SQ, FP32, GRAD, INT16, MAIN_PARAM, MODULE_BUFFER, MOMENTUM_BUFFER,
                     OPTIMIZERS, PARAM, STATES, Buffer, Layout, Model, Param, RankView, Region, layout)
from .registry import CUDA, HOST, SOURCE, TARGET, Registry, Training

__version__ = "0.1.0"

_TORCH = ("State", "switch", "assemble", "correspondence", "region_index", "TORCH_DTYPE")


def __getattr__(name):
    if name == "elastic":
        from . import elastic
        return elastic
    if name in _TORCH:
        from . import state
        return getattr(state, name)
    raise AttributeError("module 'vps' has no attribute %r" % name)
