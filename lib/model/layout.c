#include <inttypes.h>
#include <stdio.h>

#include "util/hash.h"
#include "util/internal.h"
#include "model/dtensor.h"
#include "model/layout_int.h"

static const char *state_names[VPS_NSTATES] = {"param", "main_param", "exp_avg",	     "exp_avg_sq",
						"grad",	 "module_buffer", "momentum_buffer"};
static const char *dtype_names[] = {"bf16", "fp32", "int16"};
#define NDTYPES ((int)(sizeof(dtype_names) / sizeof(dtype_names[0])))

const char *vps_state_name(enum vps_state state)
{
	return state >= 0 && state < VPS_NSTATES ? state_names[state] : "?";
}

vps_result_t vps_state_parse(const char *name, int *state)
{
	for (int i = 0; i < VPS_NSTATES; i++)
		if (!strcmp(name, state_names[i])) {
			*state = i;
			return VPS_OK;
		}
	return vps_fail(VPS_EINPUT, "unknown state '%s'", name);
}

const char *vps_dtype_name(enum vps_dtype dtype)
{
	return (int)dtype >= 0 && (int)dtype < NDTYPES ? dtype_names[dtype] : "?";
}

vps_result_t vps_dtype_parse(const char *name, int *dtype)
{
	for (int i = 0; i < NDTYPES; i++)
		if (!strcmp(name, dtype_names[i])) {
			*dtype = i;
			return VPS_OK;
		}
	return vps_fail(VPS_EINPUT, "unknown dtype '%s'", name);
}

size_t vps_dtype_size(enum vps_dtype dtype) { return dtype == VPS_DTYPE_FP32 ? 4 : 2; }
enum vps_dtype vps_state_dtype(enum vps_state state) { return state == VPS_STATE_PARAM ? VPS_DTYPE_BF16 : VPS_DTYPE_FP32; }

void vps_rank_view_release(struct vps_rank_view *v)
{
	if (!v)
		return;
	if (v->region_names)
		for (size_t i = 0; i < v->nregions; i++)
			free(v->region_names[i]);
	free(v->region_names);
	free(v->buffers);
	free(v->params);
	free(v->regions);
	free(v->region_param);
	memset(v, 0, sizeof(*v));
}

void vps_holders_release(struct vps_holders *h)
{
	free(h->v);
	memset(h, 0, sizeof(*h));
}

/* ---------------------------------------------------------------------- */

const struct vps_model *vps_layout_model(const struct vps_layout *l) { return &l->m; }
const struct vps_parallel *vps_layout_parallel(const struct vps_layout *l) { return &l->p; }
const struct vps_devices *vps_layout_devices(const struct vps_layout *l) { return &l->d; }
int64_t vps_layout_world(const struct vps_layout *l) { return l->world; }
bool vps_layout_expert_buffer(const struct vps_layout *l) { return l->expert_buffer; }
struct vps_device vps_layout_device(const struct vps_layout *l, int64_t rank) { return vps_devices_get(&l->d, rank); }
int64_t vps_layout_rank_on(const struct vps_layout *l, struct vps_device dev)
{
	return vps_devices_find(&l->d, l->world, dev);
}

/* ---- the optimizer: which states a parameter has ---- */

/* The states an optimizer keeps per parameter beside the fp32 main param
 * (torch's AdamW and TE's FusedAdam: exp_avg, exp_avg_sq; torch's SGD with
 * momentum and emerging_optimizers' Muon: momentum_buffer; its Lion:
 * exp_avg), as a mask of states. */
static uint32_t optimizer_states(int optimizer)
{
	switch (optimizer) {
	case VPS_OPT_ADAM: return 1u << VPS_STATE_EXP_AVG | 1u << VPS_STATE_EXP_AVG_SQ;
	case VPS_OPT_LION: return 1u << VPS_STATE_EXP_AVG;
	default: return 1u << VPS_STATE_MOMENTUM;
	}
}

static bool emerging(const struct vps_layout *l)
{
	return l->p.optimizer == VPS_OPT_MUON || l->p.optimizer == VPS_OPT_LION;
}

bool vps_layout_tensor_matrix(const struct vps_layout *l, const struct vps_tensor *t)
{
	(void)l;
	/* the kinds Megatron registers as 2-D parameters but the word embeddings
	 * and the output layer, which LanguageModule marks
	 * is_embedding_or_output_parameter (the learned position embeddings it
	 * does not mark) */
	switch (t->kind) {
	case VPS_T_POS_EMB:
	case VPS_T_PROJ_W:
	case VPS_T_QKV_W:
	case VPS_T_FC1_W:
	case VPS_T_FC2_W:
	case VPS_T_ROUTER_W:
	case VPS_T_EXP_FC1_W:
	case VPS_T_EXP_FC2_W:
	case VPS_T_Q_PROJ_W:
	case VPS_T_Q_DOWN_W:
	case VPS_T_Q_UP_W:
	case VPS_T_KV_DOWN_W:
	case VPS_T_KV_UP_W:
	case VPS_T_SHARED_FC1_W:
	case VPS_T_SHARED_FC2_W:
	case VPS_T_MTP_EH_PROJ_W: return !t->module_buffer;
	default: return false;
	}
}

int vps_layout_tensor_optimizer(const struct vps_layout *l, const struct vps_tensor *t)
{
	if (t->module_buffer)
		return -1;
	/* Muon and Lion take the matrices and leave the rest to their scalar
	 * optimizer (emerging_optimizers.py default_param_overrides,
	 * muon_scalar_optimizer) */
	if (emerging(l) && !vps_layout_tensor_matrix(l, t))
		return l->p.scalar_optimizer;
	return l->p.optimizer;
}

/* The states of a parameter stepped by optimizer opt, as a mask. */
static uint32_t param_states(const struct vps_layout *l, int opt)
{
	uint32_t m = 1u << VPS_STATE_PARAM | 1u << VPS_STATE_MAIN_PARAM | optimizer_states(opt);
	return l->p.grad ? m | 1u << VPS_STATE_GRAD : m;
}

/* A DTensor job's states, as dtensor.c lays them out: its fp32 parameter
 * (main_param) and PyTorch's Adam's moments, the module buffers apart. */
static uint32_t dtensor_states(const struct vps_layout *l)
{
	uint32_t m = 0;
	for (int st = 0; st < VPS_NSTATES; st++)
		if (vps_dtensor_has_state(l, (enum vps_state)st))
			m |= 1u << st;
	return m;
}

static uint32_t tensor_states(const struct vps_layout *l, const struct vps_tensor *t)
{
	if (t->module_buffer)
		return 1u << VPS_STATE_MODULE;
	if (l->dt)
		return dtensor_states(l) & ~(1u << VPS_STATE_MODULE);
	return param_states(l, vps_layout_tensor_optimizer(l, t));
}

static uint32_t layout_states(const struct vps_layout *l)
{
	if (l->dt)
		return dtensor_states(l);
	uint32_t m = param_states(l, l->p.optimizer);
	if (emerging(l))
		m |= param_states(l, l->p.scalar_optimizer);
	return vps_model_module_buffers(&l->m) > 0 ? m | 1u << VPS_STATE_MODULE : m;
}

static int popcount32(uint32_t x)
{
	int n = 0;
	for (; x; x &= x - 1)
		n++;
	return n;
}

static bool in_mask(uint32_t mask, int state) { return state >= 0 && state < VPS_NSTATES && (mask >> state & 1); }

int vps_layout_nstates(const struct vps_layout *l)
{
	return popcount32(layout_states(l) & ~(1u << VPS_STATE_MODULE));
}

/* the state may come from outside (the Python module passes ints) */
bool vps_layout_has_state(const struct vps_layout *l, enum vps_state state)
{
	return in_mask(layout_states(l), (int)state);
}

bool vps_layout_tensor_has_state(const struct vps_layout *l, const struct vps_tensor *t, enum vps_state state)
{
	return in_mask(tensor_states(l, t), (int)state);
}

enum vps_dtype vps_layout_state_dtype(const struct vps_layout *l, enum vps_state state)
{
	const struct vps_parallel *p = &l->p;
	/* TE's FusedAdam with master weights of fp32 over bf16 params keeps
	 * their low 16 bits (store_param_remainders, on by default since TE
	 * 2.1; megatron-core passes it and Megatron-LM has no flag against it),
	 * and the moments in --exp-avg-dtype / --exp-avg-sq-dtype
	 * (distrib_optimizer.py _get_state_key_dtype, load_state_dict) */
	if (state == VPS_STATE_MAIN_PARAM && p->precision_aware)
		return VPS_DTYPE_INT16;
	if ((state == VPS_STATE_EXP_AVG && p->exp_avg_bf16) || (state == VPS_STATE_EXP_AVG_SQ && p->exp_avg_sq_bf16))
		return VPS_DTYPE_BF16;
	return vps_state_dtype(state);
}

/* A chunk's buffers come in groups: dense and expert parameters (with the
 * layer-wise optimizer, those it leaves to its scalar optimizer), each with
 * a buffer per state its parameters have, then its module buffers, with
 * one, then the layer-wise optimizer's dense and expert matrices. */
enum { GROUP_DENSE, GROUP_EXPERT, GROUP_MODULE, GROUP_DENSE_LW, GROUP_EXPERT_LW, NGROUPS };

static bool group_expert(int g) { return g == GROUP_EXPERT || g == GROUP_EXPERT_LW; }
static bool group_lw(int g) { return g == GROUP_DENSE_LW || g == GROUP_EXPERT_LW; }

/* The group of a parameter: DDP keeps expert parameters apart when EP > 1
 * or ETP != TP, and the layer-wise optimizer's matrices apart again
 * (param_and_grad_buffer.py group_params_for_buffers, BufferKey). */
static int tensor_group(const struct vps_layout *l, const struct vps_tensor *t)
{
	if (t->module_buffer)
		return GROUP_MODULE;
	bool expert = t->is_expert && l->expert_buffer, lw = l->layerwise && vps_layout_tensor_matrix(l, t);
	return expert ? (lw ? GROUP_EXPERT_LW : GROUP_EXPERT) : (lw ? GROUP_DENSE_LW : GROUP_DENSE);
}

/* Whether a group holds a state as shards: the distributed optimizer's
 * ZeRO-1 ranges, or the layer-wise optimizer's whole parameters, which
 * Megatron shards only over a dp_cp group of more than one rank
 * (LayerWiseDistributedOptimizer.shard_params), experts included. */
static bool group_state_sharded(const struct vps_layout *l, int g, int state)
{
	if (state == VPS_STATE_PARAM || state == VPS_STATE_GRAD || state == VPS_STATE_MODULE)
		return false;
	return group_lw(g) ? vps_parallel_dpcp(&l->p) > 1 : l->p.zero != 0;
}

