#!/usr/bin/env python3
"""PyTorch's distributed checkpoint (torch.distributed.checkpoint, DCP) as
checkpoint-and-restart of GPU state: the state a vps switch moves, held in
CUDA tensors by the ranks of layout A, saved with dcp.save, and loaded
resharded by the ranks of layout B into CUDA tensors with dcp.load; timed,
and every element checked.

    gpu_dcp.py [--device cuda|cpu] A.layout B.layout DIR

One process per rank of the transition world, all on the one GPU (cuda:0),
joined in a gloo process group (NCCL refuses two ranks on one GPU). Each
rank's state is vps's flat buffers of its layout (its sources under A, its
targets under B) as tensors on the device, the sources filled with the
reference trainer's deterministic pattern. Every (tensor, state) pair is
one DCP entry: a ShardedTensor of the logical tensor's shape whose local
shards are views of the rank's buffers at the boxes' global offsets, so
DCP is told only vps's layout. A box that replicas hold alike is saved
once (DCP needs the saved shards to tile each tensor), the replicas taking
turns box by box; on load each rank asks for its own boxes, replicas too.
save: from a barrier of every rank until the last is done, with a
FileSystemWriter (a file per rank, fsynced) into DIR, and DIR fsynced.
load: from a barrier until the last rank is done. Then, untimed, every
element of every rank's B state is checked against the pattern and its
padding for zeros; a wrong one fails the run (exit 1).

--device cpu runs the same on the CPU (the tests here, which have no GPU);
cuda (the default) refuses to start without one (exit 2). Prints YAML:
save_seconds, load_seconds, state_bytes (A's, every rank), entries,
wrong_elements. Bad arguments exit 2."""
import argparse
import datetime
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings

from ckpt_common import Pattern, box_key, state_dict, tiling, writers

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ME = "gpu_dcp.py"


def fail(msg, code=1):
    print("%s: %s" % (ME, msg), file=sys.stderr)
    sys.stderr.flush()
    sys.exit(code)


def parse(argv):
    a = argparse.ArgumentParser(prog=ME, description=__doc__.split("\n\n")[0])
    a.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where the state lives (default cuda, the one GPU; cpu: the same without one)")
    a.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a rank's process, started by the parent
    a.add_argument("--store", help=argparse.SUPPRESS)
    a.add_argument("a", metavar="A.layout")
    a.add_argument("b", metavar="B.layout")
    a.add_argument("dir", metavar="DIR", help="where the checkpoint goes (a disk, not tmpfs)")
    args = a.parse_args(argv)
    for path in (args.a, args.b):
        if not os.path.isfile(path):
            fail("%s: no such layout file" % path, 2)
    if not os.path.isdir(args.dir):
        fail("%s: not a directory" % args.dir, 2)
    return args


# ---- a rank ----

