"""torch.distributed over gloo for the example's tensors, wherever they
live: gloo sends, receives and gathers host tensors, so a GPU tensor goes
through the host (NCCL, which takes GPU tensors, refuses two ranks on one
GPU, and the example's ranks may share one). Host tensors go straight."""
import torch
import torch.distributed as dist


def all_reduce(t, group=None):
    """Sum t over the group, in place."""
    if not t.is_cuda:
        dist.all_reduce(t, group=group)
        return
    h = t.cpu()
    dist.all_reduce(h, group=group)
    t.copy_(h)


def all_gather(parts, t, group=None):
    """parts[i] = rank i's t (of the group)."""
    if not t.is_cuda:
        dist.all_gather(parts, t, group=group)
        return
    hs = [torch.empty_like(p, device="cpu") for p in parts]
    dist.all_gather(hs, t.cpu(), group=group)
    for p, h in zip(parts, hs):
        p.copy_(h)


def send(t, dst):
    dist.send(t.cpu() if t.is_cuda else t, dst)


def recv(t, src):
    """Receive into t, in place."""
    if not t.is_cuda:
        dist.recv(t, src)
        return
    h = torch.empty_like(t, device="cpu")
    dist.recv(h, src)
    t.copy_(h)
