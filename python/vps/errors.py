"""vps.Error and a subclass per result code, for a caller to branch on.

Each class stands for one vps_result_t by its name (VPS_ENOTFOUND, ...),
the API's pinned word; the number comes from the library when the module
loads (vps_result_name), so no number is written down here:

    try:
        vps.Registry.unlink(name)
    except vps.Busy:          # its trainer is alive
        ...
    except vps.Error as e:    # anything else: e.code, e.name, e.message
        ...

vps.Error(code, message) makes the subclass of the code (vps.Error(8, m)
is a vps.Timeout); vps.NotFound(message) is the same as vps.Error with
NotFound's code. A code the library has and this module does not know
(a newer library) is a plain vps.Error with the library's name for it."""
from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = ["Error", "InvalidInput", "CheckFailed", "SystemFailure", "OutOfMemory", "BadFormat", "CudaError",
           "NcclError", "Timeout", "PeerFailed", "Unsupported", "NotFound", "Stale", "Busy", "InternalError",
           "CODES"]

# result code -> its name, as the library gives them (VPS_OK included)
CODES: Dict[int, str] = {}
_BY_CODE: Dict[int, Type["Error"]] = {}


class Error(Exception):
    """A libvps call failed, or the module refused a call for a reason the
    library would give the same code for (a closed object is InvalidInput).

    code is the vps_result_t, name its name (VPS_EINPUT, ...) and message
    the library's own text (vps_last_error), prefixed with what the call
    read where the module knows it. str() is the message."""

    #: the vps_result_t this class stands for (set when the library loads)
    code: int = -1
    #: its name in include/vps/base.h
    result: Optional[str] = None

    def __new__(cls, *args, **kwargs):
        if cls is Error and len(args) == 2 and args[0] in _BY_CODE:
            cls = _BY_CODE[args[0]]
        return super().__new__(cls)

    def __init__(self, *args: object) -> None:
        if len(args) == 2:
            code, message = args
        elif len(args) == 1 and type(self).result is not None:
            code, message = type(self).code, args[0]
        else:
            raise TypeError("vps.Error(code, message) or %s(message)" % type(self).__name__)
        self.code = int(code)  # type: ignore[call-overload]
        self.name = CODES.get(self.code, "VPS_E%d" % self.code)
        self.message = str(message)
        super().__init__(self.message)

    def __reduce__(self):
        return (Error, (self.code, self.message), self.__dict__)


class InvalidInput(Error):
    """VPS_EINPUT: malformed or invalid input (a file, a flag, a config, an
    argument), or a call on a closed object."""
    result = "VPS_EINPUT"


class CheckFailed(Error):
    """VPS_ECHECK: a verification found a violation (replicas that differ,
    a framework's buffers that are not the layout's)."""
    result = "VPS_ECHECK"


class SystemFailure(Error):
    """VPS_ESYS: an operating-system call failed (errno in the message)."""
    result = "VPS_ESYS"


class OutOfMemory(Error):
    """VPS_ENOMEM: an allocation failed."""
    result = "VPS_ENOMEM"


class BadFormat(Error):
    """VPS_EFORMAT: a file is truncated, corrupt or of another version."""
    result = "VPS_EFORMAT"


class CudaError(Error):
    """VPS_ECUDA: a CUDA runtime call failed."""
    result = "VPS_ECUDA"


class NcclError(Error):
    """VPS_ENCCL: an NCCL call failed."""
    result = "VPS_ENCCL"


class Timeout(Error):
    """VPS_ETIMEOUT: a peer, the executor or the trainer did not answer in
    time. After vps.switch the error carries seq, to wait on again."""
    result = "VPS_ETIMEOUT"


class PeerFailed(Error):
    """VPS_EPEER: a peer failed or disagreed (the executors failed the
    switch; their message says why)."""
    result = "VPS_EPEER"


class Unsupported(Error):
    """VPS_EUNSUPPORTED: built without the feature asked for, or a case the
    code does not handle (vps.megatron's refusals)."""
    result = "VPS_EUNSUPPORTED"


class NotFound(Error):
    """VPS_ENOTFOUND: what a name names does not exist (yet): a registry, a
    model, a configuration, a tensor."""
    result = "VPS_ENOTFOUND"


class Stale(Error):
    """VPS_ESTALE: it exists, but its owner is gone (a crashed trainer's
    registry)."""
    result = "VPS_ESTALE"


class Busy(Error):
    """VPS_EBUSY: another live process owns it (a registry with its
    trainer or executor)."""
    result = "VPS_EBUSY"


class InternalError(Error):
    """VPS_EINTERNAL: a bug in vps, an invariant that input cannot break did
    not hold."""
    result = "VPS_EINTERNAL"


_CLASSES = (InvalidInput, CheckFailed, SystemFailure, OutOfMemory, BadFormat, CudaError, NcclError, Timeout,
            PeerFailed, Unsupported, NotFound, Stale, Busy, InternalError)


def _bind(lib) -> None:
    """Give each class its code, by the library's names for its codes
    (vps_result_name: a name for every code from 0, then NULL)."""
    by_name = {c.result: c for c in _CLASSES}
    code = 0
    while True:
        name = lib.vps_result_name(code)
        if not name:
            break
        CODES[code] = name.decode()
        cls = by_name.pop(CODES[code], None)
        if cls is not None:
            cls.code = code
            _BY_CODE[code] = cls
        code += 1
    if by_name:
        raise ImportError("vps: the library has no result code %s; the module and the library are of different "
                          "versions" % ", ".join(sorted(by_name)))


def closed(what: str) -> Error:
    """The error for a call on an object whose C handle was released: the
    library would dereference a freed or NULL pointer."""
    return InvalidInput("%s is closed" % what)
