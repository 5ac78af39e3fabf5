"""A LLaMA-shaped GPT with Megatron-Core's tensor and pipeline parallelism,
whose parameters are views of the flat buffers vps gives the rank.

Tensor parallelism as Megatron's: column-parallel linear_qkv, linear_fc1 and
output_layer, row-parallel linear_proj and linear_fc2, a vocabulary-parallel
embedding; the loss gathers the vocabulary-parallel logits. Pipeline
parallelism is plain GPipe: every micro-batch forward, then every one
backward, activations and their gradients sent stage to stage.

The bf16 parameters are the model's state, as in Megatron; each step
computes with their fp32 values (exact), so that the fp32 gradients are
those of the bf16 model. The padded vocabulary rows are masked out of the
softmax: they hold no logical element, and vocab padding differs from one
tensor-parallel size to another."""
import math

import torch
import torch.nn.functional as F

import comm


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient is summed over the tensor-parallel group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        if ctx.group is not None:
            g = g.clone()
            comm.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """Sum over the tensor-parallel group forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        if group is not None:
            x = x.clone()
            comm.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromTP(torch.autograd.Function):
    """Concatenate the last axis over the group; backward keeps this rank's
    slice (every rank computes the same loss from the gathered whole)."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        ctx.rank, ctx.width = rank, x.shape[-1]
        if group is None:
            return x
        parts = [torch.empty_like(x) for _ in range(size)]
        comm.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        lo = ctx.rank * ctx.width
        return g[..., lo:lo + ctx.width].contiguous(), None, None, None


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, base=10000.0):
    """Megatron-Core's rotary embedding (non-interleaved) of [b, s, heads, d]."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = torch.outer(torch.arange(s, dtype=torch.float32, device=x.device), inv)
    ang = torch.cat([ang, ang], dim=-1)[None, :, None, :]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


class Stage:
    """This rank's pipeline stage: params maps each local parameter name to
    the fp32 tensor a step computes with (created by begin_step)."""

    def __init__(self, model, view, state, groups):
        if model.norm != 0 or model.activation != 0 or model.position != 0 or model.bias or model.qkv_bias \
                or model.tied_embeddings or model.qk_norm or model.experts or model.mtp_layers:
            raise SystemExit("model.py: %s: only LLaMA-shaped models (RMSNorm, SwiGLU, RoPE, no biases, untied "
                             "embeddings, dense, no MTP) are implemented" % model.name)
        self.m, self.view, self.state, self.g = model, view, state, groups
        par = view.layout.parallel
        if par["vpp"] != 1:
            raise SystemExit("model.py: virtual pipeline chunks are not implemented (vpp=%d)" % par["vpp"])
        if par["cp"] != 1:
            # its groups are tp/dp/pp; CP ranks would each read whole sequences
            raise SystemExit("model.py: context parallelism is not implemented (cp=%d)" % par["cp"])
        self.tp, self.pp = par["tp"], par["pp"]
        self.c = view.coords
        self.first, self.last = self.c.pp == 0, self.c.pp == self.pp - 1
        self.layers = sorted({p.local_layer for p in view.params if p.local_layer >= 0})
        self.bf16 = {p.local_name: state.param(p) for p in view.params}
        self.padded_vocab = self.bf16["embedding.word_embeddings.weight"].shape[0] * self.tp if self.first else \
            self.bf16["output_layer.weight"].shape[0] * self.tp if self.last else 0
        self.w = {}

    def begin_step(self):
        """fp32 working copies of the bf16 parameters, gradients zero."""
        self.w = {k: v.float().requires_grad_() for k, v in self.bf16.items()}

    def grads(self):
        """(Param, fp32 gradient) for every parameter of the rank."""
        return [(p, self.w[p.local_name].grad) for p in self.view.params]

    def embed(self, tokens):
        w = self.w["embedding.word_embeddings.weight"]
        lo = self.c.tp * w.shape[0]
        out_of_range = (tokens < lo) | (tokens >= lo + w.shape[0])
        x = F.embedding((tokens - lo).masked_fill(out_of_range, 0), w)
        x = x.masked_fill(out_of_range[..., None], 0.0)
        return _ReduceFromTP.apply(x, self.g.tp)

    def layer(self, x, i):
        m, w, tp = self.m, self.w, self.tp
        pre = "decoder.layers.%d." % i
        b, s, _ = x.shape
        groups, per = m.query_groups // tp, m.heads // m.query_groups
        h = _CopyToTP.apply(rms_norm(x, w[pre + "self_attention.linear_qkv.layer_norm_weight"]), self.g.tp)
        qkv = (h @ w[pre + "self_attention.linear_qkv.weight"].t()).view(b, s, groups, per + 2, m.head_dim)
        q = rope(qkv[:, :, :, :per].reshape(b, s, groups * per, m.head_dim))
        k = rope(qkv[:, :, :, per])
        v = qkv[:, :, :, per + 1]
        k, v = k.repeat_interleave(per, dim=2), v.repeat_interleave(per, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        a = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
        a = a.transpose(1, 2).reshape(b, s, groups * per * m.head_dim)
        x = x + _ReduceFromTP.apply(a @ w[pre + "self_attention.linear_proj.weight"].t(), self.g.tp)
        h = _CopyToTP.apply(rms_norm(x, w[pre + "mlp.linear_fc1.layer_norm_weight"]), self.g.tp)
        gate, up = (h @ w[pre + "mlp.linear_fc1.weight"].t()).chunk(2, dim=-1)
        return x + _ReduceFromTP.apply((F.silu(gate) * up) @ w[pre + "mlp.linear_fc2.weight"].t(), self.g.tp)

    def forward(self, x):
        """Tokens (first stage) or the previous stage's activations, through
        this stage's layers; the last stage returns the vocabulary-parallel
        logits gathered whole, the padded vocabulary masked out."""
        if self.first:
            x = self.embed(x)
        for i in self.layers:
            x = self.layer(x, i)
        if not self.last:
            return x
        h = _CopyToTP.apply(rms_norm(x, self.w["decoder.final_layernorm.weight"]), self.g.tp)
        logits = _GatherFromTP.apply(h @ self.w["output_layer.weight"].t(), self.g.tp, self.c.tp, self.tp)
        return logits[..., :self.m.vocab]