bool vps_layout_state_sharded(const struct vps_layout *l, enum vps_state state)
{
	if (l->dt)
		return state != VPS_STATE_MODULE && vps_layout_has_state(l, state) && l->p.dp_shard * l->p.cp > 1;
	return group_state_sharded(l, GROUP_DENSE, state);
}

/* Index of a state among a mask's, in state order. */
static int mask_slot(uint32_t mask, int state) { return popcount32(mask & ((1u << state) - 1)); }

/* The states whose part offload=F keeps in host memory: the optimizer's
 * (fp32 master params and moments) of the distributed optimizer's dense
 * and expert buffers, each of which has a HybridDeviceOptimizer of its
 * own (optimizer/__init__.py builds one per DistributedOptimizer). */
static uint32_t offload_mask(const struct vps_layout *l, int g, uint32_t states)
{
	if (!(l->p.offload > 0) || (g != GROUP_DENSE && g != GROUP_EXPERT))
		return 0;
	return states & (1u << VPS_STATE_MAIN_PARAM | 1u << VPS_STATE_EXP_AVG | 1u << VPS_STATE_EXP_AVG_SQ |
			 1u << VPS_STATE_MOMENTUM);
}

/* A (chunk, group)'s buffers: one per state, then one in host memory per
 * offloaded state. */
static uint32_t group_nbuffers(const struct vps_layout *l, int g, uint32_t states)
{
	return (uint32_t)(popcount32(states) + popcount32(offload_mask(l, g, states)));
}

/* Megatron's two generators over one world (parallel_state.py,
 * initialize_model_parallel): the dense one in the order tp-cp-ep-dp-pp with
 * ep = 1, the expert one in the same order with cp = 1, so expert data
 * parallelism spans what is CP and DP in the dense one. */
void vps_layout_coords(const struct vps_layout *l, int64_t r, struct vps_coords *c)
{
	const struct vps_parallel *p = &l->p;
	if (l->dt) {
		vps_dtensor_coords(p, r, c);
		return;
	}
	c->tp = r % p->tp;
	c->cp = (r / p->tp) % p->cp;
	c->dp = (r / (p->tp * p->cp)) % p->dp;
	c->pp = r / (p->tp * p->cp * p->dp);
	c->etp = r % p->etp;
	c->ep = (r / p->etp) % p->ep;
	c->edp = (r / (p->etp * p->ep)) % l->edp;
}

static struct tmpl *tmpl_at(const struct vps_layout *l, int64_t stage, int64_t chunk, int group)
{
	return &l->tm[(stage * l->p.vpp + chunk) * NGROUPS + group];
}

/* ---- tensor-parallel pieces ---- */

int64_t vps_layout_local_elements(const struct vps_layout *l, const struct vps_tensor *t)
{
	int64_t T = t->is_expert ? l->p.etp : l->p.tp;
	struct vps_box b;
	vps_box_full(&b, t->ndim, t->shape);
	int64_t vol = vps_box_volume(&b);
	switch (t->split) {
	case VPS_SPLIT_NONE: return vol;
	case VPS_SPLIT_AXIS:
	case VPS_SPLIT_FLAT: return vol / T;
	case VPS_SPLIT_VOCAB: {
		int64_t padded = vps_round_up(t->shape[0], l->m.vocab_divisor * T);
		return padded / T * t->shape[1];
	}
	}
	return vol;
}

int vps_layout_pieces(const struct vps_layout *l, const struct vps_tensor *t, int64_t ti, struct piece *out)
{
	int64_t T = t->is_expert ? l->p.etp : l->p.tp;
	struct vps_box full;
	vps_box_full(&full, t->ndim, t->shape);
	switch (t->split) {
	case VPS_SPLIT_NONE:
		out[0].box = full;
		out[0].loc = 0;
		return 1;
	case VPS_SPLIT_AXIS: {
		int64_t n = t->shape[t->axis] / T;
		out[0].box = full;
		out[0].box.lo[t->axis] = ti * n;
		out[0].box.hi[t->axis] = (ti + 1) * n;
		out[0].loc = 0;
		return 1;
	}
	case VPS_SPLIT_VOCAB: {
		int64_t rows = vps_round_up(t->shape[0], l->m.vocab_divisor * T) / T;
		int64_t lo = ti * rows, hi = vps_min64((ti + 1) * rows, t->shape[0]);
		if (lo >= hi)
			return 0;
		out[0].box = full;
		out[0].box.lo[0] = lo;
		out[0].box.hi[0] = hi;
		out[0].loc = 0;
		return 1;
	}
	case VPS_SPLIT_FLAT: {
		int64_t vol = vps_box_volume(&full), per = vol / T;
		struct vps_box boxes[2 * VPS_MAX_DIMS];
		int64_t starts[2 * VPS_MAX_DIMS];
		int n = vps_flat_range_boxes(t->ndim, t->shape, ti * per, (ti + 1) * per, boxes, starts);
		for (int i = 0; i < n; i++) {
			out[i].box = boxes[i];
			out[i].loc = starts[i] - ti * per;
		}
		return n;
	}
	}
	return 0;
}

/* ---- templates: one buffer layout per (stage, chunk, dense/expert) ---- */

static vps_result_t tmpl_push(struct tmpl *tm, size_t *cap, const struct tparam *p)
{
	VPS_CHECK(VPS_GROW(tm->p, *cap, tm->n + 1));
	tm->p[tm->n++] = *p;
	return VPS_OK;
}

/* Whether the last stage holds a copy of the word embeddings: the tied
 * output layer's weight, or the embedding the MTP block needs (GPTModel
 * builds one where mtp_process) */
static bool embedding_copied(const struct vps_layout *l)
{
	return (l->m.tied_embeddings || l->m.mtp_layers > 0) && l->p.pp > 1;
}

static vps_result_t tmpl_add(const struct vps_layout *l, struct tmpl *tm, size_t *cap, uint32_t tensor, int32_t layer,
			     int32_t local_layer, int32_t slot, bool output_copy, int group)
{
	struct vps_tensor t;
	VPS_CHECK(vps_model_tensor(&l->m, tensor, &t));
	if (tensor_group(l, &t) != group)
		return VPS_OK;
	tm->states |= tensor_states(l, &t);
	struct tparam p = {0};
	p.tensor = tensor;
	p.layer = layer;
	p.local_layer = local_layer;
	p.slot = slot;
	p.output_copy = output_copy;
	/* Megatron marks both copies of the word embeddings shared_embedding
	 * when tied embeddings or MTP put one on the last stage too
	 * (language_module.py setup_embeddings_and_output_layer) */
	p.shared = embedding_copied(l) && t.kind == VPS_T_WORD_EMB;
	p.elements = vps_layout_local_elements(l, &t);
	return tmpl_push(tm, cap, &p);
}

