#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/doc.h"
#include "util/hash.h"
#include "util/internal.h"
#include "model/model_io.h"

/* The per-layer registration order of a model, derived from its switches.
 * Megatron registers linear_proj before linear_qkv (Attention builds its
 * output projection first), fuses the input norm into linear_qkv and, in
 * dense layers, the pre-MLP norm into linear_fc1. An MoE model may start
 * with dense layers (first_dense): two layer kinds, dense layers first. An
 * MoE layer is head, then the routed experts, then tail (shared experts). */
struct schema {
	enum vps_tensor_kind pre[2], dense[24], head[24], expert[4], tail[2], post[3], mtp_pre[5], mtp_post[2];
	uint32_t npre, ndense, nhead, nexpert, ntail, npost, nmtp_pre, nmtp_post;
	uint32_t per_dense, per_moe, per_mtp;
	int64_t first_moe; /* layers before it are dense */
	bool mtp_moe;      /* MTP layers repeat the last decoder layer's kind */
	/* module buffers (the routers' expert_bias), after every parameter:
	 * the MoE decoder layers', then the MTP layers' */
	uint32_t routers, mtp_routers;
};

static uint32_t add_attention(const struct vps_model *m, enum vps_tensor_kind *k)
{
	bool ln = m->norm == VPS_NORM_LAYER;
	uint32_t n = 0;
	if (m->kv_lora_rank > 0) {
		/* MLA (MLASelfAttention, TE spec without down-projection fusion):
		 * a separate input_layernorm, then linear_proj (built by
		 * MultiLatentAttention before MLASelfAttention adds the rest),
		 * then the projections in the order __init__ builds them; with
		 * qk_layernorm the q/kv norms are fused into the up projections,
		 * and without query compression into linear_q_proj, which then
		 * normalises the hidden state (core 0.19 mla_qk_norm_config.py:
		 * _resolve_mla_qk_layernorm). */
		k[n++] = VPS_T_INPUT_LN_W;
		k[n++] = VPS_T_PROJ_W;
		if (m->q_lora_rank > 0) {
			k[n++] = VPS_T_Q_DOWN_W;
			if (m->qk_norm)
				k[n++] = VPS_T_Q_UP_LN_W;
			k[n++] = VPS_T_Q_UP_W;
		} else {
			if (m->qk_norm)
				k[n++] = VPS_T_Q_PROJ_LN_W;
			k[n++] = VPS_T_Q_PROJ_W;
		}
		k[n++] = VPS_T_KV_DOWN_W;
		if (m->qk_norm)
			k[n++] = VPS_T_KV_UP_LN_W;
		k[n++] = VPS_T_KV_UP_W;
		return n;
	}
	k[n++] = VPS_T_PROJ_W;
	if (m->bias)
		k[n++] = VPS_T_PROJ_B;
	k[n++] = VPS_T_QKV_LN_W;
	if (ln)
		k[n++] = VPS_T_QKV_LN_B;
	k[n++] = VPS_T_QKV_W;
	if (m->bias || m->qkv_bias)
		k[n++] = VPS_T_QKV_B;
	if (m->qk_norm) {
		k[n++] = VPS_T_Q_NORM_W;
		if (ln)
			k[n++] = VPS_T_Q_NORM_B;
		k[n++] = VPS_T_K_NORM_W;
		if (ln)
			k[n++] = VPS_T_K_NORM_B;
	}
	return n;
}

static void build_schema(const struct vps_model *m, struct schema *s)
{
	bool ln = m->norm == VPS_NORM_LAYER;
	memset(s, 0, sizeof(*s));
	s->pre[s->npre++] = VPS_T_WORD_EMB;
	if (m->position == VPS_POS_LEARNED)
		s->pre[s->npre++] = VPS_T_POS_EMB;
	s->ndense = add_attention(m, s->dense);
	s->nhead = add_attention(m, s->head);
	s->dense[s->ndense++] = VPS_T_FC1_LN_W;
	if (ln)
		s->dense[s->ndense++] = VPS_T_FC1_LN_B;
	s->dense[s->ndense++] = VPS_T_FC1_W;
	if (m->bias)
		s->dense[s->ndense++] = VPS_T_FC1_B;
	s->dense[s->ndense++] = VPS_T_FC2_W;
	if (m->bias)
		s->dense[s->ndense++] = VPS_T_FC2_B;
	/* MoELayer.__init__ builds the router, the experts, then the shared
	 * experts */
	s->head[s->nhead++] = VPS_T_PRE_MLP_LN_W;
	if (ln)
		s->head[s->nhead++] = VPS_T_PRE_MLP_LN_B;
	s->head[s->nhead++] = VPS_T_ROUTER_W;
	s->expert[s->nexpert++] = VPS_T_EXP_FC1_W;
	if (m->bias)
		s->expert[s->nexpert++] = VPS_T_EXP_FC1_B;
	s->expert[s->nexpert++] = VPS_T_EXP_FC2_W;
	if (m->bias)
		s->expert[s->nexpert++] = VPS_T_EXP_FC2_B;
	if (m->shared_ffn > 0) {
		s->tail[s->ntail++] = VPS_T_SHARED_FC1_W;
		s->tail[s->ntail++] = VPS_T_SHARED_FC2_W;
	}
	s->post[s->npost++] = VPS_T_FINAL_LN_W;
	if (ln)
		s->post[s->npost++] = VPS_T_FINAL_LN_B;
	if (!m->tied_embeddings)
		s->post[s->npost++] = VPS_T_OUTPUT_W;
	s->per_dense = s->ndense;
	s->per_moe = s->nhead + (uint32_t)m->experts * s->nexpert + s->ntail;
	s->first_moe = m->experts > 0 ? m->first_dense : m->layers;
	/* MultiTokenPredictionLayer.__init__: enorm, hnorm, eh_proj, the
	 * layer (the decoder's last layer spec: get_gpt_mtp_block_spec),
	 * final_layernorm */
	s->mtp_pre[s->nmtp_pre++] = VPS_T_MTP_ENORM_W;
	if (ln)
		s->mtp_pre[s->nmtp_pre++] = VPS_T_MTP_ENORM_B;
	s->mtp_pre[s->nmtp_pre++] = VPS_T_MTP_HNORM_W;
	if (ln)
		s->mtp_pre[s->nmtp_pre++] = VPS_T_MTP_HNORM_B;
	s->mtp_pre[s->nmtp_pre++] = VPS_T_MTP_EH_PROJ_W;
	s->mtp_post[s->nmtp_post++] = VPS_T_MTP_FINAL_LN_W;
	if (ln)
		s->mtp_post[s->nmtp_post++] = VPS_T_MTP_FINAL_LN_B;
	s->mtp_moe = m->layers - 1 >= s->first_moe;
	s->per_mtp = s->nmtp_pre + (s->mtp_moe ? s->per_moe : s->per_dense) + s->nmtp_post;
	if (m->router_bias && m->experts > 0) {
		s->routers = (uint32_t)(m->layers - s->first_moe);
		s->mtp_routers = s->mtp_moe ? (uint32_t)m->mtp_layers : 0;
	}
}

static uint32_t layers_tensors(const struct schema *s, int64_t layers)
{
	int64_t dense = layers < s->first_moe ? layers : s->first_moe;
	return (uint32_t)dense * s->per_dense + (uint32_t)(layers - dense) * s->per_moe;
}

/* Ids: the pre-decoder tensors, the decoder layers, the post-decoder ones,
 * then the MTP layers (appended, so a model without them keeps its ids) */
static uint32_t mtp_first(const struct vps_model *m, const struct schema *s, int64_t k)
{
	return s->npre + layers_tensors(s, m->layers) + s->npost + (uint32_t)k * s->per_mtp;
}

uint32_t vps_model_num_tensors(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	return mtp_first(m, &s, m->mtp_layers) + s.routers + s.mtp_routers;
}

