"""Forked processes for the framework checks (tests/megatron, tests/torch):
the parent has imported torch and the framework once, so a fork costs no
import. What each process returns, or what it raised as a RankError, comes
back to the parent pickled in a scratch directory.

    results, failed = ranks.gloo_ranks(world, fn, timeout)   # fn(rank) per rank of a gloo world

    pid = os.fork()                                          # a process of one's own
    if pid == 0:
        ranks.child(tmp, slot, fn)                           # never returns
    ...
    out = ranks.result(tmp, slot)                            # fn()'s value, a RankError, or None

mcore.run_ranks and check_torch.py's run_ranks say what a failure means for
their checks."""
import contextlib
import datetime
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback

import torch


class RankError:
    """What a rank raised: its rank, the exception in one line, the traceback."""

    def __init__(self, rank, what, trace):
        self.rank, self.what, self.trace = rank, what, trace

    def __repr__(self):
        return "rank %d: %s" % (self.rank, self.what)


def child(tmp, slot, fn):
    """In a forked process: fn()'s value, or what it raised as a RankError,
    pickled to tmp/SLOT.pickle; then the process exits, 1 when fn raised,
    never returning into the parent's code."""
    code = 0
    try:
        out = fn()
    except BaseException as e:  # reported to the parent, whatever it is
        out = RankError(slot, "%s: %s" % (type(e).__name__, e), traceback.format_exc())
        code = 1
    try:
        with open(os.path.join(tmp, "%d.pickle" % slot), "wb") as f:
            pickle.dump(out, f)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def result(tmp, slot):
    """What the process of this slot pickled, or None when it left nothing."""
    path = os.path.join(tmp, "%d.pickle" % slot)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def gloo_ranks(world, fn, timeout, watch=None, teardown=None, prefix="vps-ranks-"):
    """fn(rank) in world forked processes that form a gloo world (a
    FileStore in a scratch directory named from prefix), each with one
    thread; then teardown() (a framework's own groups) and the process
    group destroyed. ([each rank's value, RankError, or None where it left
    nothing], in rank order; why they were stopped, or None): a rank killed
    by a signal, ranks still running after timeout seconds, or the reason
    watch() (called while they run) returned. Stopped ranks are killed."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        store = os.path.join(tmp, "store")

        def rank_fn(r):
            torch.set_num_threads(1)
            torch.distributed.init_process_group(
                "gloo", store=torch.distributed.FileStore(store, world), rank=r, world_size=world,
                timeout=datetime.timedelta(seconds=timeout))
            try:
                return fn(r)
            finally:
                with contextlib.suppress(Exception):
                    if teardown:
                        teardown()
                    torch.distributed.destroy_process_group()
                # what the rank started (Megatron's checkpoint writer starts a manager process by
                # spawn), which the child's os._exit would leave running
                for proc in multiprocessing.active_children():
                    proc.terminate()
                    proc.join()
        pids = {}
        # the objects made so far kept out of the ranks' collections, which
        # would otherwise write to each one and copy its page into every rank
        gc.freeze()
        try:
            for r in range(world):
                pid = os.fork()
                if pid == 0:
                    child(tmp, r, lambda r=r: rank_fn(r))
                pids[pid] = r
        finally:
            gc.unfreeze()
        deadline = time.monotonic() + timeout
        failed = None
        while pids:
            # the ranks only: the caller may have children of its own (vps-exec)
            done = [(pid, status) for pid, status in (os.waitpid(p, os.WNOHANG) for p in list(pids)) if pid]
            if not done:
                if time.monotonic() > deadline:
                    failed = "ranks %s still running after %d s" % (sorted(pids.values()), timeout)
                    break
                reason = watch() if watch else None
                if reason:
                    failed = reason
                    break
                time.sleep(0.01)
                continue
            for pid, status in done:
                r = pids.pop(pid)
                if os.WIFSIGNALED(status) and failed is None:
                    failed = "rank %d killed by signal %d" % (r, os.WTERMSIG(status))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        return [result(tmp, r) for r in range(world)], failed
