"""vps's Hugging Face imports against transformers itself (make check-hf).

For every configuration below, vps reads the config.json (vps_model_parse,
as vps-layout --model does) and transformers builds its model from the same
file on the meta device (AutoConfig, AutoModelForCausalLM.from_config).
Through vps's Hugging Face name map (python/vps/hf.py), every logical
tensor of vps's model must be transformers' parameters (or the routers'
e_score_correction_bias buffers) of those names and shapes, as many
elements; every parameter transformers builds must be claimed by exactly
one tensor; the totals must agree. The only tensors without a Hugging Face
counterpart are the ones Megatron has and transformers does not (MTP
layers, MLA's fused linear_q_proj norm), listed with -v.

The configurations: one config.json written for each vps model of
configs/models and tests/megatron/models, in the family its structure
belongs to (and vps's import of it must be that model, field for field),
and tests/hf/configs/*.json for the families configs/ has no model of
(mistral, mixtral, qwen2, qwen3, deepseek_v2), each with a tiny one.
Configurations whose transformers model holds what vps cannot lay out
(biases on a LLaMA's attention or MLP, dense layers among Qwen3-MoE's, MoE
every other DeepSeek layer) must be refused by vps, naming the key.

    check_hf.py [-v] [-k SUBSTRING]

Prints `N configurations, every tensor equal to transformers' model`; exit
1 naming the first configuration, tensor and field that differs, 2 on bad
arguments.
"""
import argparse
import glob
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

import vps  # noqa: E402
import vps.hf  # noqa: E402
from vps._lib import Model as _ModelStruct  # noqa: E402


class Mismatch(Exception):
    pass


TINY = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "vocab_size": 300}
# (label, config.json, the key vps's refusal names): transformers builds
# these with tensors vps has no place for
REFUSED = [
    ("llama-attention-bias", dict(TINY, model_type="llama", attention_bias=True), "attention_bias"),
    ("llama-mlp-bias", dict(TINY, model_type="llama", mlp_bias=True), "mlp_bias"),
    ("qwen3-moe-dense-layer", dict(TINY, model_type="qwen3_moe", num_experts=4, moe_intermediate_size=32,
                                   mlp_only_layers=[0]), "mlp_only_layers"),
    ("deepseek-moe-every-other-layer", dict(TINY, model_type="deepseek_v3", num_key_value_heads=4, kv_lora_rank=32,
                                            q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                            v_head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                                            moe_layer_freq=2), "moe_layer_freq"),
]


def hf_config(m):
    """The config.json of a vps model, in the Hugging Face family its
    structure is: GPT-2 for learned positions, DeepSeek-V3 (V2 without the
    router's expert bias) for MLA, Qwen3-MoE or Mixtral for MoE with or
    without q/k norms, Qwen3, Qwen2 or LLaMA for dense models with q/k
    norms, a qkv bias, or neither; None for a model no family holds (a
    DeepSeek-shaped MoE without MLA: tests/megatron's micro-moe)."""
    c = {"vocab_size": m.vocab, "tie_word_embeddings": bool(m.tied_embeddings)}
    if m.position == 1:
        return dict(c, model_type="gpt2", n_embd=m.hidden, n_layer=m.layers, n_head=m.heads, n_inner=m.ffn,
                    n_positions=m.max_positions)
    c.update(hidden_size=m.hidden, num_hidden_layers=m.layers, num_attention_heads=m.heads)
    if m.kv_lora_rank:
        return dict(c, model_type="deepseek_v3" if m.router_bias else "deepseek_v2",
                    topk_method="noaux_tc" if m.router_bias else "greedy", num_key_value_heads=m.heads,
                    q_lora_rank=m.q_lora_rank or None, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_head_dim,
                    qk_rope_head_dim=m.qk_pos_dim, v_head_dim=m.v_head_dim, intermediate_size=m.ffn,
                    moe_intermediate_size=m.moe_ffn, n_routed_experts=m.experts,
                    n_shared_experts=m.shared_ffn // m.moe_ffn if m.experts else 0,
                    first_k_dense_replace=m.first_dense, moe_layer_freq=1, num_nextn_predict_layers=m.mtp_layers)
    c.update(num_key_value_heads=m.query_groups, head_dim=m.head_dim)
    if m.experts and m.qk_norm:
        return dict(c, model_type="qwen3_moe", num_experts=m.experts, moe_intermediate_size=m.moe_ffn,
                    intermediate_size=m.ffn or m.moe_ffn, decoder_sparse_step=1, mlp_only_layers=[])
    if m.experts and (m.first_dense or m.shared_ffn or m.router_bias):
        # dense first layers, a shared expert and the routers' expert bias together are DeepSeek's,
        # whose Hugging Face family has them only with MLA: no family holds such a model
        return None
    if m.experts:
        return dict(c, model_type="mixtral", num_local_experts=m.experts, intermediate_size=m.moe_ffn)
    t = "qwen3" if m.qk_norm else "qwen2" if m.qkv_bias else "llama"
    return dict(c, model_type=t, intermediate_size=m.ffn)


def fields(m):
    return {f: getattr(m, f) for f, _ in _ModelStruct._fields_ if f != "name"}