uint32_t vps_model_module_first(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	return mtp_first(m, &s, m->mtp_layers);
}

bool vps_model_router_bias(const struct vps_model *m, int64_t layer, int64_t mtp, uint32_t *id)
{
	struct schema s;
	build_schema(m, &s);
	uint32_t first = mtp_first(m, &s, m->mtp_layers);
	if (layer >= 0 && layer >= s.first_moe && layer - s.first_moe < (int64_t)s.routers) {
		*id = first + (uint32_t)(layer - s.first_moe);
		return true;
	}
	if (layer < 0 && mtp >= 0 && mtp < (int64_t)s.mtp_routers) {
		*id = first + s.routers + (uint32_t)mtp;
		return true;
	}
	return false;
}

uint32_t vps_model_pre_tensors(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	return s.npre;
}

uint32_t vps_model_layer_first(const struct vps_model *m, int64_t layer)
{
	struct schema s;
	build_schema(m, &s);
	return s.npre + layers_tensors(&s, layer);
}

bool vps_model_layer_moe(const struct vps_model *m, int64_t layer)
{
	return m->experts > 0 && layer >= m->first_dense;
}

static void layer_span(const struct vps_model *m, const struct schema *sp, uint32_t first, bool moe,
		       struct vps_layer_span *out)
{
	const struct schema s = *sp;
	out->first = first;
	if (!moe) {
		out->count = s.per_dense;
		out->expert_first = s.per_dense;
		out->experts = 0;
		out->per_expert = s.nexpert;
	} else {
		out->count = s.per_moe;
		out->expert_first = s.nhead;
		out->experts = (uint32_t)m->experts;
		out->per_expert = s.nexpert;
	}
}

void vps_model_layer_span(const struct vps_model *m, int64_t layer, struct vps_layer_span *out)
{
	struct schema s;
	build_schema(m, &s);
	layer_span(m, &s, s.npre + layers_tensors(&s, layer), layer >= s.first_moe, out);
}

void vps_model_mtp_span(const struct vps_model *m, int64_t k, struct vps_mtp_span *out)
{
	struct schema s;
	build_schema(m, &s);
	out->first = mtp_first(m, &s, k);
	out->count = s.per_mtp;
	out->pre = s.nmtp_pre;
	layer_span(m, &s, out->first + s.nmtp_pre, s.mtp_moe, &out->layer);
}

static void set_shape(struct vps_tensor *t, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
	t->ndim = ndim;
	t->shape[0] = a;
	t->shape[1] = b;
	t->shape[2] = c;
	t->shape[3] = d;
	for (int k = ndim; k < VPS_MAX_DIMS; k++)
		t->shape[k] = 1;
}

/* The shape and tensor-parallel split of an attention tensor.
 * @return false for a tensor of another kind. */