static int tparam_ref_cmp(const void *a, const void *b)
{
	const struct tparam_ref *x = a, *y = b;
	return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static vps_result_t index_by_tensor(struct tmpl *tm)
{
	tm->by_tensor = vps_calloc(tm->n, sizeof(*tm->by_tensor));
	if (!tm->by_tensor)
		return VPS_ENOMEM;
	for (size_t k = 0; k < tm->n; k++)
		if (!tm->p[k].output_copy)
			tm->by_tensor[tm->nby_tensor++] = (struct tparam_ref){tm->p[k].tensor, (uint32_t)k};
	qsort(tm->by_tensor, tm->nby_tensor, sizeof(*tm->by_tensor), tparam_ref_cmp);
	return VPS_OK;
}

/* One layer's tensors in registration order; shared experts follow the
 * routed ones (MoELayer.__init__). layer and local_layer are -1 in an MTP
 * layer. */
static vps_result_t tmpl_add_layer(const struct vps_layout *l, struct tmpl *tm, size_t *cap,
				   const struct vps_layer_span *sp, int32_t layer, int32_t local_layer, int group)
{
	uint32_t base = sp->first, after = sp->expert_first + sp->experts * sp->per_expert;
	for (uint32_t k = 0; k < sp->expert_first; k++)
		VPS_CHECK(tmpl_add(l, tm, cap, base + k, layer, local_layer, -1, false, group));
	/* SequentialMLP registers expert by expert (local_experts.i.linear_fc1,
	 * .linear_fc2); TEGroupedMLP registers linear_fc1 then linear_fc2, each a
	 * GroupedLinear holding weight{i} (and bias{i}) gemm by gemm
	 * (experts.py TEGroupedMLP.__init__, TE grouped_linear.py
	 * GroupedLinear.__init__) */
	uint32_t per_linear = l->p.grouped_gemm ? l->nexpert_kinds / 2 : l->nexpert_kinds;
	for (uint32_t lin = 0; sp->experts && lin < l->nexpert_kinds / per_linear; lin++)
		for (int64_t slot = 0; slot < l->experts_per_rank; slot++)
			for (uint32_t k = lin * per_linear; k < (lin + 1) * per_linear; k++)
				VPS_CHECK(tmpl_add(l, tm, cap, base + sp->expert_first + (uint32_t)slot * l->nexpert_kinds + k,
						   layer, local_layer, (int32_t)slot, false, group));
	for (uint32_t k = after; k < sp->count; k++)
		VPS_CHECK(tmpl_add(l, tm, cap, base + k, layer, local_layer, -1, false, group));
	return VPS_OK;
}

static vps_result_t module_add(const struct vps_layout *l, struct tmpl *tm, size_t *cap, int64_t layer,
			       int64_t local_layer, int64_t mtp)
{
	struct tparam p = {0};
	if (!vps_model_router_bias(&l->m, layer, mtp, &p.tensor))
		return VPS_OK;
	p.layer = (int32_t)layer;
	p.local_layer = (int32_t)local_layer;
	p.slot = -1;
	p.offset = tm->n ? tm->p[tm->n - 1].offset + tm->p[tm->n - 1].elements : 0;
	p.elements = l->m.experts;
	return tmpl_push(tm, cap, &p);
}

/* A chunk's module buffers: its layers' routers' expert_bias, then the MTP
 * layers', packed in that order. They are module state, not in Megatron's
 * DDP buffers, so no padding, no buckets and no ZeRO shards apply: one
 * bucket spans the buffer. */
static vps_result_t build_module_tmpl(struct vps_layout *l, int64_t s, int64_t v)
{
	struct tmpl *tm = tmpl_at(l, s, v, GROUP_MODULE);
	size_t cap = 0;
	tm->output_copy_idx = -1;
	int64_t first = vps_parallel_chunk_first_layer(&l->p, &l->m, s, v);
	int64_t n = vps_parallel_stage_layers(&l->p, &l->m, s) / l->p.vpp;
	for (int64_t ll = 0; ll < n; ll++)
		VPS_CHECK(module_add(l, tm, &cap, first + ll, ll, -1));
	if (s == l->p.pp - 1 && v == l->p.vpp - 1)
		for (int64_t k = 0; k < l->m.mtp_layers; k++)
			VPS_CHECK(module_add(l, tm, &cap, -1, -1, k));
	if (!tm->n)
		return VPS_OK;
	VPS_CHECK(index_by_tensor(tm));
	tm->b = vps_calloc(1, sizeof(*tm->b));
	if (!tm->b)
		return VPS_ENOMEM;
	tm->nb = 1;
	tm->elements = tm->shard_elements = tm->b[0].hi = tm->p[tm->n - 1].offset + tm->p[tm->n - 1].elements;
	tm->dpsize = 1;
	tm->states = 1u << VPS_STATE_MODULE;
	return VPS_OK;
}

/* What the last pipeline stage's last chunk registers after its layers:
 * decoder.final_layernorm, the MTP block, output_layer (or the copy of a
 * tied embedding). */
static vps_result_t tmpl_add_last(struct vps_layout *l, struct tmpl *tm, size_t *cap, int group)
{
	uint32_t post_first = vps_model_layer_first(&l->m, l->m.layers);
	uint32_t mtp_first = vps_model_module_first(&l->m);
	if (l->m.mtp_layers > 0) {
		struct vps_mtp_span ms;
		vps_model_mtp_span(&l->m, 0, &ms);
		mtp_first = ms.first;
	}
	for (uint32_t i = post_first; i < mtp_first; i++) {
		struct vps_tensor t;
		VPS_CHECK(vps_model_tensor(&l->m, i, &t));
		if (t.kind != VPS_T_OUTPUT_W)
			VPS_CHECK(tmpl_add(l, tm, cap, i, -1, -1, -1, false, group));
	}
	for (int64_t k = 0; k < l->m.mtp_layers; k++) {
		struct vps_mtp_span ms;
		vps_model_mtp_span(&l->m, k, &ms);
		for (uint32_t i = 0; i < ms.pre; i++)
			VPS_CHECK(tmpl_add(l, tm, cap, ms.first + i, -1, -1, -1, false, group));
		VPS_CHECK(tmpl_add_layer(l, tm, cap, &ms.layer, -1, -1, group));
		for (uint32_t i = ms.layer.first + ms.layer.count; i < ms.first + ms.count; i++)
			VPS_CHECK(tmpl_add(l, tm, cap, i, -1, -1, -1, false, group));
	}
	if (!l->m.tied_embeddings) {
		struct vps_tensor t;
		VPS_CHECK(vps_model_tensor(&l->m, mtp_first - 1, &t));
		if (t.kind == VPS_T_OUTPUT_W)
			VPS_CHECK(tmpl_add(l, tm, cap, mtp_first - 1, -1, -1, -1, false, group));
	} else if (l->p.pp > 1 && group == GROUP_DENSE) {
		tm->output_copy_idx = (int64_t)tm->n;
		VPS_CHECK(tmpl_add(l, tm, cap, 0, -1, -1, -1, true, group));
	}
	return VPS_OK;
}

/* The parameters of chunk v of stage s (its dense or expert ones), in
 * Megatron's registration order. */
static vps_result_t tmpl_register(struct vps_layout *l, struct tmpl *tm, int64_t s, int64_t v, int group)
{
	const struct vps_parallel *p = &l->p;
	size_t cap = 0;
	uint32_t pre = vps_model_pre_tensors(&l->m);
	tm->output_copy_idx = -1;
	if (s == 0 && v == 0)
		for (uint32_t i = 0; i < pre; i++)
			VPS_CHECK(tmpl_add(l, tm, &cap, i, -1, -1, -1, false, group));
	bool last = s == p->pp - 1 && v == p->vpp - 1;
	/* GPTModel registers the MTP stage's embedding before the decoder */
	if (last && embedding_copied(l) && !l->m.tied_embeddings && group == GROUP_DENSE) {
		tm->output_copy_idx = (int64_t)tm->n;
		VPS_CHECK(tmpl_add(l, tm, &cap, 0, -1, -1, -1, true, group));
	}
	int64_t first = vps_parallel_chunk_first_layer(p, &l->m, s, v);
	int64_t n = vps_parallel_stage_layers(p, &l->m, s) / p->vpp;
	for (int64_t ll = 0; ll < n; ll++) {
		/* layers differ (dense first layers): each says where its
		 * routed experts sit */
		struct vps_layer_span sp;
		vps_model_layer_span(&l->m, first + ll, &sp);
		VPS_CHECK(tmpl_add_layer(l, tm, &cap, &sp, (int32_t)(first + ll), (int32_t)ll, group));
	}
	return last ? tmpl_add_last(l, tm, &cap, group) : VPS_OK;
}

/* The buckets being laid out: the open one starts at start and holds n
 * parameters; with the distributed optimizer (zero) a bucket ends on a
 * multiple of divisor. */
struct bucketing {
	size_t cap;
	int64_t start;
	size_t n;
	bool zero;
	int64_t divisor;
};

static vps_result_t close_bucket(struct tmpl *tm, struct bucketing *bk, int64_t end)
{
	int64_t hi = bk->zero ? vps_round_up(end, bk->divisor) : end;
	VPS_CHECK(VPS_GROW(tm->b, bk->cap, tm->nb + 1));
	tm->b[tm->nb].lo = bk->start;
	tm->b[tm->nb].hi = hi;
	tm->nb++;
	bk->start = hi;
	bk->n = 0;
	return VPS_OK;
}

/* The bucket size of chunk v of stage s: with overlap, the training path's
 * 1,000,000 x the dp_cp group's size for every buffer (training.py
 * resolve_ddp_bucket_size), only in the first stage's first chunk; 0: one
 * bucket. */
static int64_t bucket_elements(const struct vps_layout *l, int64_t s, int64_t v)
{
	const struct vps_parallel *p = &l->p;
	if (s > 0 || v > 0)
		return 0;
	return p->bucket == VPS_BUCKET_AUTO ? vps_max64(40000000, 1000000 * vps_parallel_dpcp(p)) : p->bucket;
}

/* Shard offsets of a tmpl's buckets, one after the other. */
static void tmpl_shards(struct tmpl *tm)
{
	tm->elements = tm->b[tm->nb - 1].hi;
	int64_t sb = 0;
	for (size_t b = 0; b < tm->nb; b++) {
		tm->b[b].shard_base = sb;
		sb += (tm->b[b].hi - tm->b[b].lo) / tm->dpsize;
	}
	tm->shard_elements = sb;
}

/* Buffer order, padding and buckets of Megatron's DDP buffers: params in
 * reverse registration order; with the distributed optimizer each param
 * starts on a multiple of 64, a shared embedding gets a bucket of its own,
 * and each bucket ends on a multiple of lcm(dp, 128). */
static vps_result_t tmpl_buckets(struct vps_layout *l, struct tmpl *tm, int64_t s, int64_t v, int group)
{
	const struct vps_parallel *p = &l->p;
	/* dense buffers are sharded over the dp_cp group, expert ones over
	 * expert DP (distributed_data_parallel.py: intra_dp_cp_group and
	 * intra_expt_dp_group) */
	int64_t dpsize = group_expert(group) ? l->edp : vps_parallel_dpcp(p);
	struct bucketing bk = {.zero = p->zero != 0, .divisor = vps_lcm(dpsize, 128)};
	int64_t bsize = bucket_elements(l, s, v);
	tm->dpsize = dpsize;
	int64_t off = 0, end = 0;
	for (size_t k = tm->n; k-- > 0;) {
		struct tparam *tp = &tm->p[k];
		if (bk.zero)
			off = vps_round_up(off, 64);
		if (bk.zero && tp->shared && bk.n > 0) {
			VPS_CHECK(close_bucket(tm, &bk, off));
			off = bk.start;
		}
		tp->offset = off;
		tp->bucket = (int32_t)tm->nb;
		end = off + tp->elements;
		bk.n++;
		if ((bsize && end - bk.start >= bsize) || (bk.zero && tp->shared)) {
			VPS_CHECK(close_bucket(tm, &bk, end));
			off = bk.start;
		} else {
			off = end;
		}
	}
	if (bk.n)
		VPS_CHECK(close_bucket(tm, &bk, end));
	tmpl_shards(tm);
	return VPS_OK;
}

/* ---- the layer-wise optimizer's buffers ---- */

/* The shards of one layer-wise bucket being packed: the least loaded
 * first, the lower index among equals (Python's min over range(dp)). Shards
 * not yet used are all empty and so come first, in order: only the used
 * ones are kept, in a heap, so that packing costs O(params log dp) and
 * never O(dp). */
struct lw_shard {
	int64_t load;
	int64_t index;
};

struct lw_pack {
	struct lw_shard *heap;
	size_t n, cap;
	int64_t fresh; /* shards [fresh, dp) are still empty */
	int64_t dp;
};

static bool lw_before(const struct lw_shard *a, const struct lw_shard *b)
{
	return a->load < b->load || (a->load == b->load && a->index < b->index);
}

static void lw_sift_down(struct lw_pack *k, size_t i)
{
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= k->n)
			return;
		if (c + 1 < k->n && lw_before(&k->heap[c + 1], &k->heap[c]))
			c++;
		if (!lw_before(&k->heap[c], &k->heap[i]))
			return;
		struct lw_shard t = k->heap[i];
		k->heap[i] = k->heap[c];
		k->heap[c] = t;
		i = c;
	}
}

