"""Hugging Face names of vps's logical tensors: which parameters (and
buffers) of transformers' model classes hold each tensor's elements.

    import vps.hf
    m = vps.Model("Qwen3-30B-A3B/config.json")
    for name, shape, pieces in vps.hf.tensors(m):
        ...  # pieces: [Piece(hf_name, index, shape), ...]

A Piece is one Hugging Face tensor, or with index set the index-th entry of
its first axis (transformers 5 fuses an MoE layer's experts into
mlp.experts.gate_up_proj [E, 2 x moe_ffn, h] and mlp.experts.down_proj
[E, h, moe_ffn]), with the piece's shape. The pieces hold the logical
tensor's elements, as many of them, but not in its order: a SwiGLU fc1 is
gate then up; linear_qkv is q, k and v, which Megatron interleaves per
query group; GPT-2's Conv1D weights are the transpose of a linear's. The
names are those of the model transformers builds (AutoModelForCausalLM,
5.x), which are the checkpoint's except for fused experts.

The family is read from the model's structure: learned positions are
GPT-2's names (transformer.h.L...), multi-latent attention DeepSeek-V2/V3's,
anything else LLaMA's (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral).
Tensors that Megatron has and transformers does not get no pieces: the MTP
layers (Hugging Face's DeepSeek classes do not build them) and
linear_q_proj.layer_norm_weight (Megatron-Core 0.19's fused Q norm of MLA
without query compression). tests/hf checks the map against transformers.
"""
import re
from collections import namedtuple

__all__ = ["Piece", "tensors", "pieces"]

Piece = namedtuple("Piece", "name index shape")
Piece.__doc__ = "One Hugging Face tensor holding (part of) a logical tensor: name, first-axis index or None, shape."

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.*)")
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(.*)")


def tensors(model):
    """[(vps name, logical shape, [Piece, ...])] for every logical tensor of
    model (a vps.Model), in tensor id order."""
    return [(model.tensor_name(t), model.tensor_shape(t), pieces(model, model.tensor_name(t)))
            for t in range(model.num_tensors)]


def pieces(model, name):
    """The Hugging Face pieces of the logical tensor called name (a global
    Megatron name, as vps names tensors); [] for one transformers does not
    build."""
    if name.startswith("mtp."):
        return []
    gpt2 = model.position == 1
    if name == "embedding.word_embeddings.weight":
        return [Piece("transformer.wte.weight" if gpt2 else "model.embed_tokens.weight", None,
                      (model.vocab, model.hidden))]
    if name == "embedding.position_embeddings.weight":
        return [Piece("transformer.wpe.weight", None, (model.max_positions, model.hidden))]
    if name == "output_layer.weight":
        return [Piece("lm_head.weight", None, (model.vocab, model.hidden))]
    if name.startswith("decoder.final_layernorm."):
        return [Piece(("transformer.ln_f." if gpt2 else "model.norm.") + name.rsplit(".", 1)[1], None,
                      (model.hidden,))]
    m = _LAYER.fullmatch(name)
    if not m:
        raise ValueError("%s: not a tensor of a decoder vps knows" % name)
    layer, rest = int(m.group(1)), m.group(2)
    if gpt2:
        return _gpt2(model, "transformer.h.%d." % layer, rest)
    return _llama(model, "model.layers.%d." % layer, rest)


def _gpt2(model, p, rest):
    h, f = model.hidden, model.ffn
    table = {
        "self_attention.linear_qkv.layer_norm_weight": [(p + "ln_1.weight", (h,))],
        "self_attention.linear_qkv.layer_norm_bias": [(p + "ln_1.bias", (h,))],
        # Conv1D keeps [in, out]
        "self_attention.linear_qkv.weight": [(p + "attn.c_attn.weight", (h, 3 * h))],
        "self_attention.linear_qkv.bias": [(p + "attn.c_attn.bias", (3 * h,))],
        "self_attention.linear_proj.weight": [(p + "attn.c_proj.weight", (h, h))],
        "self_attention.linear_proj.bias": [(p + "attn.c_proj.bias", (h,))],
        "mlp.linear_fc1.layer_norm_weight": [(p + "ln_2.weight", (h,))],
        "mlp.linear_fc1.layer_norm_bias": [(p + "ln_2.bias", (h,))],
        "mlp.linear_fc1.weight": [(p + "mlp.c_fc.weight", (h, f))],
        "mlp.linear_fc1.bias": [(p + "mlp.c_fc.bias", (f,))],
        "mlp.linear_fc2.weight": [(p + "mlp.c_proj.weight", (f, h))],
        "mlp.linear_fc2.bias": [(p + "mlp.c_proj.bias", (h,))],
    }
    if rest not in table:
        raise ValueError("%s: no GPT-2 parameter holds it" % rest)
    return [Piece(n, None, s) for n, s in table[rest]]