static bool attention_shape(const struct vps_model *m, struct vps_tensor *t)
{
	int64_t h = m->hidden, g = m->query_groups, d = m->head_dim;
	int64_t slots = m->heads / m->query_groups + 2;
	switch (t->kind) {
	case VPS_T_PROJ_W:
		/* MLA: linear_proj's input is heads x v_head_dim
		 * (query_projection_size in MultiLatentAttention) */
		set_shape(t, 2, h, m->heads * (m->kv_lora_rank > 0 ? m->v_head_dim : d), 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = 1;
		return true;
	/* MLA up projections are column parallel and viewed per head
	 * ([..., heads_per_partition, head dim]): a head axis makes each TP
	 * rank's rows one box. The down projections are TELinear
	 * parallel_mode='duplicated': whole on every TP rank. */
	case VPS_T_Q_PROJ_W:
		set_shape(t, 3, m->heads, m->qk_head_dim + m->qk_pos_dim, h, 1);
		t->split = VPS_SPLIT_AXIS;
		return true;
	case VPS_T_Q_PROJ_LN_W:
		set_shape(t, 1, h, 1, 1, 1);
		return true;
	case VPS_T_Q_DOWN_W:
		set_shape(t, 2, m->q_lora_rank, h, 1, 1);
		return true;
	case VPS_T_Q_UP_LN_W:
		set_shape(t, 1, m->q_lora_rank, 1, 1, 1);
		return true;
	case VPS_T_Q_UP_W:
		set_shape(t, 3, m->heads, m->qk_head_dim + m->qk_pos_dim, m->q_lora_rank, 1);
		t->split = VPS_SPLIT_AXIS;
		return true;
	case VPS_T_KV_DOWN_W:
		set_shape(t, 2, m->kv_lora_rank + m->qk_pos_dim, h, 1, 1);
		return true;
	case VPS_T_KV_UP_LN_W:
		set_shape(t, 1, m->kv_lora_rank, 1, 1, 1);
		return true;
	case VPS_T_KV_UP_W:
		set_shape(t, 3, m->heads, m->qk_head_dim + m->v_head_dim, m->kv_lora_rank, 1);
		t->split = VPS_SPLIT_AXIS;
		return true;
	case VPS_T_QKV_W:
		set_shape(t, 4, g, slots, d, h);
		t->split = VPS_SPLIT_FLAT;
		return true;
	case VPS_T_QKV_B:
		set_shape(t, 3, g, slots, d, 1);
		t->split = VPS_SPLIT_FLAT;
		return true;
	case VPS_T_Q_NORM_W:
	case VPS_T_Q_NORM_B:
	case VPS_T_K_NORM_W:
	case VPS_T_K_NORM_B:
		set_shape(t, 1, d, 1, 1, 1);
		return true;
	default:
		return false;
	}
}

/* The same for an MLP's, a shared expert's, a routed expert's or a
 * router's tensor. */
static bool mlp_shape(const struct vps_model *m, struct vps_tensor *t)
{
	int64_t h = m->hidden;
	bool gated = m->activation == VPS_ACT_SWIGLU;
	switch (t->kind) {
	case VPS_T_FC1_W:
	case VPS_T_SHARED_FC1_W:
	case VPS_T_EXP_FC1_W: {
		/* SharedExpertMLP is an MLP of ffn_hidden_size = shared_ffn */
		int64_t f = t->kind == VPS_T_FC1_W ? m->ffn : t->kind == VPS_T_SHARED_FC1_W ? m->shared_ffn : m->moe_ffn;
		if (gated)
			set_shape(t, 3, 2, f, h, 1);
		else
			set_shape(t, 2, f, h, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = gated ? 1 : 0;
		return true;
	}
	case VPS_T_FC1_B:
	case VPS_T_EXP_FC1_B: {
		int64_t f = t->kind == VPS_T_FC1_B ? m->ffn : m->moe_ffn;
		if (gated)
			set_shape(t, 2, 2, f, 1, 1);
		else
			set_shape(t, 1, f, 1, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = gated ? 1 : 0;
		return true;
	}
	case VPS_T_FC2_W:
	case VPS_T_SHARED_FC2_W:
	case VPS_T_EXP_FC2_W:
		set_shape(t, 2, h,
			  t->kind == VPS_T_FC2_W ? m->ffn : t->kind == VPS_T_SHARED_FC2_W ? m->shared_ffn : m->moe_ffn, 1,
			  1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = 1;
		return true;
	case VPS_T_ROUTER_W:
		set_shape(t, 2, m->experts, h, 1, 1);
		return true;
	case VPS_T_ROUTER_BIAS:
		/* TopKRouter: register_buffer('expert_bias', zeros(num_experts,
		 * dtype=float32)), whole on every rank of the layer's stage */
		set_shape(t, 1, m->experts, 1, 1, 1);
		return true;
	default:
		return false;
	}
}

/* The embeddings, the output layer, MTP's eh_proj, and what every other
 * kind is: [h], replicated. */
static void other_shape(const struct vps_model *m, struct vps_tensor *t)
{
	int64_t h = m->hidden;
	switch (t->kind) {
	case VPS_T_WORD_EMB:
	case VPS_T_OUTPUT_W:
		set_shape(t, 2, m->vocab, h, 1, 1);
		t->split = VPS_SPLIT_VOCAB;
		break;
	case VPS_T_POS_EMB:
		set_shape(t, 2, m->max_positions, h, 1, 1);
		break;
	case VPS_T_MTP_EH_PROJ_W:
		/* eh_proj: column parallel [h, 2h] (MultiTokenPredictionLayer) */
		set_shape(t, 2, h, 2 * h, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		break;
	default: /* norms and the biases of row-parallel layers: [h], replicated */
		set_shape(t, 1, h, 1, 1, 1);
		break;
	}
}

static void fill_tensor(const struct vps_model *m, struct vps_tensor *t)
{
	t->split = VPS_SPLIT_NONE;
	t->axis = 0;
	t->is_expert = false;
	if (!attention_shape(m, t) && !mlp_shape(m, t))
		other_shape(m, t);
	if (t->kind >= VPS_T_EXP_FC1_W && t->kind <= VPS_T_EXP_FC2_B)
		t->is_expert = true;
	t->module_buffer = t->kind == VPS_T_ROUTER_BIAS;
}

/* Tensor pos of an MoE layer: head, the routed experts, tail. */
static void moe_tensor(const struct vps_model *m, const struct schema *s, uint32_t pos, struct vps_tensor *t)
{
	uint32_t nexp = (uint32_t)m->experts * s->nexpert;
	if (pos < s->nhead) {
		t->kind = s->head[pos];
	} else if (pos < s->nhead + nexp) {
		pos -= s->nhead;
		t->expert = (int32_t)(pos / s->nexpert);
		t->kind = s->expert[pos % s->nexpert];
	} else {
		t->kind = s->tail[pos - s->nhead - nexp];
	}
}

vps_result_t vps_model_tensor(const struct vps_model *m, uint32_t id, struct vps_tensor *t)
{
	struct schema s;
	build_schema(m, &s);
	uint32_t ndense = layers_tensors(&s, s.first_moe < m->layers ? s.first_moe : m->layers);
	uint32_t nlay = layers_tensors(&s, m->layers);
	uint32_t params = mtp_first(m, &s, m->mtp_layers); /* module buffers follow */
	memset(t, 0, sizeof(*t));
	t->id = id;
	t->layer = -1;
	t->expert = -1;
	t->mtp = -1;
	if (id < s.npre) {
		t->kind = s.pre[id];
	} else if (id < s.npre + ndense) {
		uint32_t rel = id - s.npre;
		t->layer = (int32_t)(rel / s.per_dense);
		t->kind = s.dense[rel % s.per_dense];
	} else if (id < s.npre + nlay) {
		uint32_t rel = id - s.npre - ndense;
		t->layer = (int32_t)(s.first_moe + rel / s.per_moe);
		moe_tensor(m, &s, rel % s.per_moe, t);
	} else if (id < s.npre + nlay + s.npost) {
		t->kind = s.post[id - s.npre - nlay];
	} else if (id < params) {
		uint32_t rel = id - mtp_first(m, &s, 0), pos = rel % s.per_mtp;
		uint32_t inner = s.per_mtp - s.nmtp_pre - s.nmtp_post;
		t->mtp = (int32_t)(rel / s.per_mtp);
		if (pos < s.nmtp_pre)
			t->kind = s.mtp_pre[pos];
		else if (pos >= s.nmtp_pre + inner)
			t->kind = s.mtp_post[pos - s.nmtp_pre - inner];
		else if (s.mtp_moe)
			moe_tensor(m, &s, pos - s.nmtp_pre, t);
		else
			t->kind = s.dense[pos - s.nmtp_pre];
	} else if (id - params < s.routers + s.mtp_routers) {
		uint32_t rel = id - params;
		t->kind = VPS_T_ROUTER_BIAS;
		if (rel < s.routers)
			t->layer = (int32_t)(s.first_moe + rel);
		else
			t->mtp = (int32_t)(rel - s.routers);
	} else {
		return vps_fail(VPS_EINPUT, "tensor id %u out of range (model has %u)", id,
				params + s.routers + s.mtp_routers);
	}
	fill_tensor(m, t);
	return VPS_OK;
}

static const char *kind_suffix(enum vps_tensor_kind k)
{
	switch (k) {
	case VPS_T_WORD_EMB: return "embedding.word_embeddings.weight";
	case VPS_T_POS_EMB: return "embedding.position_embeddings.weight";
	case VPS_T_PROJ_W: return "self_attention.linear_proj.weight";
	case VPS_T_PROJ_B: return "self_attention.linear_proj.bias";
	case VPS_T_QKV_LN_W: return "self_attention.linear_qkv.layer_norm_weight";
	case VPS_T_QKV_LN_B: return "self_attention.linear_qkv.layer_norm_bias";
	case VPS_T_QKV_W: return "self_attention.linear_qkv.weight";
	case VPS_T_QKV_B: return "self_attention.linear_qkv.bias";
	case VPS_T_Q_NORM_W: return "self_attention.q_layernorm.weight";
	case VPS_T_Q_NORM_B: return "self_attention.q_layernorm.bias";
	case VPS_T_K_NORM_W: return "self_attention.k_layernorm.weight";
	case VPS_T_K_NORM_B: return "self_attention.k_layernorm.bias";
	case VPS_T_PRE_MLP_LN_W: return "pre_mlp_layernorm.weight";
	case VPS_T_PRE_MLP_LN_B: return "pre_mlp_layernorm.bias";
	case VPS_T_FC1_LN_W: return "mlp.linear_fc1.layer_norm_weight";
	case VPS_T_FC1_LN_B: return "mlp.linear_fc1.layer_norm_bias";
	case VPS_T_FC1_W: return "mlp.linear_fc1.weight";
	case VPS_T_FC1_B: return "mlp.linear_fc1.bias";
	case VPS_T_FC2_W: return "mlp.linear_fc2.weight";
	case VPS_T_FC2_B: return "mlp.linear_fc2.bias";
	case VPS_T_ROUTER_W: return "mlp.router.weight";
	case VPS_T_EXP_FC1_W: return "linear_fc1.weight";
	case VPS_T_EXP_FC1_B: return "linear_fc1.bias";
	case VPS_T_EXP_FC2_W: return "linear_fc2.weight";
	case VPS_T_EXP_FC2_B: return "linear_fc2.bias";
	case VPS_T_FINAL_LN_W: return "decoder.final_layernorm.weight";
	case VPS_T_FINAL_LN_B: return "decoder.final_layernorm.bias";
	case VPS_T_OUTPUT_W: return "output_layer.weight";
	case VPS_T_INPUT_LN_W: return "input_layernorm.weight";
	case VPS_T_Q_PROJ_LN_W: return "self_attention.linear_q_proj.layer_norm_weight";
	case VPS_T_Q_PROJ_W: return "self_attention.linear_q_proj.weight";
	case VPS_T_Q_DOWN_W: return "self_attention.linear_q_down_proj.weight";
	case VPS_T_Q_UP_LN_W: return "self_attention.linear_q_up_proj.layer_norm_weight";
	case VPS_T_Q_UP_W: return "self_attention.linear_q_up_proj.weight";
	case VPS_T_KV_DOWN_W: return "self_attention.linear_kv_down_proj.weight";
	case VPS_T_KV_UP_LN_W: return "self_attention.linear_kv_up_proj.layer_norm_weight";
	case VPS_T_KV_UP_W: return "self_attention.linear_kv_up_proj.weight";
	case VPS_T_SHARED_FC1_W: return "mlp.shared_experts.linear_fc1.weight";
	case VPS_T_SHARED_FC2_W: return "mlp.shared_experts.linear_fc2.weight";
	case VPS_T_MTP_ENORM_W: return "enorm.weight";
	case VPS_T_MTP_ENORM_B: return "enorm.bias";
	case VPS_T_MTP_HNORM_W: return "hnorm.weight";
	case VPS_T_MTP_HNORM_B: return "hnorm.bias";
	case VPS_T_MTP_EH_PROJ_W: return "eh_proj.weight";
	case VPS_T_MTP_FINAL_LN_W: return "final_layernorm.weight";
	case VPS_T_MTP_FINAL_LN_B: return "final_layernorm.bias";
	case VPS_T_ROUTER_BIAS: return "mlp.router.expert_bias";
	case VPS_T_NKINDS: break;
	}
	return "?";
}

static bool mtp_own_kind(enum vps_tensor_kind k)
{
	return k >= VPS_T_MTP_ENORM_W && k <= VPS_T_MTP_FINAL_LN_B;
}

size_t vps_tensor_local_name(const struct vps_tensor *t, int64_t layer, int64_t expert, char *buf, size_t n)
{
	int len;
	/* the MTP block is whole on one chunk: its local index is its global one */
	if (t->mtp >= 0 && mtp_own_kind(t->kind))
		len = snprintf(buf, n, "mtp.layers.%" PRId32 ".%s", t->mtp, kind_suffix(t->kind));
	else if (t->mtp >= 0 && t->expert < 0)
		len = snprintf(buf, n, "mtp.layers.%" PRId32 ".mtp_model_layer.%s", t->mtp, kind_suffix(t->kind));
	else if (t->mtp >= 0)
		len = snprintf(buf, n, "mtp.layers.%" PRId32 ".mtp_model_layer.mlp.experts.local_experts.%" PRId64 ".%s",
			       t->mtp, expert, kind_suffix(t->kind));
	else if (t->layer < 0)
		len = snprintf(buf, n, "%s", kind_suffix(t->kind));
	else if (t->expert < 0)
		len = snprintf(buf, n, "decoder.layers.%" PRId64 ".%s", layer, kind_suffix(t->kind));
	else
		len = snprintf(buf, n, "decoder.layers.%" PRId64 ".mlp.experts.local_experts.%" PRId64 ".%s",
			       layer, expert, kind_suffix(t->kind));
	return len < 0 ? 0 : (size_t)len;
}

size_t vps_tensor_name(const struct vps_tensor *t, char *buf, size_t n)
{
	return vps_tensor_local_name(t, t->layer, t->expert, buf, n);
}

/* Parse a non-negative decimal at *p followed by '.'; advance past the dot. */
static bool parse_index(const char **p, int64_t *v)
{
	const char *s = *p;
	int64_t x = 0;
	if (*s < '0' || *s > '9')
		return false;
	while (*s >= '0' && *s <= '9') {
		if (x > INT32_MAX)
			return false;
		x = x * 10 + (*s++ - '0');
	}
	if (*s != '.')
		return false;
	*p = s + 1;
	*v = x;
	return true;
}

static bool find_kind(const enum vps_tensor_kind *k, uint32_t n, const char *name, uint32_t *pos)
{
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(name, kind_suffix(k[i]))) {
			*pos = i;
			return true;
		}
	return false;
}

/* p: a tensor's name after its layer's prefix; base: the layer's first id */
static bool find_in_layer(const struct vps_model *m, const struct schema *s, uint32_t base, bool moe, const char *p,
			  uint32_t *id)
{
	static const char ep[] = "mlp.experts.local_experts.";
	uint32_t pos;
	int64_t expert;
	if (!moe) {
		if (!find_kind(s->dense, s->ndense, p, &pos))
			return false;
		*id = base + pos;
		return true;
	}
	if (strncmp(p, ep, sizeof(ep) - 1) == 0) {
		p += sizeof(ep) - 1;
		if (!parse_index(&p, &expert) || expert >= m->experts || !find_kind(s->expert, s->nexpert, p, &pos))
			return false;
		*id = base + s->nhead + (uint32_t)expert * s->nexpert + pos;
		return true;
	}
	if (find_kind(s->head, s->nhead, p, &pos)) {
		*id = base + pos;
		return true;
	}
	if (find_kind(s->tail, s->ntail, p, &pos)) {
		*id = base + s->nhead + (uint32_t)m->experts * s->nexpert + pos;
		return true;
	}
	return false;
}

vps_result_t vps_model_find_tensor(const struct vps_model *m, const char *name, uint32_t *id)
{
	struct schema s;
	build_schema(m, &s);
	uint32_t nlay = layers_tensors(&s, m->layers), pos;
	if (find_kind(s.pre, s.npre, name, &pos)) {
		*id = pos;
		return VPS_OK;
	}
	if (find_kind(s.post, s.npost, name, &pos)) {
		*id = s.npre + nlay + pos;
		return VPS_OK;
	}
	static const char lp[] = "decoder.layers.", mp[] = "mtp.layers.", inner[] = "mtp_model_layer.";
	const char *p = name, *bias = kind_suffix(VPS_T_ROUTER_BIAS);
	int64_t layer;
	if (strncmp(p, lp, sizeof(lp) - 1) == 0) {
		p += sizeof(lp) - 1;
		if (parse_index(&p, &layer) && layer < m->layers &&
		    (find_in_layer(m, &s, s.npre + layers_tensors(&s, layer), layer >= s.first_moe, p, id) ||
		     (!strcmp(p, bias) && vps_model_router_bias(m, layer, -1, id))))
			return VPS_OK;
	} else if (strncmp(p, mp, sizeof(mp) - 1) == 0) {
		p += sizeof(mp) - 1;
		if (parse_index(&p, &layer) && layer < m->mtp_layers) {
			if (!strncmp(p, inner, sizeof(inner) - 1) && !strcmp(p + sizeof(inner) - 1, bias) &&
			    vps_model_router_bias(m, -1, layer, id))
				return VPS_OK;
			uint32_t base = mtp_first(m, &s, layer);
			if (find_kind(s.mtp_pre, s.nmtp_pre, p, &pos)) {
				*id = base + pos;
				return VPS_OK;
			}
			if (find_kind(s.mtp_post, s.nmtp_post, p, &pos)) {
				*id = base + s.per_mtp - s.nmtp_post + pos;
				return VPS_OK;
			}
			if (strncmp(p, inner, sizeof(inner) - 1) == 0 &&
			    find_in_layer(m, &s, base + s.nmtp_pre, s.mtp_moe, p + sizeof(inner) - 1, id))
				return VPS_OK;
		}
	}
	return vps_fail(VPS_EINPUT, "no tensor '%s' in model %s", name, m->name);
}

/* Elements of the tensors of the given kinds, in floating point (no wrap:
 * validate bounds the model with it before any int64 count is formed). */
static double kinds_volume(const struct vps_model *m, const enum vps_tensor_kind *k, uint32_t n)
{
	double sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct vps_tensor t;
		memset(&t, 0, sizeof(t));
		t.kind = k[i];
		fill_tensor(m, &t);
		double v = 1;
		for (int d = 0; d < t.ndim; d++)
			v *= (double)t.shape[d];
		sum += v;
	}
	return sum;
}

static int64_t kinds_elements(const struct vps_model *m, const enum vps_tensor_kind *k, uint32_t n)
{
	int64_t sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct vps_tensor t;
		struct vps_box b;
		memset(&t, 0, sizeof(t));
		t.kind = k[i];
		fill_tensor(m, &t);
		vps_box_full(&b, t.ndim, t.shape);
		sum += vps_box_volume(&b);
	}
	return sum;
}

int64_t vps_model_parameters(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	/* layers of a kind are identical: count one of each and multiply */
	int64_t dense = s.first_moe < m->layers ? s.first_moe : m->layers;
	int64_t moe = kinds_elements(m, s.head, s.nhead) + m->experts * kinds_elements(m, s.expert, s.nexpert) +
		      kinds_elements(m, s.tail, s.ntail);
	int64_t dense_layer = kinds_elements(m, s.dense, s.ndense);
	int64_t mtp = kinds_elements(m, s.mtp_pre, s.nmtp_pre) + kinds_elements(m, s.mtp_post, s.nmtp_post) +
		      (s.mtp_moe ? moe : dense_layer);
	return kinds_elements(m, s.pre, s.npre) + kinds_elements(m, s.post, s.npost) + dense * dense_layer +
	       (m->layers - dense) * moe + m->mtp_layers * mtp;
}

int64_t vps_model_module_buffers(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	/* every MoE layer's router, the MTP layers' included */
	return (int64_t)(s.routers + s.mtp_routers) * m->experts;
}

uint64_t vps_model_hash(const struct vps_model *m)
{
	int64_t f[] = {m->hidden, m->layers, m->heads, m->query_groups, m->head_dim, m->ffn,
		       m->vocab, m->vocab_divisor, m->norm, m->activation, m->position,
		       m->max_positions, m->bias, m->qkv_bias, m->tied_embeddings, m->qk_norm,
		       m->experts, m->moe_ffn};
	uint64_t h = vps_hash64(f, sizeof(f), 0x6d6f64656cULL);
	/* the DeepSeek fields only when set: an older model keeps its hash */
	int64_t ds[] = {m->first_dense, m->shared_ffn, m->router_bias, m->kv_lora_rank, m->q_lora_rank,
			m->qk_head_dim, m->qk_pos_dim, m->v_head_dim};
	for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++)
		if (ds[i])
			h = vps_hash64(ds, sizeof(ds), h);
	if (m->mtp_layers)
		h = vps_hash64(&m->mtp_layers, sizeof(m->mtp_layers), h);
	/* linear_q_proj.layer_norm_weight joined these models' tensors (vps
	 * 0.1 laid them out without it): documents written by the older rule
	 * name another model, and are refused rather than misread */
	if (m->kv_lora_rank && !m->q_lora_rank && m->qk_norm)
		h = vps_hash64("q_proj_norm", 11, h);
	return h;
}

/* ---------------------------------------------------------------------- */

static const char *norm_names[] = {"rmsnorm", "layernorm"};
static const char *act_names[] = {"swiglu", "gelu"};
static const char *pos_names[] = {"rope", "learned"};

static vps_result_t read_enum(struct vps_reader *r, const char *key, const char **names, int n,
			      int def, int *out)
{
	const char *s;
	VPS_CHECK(vps_r_str_opt(r, key, &s, names[def]));
	for (int i = 0; i < n; i++)
		if (!strcmp(s, names[i])) {
			*out = i;
			return VPS_OK;
		}
	if (n == 2)
		return vps_r_error(r, key, "'%s' is not one of %s, %s", s, names[0], names[1]);
	return vps_r_error(r, key, "unknown value '%s'", s);
}

#define DIM_MAX ((int64_t)1 << 31)
/* Megatron's MTP depth is a handful (DeepSeek-V3: 1); the bound keeps ids small */
#define MTP_MAX 64

vps_result_t vps_model_read(struct vps_reader *r, const char *key, struct vps_model *m)
{
	const char *name;
	int e;
	memset(m, 0, sizeof(*m));
	if (key)
		VPS_CHECK(vps_r_map_begin(r, key));
	VPS_CHECK(vps_r_str(r, "name", &name));
	if (strlen(name) >= sizeof(m->name) || !*name)
		return vps_r_error(r, "name", "must be 1 to %zu characters", sizeof(m->name) - 1);
	strcpy(m->name, name);
	VPS_CHECK(vps_r_int(r, "hidden", &m->hidden, 1, DIM_MAX));
	VPS_CHECK(vps_r_int(r, "layers", &m->layers, 1, 1 << 20));
	VPS_CHECK(vps_r_int(r, "heads", &m->heads, 1, DIM_MAX));
	VPS_CHECK(vps_r_int_opt(r, "query_groups", &m->query_groups, 1, DIM_MAX, m->heads));
	VPS_CHECK(vps_r_int_opt(r, "head_dim", &m->head_dim, 1, DIM_MAX,
				m->hidden % m->heads ? 0 : m->hidden / m->heads));
	if (m->head_dim <= 0)
		return vps_r_error(r, "heads", "hidden=%" PRId64 " is not a multiple of heads=%" PRId64
				   "; give head_dim", m->hidden, m->heads);
	VPS_CHECK(vps_r_int_opt(r, "ffn", &m->ffn, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int(r, "vocab", &m->vocab, 1, DIM_MAX));
	VPS_CHECK(vps_r_int_opt(r, "vocab_divisor", &m->vocab_divisor, 1, 1 << 20, 128));
	VPS_CHECK(read_enum(r, "norm", norm_names, 2, 0, &e));
	m->norm = e;
	VPS_CHECK(read_enum(r, "activation", act_names, 2, 0, &e));
	m->activation = e;
	VPS_CHECK(read_enum(r, "position", pos_names, 2, 0, &e));
	m->position = e;
	VPS_CHECK(vps_r_int_opt(r, "max_positions", &m->max_positions, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_bool_opt(r, "bias", &m->bias, false));
	VPS_CHECK(vps_r_bool_opt(r, "qkv_bias", &m->qkv_bias, false));
	VPS_CHECK(vps_r_bool_opt(r, "tied_embeddings", &m->tied_embeddings, false));
	VPS_CHECK(vps_r_bool_opt(r, "qk_norm", &m->qk_norm, false));
	VPS_CHECK(vps_r_int_opt(r, "experts", &m->experts, 0, 1 << 20, 0));
	VPS_CHECK(vps_r_int_opt(r, "moe_ffn", &m->moe_ffn, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "first_dense", &m->first_dense, 0, 1 << 20, 0));
	VPS_CHECK(vps_r_int_sparse(r, "shared_ffn", &m->shared_ffn, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_bool_sparse(r, "router_bias", &m->router_bias, false));
	VPS_CHECK(vps_r_int_sparse(r, "kv_lora_rank", &m->kv_lora_rank, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "q_lora_rank", &m->q_lora_rank, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "qk_head_dim", &m->qk_head_dim, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "qk_pos_dim", &m->qk_pos_dim, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "v_head_dim", &m->v_head_dim, 0, DIM_MAX, 0));
	VPS_CHECK(vps_r_int_sparse(r, "mtp_layers", &m->mtp_layers, 0, MTP_MAX, 0));
	/* point at the key at fault; vps_model_validate words the rule */
	const char *key_at_fault = NULL;
	if (m->heads % m->query_groups)
		key_at_fault = "query_groups";
	else if ((m->experts == 0 && m->ffn <= 0) || (m->experts == 0 && m->moe_ffn))
		key_at_fault = "ffn";
	else if (m->experts > 0 && m->moe_ffn <= 0)
		key_at_fault = "experts";
	else if (m->position == VPS_POS_LEARNED ? m->max_positions <= 0 : m->max_positions != 0)
		key_at_fault = "max_positions";
	else if (m->first_dense > 0 && (m->experts == 0 || m->first_dense >= m->layers || m->ffn <= 0))
		key_at_fault = "first_dense";
	else if (m->shared_ffn > 0 && (m->experts == 0 || m->bias))
		key_at_fault = "shared_ffn";
	else if (m->router_bias && m->experts == 0)
		key_at_fault = "router_bias";
	else if (m->kv_lora_rank == 0 && (m->q_lora_rank || m->qk_head_dim || m->qk_pos_dim || m->v_head_dim))
		key_at_fault = m->q_lora_rank ? "q_lora_rank" : m->qk_head_dim ? "qk_head_dim"
			       : m->qk_pos_dim ? "qk_pos_dim" : "v_head_dim";
	else if (m->kv_lora_rank > 0)
		key_at_fault = "kv_lora_rank";
	else if (m->mtp_layers > 0)
		key_at_fault = "mtp_layers";
	char where[300];
	if (vps_reader_is_binary(r))
		snprintf(where, sizeof(where), "%s: model", vps_reader_name(r));
	else
		snprintf(where, sizeof(where), "%s: line %d", vps_reader_name(r),
			 vps_r_line(r, key_at_fault && vps_r_has(r, key_at_fault) ? key_at_fault : "name"));
	vps_result_t rc = vps_model_validate(m, where);
	if (rc)
		return rc;
	if (key)
		VPS_CHECK(vps_r_map_end(r));
	return VPS_OK;
}

vps_result_t vps_model_write(struct vps_writer *w, const char *key, const struct vps_model *m)
{
	VPS_CHECK(vps_w_map_begin(w, key));
	VPS_CHECK(vps_w_str(w, "name", m->name));
	VPS_CHECK(vps_w_int(w, "hidden", m->hidden));
	VPS_CHECK(vps_w_int(w, "layers", m->layers));
	VPS_CHECK(vps_w_int(w, "heads", m->heads));
	VPS_CHECK(vps_w_int(w, "query_groups", m->query_groups));
	VPS_CHECK(vps_w_int(w, "head_dim", m->head_dim));
	VPS_CHECK(vps_w_int(w, "ffn", m->ffn));
	VPS_CHECK(vps_w_int(w, "vocab", m->vocab));
	VPS_CHECK(vps_w_int(w, "vocab_divisor", m->vocab_divisor));
	VPS_CHECK(vps_w_str(w, "norm", norm_names[m->norm]));
	VPS_CHECK(vps_w_str(w, "activation", act_names[m->activation]));
	VPS_CHECK(vps_w_str(w, "position", pos_names[m->position]));
	VPS_CHECK(vps_w_int(w, "max_positions", m->max_positions));
	VPS_CHECK(vps_w_bool(w, "bias", m->bias));
	VPS_CHECK(vps_w_bool(w, "qkv_bias", m->qkv_bias));
	VPS_CHECK(vps_w_bool(w, "tied_embeddings", m->tied_embeddings));
	VPS_CHECK(vps_w_bool(w, "qk_norm", m->qk_norm));
	VPS_CHECK(vps_w_int(w, "experts", m->experts));
	VPS_CHECK(vps_w_int(w, "moe_ffn", m->moe_ffn));
	/* the binary encoding has every field in the reader's order; YAML only
	 * those set, so a model without them reads and prints as it did */
	VPS_CHECK(vps_w_int_sparse(w, "first_dense", m->first_dense, 0));
	VPS_CHECK(vps_w_int_sparse(w, "shared_ffn", m->shared_ffn, 0));
	VPS_CHECK(vps_w_bool_sparse(w, "router_bias", m->router_bias, false));
	VPS_CHECK(vps_w_int_sparse(w, "kv_lora_rank", m->kv_lora_rank, 0));
	VPS_CHECK(vps_w_int_sparse(w, "q_lora_rank", m->q_lora_rank, 0));
	VPS_CHECK(vps_w_int_sparse(w, "qk_head_dim", m->qk_head_dim, 0));
	VPS_CHECK(vps_w_int_sparse(w, "qk_pos_dim", m->qk_pos_dim, 0));
	VPS_CHECK(vps_w_int_sparse(w, "v_head_dim", m->v_head_dim, 0));
	VPS_CHECK(vps_w_int_sparse(w, "mtp_layers", m->mtp_layers, 0));
	return vps_w_map_end(w);
}

vps_result_t vps_model_validate(const struct vps_model *m, const char *where)
{
	if (m->heads % m->query_groups)
		return vps_fail(VPS_EINPUT, "%s: query_groups=%" PRId64 " does not divide heads=%" PRId64,
				where, m->query_groups, m->heads);
	if (m->experts == 0 && m->ffn <= 0)
		return vps_fail(VPS_EINPUT, "%s: a dense model needs ffn > 0", where);
	if (m->experts > 0 && m->moe_ffn <= 0)
		return vps_fail(VPS_EINPUT, "%s: experts=%" PRId64 " needs moe_ffn > 0", where, m->experts);
	if (m->experts == 0 && m->moe_ffn != 0)
		return vps_fail(VPS_EINPUT, "%s: moe_ffn is set but experts is 0", where);
	if (m->position == VPS_POS_LEARNED && m->max_positions <= 0)
		return vps_fail(VPS_EINPUT, "%s: learned positions need max_positions > 0", where);
	if (m->position == VPS_POS_ROPE && m->max_positions != 0)
		return vps_fail(VPS_EINPUT, "%s: max_positions is only for learned positions", where);
	if (m->first_dense < 0 || (m->first_dense > 0 && (m->experts == 0 || m->first_dense >= m->layers)))
		return vps_fail(VPS_EINPUT, "%s: first_dense=%" PRId64 " needs an MoE model with more layers (%" PRId64 ")",
				where, m->first_dense, m->layers);
	if (m->first_dense > 0 && m->ffn <= 0)
		return vps_fail(VPS_EINPUT, "%s: first_dense=%" PRId64 " dense layers need ffn > 0", where, m->first_dense);
	if (m->shared_ffn < 0 || (m->shared_ffn > 0 && (m->experts == 0 || m->bias)))
		return vps_fail(VPS_EINPUT, "%s: shared_ffn needs an MoE model without biases (SharedExpertMLP)", where);
	if (m->router_bias && m->experts == 0)
		return vps_fail(VPS_EINPUT, "%s: router_bias needs an MoE model", where);
	if (m->kv_lora_rank > 0) {
		if (m->qk_head_dim <= 0 || m->v_head_dim <= 0 || m->qk_pos_dim < 0 || m->q_lora_rank < 0)
			return vps_fail(VPS_EINPUT, "%s: multi-latent attention (kv_lora_rank) needs qk_head_dim > 0 and "
					"v_head_dim > 0", where);
		/* Megatron's q_head_dim, the k_channels of core attention */
		if (m->head_dim != m->qk_head_dim + m->qk_pos_dim)
			return vps_fail(VPS_EINPUT, "%s: multi-latent attention needs head_dim = qk_head_dim + qk_pos_dim = %" PRId64,
					where, m->qk_head_dim + m->qk_pos_dim);
		if (m->norm != VPS_NORM_RMS || m->bias || m->qkv_bias || m->query_groups != m->heads)
			return vps_fail(VPS_EINPUT, "%s: multi-latent attention is supported with rmsnorm, no biases and "
					"query_groups = heads", where);
	} else if (m->q_lora_rank || m->qk_head_dim || m->qk_pos_dim || m->v_head_dim) {
		return vps_fail(VPS_EINPUT, "%s: q_lora_rank, qk_head_dim, qk_pos_dim and v_head_dim are for "
				"multi-latent attention: set kv_lora_rank", where);
	}
	if (m->mtp_layers < 0 || m->mtp_layers > MTP_MAX)
		return vps_fail(VPS_EINPUT, "%s: mtp_layers=%" PRId64 " is not 0 to %d", where, m->mtp_layers, MTP_MAX);
	/* megatron/training/arguments.py validate_args (core_v0.19.0, "MTP
	 * validation") asserts rope or no position embedding with MTP */
	if (m->mtp_layers > 0 && m->position == VPS_POS_LEARNED)
		return vps_fail(VPS_EINPUT, "%s: multi-token prediction (mtp_layers=%" PRId64 ") needs rope positions: "
				"Megatron-LM refuses it with learned absolute position embeddings", where, m->mtp_layers);
	/* Tensor ids are 32-bit, and every tool builds a template per tensor:
	 * 2^20 is over ten times the largest real model (DeepSeek-V3, 61 x 256
	 * experts: about 63k) and still a layout in well under a second. */
	struct schema s;
	build_schema(m, &s);
	uint64_t per_layer = s.nhead + s.ntail + s.ndense + s.nmtp_pre + s.nmtp_post + (uint64_t)m->experts * s.nexpert;
	if (per_layer * (uint64_t)(m->layers + m->mtp_layers) > (uint64_t)1 << 20)
		return vps_fail(VPS_EINPUT, "%s: too many tensors (layers x experts): at most %d", where, 1 << 20);
	/* Every size computed from the model (tensors, buffers, offsets)
	 * stays below 2^48 elements: counted in floating point, which does
	 * not wrap, before any int64 product is formed. */
	double dense = (double)(s.first_moe < m->layers ? s.first_moe : m->layers);
	double total = kinds_volume(m, s.pre, s.npre) + kinds_volume(m, s.post, s.npost) +
		       dense * kinds_volume(m, s.dense, s.ndense) +
		       ((double)m->layers - dense) * (kinds_volume(m, s.head, s.nhead) + kinds_volume(m, s.tail, s.ntail) +
						      (double)m->experts * kinds_volume(m, s.expert, s.nexpert));
	/* an MTP layer is at most a layer of either kind and its own tensors */
	total += (double)m->mtp_layers *
		 (kinds_volume(m, s.head, s.nhead) + kinds_volume(m, s.tail, s.ntail) + kinds_volume(m, s.dense, s.ndense) +
		  (double)m->experts * kinds_volume(m, s.expert, s.nexpert) + kinds_volume(m, s.mtp_pre, s.nmtp_pre) +
		  kinds_volume(m, s.mtp_post, s.nmtp_post));
	total += (double)(s.routers + s.mtp_routers) * (double)m->experts;
	if (total >= (double)VPS_MAX_ELEMENTS)
		return vps_fail(VPS_EINPUT, "%s: %.3g parameters is more than any model has (2^48)", where, total);
	return VPS_OK;
}

/* ---- Hugging Face config.json ---- */

static vps_result_t hf_int(struct vps_reader *r, const char *key, int64_t *v, int64_t def, bool required)
{
	if (!vps_r_has(r, key)) {
		if (required)
			return vps_r_error(r, NULL, "Hugging Face config lacks '%s'", key);
		*v = def;
		return VPS_OK;
	}
	/* JSON null means "use the default" in several configs. */
	const char *s;
	VPS_CHECK(vps_r_str(r, key, &s));
	if (!strcmp(s, "null")) {
		*v = def;
		return VPS_OK;
	}
	char *end;
	long long x = strtoll(s, &end, 10);
	if (!*s || *end || x < 0 || x > DIM_MAX)
		return vps_r_error(r, key, "'%s' is not a size", s);
	*v = x;
	return VPS_OK;
}

static vps_result_t hf_bool(struct vps_reader *r, const char *key, bool *v, bool def)
{
	if (!vps_r_has(r, key)) {
		*v = def;
		return VPS_OK;
	}
	return vps_r_bool(r, key, v);
}

/* DeepSeek-V2/V3 (configuration_deepseek.py). MLA with the q/kv norms
 * (q_a_layernorm, kv_a_layernorm: Megatron's qk_layernorm), dense layers
 * [0, first_k_dense_replace), then MoE layers with n_shared_experts shared
 * experts of moe_intermediate_size each. */
static vps_result_t parse_hf_deepseek(struct vps_reader *r, struct vps_model *m, bool v3)
{
	int64_t shared, freq;
	VPS_CHECK(hf_int(r, "hidden_size", &m->hidden, 0, true));
	VPS_CHECK(hf_int(r, "num_hidden_layers", &m->layers, 0, true));
	VPS_CHECK(hf_int(r, "num_attention_heads", &m->heads, 0, true));
	VPS_CHECK(hf_int(r, "num_key_value_heads", &m->query_groups, m->heads, false));
	if (m->query_groups != m->heads)
		return vps_r_error(r, "num_key_value_heads", "multi-latent attention has one key/value head per head");
	VPS_CHECK(hf_int(r, "q_lora_rank", &m->q_lora_rank, 0, false));
	VPS_CHECK(hf_int(r, "kv_lora_rank", &m->kv_lora_rank, 0, true));
	if (m->kv_lora_rank == 0)
		return vps_r_error(r, "kv_lora_rank", "must be positive (multi-latent attention)");
	VPS_CHECK(hf_int(r, "qk_nope_head_dim", &m->qk_head_dim, 0, true));
	VPS_CHECK(hf_int(r, "qk_rope_head_dim", &m->qk_pos_dim, 0, true));
	VPS_CHECK(hf_int(r, "v_head_dim", &m->v_head_dim, 0, true));
	VPS_CHECK(hf_int(r, "intermediate_size", &m->ffn, 0, true));
	VPS_CHECK(hf_int(r, "moe_intermediate_size", &m->moe_ffn, 0, false));
	VPS_CHECK(hf_int(r, "n_routed_experts", &m->experts, 0, false));
	VPS_CHECK(hf_int(r, "n_shared_experts", &shared, 0, false));
	VPS_CHECK(hf_int(r, "first_k_dense_replace", &m->first_dense, 0, false));
	VPS_CHECK(hf_int(r, "moe_layer_freq", &freq, 1, false));
	/* the checkpoint's layers [num_hidden_layers, + num_nextn_predict_layers)
	 * are MTP layers: a Megatron job trains them (--mtp-num-layers), though
	 * Hugging Face's DeepseekV3ForCausalLM drops them on load */
	VPS_CHECK(hf_int(r, "num_nextn_predict_layers", &m->mtp_layers, 0, false));
	if (m->mtp_layers > MTP_MAX)
		return vps_r_error(r, "num_nextn_predict_layers", "is more than %d", MTP_MAX);
	VPS_CHECK(hf_int(r, "vocab_size", &m->vocab, 0, true));
	VPS_CHECK(hf_bool(r, "tie_word_embeddings", &m->tied_embeddings, false));
	if (m->experts > 0 && freq != 1)
		return vps_r_error(r, "moe_layer_freq", "only 1 (every layer from first_k_dense_replace on is MoE) is "
				   "supported");
	if (m->experts > 0 && m->moe_ffn == 0)
		return vps_r_error(r, "moe_intermediate_size", "must be positive with n_routed_experts");
	if (m->heads == 0)
		return vps_r_error(r, "num_attention_heads", "must be positive");
	if (m->experts == 0) {
		m->moe_ffn = m->first_dense = shared = 0;
	} else if (m->first_dense >= m->layers) {
		return vps_r_error(r, "first_k_dense_replace", "leaves no MoE layer of %" PRId64, m->layers);
	}
	if (!vps_mul_ok(shared, m->moe_ffn, &m->shared_ffn) || m->shared_ffn > DIM_MAX)
		return vps_r_error(r, "n_shared_experts", "too large");
	/* noaux_tc routing keeps e_score_correction_bias (V3's default) */
	const char *topk = v3 ? "noaux_tc" : "greedy";
	if (vps_r_has(r, "topk_method"))
		VPS_CHECK(vps_r_str(r, "topk_method", &topk));
	m->router_bias = m->experts > 0 && !strcmp(topk, "noaux_tc");
	m->head_dim = m->qk_head_dim + m->qk_pos_dim;
	m->norm = VPS_NORM_RMS;
	m->activation = VPS_ACT_SWIGLU;
	m->position = VPS_POS_ROPE;
	m->qk_norm = true;
	return VPS_OK;
}

static vps_result_t parse_hf(struct vps_reader *r, struct vps_model *m, const char *stem)
{
	const char *type = "llama";
	if (vps_r_has(r, "model_type"))
		VPS_CHECK(vps_r_str(r, "model_type", &type));
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", stem);
	m->vocab_divisor = 128;
	bool gpt2 = !strcmp(type, "gpt2");
	if (gpt2) {
		int64_t inner;
		VPS_CHECK(hf_int(r, "n_embd", &m->hidden, 0, true));
		VPS_CHECK(hf_int(r, "n_layer", &m->layers, 0, true));
		VPS_CHECK(hf_int(r, "n_head", &m->heads, 0, true));
		VPS_CHECK(hf_int(r, "n_inner", &inner, 4 * m->hidden, false));
		VPS_CHECK(hf_int(r, "n_positions", &m->max_positions, 1024, false));
		VPS_CHECK(hf_int(r, "vocab_size", &m->vocab, 0, true));
		VPS_CHECK(hf_bool(r, "tie_word_embeddings", &m->tied_embeddings, true));
		m->ffn = inner;
		m->query_groups = m->heads;
		m->head_dim = m->hidden / m->heads;
		m->norm = VPS_NORM_LAYER;
		m->activation = VPS_ACT_GELU;
		m->position = VPS_POS_LEARNED;
		m->bias = true;
	} else if (!strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2") ||
		   !strcmp(type, "qwen3") || !strcmp(type, "qwen3_moe") || !strcmp(type, "mixtral")) {
		bool attention_bias = false, mlp_bias = false;
		VPS_CHECK(hf_int(r, "hidden_size", &m->hidden, 0, true));
		VPS_CHECK(hf_int(r, "num_hidden_layers", &m->layers, 0, true));
		VPS_CHECK(hf_int(r, "num_attention_heads", &m->heads, 0, true));
		VPS_CHECK(hf_int(r, "num_key_value_heads", &m->query_groups, m->heads, false));
		if (m->heads == 0)
			return vps_r_error(r, "num_attention_heads", "must be positive");
		VPS_CHECK(hf_int(r, "head_dim", &m->head_dim, m->hidden / m->heads, false));
		VPS_CHECK(hf_int(r, "intermediate_size", &m->ffn, 0, true));
		VPS_CHECK(hf_int(r, "vocab_size", &m->vocab, 0, true));
		VPS_CHECK(hf_bool(r, "tie_word_embeddings", &m->tied_embeddings, false));
		VPS_CHECK(hf_bool(r, "attention_bias", &attention_bias, false));
		if (attention_bias)
			return vps_r_error(r, "attention_bias", "biases on q/k/v/o are not supported");
		VPS_CHECK(hf_bool(r, "mlp_bias", &mlp_bias, false));
		if (mlp_bias)
			return vps_r_error(r, "mlp_bias", "biases on the MLP are not supported");
		m->norm = VPS_NORM_RMS;
		m->activation = VPS_ACT_SWIGLU;
		m->position = VPS_POS_ROPE;
		m->qkv_bias = !strcmp(type, "qwen2");
		m->qk_norm = !strncmp(type, "qwen3", 5);
		if (!strcmp(type, "qwen3_moe")) {
			int64_t step;
			VPS_CHECK(hf_int(r, "num_experts", &m->experts, 0, true));
			VPS_CHECK(hf_int(r, "moe_intermediate_size", &m->moe_ffn, 0, true));
			VPS_CHECK(hf_int(r, "decoder_sparse_step", &step, 1, false));
			if (step != 1)
				return vps_r_error(r, "decoder_sparse_step", "only every-layer MoE (1) is supported");
			if (vps_r_has(r, "mlp_only_layers")) {
				uint64_t n;
				VPS_CHECK(vps_r_seq_begin(r, "mlp_only_layers", &n));
				if (n)
					return vps_r_error(r, "mlp_only_layers", "dense layers in an MoE model are not supported");
				VPS_CHECK(vps_r_seq_end(r));
			}
			m->ffn = 0;
		} else if (!strcmp(type, "mixtral")) {
			VPS_CHECK(hf_int(r, "num_local_experts", &m->experts, 0, true));
			m->moe_ffn = m->ffn;
			m->ffn = 0;
		}
	} else if (!strcmp(type, "deepseek_v3") || !strcmp(type, "deepseek_v2")) {
		VPS_CHECK(parse_hf_deepseek(r, m, !strcmp(type, "deepseek_v3")));
	} else {
		return vps_r_error(r, "model_type", "unsupported model type '%s'", type);
	}
	if (m->hidden <= 0 || m->layers <= 0 || m->heads <= 0 || m->vocab <= 0 || m->query_groups <= 0 ||
	    m->head_dim <= 0)
		return vps_r_error(r, NULL, "sizes must be positive");
	return vps_r_map_end_lenient(r);
}

vps_result_t vps_model_parse(struct vps_model *m, const char *name, const void *data, size_t len)
{
	struct vps_reader *r = NULL;
	vps_result_t rc;
	enum vps_doc_kind kind = vps_doc_sniff(data, len);
	if (kind && kind != VPS_DOC_MODEL)
		return vps_doc_wrong_kind(name, kind, VPS_DOC_BIT(VPS_DOC_MODEL));
	VPS_CHECK(vps_reader_new(&r, name, data, len, kind));
	if (kind == VPS_DOC_MODEL) {
		VPS_CHECK_GOTO(vps_model_read(r, NULL, m), rc, done);
		rc = vps_reader_finish(r);
	} else if (vps_r_has(r, "hidden_size") || vps_r_has(r, "n_embd") || vps_r_has(r, "model_type")) {
		char stem[64];
		const char *base = strrchr(name, '/');
		base = base ? base + 1 : name;
		snprintf(stem, sizeof(stem), "%s", base);
		char *dot = strrchr(stem, '.');
		if (dot)
			*dot = '\0';
		if (!strcmp(stem, "config")) {
			/* config.json says nothing: name it by its directory */
			const char *end = base > name ? base - 1 : name;
			const char *start = end;
			while (start > name && start[-1] != '/')
				start--;
			if (end > start)
				snprintf(stem, sizeof(stem), "%.*s", (int)(end - start), start);
		}
		VPS_CHECK_GOTO(parse_hf(r, m, stem), rc, done);
		rc = vps_model_validate(m, name);
	} else {
		rc = vps_fail(VPS_EINPUT, "%s: line 1: neither a vps model ('vps: model') nor a Hugging Face config",
			      name);
	}
done:
	vps_reader_free(r);
	return rc;
}

static bool is_dir(const char *path)
{
	struct stat st;
	return strcmp(path, "-") && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A Hugging Face model directory: its config.json, the model named by the
 * directory (its real name, so that "." and "dir/" name it too). */
static vps_result_t load_hf_dir(struct vps_model *m, const char *dir)
{
	char path[4096], real[PATH_MAX];
	size_t len = strlen(dir);
	while (len > 1 && dir[len - 1] == '/')
		len--;
	if (len + sizeof("/config.json") > sizeof(path))
		return vps_fail(VPS_EINPUT, "%.64s...: path too long", dir);
	snprintf(path, sizeof(path), "%.*s/config.json", (int)len, dir);
	if (access(path, F_OK) != 0)
		return vps_fail(VPS_ENOTFOUND, "%s: a directory without config.json (a Hugging Face model "
					    "directory has one)", dir);
	struct vps_bytes b = {0};
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_model_parse(m, path, b.data, b.len);
	vps_bytes_release(&b);
	if (!rc && realpath(dir, real)) {
		const char *base = strrchr(real, '/');
		base = base && base[1] ? base + 1 : real;
		snprintf(m->name, sizeof(m->name), "%.*s", (int)sizeof(m->name) - 1, base);
	}
	return rc;
}

vps_result_t vps_model_load(struct vps_model *m, const char *spec, const char *search_path)
{
	struct vps_bytes b = {0};
	char path[4096];
	/* a path to a directory, or a bare name that is no known model but a
	 * directory here (./NAME for the directory when both exist) */
	if (strchr(spec, '/') && is_dir(spec))
		return load_hf_dir(m, spec);
	vps_result_t rc = vps_config_find(spec, search_path, "model", path, sizeof(path));
	if (rc && is_dir(spec)) {
		vps_clear_error();
		return load_hf_dir(m, spec);
	}
	if (rc)
		return rc;
	VPS_CHECK(vps_read_file(path, &b));
	rc = vps_model_parse(m, strcmp(path, "-") ? path : "<stdin>", b.data, b.len);
	vps_bytes_release(&b);
	return rc;
}