def sources(k):
    """(label, config.json dict, the vps model it must import as or None)."""
    out = []
    for path in sorted(glob.glob(os.path.join(TOP, "configs", "models", "*.yaml")) +
                       glob.glob(os.path.join(TOP, "tests", "megatron", "models", "*.yaml"))):
        m = vps.Model(path)
        cfg = hf_config(m)
        if cfg is not None:
            out.append((os.path.basename(path)[:-5], cfg, m))
    for path in sorted(glob.glob(os.path.join(HERE, "configs", "*.json"))):
        with open(path) as f:
            out.append((os.path.basename(path)[:-5], json.load(f), None))
    return [s for s in out if not k or k in s[0]]


def check(label, cfg, want, tmp):
    d = os.path.join(tmp, label)
    os.makedirs(d)
    path = os.path.join(d, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    m = vps.Model(path)
    if want is not None and fields(m) != fields(want):
        diff = {f: (v, fields(m)[f]) for f, v in fields(want).items() if fields(m)[f] != v}
        raise Mismatch("vps's import of the config written for it is another model: %s (model, import)" % diff)
    hc = AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        hm = AutoModelForCausalLM.from_config(hc)
    params = {n: tuple(p.shape) for n, p in hm.named_parameters()}
    params.update({n: tuple(b.shape) for n, b in hm.named_buffers() if n.endswith(".e_score_correction_bias")})
    claimed = {}
    megatron_only = []
    total = 0
    for name, shape, pieces in vps.hf.tensors(m):
        n = math.prod(shape)
        if not pieces:
            megatron_only.append(name)
            continue
        if sum(math.prod(p.shape) for p in pieces) != n:
            raise Mismatch("%s %s: %d elements, its Hugging Face pieces %s hold %d"
                           % (name, list(shape), n, pieces, sum(math.prod(p.shape) for p in pieces)))
        for p in pieces:
            hs = params.get(p.name)
            if hs is None:
                raise Mismatch("%s: transformers' %s has no %s" % (name, type(hm).__name__, p.name))
            if p.index is None:
                if hs != p.shape:
                    raise Mismatch("%s: %s is %s in transformers' model, %s in vps's map"
                                   % (name, p.name, list(hs), list(p.shape)))
                key = p.name
            else:
                if hs[1:] != p.shape or not 0 <= p.index < hs[0]:
                    raise Mismatch("%s: %s[%d] is not a %s piece of transformers' %s"
                                   % (name, p.name, p.index, list(p.shape), list(hs)))
                key = (p.name, p.index)
            if key in claimed:
                raise Mismatch("%s: %s is %s's already" % (name, key, claimed[key]))
            claimed[key] = name
        total += n
    for name, hs in params.items():
        whole = name in claimed
        parts = sum(1 for k in claimed if isinstance(k, tuple) and k[0] == name)
        if not whole and parts != (hs[0] if hs else 0):
            raise Mismatch("transformers' %s %s is no vps tensor's%s"
                           % (name, list(hs), "" if not parts else " (%d of its %d entries are)" % (parts, hs[0])))
    hf_total = sum(math.prod(s) for s in params.values())
    if total != hf_total:
        raise Mismatch("vps's tensors hold %d elements, transformers' model %d" % (total, hf_total))
    for name in megatron_only:
        if not (name.startswith("mtp.") or name.endswith(".linear_q_proj.layer_norm_weight")):
            raise Mismatch("%s: vps's map gives no Hugging Face tensor" % name)
    return m, type(hm).__name__, total, megatron_only


def refused(label, cfg, key, tmp):
    """vps must refuse the config, naming key; transformers builds it."""
    d = os.path.join(tmp, label)
    os.makedirs(d)
    path = os.path.join(d, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d))
    try:
        vps.Model(path)
    except vps.Error as e:
        if key not in str(e):
            raise Mismatch("refused without naming %s: %s" % (key, e))
        return
    raise Mismatch("vps reads it, though transformers' model has tensors vps has no place for (%s)" % key)


def main():
    ap = argparse.ArgumentParser(prog="check_hf.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per configuration")
    ap.add_argument("-k", metavar="SUBSTRING", help="only the configurations whose name contains it")
    args = ap.parse_args()
    todo = sources(args.k)
    bad = [r for r in REFUSED if not args.k or args.k in r[0]]
    if not todo and not bad:
        print("check_hf.py: -k %s: no configuration matches" % args.k, file=sys.stderr)
        return 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vps-hf-") as tmp:
        for label, cfg, want in todo:
            t0 = time.monotonic()
            try:
                m, cls, total, extra = check(label, cfg, want, tmp)
            except (Mismatch, vps.Error) as e:
                print("check-hf: %s (%s, transformers %s): %s" % (label, cfg.get("model_type"),
                                                                  transformers.__version__, e), file=sys.stderr)
                return 1
            if args.verbose:
                print("%-22s %-11s %-24s %6d tensors, %15d elements%s  %.1f s"
                      % (label, cfg["model_type"], cls, m.num_tensors, total,
                         " (+%d Megatron's only)" % len(extra) if extra else "", time.monotonic() - t0))
        for label, cfg, key in bad:
            try:
                refused(label, cfg, key, tmp)
            except Mismatch as e:
                print("check-hf: %s (%s, transformers %s): %s" % (label, cfg["model_type"], transformers.__version__,
                                                                  e), file=sys.stderr)
                return 1
            if args.verbose:
                print("%-22s %-11s refused by vps, naming %s" % (label, cfg["model_type"], key))
    if args.verbose:
        print("transformers %s, %.0f s" % (transformers.__version__, time.monotonic() - start))
    print("%d configurations, every tensor equal to transformers' model; %d that vps cannot lay out refused"
          % (len(todo), len(bad)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