def _llama(model, p, rest):
    h, d, heads, g = model.hidden, model.head_dim, model.heads, model.query_groups
    f, mf, shared = model.ffn, model.moe_ffn, model.shared_ffn
    e = _EXPERT.fullmatch(rest)
    if e:
        expert, what = int(e.group(1)), e.group(2)
        if what == "linear_fc1.weight":
            return [Piece(p + "mlp.experts.gate_up_proj", expert, (2 * mf, h))]
        if what == "linear_fc2.weight":
            return [Piece(p + "mlp.experts.down_proj", expert, (h, mf))]
        raise ValueError("%s: no expert parameter holds it" % rest)
    mla = model.kv_lora_rank > 0
    qk, pos, v, ql, kvl = model.qk_head_dim, model.qk_pos_dim, model.v_head_dim, model.q_lora_rank, model.kv_lora_rank
    a = p + "self_attn."
    table = {
        "input_layernorm.weight": [(p + "input_layernorm.weight", (h,))],
        "self_attention.linear_qkv.layer_norm_weight": [(p + "input_layernorm.weight", (h,))],
        "self_attention.linear_qkv.weight": [(a + "q_proj.weight", (heads * d, h)), (a + "k_proj.weight", (g * d, h)),
                                             (a + "v_proj.weight", (g * d, h))],
        "self_attention.linear_qkv.bias": [(a + "q_proj.bias", (heads * d,)), (a + "k_proj.bias", (g * d,)),
                                           (a + "v_proj.bias", (g * d,))],
        "self_attention.linear_proj.weight": [(a + "o_proj.weight", (h, heads * (v if mla else d)))],
        "self_attention.q_layernorm.weight": [(a + "q_norm.weight", (d,))],
        "self_attention.k_layernorm.weight": [(a + "k_norm.weight", (d,))],
        "self_attention.linear_q_proj.layer_norm_weight": [],
        "self_attention.linear_q_proj.weight": [(a + "q_proj.weight", (heads * (qk + pos), h))],
        "self_attention.linear_q_down_proj.weight": [(a + "q_a_proj.weight", (ql, h))],
        "self_attention.linear_q_up_proj.layer_norm_weight": [(a + "q_a_layernorm.weight", (ql,))],
        "self_attention.linear_q_up_proj.weight": [(a + "q_b_proj.weight", (heads * (qk + pos), ql))],
        "self_attention.linear_kv_down_proj.weight": [(a + "kv_a_proj_with_mqa.weight", (kvl + pos, h))],
        "self_attention.linear_kv_up_proj.layer_norm_weight": [(a + "kv_a_layernorm.weight", (kvl,))],
        "self_attention.linear_kv_up_proj.weight": [(a + "kv_b_proj.weight", (heads * (qk + v), kvl))],
        "mlp.linear_fc1.layer_norm_weight": [(p + "post_attention_layernorm.weight", (h,))],
        "pre_mlp_layernorm.weight": [(p + "post_attention_layernorm.weight", (h,))],
        "mlp.linear_fc1.weight": [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h))],
        "mlp.linear_fc2.weight": [(p + "mlp.down_proj.weight", (h, f))],
        "mlp.router.weight": [(p + "mlp.gate.weight", (model.experts, h))],
        "mlp.router.expert_bias": [(p + "mlp.gate.e_score_correction_bias", (model.experts,))],
        "mlp.shared_experts.linear_fc1.weight": [(p + "mlp.shared_experts.gate_proj.weight", (shared, h)),
                                                 (p + "mlp.shared_experts.up_proj.weight", (shared, h))],
        "mlp.shared_experts.linear_fc2.weight": [(p + "mlp.shared_experts.down_proj.weight", (h, shared))],
    }
    if rest not in table:
        raise ValueError("%s: no Hugging Face parameter holds it" % rest)
    return [Piece(n, None, s) for n, s in table[rest]]
