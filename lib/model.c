#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "doc.h"
#include "internal.h"
#include "model_io.h"

/* The per-layer registration order of a model, derived from its switches.
 * Megatron registers linear_proj before linear_qkv (Attention builds its
 * output projection first), fuses the input norm into linear_qkv and, in
 * dense layers, the pre-MLP norm into linear_fc1. */
struct schema {
	enum vps_tensor_kind pre[2], layer[24], expert[4], post[3];
	uint32_t npre, nlayer, nexpert, npost;
	uint32_t per_layer;
};

static void build_schema(const struct vps_model *m, struct schema *s)
{
	bool ln = m->norm == VPS_NORM_LAYER;
	memset(s, 0, sizeof(*s));
	s->pre[s->npre++] = VPS_T_WORD_EMB;
	if (m->position == VPS_POS_LEARNED)
		s->pre[s->npre++] = VPS_T_POS_EMB;
	s->layer[s->nlayer++] = VPS_T_PROJ_W;
	if (m->bias)
		s->layer[s->nlayer++] = VPS_T_PROJ_B;
	s->layer[s->nlayer++] = VPS_T_QKV_LN_W;
	if (ln)
		s->layer[s->nlayer++] = VPS_T_QKV_LN_B;
	s->layer[s->nlayer++] = VPS_T_QKV_W;
	if (m->bias || m->qkv_bias)
		s->layer[s->nlayer++] = VPS_T_QKV_B;
	if (m->qk_norm) {
		s->layer[s->nlayer++] = VPS_T_Q_NORM_W;
		if (ln)
			s->layer[s->nlayer++] = VPS_T_Q_NORM_B;
		s->layer[s->nlayer++] = VPS_T_K_NORM_W;
		if (ln)
			s->layer[s->nlayer++] = VPS_T_K_NORM_B;
	}
	if (m->experts > 0) {
		s->layer[s->nlayer++] = VPS_T_PRE_MLP_LN_W;
		if (ln)
			s->layer[s->nlayer++] = VPS_T_PRE_MLP_LN_B;
		s->layer[s->nlayer++] = VPS_T_ROUTER_W;
		s->expert[s->nexpert++] = VPS_T_EXP_FC1_W;
		if (m->bias)
			s->expert[s->nexpert++] = VPS_T_EXP_FC1_B;
		s->expert[s->nexpert++] = VPS_T_EXP_FC2_W;
		if (m->bias)
			s->expert[s->nexpert++] = VPS_T_EXP_FC2_B;
	} else {
		s->layer[s->nlayer++] = VPS_T_FC1_LN_W;
		if (ln)
			s->layer[s->nlayer++] = VPS_T_FC1_LN_B;
		s->layer[s->nlayer++] = VPS_T_FC1_W;
		if (m->bias)
			s->layer[s->nlayer++] = VPS_T_FC1_B;
		s->layer[s->nlayer++] = VPS_T_FC2_W;
		if (m->bias)
			s->layer[s->nlayer++] = VPS_T_FC2_B;
	}
	s->post[s->npost++] = VPS_T_FINAL_LN_W;
	if (ln)
		s->post[s->npost++] = VPS_T_FINAL_LN_B;
	if (!m->tied_embeddings)
		s->post[s->npost++] = VPS_T_OUTPUT_W;
	s->per_layer = s->nlayer + (uint32_t)m->experts * s->nexpert;
}

uint32_t vps_model_num_tensors(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	return s.npre + (uint32_t)m->layers * s.per_layer + s.npost;
}