def rank_main(args, rank, world):
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.path.insert(0, os.path.join(TOP, "python"))
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import vps

    torch.set_num_threads(1)
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(0)
    where = "cuda:0" if args.device == "cuda" else "cpu"
    dist.init_process_group("gloo", store=dist.FileStore(args.store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    la, lb = vps.Layout.load(args.a), vps.Layout.load(args.b)
    model = la.model
    pattern = Pattern(model)
    dtypes = {vps.BF16: torch.bfloat16, vps.FP32: torch.float32}

    def buffers_of(lay, r):
        view = lay.rank(r)
        return view, [torch.zeros(b.elements, dtype=dtypes[b.dtype], device=dev) for b in view.buffers]

    # A: the sources, filled on the host and copied to the device
    ra, rb = rank if rank < la.world else -1, rank if rank < lb.world else -1
    sd_a, state_bytes = {}, 0
    if ra >= 0:
        va, bufs_a = buffers_of(la, ra)
        for b, t in zip(va.buffers, bufs_a):
            host = torch.zeros(b.elements, dtype=t.dtype)
            for r in va.regions:
                if r.buffer == b.id:
                    pattern.fill(host, r)
            t.copy_(host)
            state_bytes += host.numel() * host.element_size()
        owner = writers(la)
        saved = [r for r in va.regions if owner[box_key(r)] == rank]
        sd_a = state_dict(model, bufs_a, saved, tiling(owner, set(), rank), rank, where)
    if ra >= 0 and args.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.time()
    dcp.save(sd_a, storage_writer=dcp.FileSystemWriter(args.dir, sync_files=True, thread_count=1))
    if rank == 0:
        fd = os.open(args.dir, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    dist.barrier()
    save = time.time() - t0
    del sd_a
    # B: the targets, zero on the device, loaded resharded
    sd_b, bufs_b, vb = {}, [], None
    if rb >= 0:
        vb, bufs_b = buffers_of(lb, rb)
        owner_b = writers(lb)
        sd_b = state_dict(model, bufs_b, vb.regions, tiling(owner_b, {box_key(r) for r in vb.regions}, rank), rank,
                          where)
    if args.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.time()
    dcp.load(sd_b, storage_reader=dcp.FileSystemReader(args.dir))
    if args.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    load = time.time() - t0
    # untimed: every element as the pattern says, padding zero
    wrong = dirty = 0
    if rb >= 0:
        wrong, dirty = pattern.check([t.cpu() for t in bufs_b], vb.regions)
    totals = torch.tensor([wrong, dirty, state_bytes, len(sd_b)], dtype=torch.int64)
    dist.all_reduce(totals)
    dist.destroy_process_group()
    if rank == 0:
        print("save_seconds: %.4f" % save)
        print("load_seconds: %.4f" % load)
        print("state_bytes: %d" % totals[2].item())
        print("entries_loaded: %d" % totals[3].item())
        print("wrong_elements: %d" % totals[0].item())
        print("dirty_padding: %d" % totals[1].item())
    if totals[0].item() or totals[1].item():
        if rank == 0:
            print("%s: %d wrong elements, %d nonzero padding elements after loading the checkpoint"
                  % (ME, totals[0].item(), totals[1].item()), file=sys.stderr)
        sys.exit(1)


def probe_gpu():
    """Whether torch sees a GPU, asked in a child: CUDA is not initialised
    in this process, whose ranks are its children."""
    r = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                       capture_output=True, text=True)
    if r.returncode:
        fail("%s cannot import torch: %s" % (sys.executable, (r.stderr.strip().splitlines() or ["?"])[-1]), 2)
    return r.stdout.strip() == "1"


def main():
    args = parse(sys.argv[1:])
    if args.rank is not None:
        sys.path.insert(0, os.path.join(TOP, "python"))
        import vps
        world = max(vps.Layout.load(args.a).world, vps.Layout.load(args.b).world)
        rank_main(args, args.rank, world)
        return
    if args.device == "cuda" and not probe_gpu():
        fail("no GPU: torch.cuda.is_available() is false in %s (--device cpu runs the same on the CPU)"
             % sys.executable, 2)
    sys.path.insert(0, os.path.join(TOP, "python"))
    import vps
    la, lb = vps.Layout.load(args.a), vps.Layout.load(args.b)
    if la.model.name != lb.model.name:
        fail("%s and %s are layouts of different models" % (args.a, args.b), 2)
    try:
        writers(la)
        writers(lb)
    except ValueError as e:
        fail(str(e), 2)
    world = max(la.world, lb.world)
    tmp = tempfile.mkdtemp(prefix="vps-gdcp-")
    store = os.path.join(tmp, "store")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--device", args.device, "--rank", str(r),
                               "--store", store, args.a, args.b, args.dir]) for r in range(world)]
    codes = [p.wait() for p in procs]
    try:
        os.unlink(store)
    except OSError:
        pass
    os.rmdir(tmp)
    if any(codes):
        fail("rank %d exited with status %d" % next((r, c) for r, c in enumerate(codes) if c))


if __name__ == "__main__":
    main()