static vps_result_t lw_push(struct lw_pack *k, struct lw_shard x)
{
	VPS_CHECK(VPS_GROW(k->heap, k->cap, k->n + 1));
	size_t i = k->n++;
	k->heap[i] = x;
	while (i > 0 && lw_before(&k->heap[i], &k->heap[(i - 1) / 2])) {
		struct lw_shard t = k->heap[i];
		k->heap[i] = k->heap[(i - 1) / 2];
		k->heap[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
	return VPS_OK;
}

/* Place a parameter of `elements` on the least loaded shard: its index and
 * its start inside the shard (on a multiple of 64, pad_param_start). */
static vps_result_t lw_place(struct lw_pack *k, int64_t elements, int64_t *shard, int64_t *at)
{
	/* a used shard holds a parameter, so its load is above an empty one's */
	if (k->fresh < k->dp) {
		*shard = k->fresh++;
		*at = 0;
		return lw_push(k, (struct lw_shard){elements, *shard});
	}
	*shard = k->heap[0].index;
	*at = vps_round_up(k->heap[0].load, 64);
	k->heap[0].load = *at + elements;
	lw_sift_down(k, 0);
	return VPS_OK;
}

struct lw_order {
	int64_t elements;
	size_t k; /* position in the chunk, reverse registration order */
};

static int lw_order_cmp(const void *a, const void *b)
{
	const struct lw_order *x = a, *y = b;
	if (x->elements != y->elements)
		return x->elements > y->elements ? -1 : 1;
	return x->k < y->k ? -1 : x->k > y->k;
}

/* One layer-wise bucket: params tm->p[first - count + 1 .. first] (walked
 * from first down, reverse registration order), largest first onto the
 * least loaded of dp shards, each shard then padded to the largest's size
 * rounded to lcm(64, lcm(dp, 128) / dp) (LayerWiseDistributedOptimizer.
 * _compute_per_buffer_param_layout's _emit_bucket, _shard_divisor). */
static vps_result_t lw_emit(struct tmpl *tm, size_t *capb, size_t first, size_t count, int64_t *cursor)
{
	vps_result_t rc = VPS_OK;
	int64_t dp = tm->dpsize, divisor = vps_lcm(64, vps_lcm(dp, 128) / dp);
	struct lw_order *ord = vps_malloc(count * sizeof(*ord) + 1);
	int64_t *shard = vps_malloc(count * sizeof(*shard) + 1), *at = vps_malloc(count * sizeof(*at) + 1);
	struct lw_pack k = {.dp = dp};
	if (!ord || !shard || !at) {
		rc = VPS_ENOMEM;
		goto done;
	}
	for (size_t i = 0; i < count; i++)
		ord[i] = (struct lw_order){tm->p[first - i].elements, i};
	/* Python's sort is stable: equal sizes keep the walk's order */
	qsort(ord, count, sizeof(*ord), lw_order_cmp);
	int64_t widest = 0;
	for (size_t i = 0; i < count && !rc; i++) {
		rc = lw_place(&k, ord[i].elements, &shard[ord[i].k], &at[ord[i].k]);
		widest = vps_max64(widest, at[ord[i].k] + ord[i].elements);
	}
	if (rc)
		goto done;
	int64_t per = vps_round_up(widest, divisor), start = *cursor;
	for (size_t i = 0; i < count; i++) {
		struct tparam *tp = &tm->p[first - i];
		tp->offset = start + shard[i] * per + at[i];
		tp->bucket = (int32_t)tm->nb;
	}
	VPS_CHECK_GOTO(VPS_GROW(tm->b, *capb, tm->nb + 1), rc, done);
	tm->b[tm->nb].lo = start;
	tm->b[tm->nb].hi = start + dp * per;
	tm->nb++;
	*cursor = start + dp * per;
done:
	free(ord);
	free(shard);
	free(at);
	free(k.heap);
	return rc;
}

/* The layer-wise optimizer's buffer: each bucket a run of parameters in
 * reverse registration order, closed once its elements reach the bucket
 * size or 0.9 x dp x its largest parameter, whichever is more; every
 * parameter whole inside one DP rank's shard, which owns it
 * (layer_wise_optimizer.py _compute_per_buffer_param_layout,
 * _shard_params_from_layout). No shared embedding is a matrix. */
static vps_result_t tmpl_buckets_lw(struct vps_layout *l, struct tmpl *tm, int64_t s, int64_t v, int group)
{
	tm->dpsize = group_expert(group) ? l->edp : vps_parallel_dpcp(&l->p);
	int64_t bsize = bucket_elements(l, s, v), cursor = 0, sum = 0, widest = 0;
	size_t capb = 0, count = 0;
	for (size_t k = tm->n; k-- > 0;) {
		sum += tm->p[k].elements;
		widest = vps_max64(widest, tm->p[k].elements);
		count++;
		/* PADDING_FLOOR: int(dp_size * chunk_max_param * 0.9), the product
		 * rounded to a double as Python's int * float rounds it */
		double floor = (double)tm->dpsize * (double)widest * 0.9;
		int64_t threshold = floor < 9.0e18 ? vps_max64(bsize, (int64_t)floor) : INT64_MAX;
		if (bsize && sum >= threshold) {
			VPS_CHECK(lw_emit(tm, &capb, k + count - 1, count, &cursor));
			sum = widest = 0;
			count = 0;
		}
	}
	if (count)
		VPS_CHECK(lw_emit(tm, &capb, count - 1, count, &cursor));
	tmpl_shards(tm);
	return VPS_OK;
}

static vps_result_t build_tmpl(struct vps_layout *l, int64_t s, int64_t v, int group)
{
	struct tmpl *tm = tmpl_at(l, s, v, group);
	VPS_CHECK(tmpl_register(l, tm, s, v, group));
	if (tm->n == 0)
		return VPS_OK;
	VPS_CHECK(index_by_tensor(tm));
	return group_lw(group) ? tmpl_buckets_lw(l, tm, s, v, group) : tmpl_buckets(l, tm, s, v, group);
}

vps_result_t vps_layout_new(struct vps_layout **out, const struct vps_model *m, const struct vps_parallel *pin,
			    const struct vps_devices *d, const char *where)
{
	vps_result_t rc;
	struct vps_layout *l = vps_calloc(1, sizeof(*l));
	if (!l)
		return VPS_ENOMEM;
	l->m = *m;
	l->p = *pin;
	VPS_CHECK_GOTO(vps_model_validate(&l->m, where), rc, fail);
	VPS_CHECK_GOTO(vps_parallel_validate(&l->p, &l->m, where), rc, fail);
	/* the padded vocabulary can outgrow the model by the divisor times TP */
	int64_t padded;
	if (!vps_mul_ok(vps_round_up(m->vocab, m->vocab_divisor * l->p.tp), m->hidden, &padded) ||
	    padded > VPS_MAX_ELEMENTS) {
		rc = vps_fail(VPS_EINPUT, "%s: the vocabulary padded to %" PRId64 " x tp=%" PRId64
			      " makes an embedding of more than 2^48 elements", where, m->vocab_divisor, l->p.tp);
		goto fail;
	}
	l->world = vps_parallel_world(&l->p);
	l->edp = vps_parallel_edp(&l->p);
	VPS_CHECK_GOTO(vps_devices_copy(&l->d, d), rc, fail);
	VPS_CHECK_GOTO(vps_devices_validate(&l->d, l->world, where), rc, fail);
	if (l->p.family == VPS_FAMILY_DTENSOR) {
		VPS_CHECK_GOTO(vps_dtensor_new(&l->dt, &l->m, &l->p, where), rc, fail);
		l->expert_buffer = m->experts > 0;
		l->experts_per_rank = m->experts ? m->experts / l->p.ep : 0;
		*out = l;
		return VPS_OK;
	}
	l->expert_buffer = m->experts > 0 && (l->p.ep > 1 || l->p.etp != l->p.tp);
	l->layerwise = emerging(l) && l->p.zero;
	l->experts_per_rank = m->experts ? m->experts / l->p.ep : 0;
	l->nexpert_kinds = m->bias ? 4 : 2;
	size_t ntm = (size_t)(l->p.pp * l->p.vpp * NGROUPS);
	l->tm = vps_calloc(ntm, sizeof(*l->tm));
	if (!l->tm) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (int64_t s = 0; s < l->p.pp; s++)
		for (int64_t v = 0; v < l->p.vpp; v++)
			for (int e = 0; e < NGROUPS; e++) {
				VPS_CHECK_GOTO(e == GROUP_MODULE ? build_module_tmpl(l, s, v) : build_tmpl(l, s, v, e), rc, fail);
				if (tmpl_at(l, s, v, e)->elements > VPS_MAX_ELEMENTS) {
					rc = vps_fail(VPS_EINPUT, "%s: a buffer of stage %" PRId64 " holds more than 2^48 elements",
						      where, s);
					goto fail;
				}
			}
	*out = l;
	return VPS_OK;
fail:
	vps_layout_free(l);
	return rc;
}

void vps_layout_free(struct vps_layout *l)
{
	if (!l)
		return;
	if (l->tm) {
		size_t ntm = (size_t)(l->p.pp * l->p.vpp * NGROUPS);
		for (size_t i = 0; i < ntm; i++) {
			free(l->tm[i].p);
			free(l->tm[i].b);
			free(l->tm[i].by_tensor);
		}
		free(l->tm);
	}
	for (size_t i = 0; i < l->nex; i++)
		vps_rank_view_release(&l->ex[i]);
	free(l->ex);
	free(l->exidx);
	vps_dtensor_free(l->dt);
	vps_devices_release(&l->d);
	free(l);
}

/* ---- regions of one parameter ---- */

/* Tensor id of a template param on a rank of expert-parallel rank ep. */
static uint32_t tparam_tensor(const struct vps_layout *l, const struct tparam *tp, int64_t ep)
{
	if (tp->slot < 0)
		return tp->tensor;
	return tp->tensor + (uint32_t)(ep * l->experts_per_rank * l->nexpert_kinds);
}

/* Which regions of a parameter are wanted: of a state in its dtype, in a
 * buffer, and in a shard buffer (sharded) DP rank `shard`'s part. */
struct region_of {
	int state;
	enum vps_dtype dtype;
	bool sharded;
	int64_t shard;
	uint32_t buffer;
};

/* Emit the regions of one (param, state): whole pieces, or in a ZeRO shard
 * buffer the parts of the pieces inside DP rank d's shard of the param's
 * bucket, addressed in the shard buffer. */
static vps_result_t param_regions(const struct tmpl *tm, const struct tparam *tp, uint32_t tensor, int ndim,
				  const struct piece *pc, int npc, const struct region_of *ro,
				  const struct vps_box *clip, struct vps_region **out, size_t *n, size_t *cap)
{
	int64_t a = tp->offset, e = tp->offset + tp->elements, d = ro->shard;
	bool sharded = ro->sharded;
	const struct tbucket *b = &tm->b[tp->bucket];
	int64_t s_lo = 0;
	if (sharded) {
		int64_t sz = (b->hi - b->lo) / tm->dpsize;
		s_lo = b->lo + d * sz;
		a = vps_max64(a, s_lo);
		e = vps_min64(e, s_lo + sz);
		if (a >= e)
			return VPS_OK;
	}
	for (int i = 0; i < npc; i++) {
		int64_t vol = vps_box_volume(&pc[i].box);
		int64_t plo = tp->offset + pc[i].loc, phi = plo + vol;
		int64_t x = vps_max64(a, plo), y = vps_min64(e, phi);
		if (x >= y)
			continue;
		if (clip && !vps_box_intersect(&pc[i].box, clip, NULL))
			continue;
		int64_t strides[VPS_MAX_DIMS];
		vps_box_rowmajor_strides(&pc[i].box, strides);
		struct vps_box sub[2 * VPS_MAX_DIMS];
		int64_t starts[2 * VPS_MAX_DIMS], ext[VPS_MAX_DIMS];
		int nsub;
		if (x == plo && y == phi) {
			nsub = 1;
			sub[0] = pc[i].box;
			starts[0] = 0;
		} else {
			for (int k = 0; k < ndim; k++)
				ext[k] = pc[i].box.hi[k] - pc[i].box.lo[k];
			nsub = vps_flat_range_boxes(ndim, ext, x - plo, y - plo, sub, starts);
			for (int j = 0; j < nsub; j++)
				for (int k = 0; k < ndim; k++) {
					sub[j].lo[k] += pc[i].box.lo[k];
					sub[j].hi[k] += pc[i].box.lo[k];
				}
		}
		for (int j = 0; j < nsub; j++) {
			if (clip && !vps_box_intersect(&sub[j], clip, NULL))
				continue;
			VPS_CHECK(vps_grow((void **)out, cap, *n + 1, sizeof(**out)));
			struct vps_region *r = &(*out)[(*n)++];
			memset(r, 0, sizeof(*r));
			r->tensor = tensor;
			r->state = (uint8_t)ro->state;
			r->dtype = vps_dtype_field(ro->dtype);
			r->buffer = ro->buffer;
			r->box = sub[j];
			memcpy(r->strides, strides, sizeof(strides));
			r->offset = sharded ? b->shard_base + (plo + starts[j] - s_lo) : plo + starts[j];
		}
	}
	return VPS_OK;
}

/* ---- offload: the HybridDeviceOptimizer's split ---- */

/* DP rank d's part of parameter tp, in its shard buffer: [*lo, *hi), empty
 * when *hi <= *lo. */
static void shard_span(const struct tmpl *tm, const struct tparam *tp, int64_t d, int64_t *lo, int64_t *hi)
{
	const struct tbucket *b = &tm->b[tp->bucket];
	int64_t sz = (b->hi - b->lo) / tm->dpsize, s_lo = b->lo + d * sz;
	*lo = b->shard_base + vps_max64(tp->offset, s_lo) - s_lo;
	*hi = b->shard_base + vps_min64(tp->offset + tp->elements, s_lo + sz) - s_lo;
}

/* Where offload=F puts DP rank d's parts of one group's parameters on one
 * stage: for parameter k of chunk ch (index first[ch] + k), whether its
 * states are in host memory, and delta: its part's offset in the buffer
 * that holds it less its offset in the shard buffer. The host buffer packs
 * its parts in shard order; the GPU one keeps the rest, in the same order. */
struct offload_split {
	size_t *first;          /* [vpp + 1] */
	bool *host;             /* [first[vpp]] */
	int64_t *delta;         /* [first[vpp]] */
	int64_t *host_elements; /* [vpp] */
};

static void offload_split_release(struct offload_split *sp)
{
	free(sp->first);
	free(sp->host);
	free(sp->delta);
	free(sp->host_elements);
	memset(sp, 0, sizeof(*sp));
}

struct at_offset {
	int64_t offset;
	size_t k;
};

static int at_offset_cmp(const void *a, const void *b)
{
	const struct at_offset *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The HybridDeviceOptimizer (cpu_offloading/hybrid_optimizer.py
 * _get_sub_optimizer_param_groups) takes its parameters group by group
 * (optimizer/__init__.py _get_param_groups, standard overrides: the default
 * group, then wd_mult=0's, biases and 1-D parameters), each group in the
 * distributed optimizer's order (_build_optimizer_group_ranges: buffer by
 * buffer, chunk by chunk, each in buffer order), and moves a parameter's
 * part to the host while the elements moved are fewer than F times the
 * elements of all (a float compare, as here). */
static vps_result_t offload_split(const struct vps_layout *l, int64_t s, int g, int64_t d, struct offload_split *sp)
{
	size_t nv = (size_t)l->p.vpp;
	struct at_offset *order = NULL;
	vps_result_t rc = VPS_ENOMEM;
	memset(sp, 0, sizeof(*sp));
	sp->first = vps_calloc(nv + 1, sizeof(*sp->first));
	sp->host_elements = vps_calloc(nv, sizeof(*sp->host_elements));
	if (!sp->first || !sp->host_elements)
		goto fail;
	for (size_t ch = 0; ch < nv; ch++)
		sp->first[ch + 1] = sp->first[ch] + tmpl_at(l, s, (int64_t)ch, g)->n;
	size_t n = sp->first[nv];
	sp->host = vps_calloc(n + 1, sizeof(*sp->host));
	sp->delta = vps_calloc(n + 1, sizeof(*sp->delta));
	order = vps_malloc((n + 1) * sizeof(*order));
	if (!sp->host || !sp->delta || !order)
		goto fail;
	int64_t total = 0, lo, hi;
	for (size_t ch = 0; ch < nv; ch++) {
		const struct tmpl *tm = tmpl_at(l, s, (int64_t)ch, g);
		for (size_t k = 0; k < tm->n; k++) {
			shard_span(tm, &tm->p[k], d, &lo, &hi);
			total += vps_max64(hi - lo, 0);
			order[sp->first[ch] + k] = (struct at_offset){tm->p[k].offset, k};
		}
		qsort(order + sp->first[ch], tm->n, sizeof(*order), at_offset_cmp);
	}
	double threshold = (double)total * l->p.offload;
	int64_t moved = 0;
	for (int vectors = 0; vectors < 2; vectors++)
		for (size_t ch = 0; ch < nv; ch++) {
			const struct tmpl *tm = tmpl_at(l, s, (int64_t)ch, g);
			for (size_t j = sp->first[ch]; j < sp->first[ch + 1]; j++) {
				const struct tparam *tp = &tm->p[order[j].k];
				struct vps_tensor t;
				shard_span(tm, tp, d, &lo, &hi);
				if (hi <= lo)
					continue;
				if ((rc = vps_model_tensor(&l->m, tp->tensor, &t)))
					goto fail;
				/* Megatron's 1-D parameters and biases: its parameters that
				 * are no weight matrix (vps's logical shapes split some,
				 * linear_qkv.bias by query group, so ndim does not say) */
				bool vector = !vps_layout_tensor_matrix(l, &t) && t.kind != VPS_T_WORD_EMB &&
					      t.kind != VPS_T_OUTPUT_W;
				if (vector != (vectors == 1) || !((double)moved < threshold))
					continue;
				sp->host[sp->first[ch] + order[j].k] = true;
				moved += hi - lo;
			}
		}
	for (size_t ch = 0; ch < nv; ch++) {
		const struct tmpl *tm = tmpl_at(l, s, (int64_t)ch, g);
		int64_t host_at = 0;
		for (size_t j = sp->first[ch]; j < sp->first[ch + 1]; j++) {
			size_t i = sp->first[ch] + order[j].k;
			shard_span(tm, &tm->p[order[j].k], d, &lo, &hi);
			if (hi <= lo)
				continue;
			sp->delta[i] = sp->host[i] ? host_at - lo : -host_at;
			if (sp->host[i])
				host_at += hi - lo;
		}
		sp->host_elements[ch] = host_at;
	}
	free(order);
	return VPS_OK;
fail:
	free(order);
	offload_split_release(sp);
	return rc == VPS_OK ? VPS_ENOMEM : rc;
}

/* The dense or expert shard a rank's coordinates place it in. */
static int64_t group_shard(const struct vps_layout *l, int g, const struct vps_coords *c)
{
	return group_expert(g) ? c->edp : c->cp + l->p.cp * c->dp;
}

/* Move regions [from, n) of parameter i, of an offloaded state, to where
 * the split puts them. */
static void offload_regions(const struct offload_split *sp, size_t i, uint32_t host_buffer, struct vps_region *r,
			    size_t from, size_t n)
{
	for (size_t j = from; j < n; j++) {
		if (sp->host[i])
			r[j].buffer = host_buffer;
		r[j].offset += sp->delta[i];
	}
}

static const struct vps_rank_view *find_explicit(const struct vps_layout *l, int64_t rank)
{
	size_t lo = 0, hi = l->nex;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (l->ex[mid].rank == rank)
			return &l->ex[mid];
		if (l->ex[mid].rank < rank)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static vps_result_t copy_view(const struct vps_rank_view *src, struct vps_rank_view *dst)
{
	memset(dst, 0, sizeof(*dst));
	dst->rank = src->rank;
	dst->device = src->device;
	dst->coords = src->coords;
	dst->nbuffers = src->nbuffers;
	dst->nparams = src->nparams;
	dst->nregions = src->nregions;
	dst->buffers = vps_malloc(src->nbuffers * sizeof(*src->buffers) + 1);
	dst->params = vps_malloc(src->nparams * sizeof(*src->params) + 1);
	dst->regions = vps_malloc(src->nregions * sizeof(*src->regions) + 1);
	dst->region_param = vps_malloc(src->nregions * sizeof(*src->region_param) + 1);
	if (src->region_names)
		dst->region_names = vps_calloc(src->nregions + 1, sizeof(char *));
	if (!dst->buffers || !dst->params || !dst->regions || !dst->region_param ||
	    (src->region_names && !dst->region_names)) {
		vps_rank_view_release(dst);
		return VPS_ENOMEM;
	}
	/* an explicit view read from a file has no params */
	if (src->nbuffers)
		memcpy(dst->buffers, src->buffers, src->nbuffers * sizeof(*src->buffers));
	if (src->nparams)
		memcpy(dst->params, src->params, src->nparams * sizeof(*src->params));
	if (src->nregions) {
		memcpy(dst->regions, src->regions, src->nregions * sizeof(*src->regions));
		memcpy(dst->region_param, src->region_param, src->nregions * sizeof(*src->region_param));
	}
	if (src->region_names)
		for (size_t i = 0; i < src->nregions; i++) {
			dst->region_names[i] = vps_strdup(src->region_names[i]);
			if (!dst->region_names[i]) {
				vps_rank_view_release(dst);
				return VPS_ENOMEM;
			}
		}
	return VPS_OK;
}

vps_result_t vps_layout_computed_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *v)
{
	vps_result_t rc = VPS_OK;
	size_t cap_b = 0, cap_p = 0, cap_r = 0, cap_rp = 0;
	memset(v, 0, sizeof(*v));
	if (rank < 0 || rank >= l->world)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the world of %" PRId64, rank, l->world);
	v->rank = rank;
	v->device = vps_layout_device(l, rank);
	vps_layout_coords(l, rank, &v->coords);
	if (l->dt) {
		rc = vps_dtensor_rank(l, rank, v);
		if (rc)
			vps_rank_view_release(v);
		return rc;
	}
	const struct vps_coords *c = &v->coords;
	struct offload_split split[2] = {{0}};
	if (l->p.offload > 0)
		for (int g = GROUP_DENSE; g <= GROUP_EXPERT; g++)
			VPS_CHECK_GOTO(offload_split(l, c->pp, g, group_shard(l, g, c), &split[g]), rc, fail);
	for (int64_t ch = 0; ch < l->p.vpp; ch++) {
		for (int g = 0; g < NGROUPS; g++) {
			const struct tmpl *tm = tmpl_at(l, c->pp, ch, g);
			if (!tm->n)
				continue;
			uint32_t first_buffer = (uint32_t)v->nbuffers, omask = offload_mask(l, g, tm->states);
			int64_t host_elements = omask ? split[g].host_elements[ch] : 0;
			for (int pass = 0; pass < 2; pass++)
				for (int st = 0; st < VPS_NSTATES; st++) {
					if (!in_mask(pass ? omask : tm->states, st))
						continue;
					VPS_CHECK_GOTO(VPS_GROW(v->buffers, cap_b, v->nbuffers + 1), rc, fail);
					struct vps_buffer *b = &v->buffers[v->nbuffers];
					memset(b, 0, sizeof(*b));
					b->id = (uint32_t)v->nbuffers;
					b->state = (uint8_t)st;
					b->dtype = (uint8_t)vps_layout_state_dtype(l, st);
					b->chunk = (int32_t)ch;
					b->expert = group_expert(g);
					b->layerwise = group_lw(g);
					b->sharded = group_state_sharded(l, g, st);
					b->host = pass == 1;
					b->elements = b->sharded ? tm->shard_elements : tm->elements;
					if (in_mask(omask, st))
						b->elements = pass ? host_elements : b->elements - host_elements;
					v->nbuffers++;
				}
			/* this (chunk, group)'s params, in registration order */
			size_t first_param = v->nparams;
			for (size_t k = 0; k < tm->n; k++) {
				const struct tparam *tp = &tm->p[k];
				VPS_CHECK_GOTO(VPS_GROW(v->params, cap_p, v->nparams + 1), rc, fail);
				struct vps_param *pm = &v->params[v->nparams++];
				memset(pm, 0, sizeof(*pm)); /* ndim 0: Megatron's local shape is the caller's */
				pm->tensor = tparam_tensor(l, tp, c->ep);
				pm->chunk = (int32_t)ch;
				pm->local_layer = tp->local_layer;
				pm->local_expert = tp->slot;
				pm->output_copy = tp->output_copy;
				pm->expert = group_expert(g);
				pm->layerwise = group_lw(g);
				pm->offset = tp->offset;
				pm->elements = tp->elements;
				pm->bucket = tp->bucket;
			}
			for (int st = 0; st < VPS_NSTATES; st++) {
				if (!in_mask(tm->states, st))
					continue;
				struct region_of ro = {.state = st,
						       .dtype = vps_layout_state_dtype(l, st),
						       .sharded = group_state_sharded(l, g, st),
						       .buffer = first_buffer + (uint32_t)mask_slot(tm->states, st)};
				for (size_t k = 0; k < tm->n; k++) {
					const struct tparam *tp = &tm->p[k];
					uint32_t tensor = tparam_tensor(l, tp, c->ep);
					struct vps_tensor t;
					VPS_CHECK_GOTO(vps_model_tensor(&l->m, tensor, &t), rc, fail);
					/* Muon's and Lion's buffers hold their scalar optimizer's
					 * states too, where zero=0 keeps one buffer for both */
					if (!vps_layout_tensor_has_state(l, &t, st))
						continue;
					struct piece pc[2 * VPS_MAX_DIMS];
					int64_t ti = t.is_expert ? c->etp : c->tp;
					int npc = vps_layout_pieces(l, &t, ti, pc);
					size_t before = v->nregions;
					/* the shard is the rank's place in its dp_cp group, whose
					 * ranks Megatron lists CP first (generate_masked_orthogonal_rank_groups) */
					ro.shard = t.is_expert ? c->edp : c->cp + l->p.cp * c->dp;
					VPS_CHECK_GOTO(param_regions(tm, tp, tensor, t.ndim, pc, npc, &ro, NULL, &v->regions,
								     &v->nregions, &cap_r),
						       rc, fail);
					if (in_mask(omask, st))
						offload_regions(&split[g], split[g].first[ch] + k,
								first_buffer + (uint32_t)popcount32(tm->states) +
									(uint32_t)mask_slot(omask, st),
								v->regions, before, v->nregions);
					VPS_CHECK_GOTO(VPS_GROW(v->region_param, cap_rp, v->nregions), rc, fail);
					for (size_t i = before; i < v->nregions; i++)
						v->region_param[i] = (uint32_t)(first_param + k);
				}
			}
		}
	}
	offload_split_release(&split[0]);
	offload_split_release(&split[1]);
	return VPS_OK;
fail:
	offload_split_release(&split[0]);
	offload_split_release(&split[1]);
	vps_rank_view_release(v);
	return rc;
}

vps_result_t vps_layout_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *out)
{
	const struct vps_rank_view *ex = find_explicit(l, rank);
	if (ex)
		return copy_view(ex, out);
	return vps_layout_computed_rank(l, rank, out);
}

/* ---- holders ---- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static vps_result_t push_holder(struct vps_holders *h, const struct vps_region *r, int64_t base, int64_t stride,
				int64_t count)
{
	VPS_CHECK(VPS_GROW(h->v, h->cap, h->n + 1));
	struct vps_holder *x = &h->v[h->n++];
	x->region = *r;
	x->base = base;
	x->stride = stride;
	x->count = count;
	return VPS_OK;
}

/* Remove explicit ranks from the computed holder sets in h->v[from..]. */
static vps_result_t drop_explicit(const struct vps_layout *l, struct vps_holders *h, size_t from)
{
	size_t end = h->n;
	for (size_t i = from; i < end; i++) {
		struct vps_holder hd = h->v[i];
		int64_t last = hd.base + (hd.count - 1) * hd.stride;
		/* explicit ranks inside [base, last] on the progression */
		int64_t *hits = NULL;
		size_t nh = 0, ch = 0;
		for (size_t e = 0; e < l->nex; e++) {
			int64_t r = l->ex[e].rank;
			if (r < hd.base || r > last || (r - hd.base) % hd.stride)
				continue;
			if (VPS_GROW(hits, ch, nh + 1)) {
				free(hits);
				return VPS_ENOMEM;
			}
			hits[nh++] = (r - hd.base) / hd.stride;
		}
		if (!nh)
			continue;
		qsort(hits, nh, sizeof(*hits), cmp_i64);
		/* keep the runs between hits */
		h->v[i].count = 0;
		int64_t start = 0;
		for (size_t k = 0; k <= nh; k++) {
			int64_t stop = k < nh ? hits[k] : hd.count;
			if (stop > start) {
				vps_result_t rc = push_holder(h, &hd.region, hd.base + start * hd.stride, hd.stride,
							      stop - start);
				if (rc) {
					free(hits);
					return rc;
				}
			}
			start = stop + 1;
		}
		free(hits);
	}
	/* compact away emptied entries */
	size_t w = from;
	for (size_t i = from; i < h->n; i++)
		if (h->v[i].count > 0)
			h->v[w++] = h->v[i];
	h->n = w;
	return VPS_OK;
}

static int exidx_cmp(const struct explicit_entry *a, uint32_t tensor, int state)
{
	if (a->tensor != tensor)
		return a->tensor < tensor ? -1 : 1;
	return a->state < state ? -1 : a->state > state;
}

static vps_result_t explicit_holders(const struct vps_layout *l, uint32_t tensor, int state,
				     const struct vps_box *box, struct vps_holders *h)
{
	size_t lo = 0, hi = l->nexidx;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (exidx_cmp(&l->exidx[mid], tensor, state) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < l->nexidx && !exidx_cmp(&l->exidx[i], tensor, state); i++) {
		const struct vps_rank_view *v = &l->ex[l->exidx[i].view];
		const struct vps_region *r = &v->regions[l->exidx[i].region];
		if (box && !vps_box_intersect(&r->box, box, NULL))
			continue;
		VPS_CHECK(push_holder(h, r, v->rank, 1, 1));
	}
	return VPS_OK;
}

static int tparam_find(const struct tmpl *tm, uint32_t tensor)
{
	size_t lo = 0, hi = tm->nby_tensor;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (tm->by_tensor[mid].tensor == tensor)
			return (int)tm->by_tensor[mid].idx;
		if (tm->by_tensor[mid].tensor < tensor)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* Buffer index of (chunk, group, state) on every rank of a stage. */
static uint32_t buffer_index(const struct vps_layout *l, int64_t stage, int64_t chunk, int group, int state, bool host)
{
	uint32_t idx = 0;
	for (int64_t c = 0; c < l->p.vpp; c++)
		for (int g = 0; g < NGROUPS; g++) {
			uint32_t states = tmpl_at(l, stage, c, g)->states;
			if (!tmpl_at(l, stage, c, g)->n)
				continue;
			if (c == chunk && g == group)
				return host ? idx + (uint32_t)popcount32(states) +
						      (uint32_t)mask_slot(offload_mask(l, g, states), state)
					    : idx + (uint32_t)mask_slot(states, state);
			idx += group_nbuffers(l, g, states);
		}
	return UINT32_MAX;
}

size_t vps_layout_param_name(const struct vps_layout *l, const struct vps_param *p, char *buf, size_t n)
{
	struct vps_tensor t;
	if (l->dt)
		return vps_dtensor_param_name(l, p, buf, n);
	if (p->output_copy || vps_model_tensor(&l->m, p->tensor, &t))
		return (size_t)snprintf(buf, n, "%s",
					!p->output_copy		  ? "?"
					: l->m.tied_embeddings ? "output_layer.weight"
							       : "embedding.word_embeddings.weight");
	if (p->local_expert < 0 || !l->p.grouped_gemm)
		return vps_tensor_local_name(&t, p->local_layer, p->local_expert, buf, n);
	/* TEGroupedMLP names gemm i's weight experts.linear_fc1.weight{i}
	 * where SequentialMLP has experts.local_experts.{i}.linear_fc1.weight */
	static const char seq_experts[] = "mlp.experts.local_experts.";
	char seq[256];
	vps_tensor_local_name(&t, p->local_layer, p->local_expert, seq, sizeof(seq));
	char *at = strstr(seq, seq_experts), *linear = at ? strchr(at + sizeof(seq_experts) - 1, '.') : NULL;
	if (!linear)
		return (size_t)snprintf(buf, n, "%s", seq);
	int len = snprintf(buf, n, "%.*smlp.experts.%s%" PRId32, (int)(at - seq), seq, linear + 1, p->local_expert);
	return len < 0 ? 0 : (size_t)len;
}

int64_t vps_layout_buffer_elements(const struct vps_layout *l, int64_t rank, uint32_t buffer)
{
	const struct vps_rank_view *ex = find_explicit(l, rank);
	if (ex)
		return buffer < ex->nbuffers ? ex->buffers[buffer].elements : -1;
	if (l->dt)
		return vps_dtensor_buffer_elements(l, rank, buffer);
	struct vps_coords c;
	vps_layout_coords(l, rank, &c);
	uint32_t idx = 0;
	for (int64_t ch = 0; ch < l->p.vpp; ch++)
		for (int g = 0; g < NGROUPS; g++) {
			const struct tmpl *tm = tmpl_at(l, c.pp, ch, g);
			if (!tm->n)
				continue;
			uint32_t n = (uint32_t)popcount32(tm->states), omask = offload_mask(l, g, tm->states);
			if (buffer >= idx + group_nbuffers(l, g, tm->states)) {
				idx += group_nbuffers(l, g, tm->states);
				continue;
			}
			bool host = buffer >= idx + n;
			uint32_t slot = host ? buffer - idx - n : buffer - idx, mask = host ? omask : tm->states;
			int st = 0;
			while (!in_mask(mask, st) || (uint32_t)mask_slot(mask, st) != slot)
				st++;
			int64_t el = group_state_sharded(l, g, st) ? tm->shard_elements : tm->elements;
			if (!in_mask(omask, st))
				return el;
			struct offload_split sp;
			if (offload_split(l, c.pp, g, group_shard(l, g, &c), &sp))
				return -1;
			int64_t host_elements = sp.host_elements[ch];
			offload_split_release(&sp);
			return host ? host_elements : el - host_elements;
		}
	return -1;
}

/* Where the rules place a tensor: the (stage, chunk) of its template, and
 * whether it is the output layer's copy of the word embedding there. */
struct place {
	int64_t stage, chunk;
	bool copy;
};

static int tensor_places(const struct vps_layout *l, const struct vps_tensor *t, struct place locs[2])
{
	const struct vps_parallel *p = &l->p;
	if (t->layer >= 0) {
		vps_parallel_layer_place(p, &l->m, t->layer, &locs[0].stage, &locs[0].chunk);
		locs[0].copy = false;
		return 1;
	}
	if (t->kind == VPS_T_WORD_EMB || t->kind == VPS_T_POS_EMB) {
		locs[0] = (struct place){0, 0, false};
		if (t->kind != VPS_T_WORD_EMB || !embedding_copied(l))
			return 1;
		locs[1] = (struct place){p->pp - 1, p->vpp - 1, true};
		return 2;
	}
	locs[0] = (struct place){p->pp - 1, p->vpp - 1, false};
	return 1;
}

/* The holders of one (tensor, state) under the layout's rules, being
 * listed. */
struct holder_query {
	const struct vps_tensor *t;
	uint32_t tensor;
	int state;
	const struct vps_box *box; /* NULL: the whole tensor */
	int64_t ep;                /* an expert's expert-parallel rank */
	int64_t dpcp;
	struct region_of ro;       /* the state, its dtype, its buffer, whether sharded */
	int64_t chunk;             /* the place being listed: its chunk and group */
	int group;
};

/* The holders of tensor-parallel slice ti of parameter tp of template tm,
 * in buffer `buffer` of pipeline stage s. A dense slice's replicas are
 * every (cp, dp) of its stage, which in the order tp-cp-ep-dp-pp are the
 * ranks ti + tp * j, j < cp * dp. */
static vps_result_t slice_holders(const struct vps_layout *l, const struct holder_query *q, const struct tmpl *tm,
				  const struct tparam *tp, int64_t s, int64_t ti, struct vps_holders *h)
{
	const struct vps_parallel *p = &l->p;
	const struct vps_tensor *t = q->t;
	struct piece pc[2 * VPS_MAX_DIMS];
	int npc = vps_layout_pieces(l, t, ti, pc), any = 0;
	for (int i = 0; i < npc; i++)
		any |= !q->box || vps_box_intersect(&pc[i].box, q->box, NULL);
	if (!any)
		return VPS_OK;
	if (!q->ro.sharded) {
		size_t nr = 0, cap = 0;
		struct vps_region *rs = NULL;
		vps_result_t rc = param_regions(tm, tp, q->tensor, t->ndim, pc, npc, &q->ro, q->box, &rs, &nr, &cap);
		for (size_t i = 0; !rc && i < nr; i++) {
			if (t->is_expert)
				rc = push_holder(h, &rs[i], ti + p->etp * (q->ep + p->ep * l->edp * s), p->etp * p->ep,
						 l->edp);
			else
				rc = push_holder(h, &rs[i], ti + p->tp * q->dpcp * s, p->tp, q->dpcp);
		}
		free(rs);
		return rc;
	}
	const struct tbucket *b = &tm->b[tp->bucket];
	int64_t sz = (b->hi - b->lo) / tm->dpsize;
	int64_t d0 = (tp->offset - b->lo) / sz, d1 = (tp->offset + tp->elements - 1 - b->lo) / sz;
	bool offloaded = in_mask(offload_mask(l, q->group, tm->states), q->state);
	uint32_t host_buffer = offloaded ? buffer_index(l, s, q->chunk, q->group, q->state, true) : 0;
	for (int64_t d = d0; d <= d1; d++) {
		size_t nr = 0, cap = 0;
		struct vps_region *rs = NULL;
		struct region_of ro = q->ro;
		ro.shard = d;
		vps_result_t rc = param_regions(tm, tp, q->tensor, t->ndim, pc, npc, &ro, q->box, &rs, &nr, &cap);
		if (!rc && offloaded && nr) {
			/* the split depends on every parameter of the holder's shard:
			 * worked out per holder, only for offload=F */
			struct offload_split sp;
			rc = offload_split(l, s, q->group, d, &sp);
			if (!rc)
				offload_regions(&sp, sp.first[q->chunk] + (size_t)(tp - tm->p), host_buffer, rs, 0, nr);
			offload_split_release(&sp);
		}
		for (size_t i = 0; !rc && i < nr; i++) {
			int64_t rank = t->is_expert ? ti + p->etp * (q->ep + p->ep * (d + l->edp * s))
						    : ti + p->tp * (d + q->dpcp * s);
			rc = push_holder(h, &rs[i], rank, 1, 1);
		}
		free(rs);
		if (rc)
			return rc;
	}
	return VPS_OK;
}

/* Every holder under the rules: each place of the tensor, each of its
 * tensor-parallel slices. */
static vps_result_t rule_holders(const struct vps_layout *l, struct holder_query *q, struct vps_holders *h)
{
	const struct vps_parallel *p = &l->p;
	const struct vps_tensor *t = q->t;
	struct place locs[2];
	int nloc = tensor_places(l, t, locs);
	int group = tensor_group(l, t);
	q->ro.sharded = group_state_sharded(l, group, q->state);
	uint32_t slot_tensor = t->expert >= 0 ? q->tensor - (uint32_t)(q->ep * l->experts_per_rank * l->nexpert_kinds)
					      : q->tensor;
	int64_t T = t->is_expert ? p->etp : p->tp;
	for (int li = 0; li < nloc; li++) {
		const struct tmpl *tm = tmpl_at(l, locs[li].stage, locs[li].chunk, group);
		int k = locs[li].copy ? (int)tm->output_copy_idx : tparam_find(tm, slot_tensor);
		if (k < 0)
			return vps_fail(VPS_EINTERNAL, "tensor %u missing from its stage's template", q->tensor);
		q->ro.buffer = buffer_index(l, locs[li].stage, locs[li].chunk, group, q->state, false);
		q->chunk = locs[li].chunk;
		q->group = group;
		for (int64_t ti = 0; ti < T; ti++)
			VPS_CHECK(slice_holders(l, q, tm, &tm->p[k], locs[li].stage, ti, h));
	}
	return VPS_OK;
}

vps_result_t vps_layout_holders(const struct vps_layout *l, uint32_t tensor, enum vps_state state,
			const struct vps_box *box,
				struct vps_holders *h)
{
	struct vps_tensor t;
	VPS_CHECK(vps_model_tensor(&l->m, tensor, &t));
	if (!vps_layout_tensor_has_state(l, &t, state))
		return VPS_OK;
	size_t from = h->n;
	if ((int64_t)l->nex < l->world) {
		struct holder_query q = {.t = &t,
					 .tensor = tensor,
					 .state = state,
					 .box = box,
					 .ep = t.expert >= 0 ? t.expert / l->experts_per_rank : 0,
					 .dpcp = vps_parallel_dpcp(&l->p),
					 .ro = {.state = state, .dtype = vps_layout_state_dtype(l, state)}};
		VPS_CHECK(l->dt ? vps_dtensor_holders(l, &t, tensor, state, box, h) : rule_holders(l, &q, h));
		if (l->nex)
			VPS_CHECK(drop_explicit(l, h, from));
	}
	return explicit_holders(l, tensor, state, box, h);
}

/* ---- explicit ranks ---- */

static int exidx_sort(const void *a, const void *b)
{
	const struct explicit_entry *x = a, *y = b;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	if (x->view != y->view)
		return x->view < y->view ? -1 : 1;
	return x->region < y->region ? -1 : x->region > y->region;
}

static int view_cmp(const void *a, const void *b)
{
	const struct vps_rank_view *x = a, *y = b;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static vps_result_t rebuild_exidx(struct vps_layout *l)
{
	size_t n = 0;
	for (size_t i = 0; i < l->nex; i++)
		n += l->ex[i].nregions;
	free(l->exidx);
	l->exidx = vps_malloc(n * sizeof(*l->exidx) + 1);
	if (!l->exidx)
		return VPS_ENOMEM;
	l->nexidx = 0;
	for (size_t i = 0; i < l->nex; i++)
		for (size_t j = 0; j < l->ex[i].nregions; j++) {
			struct explicit_entry *e = &l->exidx[l->nexidx++];
			e->tensor = l->ex[i].regions[j].tensor;
			e->state = l->ex[i].regions[j].state;
			e->view = (uint32_t)i;
			e->region = (uint32_t)j;
		}
	qsort(l->exidx, l->nexidx, sizeof(*l->exidx), exidx_sort);
	return VPS_OK;
}

vps_result_t vps_layout_set_explicit(struct vps_layout *l, struct vps_rank_view *v)
{
	if (v->rank < 0 || v->rank >= l->world)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the world of %" PRId64, v->rank, l->world);
	struct vps_rank_view *slot = (struct vps_rank_view *)find_explicit(l, v->rank);
	if (slot) {
		vps_rank_view_release(slot);
		*slot = *v;
	} else {
		struct vps_rank_view *nv = vps_realloc_array(l->ex, l->nex + 1, sizeof(*l->ex));
		if (!nv)
			return VPS_ENOMEM;
		l->ex = nv;
		l->ex[l->nex++] = *v;
		qsort(l->ex, l->nex, sizeof(*l->ex), view_cmp);
	}
	memset(v, 0, sizeof(*v));
	l->hash_ready = false;
	return rebuild_exidx(l);
}

size_t vps_layout_num_explicit(const struct vps_layout *l) { return l->nex; }
int64_t vps_layout_explicit_rank(const struct vps_layout *l, size_t i) { return l->ex[i].rank; }

/* ---- identity ---- */

static uint64_t hash_view(const struct vps_rank_view *v)
{
	uint64_t h = vps_hash64(&v->rank, sizeof(v->rank), 1);
	h = vps_hash64(&v->device, sizeof(v->device), h);
	for (size_t i = 0; i < v->nbuffers; i++) {
		const struct vps_buffer *b = &v->buffers[i];
		int64_t f[] = {b->id, b->state, b->dtype, b->chunk, b->expert, b->sharded, b->elements};
		h = vps_hash64(f, sizeof(f), h);
		if (b->layerwise)
			h = vps_hash64("layerwise", 9, h);
		if (b->host)
			h = vps_hash64("host", 4, h);
	}
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *r = &v->regions[i];
		int64_t f[4 + 3 * VPS_MAX_DIMS] = {r->tensor, r->state, r->buffer, r->offset};
		for (int k = 0; k < r->box.ndim; k++) {
			f[4 + k] = r->box.lo[k];
			f[4 + VPS_MAX_DIMS + k] = r->box.hi[k];
			f[4 + 2 * VPS_MAX_DIMS + k] = r->strides[k];
		}
		h = vps_hash64(f, sizeof(f), h);
	}
	return h;
}

uint64_t vps_layout_hash(const struct vps_layout *l)
{
	if (l->hash_ready)
		return l->hash;
	const struct vps_parallel *p = &l->p;
	int64_t f[] = {p->tp, p->pp, p->dp, p->ep, p->etp, p->vpp, p->zero, p->first, p->last, p->bucket, p->grad};
	uint64_t h = vps_hash64(f, sizeof(f), vps_model_hash(&l->m));
	/* only when set, so that every layout without CP keeps the hash it had
	 * before cp= existed (registries and staged plans name layouts by it) */
	if (p->cp != 1)
		h = vps_hash64(&p->cp, sizeof(p->cp), h);
	if (p->grouped_gemm)
		h = vps_hash64("grouped_gemm", 12, h);
	/* bucket=auto with CP cuts dp x cp sized buckets since the training
	 * path's rule replaced dp alone: plans and registries of the older
	 * layout are refused, not misread */
	if (p->bucket == VPS_BUCKET_AUTO && p->cp != 1)
		h = vps_hash64("auto_dpcp", 9, h);
	if (p->family == VPS_FAMILY_DTENSOR) {
		int64_t dt[] = {p->family, p->dp_replicate, p->dp_shard};
		h = vps_hash64(dt, sizeof(dt), h);
	}
	/* the optimizer only when not Adam in fp32: every layout before it keeps its hash */
	if (p->optimizer != VPS_OPT_ADAM || p->scalar_optimizer != VPS_OPT_ADAM || p->precision_aware ||
	    p->exp_avg_bf16 || p->exp_avg_sq_bf16) {
		int64_t o[] = {p->optimizer, p->scalar_optimizer, p->precision_aware, p->exp_avg_bf16, p->exp_avg_sq_bf16};
		h = vps_hash64(o, sizeof(o), vps_hash64("optimizer", 9, h));
	}
	if (p->offload > 0)
		h = vps_hash64(&p->offload, sizeof(p->offload), vps_hash64("offload", 7, h));
	/* devices: by value, so that a listed map equal to a packed one hashes
	 * the same */
	if (l->d.packed && l->d.first_node == 0 && l->d.gpus_per_node == 8) {
		h = vps_hash64("packed8", 7, h);
	} else {
		uint64_t dh = 0;
		for (int64_t r = 0; r < l->world; r++) {
			struct vps_device dv = vps_devices_get(&l->d, r);
			dh = vps_hash64(&dv, sizeof(dv), dh);
		}
		struct vps_devices def;
		vps_devices_packed(&def, 8, 0);
		uint64_t defh = 0;
		for (int64_t r = 0; r < l->world && dh; r++) {
			struct vps_device dv = vps_devices_get(&def, r);
			defh = vps_hash64(&dv, sizeof(dv), defh);
		}
		h = dh == defh ? vps_hash64("packed8", 7, h) : vps_hash64(&dh, sizeof(dh), h);
	}
	for (size_t i = 0; i < l->nex; i++) {
		struct vps_rank_view c;
		uint64_t hx = hash_view(&l->ex[i]);
		if (vps_layout_computed_rank(l, l->ex[i].rank, &c) == VPS_OK) {
			bool same = hash_view(&c) == hx;
			vps_rank_view_release(&c);
			if (same)
				continue;
		}
		h = vps_hash64(&hx, sizeof(hx), h);
	}
	((struct vps_layout *)l)->hash = h;
	((struct vps_layout *)l)->hash_ready = true;
	return h;
}

/* ---- statistics ---- */

/* Logical elements of the parameters each optimizer steps: [optimizer]
 * for adam and sgd, and with Muon or Lion the matrices under it and the
 * rest under its scalar optimizer (one pass over the model's tensors). */
static vps_result_t stepped_elements(const struct vps_layout *l, int64_t per_optimizer[VPS_NOPTIMIZERS])
{
	int64_t all = vps_model_parameters(&l->m);
	memset(per_optimizer, 0, VPS_NOPTIMIZERS * sizeof(*per_optimizer));
	if (!emerging(l)) {
		per_optimizer[l->p.optimizer] = all;
		return VPS_OK;
	}
	int64_t matrices = 0;
	for (uint32_t i = 0, n = vps_model_module_first(&l->m); i < n; i++) {
		struct vps_tensor t;
		VPS_CHECK(vps_model_tensor(&l->m, i, &t));
		if (vps_layout_tensor_matrix(l, &t)) {
			struct vps_box b;
			vps_box_full(&b, t.ndim, t.shape);
			matrices += vps_box_volume(&b);
		}
	}
	per_optimizer[l->p.optimizer] += matrices;
	per_optimizer[l->p.scalar_optimizer] += all - matrices;
	return VPS_OK;
}

vps_result_t vps_layout_stats(const struct vps_layout *l, struct vps_layout_stats *s)
{
	memset(s, 0, sizeof(*s));
	s->parameters = vps_model_parameters(&l->m);
	s->tensors = vps_model_num_tensors(&l->m);
	s->world = l->world;
	s->edp = l->edp;
	if (l->dt) {
		for (int st = 0; st < VPS_NSTATES; st++)
			if (st != VPS_STATE_MODULE && vps_layout_has_state(l, st))
				s->logical_bytes += s->parameters * (int64_t)vps_dtype_size(vps_layout_state_dtype(l, st));
		s->logical_bytes += vps_model_module_buffers(&l->m) * (int64_t)vps_dtype_size(vps_state_dtype(VPS_STATE_MODULE));
		return vps_dtensor_stats(l, s);
	}
	int64_t stepped[VPS_NOPTIMIZERS];
	VPS_CHECK(stepped_elements(l, stepped));
	for (int st = 0; st < VPS_NSTATES; st++) {
		int64_t el = 0;
		if (st == VPS_STATE_MODULE)
			el = vps_model_module_buffers(&l->m);
		else
			for (int o = 0; o < VPS_NOPTIMIZERS; o++)
				el += in_mask(param_states(l, o), st) ? stepped[o] : 0;
		s->logical_bytes += el * (int64_t)vps_dtype_size(vps_layout_state_dtype(l, st));
	}
	s->min_rank_bytes = INT64_MAX;
	int64_t ranks_per_stage = l->p.tp * l->p.cp * l->p.dp;
	for (int64_t stage = 0; stage < l->p.pp; stage++) {
		int64_t bytes = 0, buckets = 0;
		for (int64_t c = 0; c < l->p.vpp; c++)
			for (int g = 0; g < NGROUPS; g++) {
				const struct tmpl *tm = tmpl_at(l, stage, c, g);
				if (!tm->n)
					continue;
				if (g != GROUP_MODULE)
					buckets += (int64_t)tm->nb;
				for (int st = 0; st < VPS_NSTATES; st++) {
					if (!in_mask(tm->states, st))
						continue;
					int64_t el = group_state_sharded(l, g, st) ? tm->shard_elements : tm->elements;
					bytes += el * (int64_t)vps_dtype_size(vps_layout_state_dtype(l, st));
				}
			}
		s->max_rank_bytes = vps_max64(s->max_rank_bytes, bytes);
		s->min_rank_bytes = vps_min64(s->min_rank_bytes, bytes);
		s->total_bytes += bytes * ranks_per_stage;
		s->buckets = vps_max64(s->buckets, buckets);
	}
	return VPS_OK;
}

/* ---- states of two layouts ---- */

/* The optimizer of a matrix and of another parameter: the two classes every
 * parameter falls in. */
static void class_optimizers(const struct vps_layout *l, int out[2])
{
	out[0] = l->p.optimizer;
	out[1] = emerging(l) ? l->p.scalar_optimizer : l->p.optimizer;
}

vps_result_t vps_layout_states_match(const struct vps_layout *a, const struct vps_layout *b)
{
	static const char *const what[2] = {"the 2-D weights", "the parameters that are not 2-D weights"};
	if (a->p.grad != b->p.grad)
		return vps_fail(VPS_EINPUT, "grad=1 must be set in both layouts or in neither");
	int oa[2], ob[2];
	class_optimizers(a, oa);
	class_optimizers(b, ob);
	for (int c = 0; c < 2; c++) {
		if (oa[c] == ob[c])
			continue;
		uint32_t only_a = optimizer_states(oa[c]) & ~optimizer_states(ob[c]);
		uint32_t only_b = optimizer_states(ob[c]) & ~optimizer_states(oa[c]);
		int st = 0;
		while (st < VPS_NSTATES && !in_mask(only_a | only_b, st))
			st++;
		if (st == VPS_NSTATES)
			return vps_fail(VPS_EINPUT,
					"the source steps %s with %s, the target with %s: their momentum_buffer is not the "
					"same state, and switching optimizers is out of scope",
					what[c], vps_optimizer_name(oa[c]), vps_optimizer_name(ob[c]));
		return vps_fail(VPS_EINPUT,
				"the source steps %s with %s, the target with %s: %s %s, which the %s has not; vps moves "
				"each state once and drops none (switching optimizers is out of scope)",
				what[c], vps_optimizer_name(oa[c]), vps_optimizer_name(ob[c]),
				in_mask(only_a, st) ? "the source holds" : "the target needs", vps_state_name(st),
				in_mask(only_a, st) ? "target" : "source");
	}
	for (int st = 0; st < VPS_NSTATES; st++)
		if (vps_layout_has_state(a, st) && vps_layout_state_dtype(a, st) != vps_layout_state_dtype(b, st))
			return vps_fail(VPS_EINPUT,
					"the source holds %s as %s, the target as %s (precision_aware, exp_avg, exp_avg_sq): "
					"vps moves bytes, it does not convert them",
					vps_state_name(st), vps_dtype_name(vps_layout_state_dtype(a, st)),
					vps_dtype_name(vps_layout_state_dtype(b, st)));
	return VPS_OK;
}