uint32_t vps_model_tensors_per_layer(const struct vps_model *m)
{
	struct schema s;
	build_schema(m, &s);
	return s.per_layer;
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
	return s.npre + (uint32_t)layer * s.per_layer;
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

static void fill_tensor(const struct vps_model *m, struct vps_tensor *t)
{
	int64_t h = m->hidden, g = m->query_groups, d = m->head_dim;
	int64_t slots = m->heads / m->query_groups + 2;
	bool gated = m->activation == VPS_ACT_SWIGLU;
	t->split = VPS_SPLIT_NONE;
	t->axis = 0;
	t->is_expert = false;
	switch (t->kind) {
	case VPS_T_WORD_EMB:
	case VPS_T_OUTPUT_W:
		set_shape(t, 2, m->vocab, h, 1, 1);
		t->split = VPS_SPLIT_VOCAB;
		break;
	case VPS_T_POS_EMB:
		set_shape(t, 2, m->max_positions, h, 1, 1);
		break;
	case VPS_T_PROJ_W:
		set_shape(t, 2, h, m->heads * d, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = 1;
		break;
	case VPS_T_QKV_W:
		set_shape(t, 4, g, slots, d, h);
		t->split = VPS_SPLIT_FLAT;
		break;
	case VPS_T_QKV_B:
		set_shape(t, 3, g, slots, d, 1);
		t->split = VPS_SPLIT_FLAT;
		break;
	case VPS_T_Q_NORM_W:
	case VPS_T_Q_NORM_B:
	case VPS_T_K_NORM_W:
	case VPS_T_K_NORM_B:
		set_shape(t, 1, d, 1, 1, 1);
		break;
	case VPS_T_FC1_W:
	case VPS_T_EXP_FC1_W: {
		int64_t f = t->kind == VPS_T_FC1_W ? m->ffn : m->moe_ffn;
		if (gated)
			set_shape(t, 3, 2, f, h, 1);
		else
			set_shape(t, 2, f, h, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = gated ? 1 : 0;
		break;
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
		break;
	}
	case VPS_T_FC2_W:
	case VPS_T_EXP_FC2_W:
		set_shape(t, 2, h, t->kind == VPS_T_FC2_W ? m->ffn : m->moe_ffn, 1, 1);
		t->split = VPS_SPLIT_AXIS;
		t->axis = 1;
		break;
	case VPS_T_ROUTER_W:
		set_shape(t, 2, m->experts, h, 1, 1);
		break;
	default: /* norms and the biases of row-parallel layers: [h], replicated */
		set_shape(t, 1, h, 1, 1, 1);
		break;
	}
	if (t->kind >= VPS_T_EXP_FC1_W && t->kind <= VPS_T_EXP_FC2_B)
		t->is_expert = true;
}

vps_result_t vps_model_tensor(const struct vps_model *m, uint32_t id, struct vps_tensor *t)
{
	struct schema s;
	build_schema(m, &s);
	uint32_t nlay = (uint32_t)m->layers * s.per_layer;
	memset(t, 0, sizeof(*t));
	t->id = id;
	t->layer = -1;
	t->expert = -1;
	if (id < s.npre) {
		t->kind = s.pre[id];
	} else if (id < s.npre + nlay) {
		uint32_t rel = id - s.npre;
		uint32_t pos = rel % s.per_layer;
		t->layer = (int32_t)(rel / s.per_layer);
		if (pos < s.nlayer) {
			t->kind = s.layer[pos];
		} else {
			pos -= s.nlayer;
			t->expert = (int32_t)(pos / s.nexpert);
			t->kind = s.expert[pos % s.nexpert];
		}
	} else if (id < s.npre + nlay + s.npost) {
		t->kind = s.post[id - s.npre - nlay];
	} else {
		return vps_fail(VPS_EINPUT, "tensor id %u out of range (model has %u)", id,
				s.npre + nlay + s.npost);
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
	case VPS_T_NKINDS: break;
	}
	return "?";
}

size_t vps_tensor_local_name(const struct vps_tensor *t, int64_t layer, int64_t expert, char *buf, size_t n)
{
	int len;
	if (t->layer < 0)
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

vps_result_t vps_model_find_tensor(const struct vps_model *m, const char *name, uint32_t *id)
{
	struct schema s;
	build_schema(m, &s);
	uint32_t nlay = (uint32_t)m->layers * s.per_layer;
	for (uint32_t i = 0; i < s.npre; i++)
		if (!strcmp(name, kind_suffix(s.pre[i]))) {
			*id = i;
			return VPS_OK;
		}
	for (uint32_t i = 0; i < s.npost; i++)
		if (!strcmp(name, kind_suffix(s.post[i]))) {
			*id = s.npre + nlay + i;
			return VPS_OK;
		}
	static const char lp[] = "decoder.layers.", ep[] = "mlp.experts.local_experts.";
	const char *p = name;
	int64_t layer, expert;
	if (strncmp(p, lp, sizeof(lp) - 1) != 0)
		goto unknown;
	p += sizeof(lp) - 1;
	if (!parse_index(&p, &layer) || layer >= m->layers)
		goto unknown;
	uint32_t base = s.npre + (uint32_t)layer * s.per_layer;
	if (strncmp(p, ep, sizeof(ep) - 1) == 0) {
		p += sizeof(ep) - 1;
		if (!parse_index(&p, &expert) || expert >= m->experts)
			goto unknown;
		for (uint32_t i = 0; i < s.nexpert; i++)
			if (!strcmp(p, kind_suffix(s.expert[i]))) {
				*id = base + s.nlayer + (uint32_t)expert * s.nexpert + i;
				return VPS_OK;
			}
		goto unknown;
	}
	for (uint32_t i = 0; i < s.nlayer; i++)
		if (!strcmp(p, kind_suffix(s.layer[i]))) {
			*id = base + i;
			return VPS_OK;
		}
unknown:
	return vps_fail(VPS_EINPUT, "no tensor '%s' in model %s", name, m->name);
}

int64_t vps_model_parameters(const struct vps_model *m)
{
	uint32_t n = vps_model_num_tensors(m);
	struct schema s;
	build_schema(m, &s);
	int64_t total = 0;
	struct vps_tensor t;
	/* Layers are identical: count one and multiply. */
	for (uint32_t i = 0; i < n; i++) {
		if (i == s.npre && m->layers > 0) {
			int64_t layer = 0;
			for (uint32_t j = 0; j < s.per_layer; j++) {
				struct vps_box b;
				vps_model_tensor(m, i + j, &t);
				vps_box_full(&b, t.ndim, t.shape);
				layer += vps_box_volume(&b);
			}
			total += layer * m->layers;
			i += (uint32_t)m->layers * s.per_layer - 1;
			continue;
		}
		struct vps_box b;
		vps_model_tensor(m, i, &t);
		vps_box_full(&b, t.ndim, t.shape);
		total += vps_box_volume(&b);
	}
	return total;
}

uint64_t vps_model_hash(const struct vps_model *m)
{
	int64_t f[] = {m->hidden, m->layers, m->heads, m->query_groups, m->head_dim, m->ffn,
		       m->vocab, m->vocab_divisor, m->norm, m->activation, m->position,
		       m->max_positions, m->bias, m->qkv_bias, m->tied_embeddings, m->qk_norm,
		       m->experts, m->moe_ffn};
	return vps_hash64(f, sizeof(f), 0x6d6f64656cULL);
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
	/* Tensor ids are 32-bit, and every tool builds a template per tensor:
	 * 2^20 is over ten times the largest real model (DeepSeek-V3, 61 x 256
	 * experts: about 63k) and still a layout in well under a second. */
	uint64_t per_layer = 24 + (uint64_t)m->experts * 4;
	if (per_layer * (uint64_t)m->layers > (uint64_t)1 << 20)
		return vps_fail(VPS_EINPUT, "%s: too many tensors (layers x experts): at most %d", where, 1 << 20);
	/* Every size computed from the model (tensors, buffers, offsets)
	 * stays below 2^48 elements: counted in floating point, which does
	 * not wrap, before any int64 product is formed. */
	struct schema s;
	build_schema(m, &s);
	struct vps_tensor t;
	double total = 0, layer = 0, expert = 0;
	const struct {
		const enum vps_tensor_kind *kinds;
		uint32_t n;
		double *sum;
	} groups[] = {{s.pre, s.npre, &total}, {s.post, s.npost, &total}, {s.layer, s.nlayer, &layer},
		      {s.expert, s.nexpert, &expert}};
	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
		for (uint32_t i = 0; i < groups[g].n; i++) {
			memset(&t, 0, sizeof(t));
			t.kind = groups[g].kinds[i];
			fill_tensor(m, &t);
			double v = 1;
			for (int k = 0; k < t.ndim; k++)
				v *= (double)t.shape[k];
			*groups[g].sum += v;
		}
	total += (double)m->layers * (layer + (double)m->experts * expert);
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
		bool attention_bias = false;
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
		return vps_fail(VPS_EINPUT, "%s: a %s document is not a model", name, vps_doc_kind_name(kind));
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
		return vps_fail(VPS_EINPUT, "--model: %.64s...: path too long", dir);
	snprintf(path, sizeof(path), "%.*s/config.json", (int)len, dir);
	if (access(path, F_OK) != 0)
		return vps_fail(VPS_EINPUT, "--model: %s: a directory without config.json (a Hugging Face model "
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
	vps_result_t rc = vps_config_find(spec, search_path, "--model", "model", path, sizeof(path));
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
