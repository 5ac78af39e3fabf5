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


def send(t, dst, group=None):
    """Send t to dst: a rank of the default group, or of group when given."""
    h = t.cpu() if t.is_cuda else t
    if group is None:
        dist.send(h, dst)
    else:
        dist.send(h, group=group, group_dst=dst)


def recv(t, src, group=None):
    """Receive into t, in place, from src: a rank of the default group, or of
    group when given."""
    h = torch.empty_like(t, device="cpu") if t.is_cuda else t
    if group is None:
        dist.recv(h, src)
    else:
        dist.irecv(h, group=group, group_src=src).wait()
    if h is not t:
        t.copy_(h)
