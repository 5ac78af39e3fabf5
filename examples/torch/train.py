#!/usr/bin/env python3
"""One rank of a PyTorch training job whose state vps switches between
parallel configurations mid-training. Started by launch.py or by torchrun
(one process per rank, RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set,
env:// rendezvous), with a vps-exec beside it when the run switches: the
launcher's, or with --exec DIR the rank's own, which it starts itself after
making its part of the switches' plans in DIR (torchrun starts only the
ranks).

What vps adds to the training loop is marked "vps:"."""
import argparse
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import comm  # noqa: E402
import options  # noqa: E402
import plans  # noqa: E402
import vps  # noqa: E402
from model import Stage  # noqa: E402


def parse_args(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_training(a)
    under = a.add_argument_group("under torchrun, which starts only the ranks")
    under.add_argument("--exec", dest="exec_dir", metavar="DIR",
                       help="start this rank's vps-exec beside it, with its part of the switches' plans made in "
                            "DIR/rank-R; its log and report go to DIR (needs VPS_TOKEN in the environment)")
    under.add_argument("--transport", default="tcp", help="vps-exec's transport (tcp, ipc; default tcp)")
    under.add_argument("--budget", default="64MiB", help="vps-stage's staging budget (default 64MiB)")
    under.add_argument("--exec-timeout", default="120", help="vps-exec's --timeout (default 120)")
    return options.finish(a, a.parse_args(argv))


def start_executor(args, rank, world):
    """--exec: this rank's part of every switch's staged plan (vps-plan
    --rank), made in DIR/rank-R, and its vps-exec, started beside it. Rank
    0 picks the executors' rendezvous port (torchrun's MASTER_PORT is its
    own store's) and tells the others. Returns the process, or None when
    the run does not switch."""
    if not plans.switches(args.configs, args.steps, args.switch_every):
        return None
    if not os.environ.get("VPS_TOKEN"):
        raise SystemExit("train.py: --exec: no VPS_TOKEN in the environment: export VPS_TOKEN=$(vps-exec "
                         "--new-token) before starting the job, so that every rank's executor holds it")
    d = os.path.join(args.exec_dir, "rank-%d" % rank)
    staged = plans.make(d, args.model, args.configs, args.steps, args.switch_every, args.gpus_per_node,
                        args.global_batch, args.micro_batch, args.budget, rank)
    port = [0]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    master = "%s:%d" % (socket.gethostbyname(os.environ["MASTER_ADDR"]), port[0])
    log = open(os.path.join(args.exec_dir, "exec.%d.log" % rank), "w")
    return plans.executor(staged, args.registry, rank, world, master, args.transport, args.exec_timeout,
                          os.path.join(args.exec_dir, "report.%d.yaml" % rank), log)


# ---- a deterministic corpus: sample i is phrases of a fixed phrase book ----
class Corpus:
    def __init__(self, vocab, seq, seed, phrases=64, length=8):
        g = torch.Generator().manual_seed(seed)
        self.book = torch.randint(vocab, (phrases, length), generator=g)
        self.seq, self.seed = seq, seed

    def sample(self, i):
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        n = -(-(self.seq + 1) // self.book.shape[1])
        return self.book[torch.randint(self.book.shape[0], (n,), generator=g)].reshape(-1)[:self.seq + 1]

    def batch(self, ids):
        return torch.stack([self.sample(i) for i in ids])


# ---- process groups of every configuration, made once ----
class Groups:
    def __init__(self, lay, rank):
        par, world = lay.parallel, lay.world
        coords = [lay.coords(r) for r in range(world)]
        self.tp = self.dp = self.pp = None
        self.dp_ranks, self.prev, self.next = [rank], None, None
        me = coords[rank]
        # every rank makes every group, in one order (torch.distributed's rule)
        for axis in ("tp", "dp", "pp"):
            others = [k for k in ("tp", "dp", "pp") if k != axis]
            keys = sorted({tuple(getattr(c, k) for k in others) for c in coords})
            for key in keys:
                ranks = [r for r, c in enumerate(coords) if tuple(getattr(c, k) for k in others) == key]
                g = dist.new_group(ranks) if par[axis] > 1 else None
                if rank in ranks:
                    setattr(self, axis, g)
                    if axis == "dp":
                        self.dp_ranks = ranks
                    if axis == "pp":
                        i = ranks.index(rank)
                        self.prev = ranks[i - 1] if i > 0 else None
                        self.next = ranks[i + 1] if i + 1 < len(ranks) else None
        self.dp_rank, self.dp_size = me.dp, par["dp"]


# ---- AdamW over vps's buffers: fp32 main params and moments, ZeRO-1 over DP ----
class Adam:
    B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.01

    def __init__(self, state, groups):
        v, lay, dev = state.view, state.layout, state.device
        self.state, self.groups, self.sets = state, groups, []
        peers = {r: lay.rank(r) for r in groups.dp_ranks if r != v.rank} if lay.parallel["zero"] else {}
        for b in v.buffers:
            if b.state != vps.PARAM:
                continue
            ids = [v.buffer(s, b.chunk, b.expert) for s in (vps.MAIN_PARAM, vps.EXP_AVG, vps.EXP_AVG_SQ)]
            m_pos, p_pos = vps.correspondence(v, ids[0], v, b.id, dev)
            for other in ids[1:]:
                o_pos, o_p = vps.correspondence(v, other, v, b.id, dev)
                if not (torch.equal(o_pos, m_pos) and torch.equal(o_p, p_pos)):
                    raise SystemExit("train.py: the moments are not laid out as the main params")
            decay = torch.zeros(b.elements, dtype=torch.bool, device=dev)
            for p in v.params:
                if p.chunk == b.chunk and p.expert == b.expert and len(p.shape) == 2:
                    decay[p.offset:p.offset + p.elements] = True
            gather = []
            for r, pv in peers.items():
                pm = pv.buffer(vps.MAIN_PARAM, b.chunk, b.expert)
                their, mine = vps.correspondence(pv, pm, v, b.id, dev)
                gather.append((groups.dp_ranks.index(r), their, mine))
            self.sets.append(dict(param=b.id, ids=ids, m_pos=m_pos, p_pos=p_pos, decay=decay[p_pos], gather=gather,
                                  grad=torch.zeros(b.elements, dtype=torch.float32, device=dev)))
        # each parameter's fp32 gradient buffer (that of its chunk's param buffer)
        grads = {s["param"]: s["grad"] for s in self.sets}
        self.grad_of = [grads[v.buffer(vps.PARAM, p.chunk, p.expert)] for p in v.params]

    def step(self, stage, lr, t):
        bufs = self.state.buffers
        for s in self.sets:
            s["grad"].zero_()
        for p, g in stage.grads():
            self.grad_of[p.index][p.offset:p.offset + p.elements] = g.reshape(-1)
        for s in self.sets:
            if self.groups.dp is not None:
                comm.all_reduce(s["grad"], group=self.groups.dp)
            main, m1, m2 = (bufs[i] for i in s["ids"])
            pos, g = s["m_pos"], s["grad"][s["p_pos"]]
            p = main[pos] * torch.where(s["decay"], 1 - lr * self.WD, 1.0)
            a = m1[pos] * self.B1 + (1 - self.B1) * g
            b = m2[pos] * self.B2 + (1 - self.B2) * g * g
            denom = (b.sqrt() / (1 - self.B2 ** t) ** 0.5) + self.EPS
            p = p - (lr / (1 - self.B1 ** t)) * a / denom
            main[pos], m1[pos], m2[pos] = p, a, b
            param = bufs[s["param"]]
            param[s["p_pos"]] = p.to(torch.bfloat16)
            if s["gather"]:
                # ZeRO-1: every data-parallel rank updated its shard; gather the rest
                parts = [torch.empty_like(main) for _ in self.groups.dp_ranks]
                comm.all_gather(parts, main, group=self.groups.dp)
                for i, their, mine in s["gather"]:
                    param[mine] = parts[i][their].to(torch.bfloat16)


def init_state(state, model, seed):
    """Megatron-like initialization of every whole logical tensor, the same
    in any layout: normal(0, 0.02) weights, unit norms; main params are the
    bf16 params' values, the moments zero."""
    cache = {}

    def full(tid, st):
        if tid not in cache:
            g = torch.Generator().manual_seed(seed * 7919 + tid)
            shape = model.tensor_shape(tid)
            w = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
            cache[tid] = w.to(torch.bfloat16).float()
        return cache[tid] if st in (vps.PARAM, vps.MAIN_PARAM) else torch.zeros_like(cache[tid])

    state.load(full)


def gather_state(state, model, rank):
    """Rank 0: the whole state, every (tensor, state) assembled from every rank's pieces."""
    pieces = [(r, v.cpu()) for r, v in state.pieces()]
    out = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(pieces, out, dst=0)
    return vps.assemble(model, [p for lst in out for p in lst]) if rank == 0 else None


def same_bits(model, a, b):
    if a.keys() != b.keys():
        return "the (tensor, state) pairs differ"
    for k in a:
        x, y = a[k], b[k]
        iv = torch.int16 if x.dtype == torch.bfloat16 else torch.int32
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(iv), y.view(iv)):
            return "%s %s differs" % (model.tensor_name(k[0]), vps.STATES[k[1]])
    return None


def train_step(stage, opt, groups, corpus, tr, args, lr):
    """One optimizer step on the global batch starting at tr.consumed_samples.
    Returns the step's loss summed over this rank's tokens (last stage only)."""
    dp, mb, gb, seq = groups.dp_size, args.micro_batch, args.global_batch, args.seq
    accum = gb // (mb * dp)
    stage.begin_step()
    held, loss_sum = [], 0.0
    for m in range(accum):
        first = tr.consumed_samples + m * mb * dp + groups.dp_rank * mb
        data = corpus.batch(range(first, first + mb)).to(args.device)
        if stage.first:
            x = data[:, :-1]
        else:
            x = torch.empty(mb, seq, stage.m.hidden, device=args.device)
            comm.recv(x, groups.prev)
            x.requires_grad_()
        y = stage.forward(x)
        if stage.last:
            y = F.cross_entropy(y.reshape(-1, y.shape[-1]), data[:, 1:].reshape(-1), reduction="sum")
            loss_sum += y.item()
        else:
            comm.send(y.detach().contiguous(), groups.next)
        held.append((x, y))
    for x, y in reversed(held):
        if stage.last:
            (y / (gb * seq)).backward()
        else:
            g = torch.empty_like(y)
            comm.recv(g, groups.next)
            y.backward(g)
        if not stage.first:
            comm.send(x.grad.contiguous(), groups.prev)
    opt.step(stage, lr, tr.step + 1)
    return loss_sum if stage.last and stage.c.tp == 0 else 0.0


def main():
    args = parse_args()
    # a launcher stops the job with SIGTERM: leave through the registry's close
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)
    if args.device == "cuda":
        # torchrun's rule, as vps-exec's default device: the local rank modulo the GPUs
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = vps.Model(args.model)
    # vps: the layouts the run switches through; each rank's view says what it holds
    layouts = [vps.layout(model, c, args.gpus_per_node) for c in args.configs]
    for c, lay in zip(args.configs, layouts):
        if lay.world != world:
            raise SystemExit("train.py: %s has a world of %d, the job has %d ranks" % (c, lay.world, world))
    groups = [Groups(lay, rank) for lay in layouts]
    # vps: the registry through which vps-exec finds this rank's buffers
    reg = vps.Registry(args.registry.replace("%r", str(rank)), layouts[0], rank)
    # vps: under torchrun the rank starts its own executor
    executor = start_executor(args, rank, world) if args.exec_dir else None
    try:
        train(args, rank, model, layouts, groups, reg)
    except BaseException:
        if executor:
            executor.terminate()
            executor.wait()
        raise
    if executor and executor.wait(timeout=float(args.exec_timeout)):
        raise SystemExit("train.py: rank %d: its vps-exec exited with status %d (%s)"
                         % (rank, executor.returncode, os.path.join(args.exec_dir, "exec.%d.log" % rank)))
    reg.close()  # and with it every buffer it allocated
    dist.barrier()
    dist.destroy_process_group()


def train(args, rank, model, layouts, groups, reg):
    corpus = Corpus(model.vocab, args.seq, args.seed)
    # vps: the state's buffers, on the host (shared memory) or the GPU (PyTorch's allocator)
    state = vps.State.allocate(reg, layouts[0], rank, device=args.device)
    init_state(state, model, args.seed)
    cur = 0
    stage, opt = Stage(model, state.view, state, groups[0]), Adam(state, groups[0])
    tr = vps.Training(global_batch=args.global_batch, micro_batch=args.micro_batch,
                      dp=layouts[0].parallel["dp"])
    log = open(args.loss_log, "w") if rank == 0 and args.loss_log else None
    switches = 0
    while tr.step < args.steps:
        if args.switch_every and tr.step and tr.step % args.switch_every == 0 and switches < tr.step // args.switch_every:
            nxt = (cur + 1) % len(layouts)
            before = gather_state(state, model, rank) if args.check_switch else None
            del stage, opt  # views of the old buffers go before the buffers do
            t0 = time.time()
            # vps: move the state to the next layout; the step and data position travel with it
            state, carried = vps.switch(reg, state, layouts[nxt], rank, tr, args.timeout)
            if (carried.step, carried.consumed_samples) != (tr.step, tr.consumed_samples):
                raise SystemExit("train.py: rank %d: the switch carried step %d, samples %d; this rank was at %d, %d"
                                 % (rank, carried.step, carried.consumed_samples, tr.step, tr.consumed_samples))
            tr.dp = layouts[nxt].parallel["dp"]
            cur, switches = nxt, switches + 1
            pause = time.time() - t0
            if args.check_switch:
                after = gather_state(state, model, rank)
                if rank == 0:
                    bad = same_bits(model, before, after)
                    if bad:
                        raise SystemExit("train.py: switch %d: the state after is not the state before: %s"
                                         % (switches, bad))
                    n = sum(t.numel() for t in after.values())
                    print("train.py: switch %d at step %d to %s: %d (tensor, state) pairs, %d elements, equal bit "
                          "for bit (%.2f s)" % (switches, tr.step, args.configs[cur], len(after), n, pause),
                          flush=True)
            elif rank == 0:
                print("train.py: switch %d at step %d to %s (%.2f s)" % (switches, tr.step, args.configs[cur], pause),
                      flush=True)
            stage, opt = Stage(model, state.view, state, groups[cur]), Adam(state, groups[cur])
        lr = args.lr * min(1.0, (tr.step + 1) / args.warmup)
        local = train_step(stage, opt, groups[cur], corpus, tr, args, lr)
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total)
        tr.step += 1
        tr.scheduler_step = tr.step
        tr.consumed_samples += args.global_batch
        loss = total.item() / (args.global_batch * args.seq)
        if log:
            log.write("%d %.9g %s\n" % (tr.step, loss, args.configs[cur]))
            log.flush()
    if args.save_master:
        full = gather_state(state, model, rank)
        if rank == 0:
            torch.save({model.tensor_name(k[0]): v for k, v in full.items() if k[1] == vps.MAIN_PARAM},
                       args.save_master)
    del stage, opt, state


if __name__ == "__main__":
    main()
