/* PyTorch DTensor layouts: what FSDP2 (fully_shard), HSDP, tensor and
 * sequence parallelism, pipeline stages and expert parallelism hold on each
 * rank, as torchtitan 0.3.0 applies them (its partial_dtensor backend) on
 * PyTorch 2.11. docs/layout.md, "PyTorch DTensor layouts", gives each rule
 * with the code it comes from.
 *
 * Every parameter is a box of one logical tensor of vps's model (w1 and w3
 * are the two halves of Megatron's fused linear_fc1, wqkv is linear_qkv's
 * interleaved rows) or, for grouped experts, a stack of one such box per
 * expert. Its dims group the box's logical dims in order, so a range of a
 * parameter dim is a flat range of its group: each local shard is a few
 * boxes. A rank holds each parameter's local shard in buffers of its own:
 * the parameter (FSDP2's padded sharded storage, fp32: main_param), Adam's
 * exp_avg and exp_avg_sq (the optimizer's zeros_like of the local shard, no
 * padding). Ranks are never enumerated: a rank's view costs its own
 * parameters, a holder query the shards of the box asked for. */
#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "model/dtensor.h"
#include "model/layout_int.h"

/* The fully qualified names of torchtitan's decoder parameters. */
enum fqn {
	F_TOK_EMB,
	F_WQKV,
	F_WO,
	F_Q_NORM,
	F_K_NORM,
	F_W1,
	F_W2,
	F_W3,
	F_EXP_W1,
	F_EXP_W2,
	F_EXP_W3,
	F_GATE,
	F_SHARED_W1,
	F_SHARED_W2,
	F_SHARED_W3,
	F_ATTN_NORM,
	F_FFN_NORM,
	F_NORM,
	F_LM_HEAD,
	F_EXPERT_BIAS,
};

static const char *fqn_fmt[] = {
	[F_TOK_EMB] = "tok_embeddings.weight",
	[F_WQKV] = "layers.%d.attention.qkv_linear.wqkv.weight",
	[F_WO] = "layers.%d.attention.wo.weight",
	[F_Q_NORM] = "layers.%d.attention.q_norm.weight",
	[F_K_NORM] = "layers.%d.attention.k_norm.weight",
	[F_W1] = "layers.%d.feed_forward.w1.weight",
	[F_W2] = "layers.%d.feed_forward.w2.weight",
	[F_W3] = "layers.%d.feed_forward.w3.weight",
	[F_EXP_W1] = "layers.%d.moe.routed_experts.inner_experts.w1_EFD",
	[F_EXP_W2] = "layers.%d.moe.routed_experts.inner_experts.w2_EDF",
	[F_EXP_W3] = "layers.%d.moe.routed_experts.inner_experts.w3_EFD",
	[F_GATE] = "layers.%d.moe.router.gate.weight",
	[F_SHARED_W1] = "layers.%d.moe.shared_experts.w1.weight",
	[F_SHARED_W2] = "layers.%d.moe.shared_experts.w2.weight",
	[F_SHARED_W3] = "layers.%d.moe.shared_experts.w3.weight",
	[F_ATTN_NORM] = "layers.%d.attention_norm.weight",
	[F_FFN_NORM] = "layers.%d.ffn_norm.weight",
	[F_NORM] = "norm.weight",
	[F_LM_HEAD] = "lm_head.weight",
	[F_EXPERT_BIAS] = "layers.%d.moe.expert_bias_E",
};

/* One parameter (or module buffer) of a model part. */
struct dparam {
	uint32_t tensor;       /* its logical tensor; a stack's expert 0 */
	uint32_t nstack;       /* > 0: dim 0 stacks this many experts ... */
	uint32_t stack_stride; /* ... whose tensors are this far apart */
	int32_t layer;
	enum fqn name;
	struct vps_box part;   /* the box of the logical tensor it holds */
	int ndim;
	int64_t shape[VPS_MAX_DIMS];
	int grp[VPS_MAX_DIMS + 1]; /* dim k holds the part's dims [grp[k], grp[k+1]) */
	int tp_dim;            /* dim sharded over tp (or ep: by_ep), -1 */
	bool by_ep;
	int fsdp_dim;
	bool expert;           /* routed expert: torchtitan's sparse mesh */
	bool module_buffer;    /* whole on every rank of its stage, state module_buffer */
};

struct dpart {
	struct dparam *p;
	size_t n, nweights; /* weights first, then module buffers */
};

/* A tensor's parameter: part, index, and the stack position. */
struct dref {
	uint32_t tensor;
	uint32_t part, idx;
};

struct dtensor {
	int64_t parts; /* pp x vpp model parts (torchtitan's virtual stages) */
	struct dpart *pt;
	struct dref *refs; /* by tensor; a gated fc1 has two (w1, w3) */
	size_t nrefs;
};

/* ---- the configuration ---- */

void vps_dtensor_format(const struct vps_parallel *p, char *buf, size_t n)
{
	int len = 0;
	if (p->dp_replicate != 1)
		len = snprintf(buf, n, "dp_replicate=%" PRId64 ",", p->dp_replicate);
	if (len < 0 || (size_t)len >= n)
		return;
	len += snprintf(buf + len, n - (size_t)len, "dp_shard=%" PRId64, p->dp_shard);
	const char *keys[] = {"cp", "tp", "pp", "ep", "vpp"};
	int64_t vals[] = {p->cp, p->tp, p->pp, p->ep, p->vpp};
	for (size_t i = 0; i < 5 && len >= 0 && (size_t)len < n; i++)
		if (vals[i] != 1)
			len += snprintf(buf + len, n - (size_t)len, ",%s=%" PRId64, keys[i], vals[i]);
}

/* torchtitan's split of layers over num_stages model parts
 * (pipeline_parallel.py _generate_llm_fqn_per_model_part, input and output
 * weights 1): the embedding and the output each count as a layer. */
static void part_layers(const struct vps_model *m, int64_t stages, int64_t part, int64_t *first, int64_t *count)
{
	if (stages == 1) {
		*first = 0;
		*count = m->layers;
		return;
	}
	int64_t eff = m->layers + 2, per = eff / stages, extra = eff % stages, at = 0;
	*first = *count = 0;
	for (int64_t s = 0; s <= part; s++) {
		int64_t mine = per + (s < extra) - (s == 0) - (s == stages - 1);
		mine = vps_max64(0, vps_min64(mine, m->layers - at));
		if (s == part) {
			*first = at;
			*count = mine;
		}
		at += mine;
	}
}

vps_result_t vps_dtensor_validate(struct vps_parallel *p, const struct vps_model *m, const char *where)
{
	int64_t sizes[] = {p->tp, p->pp, p->cp, p->ep, p->vpp, p->dp_replicate, p->dp_shard};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (sizes[i] < 1)
			return vps_fail(VPS_EINPUT, "%s: dp_replicate, dp_shard, cp, tp, pp, ep and vpp must be at least 1",
					where);
	if (p->zero || p->first || p->last || p->bucket || p->grad || p->grouped_gemm || (p->etp && p->etp != p->tp))
		return vps_fail(VPS_EINPUT, "%s: zero, etp, first, last, bucket, grad and grouped_gemm are Megatron's "
				"(family=megatron); a DTensor mesh has dp_replicate, dp_shard, cp, tp, pp, ep and vpp", where);
	int64_t dp;
	if (!vps_mul_ok(p->dp_replicate, p->dp_shard, &dp) || dp > ((int64_t)1 << 24))
		return vps_fail(VPS_EINPUT, "%s: dp_replicate x dp_shard is too large", where);
	if (p->dp != 1 && p->dp != dp)
		return vps_fail(VPS_EINPUT, "%s: dp=%" PRId64 " is not dp_replicate x dp_shard = %" PRId64
				" (a DTensor mesh names its data-parallel axes apart)", where, p->dp, dp);
	p->dp = dp;
	int64_t world = 1, ws[] = {p->tp, p->cp, p->dp, p->pp};
	for (size_t i = 0; i < 4; i++)
		if (!vps_mul_ok(world, ws[i], &world) || world > ((int64_t)1 << 24))
			return vps_fail(VPS_EINPUT, "%s: a world of dp_replicate x dp_shard x cp x tp x pp ranks is too large "
					"(at most 2^24)", where);
	/* what torchtitan's decoders build: RMSNorm, SwiGLU, RoPE, no biases */
	if (m->bias || m->qkv_bias || m->norm != VPS_NORM_RMS || m->activation != VPS_ACT_SWIGLU ||
	    m->position != VPS_POS_ROPE)
		return vps_fail(VPS_EINPUT, "%s: %s is not a torchtitan decoder (RMSNorm, SwiGLU, RoPE, no biases): "
				"family=dtensor lays out llama3- and qwen3-style models", where, m->name);
	if (m->kv_lora_rank > 0 || m->mtp_layers > 0)
		return vps_fail(VPS_EINPUT, "%s: %s: multi-latent attention and multi-token prediction are not laid out "
				"in family=dtensor yet", where, m->name);
	/* Decoder.Config.update_from_config */
	if (m->heads % p->tp || m->query_groups % p->tp)
		return vps_fail(VPS_EINPUT, "%s: tp=%" PRId64 " must divide n_heads=%" PRId64 " and n_kv_heads=%" PRId64
				" (torchtitan)", where, p->tp, m->heads, m->query_groups);
	if (m->tied_embeddings && p->pp > 1)
		return vps_fail(VPS_EINPUT, "%s: torchtitan refuses weight tying with pipeline parallelism", where);
	if (m->experts == 0 && p->ep != 1)
		return vps_fail(VPS_EINPUT, "%s: ep applies to MoE models only (%s is dense)", where, m->name);
	int64_t local = p->dp_shard * p->cp * p->tp;
	if (p->ep > 1 && (m->experts % p->ep || local % p->ep))
		return vps_fail(VPS_EINPUT, "%s: ep=%" PRId64 " must divide experts=%" PRId64 " and dp_shard x cp x tp = %"
				PRId64 " (torchtitan's efsdp)", where, p->ep, m->experts, local);
	/* fully_shard refuses an uneven shard on a dim other than 0: the
	 * experts' Shard(1) when the FSDP mesh outnumbers the experts */
	int64_t fs = p->ep > 1 ? local : p->dp_replicate * p->dp_shard * p->cp;
	int64_t efs = p->ep > 1 ? local / p->ep : p->dp_shard * p->cp;
	if (m->experts > 0 && fs > m->experts && (m->moe_ffn / (p->ep > 1 ? 1 : p->tp)) % efs)
		return vps_fail(VPS_EINPUT, "%s: the experts' FSDP mesh (%" PRId64 ") outnumbers the %" PRId64
				" experts, so FSDP2 shards their dim 1, which %" PRId64 " does not divide evenly",
				where, fs, m->experts, m->moe_ffn / (p->ep > 1 ? 1 : p->tp));
	int64_t stages = p->pp * p->vpp;
	if (stages > 1) {
		int64_t eff = m->layers + 2;
		if (stages > eff || eff / stages < 1)
			return vps_fail(VPS_EINPUT, "%s: %" PRId64 " pipeline stages for %" PRId64 " layers (+ embedding and "
					"output) leave a stage empty", where, stages, m->layers);
	}
	p->etp = p->ep > 1 ? 1 : p->tp;
	return VPS_OK;
}

/* ---- the parameters of each model part ---- */

struct builder {
	const struct vps_model *m;
	const struct vps_parallel *p;
	struct dpart *pt;
	size_t cap;
};

static vps_result_t push(struct builder *b, const struct dparam *dp)
{
	VPS_CHECK(VPS_GROW(b->pt->p, b->cap, b->pt->n + 1));
	b->pt->p[b->pt->n++] = *dp;
	return VPS_OK;
}

/* A parameter holding the whole tensor as it is, or one half of a gated
 * fc1 ([2, f, h] -> [f, h]); tp_dim as torchtitan's plan shards it. */
static vps_result_t add(struct builder *b, uint32_t tensor, enum fqn name, int32_t layer, int half, int tp_dim)
{
	struct vps_tensor t;
	VPS_CHECK(vps_model_tensor(b->m, tensor, &t));
	struct dparam d = {.tensor = tensor, .layer = layer, .name = name, .tp_dim = tp_dim};
	vps_box_full(&d.part, t.ndim, t.shape);
	d.module_buffer = t.module_buffer;
	if (half >= 0) {
		d.part.lo[0] = half;
		d.part.hi[0] = half + 1;
	}
	/* the parameter's dims: [g, slots, d, h] rows as one (wqkv), the
	 * half's [1, f] as one, every other dim as it is */
	if (t.kind == VPS_T_QKV_W) {
		d.ndim = 2;
		d.shape[0] = t.shape[0] * t.shape[1] * t.shape[2];
		d.shape[1] = t.shape[3];
		int g[] = {0, 3, 4};
		memcpy(d.grp, g, sizeof(g));
	} else if (half >= 0) {
		d.ndim = 2;
		d.shape[0] = t.shape[1];
		d.shape[1] = t.shape[2];
		int g[] = {0, 2, 3};
		memcpy(d.grp, g, sizeof(g));
	} else {
		d.ndim = t.ndim;
		for (int k = 0; k <= t.ndim; k++) {
			d.grp[k] = k;
			if (k < t.ndim)
				d.shape[k] = t.shape[k];
		}
	}
	d.fsdp_dim = 0;
	return push(b, &d);
}

/* The grouped experts' w1_EFD / w3_EFD ([E, F, D], the halves of every
 * expert's fc1) or w2_EDF ([E, D, F]). */
static vps_result_t add_experts(struct builder *b, const struct vps_layer_span *sp, uint32_t k, int half,
				enum fqn name, int32_t layer)
{
	const struct vps_parallel *p = b->p;
	const struct vps_model *m = b->m;
	uint32_t tensor = sp->first + sp->expert_first + k;
	struct vps_tensor t;
	VPS_CHECK(vps_model_tensor(m, tensor, &t));
	struct dparam d = {.tensor = tensor, .layer = layer, .name = name, .expert = true};
	d.nstack = (uint32_t)m->experts;
	d.stack_stride = sp->per_expert;
	vps_box_full(&d.part, t.ndim, t.shape);
	d.ndim = 3;
	d.shape[0] = m->experts;
	if (half >= 0) {
		d.part.lo[0] = half;
		d.part.hi[0] = half + 1;
		d.shape[1] = t.shape[1];
		d.shape[2] = t.shape[2];
		int g[] = {0, 0, 2, 3};
		memcpy(d.grp, g, sizeof(g));
	} else {
		d.shape[1] = t.shape[0];
		d.shape[2] = t.shape[1];
		int g[] = {0, 0, 1, 2};
		memcpy(d.grp, g, sizeof(g));
	}
	/* moe_sharding.py: Shard(0) over ep; without EP the dense TP axis
	 * shards F: Shard(1) in w1/w3, Shard(2) in w2 */
	if (p->ep > 1) {
		d.tp_dim = 0;
		d.by_ep = true;
	} else {
		d.tp_dim = p->tp > 1 ? (half >= 0 ? 1 : 2) : -1;
	}
	/* fsdp.py apply_fsdp_to_decoder: Shard(1) when the FSDP mesh (times
	 * ep) outnumbers the experts */
	int64_t fs = p->ep > 1 ? p->dp_shard * p->cp * p->tp : p->dp_replicate * p->dp_shard * p->cp;
	d.fsdp_dim = fs > m->experts ? 1 : 0;
	return push(b, &d);
}

/* One transformer block as torchtitan registers it: attention (wqkv, wo,
 * q_norm, k_norm), the feed-forward or the MoE (routed experts, router,
 * shared experts), attention_norm, ffn_norm. */
static vps_result_t add_layer(struct builder *b, int64_t layer)
{
	const struct vps_model *m = b->m;
	struct vps_layer_span sp;
	vps_model_layer_span(m, layer, &sp);
	int32_t L = (int32_t)layer;
	uint32_t ids[VPS_T_NKINDS];
	for (int k = 0; k < VPS_T_NKINDS; k++)
		ids[k] = UINT32_MAX;
	for (uint32_t i = 0; i < sp.count; i++) {
		if (i >= sp.expert_first && i < sp.expert_first + sp.experts * sp.per_expert)
			continue;
		struct vps_tensor t;
		VPS_CHECK(vps_model_tensor(m, sp.first + i, &t));
		ids[t.kind] = sp.first + i;
	}
	VPS_CHECK(add(b, ids[VPS_T_QKV_W], F_WQKV, L, -1, 0));
	VPS_CHECK(add(b, ids[VPS_T_PROJ_W], F_WO, L, -1, 1));
	if (m->qk_norm) {
		VPS_CHECK(add(b, ids[VPS_T_Q_NORM_W], F_Q_NORM, L, -1, -1));
		VPS_CHECK(add(b, ids[VPS_T_K_NORM_W], F_K_NORM, L, -1, -1));
	}
	bool moe = sp.experts > 0;
	if (!moe) {
		VPS_CHECK(add(b, ids[VPS_T_FC1_W], F_W1, L, 0, 0));
		VPS_CHECK(add(b, ids[VPS_T_FC2_W], F_W2, L, -1, 1));
		VPS_CHECK(add(b, ids[VPS_T_FC1_W], F_W3, L, 1, 0));
	} else {
		VPS_CHECK(add_experts(b, &sp, 0, 0, F_EXP_W1, L));
		VPS_CHECK(add_experts(b, &sp, 1, -1, F_EXP_W2, L));
		VPS_CHECK(add_experts(b, &sp, 0, 1, F_EXP_W3, L));
		VPS_CHECK(add(b, ids[VPS_T_ROUTER_W], F_GATE, L, -1, -1));
		if (m->shared_ffn > 0) {
			VPS_CHECK(add(b, ids[VPS_T_SHARED_FC1_W], F_SHARED_W1, L, 0, 0));
			VPS_CHECK(add(b, ids[VPS_T_SHARED_FC2_W], F_SHARED_W2, L, -1, 1));
			VPS_CHECK(add(b, ids[VPS_T_SHARED_FC1_W], F_SHARED_W3, L, 1, 0));
		}
	}
	VPS_CHECK(add(b, ids[VPS_T_QKV_LN_W], F_ATTN_NORM, L, -1, -1));
	return add(b, ids[moe ? VPS_T_PRE_MLP_LN_W : VPS_T_FC1_LN_W], F_FFN_NORM, L, -1, -1);
}

static vps_result_t build_part(struct builder *b, int64_t part, int64_t stages)
{
	const struct vps_model *m = b->m;
	int64_t first, count;
	part_layers(m, stages, part, &first, &count);
	if (part == 0)
		VPS_CHECK(add(b, 0, F_TOK_EMB, -1, -1, 0));
	for (int64_t L = first; L < first + count; L++)
		VPS_CHECK(add_layer(b, L));
	if (part == stages - 1) {
		uint32_t post = vps_model_layer_first(m, m->layers);
		VPS_CHECK(add(b, post, F_NORM, -1, -1, -1));
		if (!m->tied_embeddings)
			VPS_CHECK(add(b, post + 1, F_LM_HEAD, -1, -1, 0));
	}
	b->pt->nweights = b->pt->n;
	/* MoE.__init__ registers expert_bias_E (persistent) */
	for (int64_t L = first; L < first + count; L++) {
		uint32_t id;
		if (vps_model_router_bias(m, L, -1, &id))
			VPS_CHECK(add(b, id, F_EXPERT_BIAS, (int32_t)L, -1, -1));
	}
	return VPS_OK;
}

static int dref_cmp(const void *a, const void *b)
{
	const struct dref *x = a, *y = b;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

vps_result_t vps_dtensor_new(struct dtensor **out, const struct vps_model *m, const struct vps_parallel *p,
			     const char *where)
{
	(void)where;
	vps_result_t rc = VPS_OK;
	struct dtensor *d = vps_calloc(1, sizeof(*d));
	if (!d)
		return VPS_ENOMEM;
	d->parts = p->pp * p->vpp;
	d->pt = vps_calloc((size_t)d->parts, sizeof(*d->pt));
	if (!d->pt) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	size_t nrefs = 0;
	for (int64_t s = 0; s < d->parts; s++) {
		struct builder b = {.m = m, .p = p, .pt = &d->pt[s]};
		VPS_CHECK_GOTO(build_part(&b, s, d->parts), rc, fail);
		nrefs += d->pt[s].n;
	}
	d->refs = vps_malloc(nrefs * sizeof(*d->refs) + 1);
	if (!d->refs) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (int64_t s = 0; s < d->parts; s++)
		for (size_t k = 0; k < d->pt[s].n; k++)
			d->refs[d->nrefs++] = (struct dref){d->pt[s].p[k].tensor, (uint32_t)s, (uint32_t)k};
	qsort(d->refs, d->nrefs, sizeof(*d->refs), dref_cmp);
	*out = d;
	return VPS_OK;
fail:
	vps_dtensor_free(d);
	return rc;
}

void vps_dtensor_free(struct dtensor *d)
{
	if (!d)
		return;
	if (d->pt)
		for (int64_t s = 0; s < d->parts; s++)
			free(d->pt[s].p);
	free(d->pt);
	free(d->refs);
	free(d);
}

/* ---- ranks and shards ---- */

/* torchtitan's world mesh is (pp, dp_replicate, dp_shard, cp, tp), tp
 * fastest (parallel_dims.py build_mesh); dp is the batch index, dp_replicate
 * x dp_shard. The expert coordinates are the sparse mesh's (pp,
 * dp_replicate, efsdp, ep): ep the fastest within a replica's dp_shard x
 * cp x tp ranks, edp = dp_replicate x efsdp. */
void vps_dtensor_coords(const struct vps_parallel *p, int64_t r, struct vps_coords *c)
{
	c->tp = r % p->tp;
	c->cp = (r / p->tp) % p->cp;
	c->dp = (r / (p->tp * p->cp)) % p->dp;
	c->pp = r / (p->tp * p->cp * p->dp);
	int64_t local = p->dp_shard * p->cp * p->tp, in = r % local, dpr = (r / local) % p->dp_replicate;
	if (p->ep > 1) {
		c->etp = 0;
		c->ep = in % p->ep;
		c->edp = dpr * (local / p->ep) + in / p->ep;
	} else {
		c->etp = c->tp;
		c->ep = 0;
		c->edp = dpr * p->dp_shard * p->cp + (r / p->tp) % (p->dp_shard * p->cp);
	}
}

/* A parameter's mesh: its tensor-parallel (or expert-parallel) cut and
 * FSDP shards, and the ranks that hold one (slice, shard): base + slice
 * * sstride + shard * fstride + i * rstride, i < rcount, then each of
 * xcount copies xstride apart (tp replicas of a norm). */
struct mesh {
	int64_t T, F;
	int64_t sstride, fstride;
	int64_t rstride, rcount, xstride, xcount;
};

static void param_mesh(const struct vps_parallel *p, const struct dparam *d, struct mesh *ms)
{
	int64_t fsdp = p->dp_shard * p->cp, local = fsdp * p->tp;
	ms->rstride = local;
	ms->rcount = p->dp_replicate;
	ms->xstride = 1;
	ms->xcount = 1;
	if (d->expert && p->ep > 1) {
		/* sparse mesh (efsdp, ep): rank in a replica = ep + EP x efsdp */
		ms->T = p->ep;
		ms->F = local / p->ep;
		ms->sstride = 1;
		ms->fstride = p->ep;
		return;
	}
	/* dense mesh (fsdp, tp), fsdp = dp_shard x cp flattened */
	ms->T = d->tp_dim >= 0 ? p->tp : 1;
	ms->F = fsdp;
	ms->sstride = 1;
	ms->fstride = p->tp;
	if (d->tp_dim < 0) {
		ms->xstride = 1;
		ms->xcount = p->tp;
	}
}

/* torch.chunk: n parts of ceil(ext / n), the last ones short or empty */
static void chunk(int64_t ext, int64_t n, int64_t i, int64_t *lo, int64_t *hi, int64_t *size)
{
	int64_t c = vps_ceil_div(ext, n);
	*size = c;
	*lo = vps_min64(i * c, ext);
	*hi = vps_min64(*lo + c, ext);
}

/* The local shard of slice ti, FSDP shard fi: [lo, hi) per parameter dim,
 * and the padded storage's extent of the FSDP dim. */
struct shard {
	int64_t lo[VPS_MAX_DIMS], hi[VPS_MAX_DIMS];
	int64_t padded; /* FSDP2's chunk size: chunks[0] */
};

static void local_shard(const struct dparam *d, const struct mesh *ms, int64_t ti, int64_t fi, struct shard *s)
{
	int64_t size;
	for (int k = 0; k < d->ndim; k++) {
		s->lo[k] = 0;
		s->hi[k] = d->shape[k];
	}
	if (d->tp_dim >= 0 && ms->T > 1)
		chunk(d->shape[d->tp_dim], ms->T, ti, &s->lo[d->tp_dim], &s->hi[d->tp_dim], &size);
	int64_t f = d->fsdp_dim, base = s->lo[f], lo, hi;
	chunk(s->hi[f] - base, ms->F, fi, &lo, &hi, &s->padded);
	s->lo[f] = base + lo;
	s->hi[f] = base + hi;
}

static int64_t shard_volume(const struct dparam *d, const struct shard *s, bool padded)
{
	int64_t v = 1;
	for (int k = 0; k < d->ndim; k++)
		v *= padded && k == d->fsdp_dim ? s->padded : s->hi[k] - s->lo[k];
	return v;
}

/* Row-major strides of the local shard (the padded storage has the same:
 * FSDP2 pads dim 0 only, and an uneven dim is refused elsewhere). */
static void shard_strides(const struct dparam *d, const struct shard *s, int64_t *st)
{
	int64_t acc = 1;
	for (int k = d->ndim - 1; k >= 0; k--) {
		st[k] = acc;
		acc *= s->hi[k] - s->lo[k];
	}
}

/* Regions being made for one buffer. */
struct regions {
	struct vps_region *v;
	size_t n, cap;
};

/* The regions of a local shard in a buffer: per expert of the stack, the
 * product over dims of the boxes of each dim's flat range of its group.
 * clip, when not NULL, keeps the regions that intersect it. */
static vps_result_t shard_regions(const struct dparam *d, const struct shard *s, int state, uint32_t buffer,
				  const struct vps_box *clip, uint32_t only_tensor, struct regions *out)
{
	int64_t st[VPS_MAX_DIMS];
	shard_strides(d, s, st);
	for (int k = 0; k < d->ndim; k++)
		if (s->hi[k] <= s->lo[k])
			return VPS_OK;
	int first_dim = d->nstack ? 1 : 0;
	int64_t e0 = d->nstack ? s->lo[0] : 0, e1 = d->nstack ? s->hi[0] : 1;
	/* each dim's boxes over its group's dims */
	struct vps_box sub[VPS_MAX_DIMS][2 * VPS_MAX_DIMS];
	int64_t starts[VPS_MAX_DIMS][2 * VPS_MAX_DIMS];
	int nsub[VPS_MAX_DIMS];
	for (int k = first_dim; k < d->ndim; k++) {
		int g0 = d->grp[k], gn = d->grp[k + 1] - g0;
		int64_t ext[VPS_MAX_DIMS];
		for (int j = 0; j < gn; j++)
			ext[j] = d->part.hi[g0 + j] - d->part.lo[g0 + j];
		nsub[k] = vps_flat_range_boxes(gn, ext, s->lo[k], s->hi[k], sub[k], starts[k]);
	}
	for (int64_t e = e0; e < e1; e++) {
		uint32_t tensor = d->tensor + (uint32_t)e * d->stack_stride;
		if (only_tensor != UINT32_MAX && tensor != only_tensor)
			continue;
		int pick[VPS_MAX_DIMS] = {0};
		for (;;) {
			struct vps_region r;
			memset(&r, 0, sizeof(r));
			r.tensor = tensor;
			r.state = (uint8_t)state;
			r.dtype = vps_dtype_field(VPS_DTYPE_FP32);
			r.buffer = buffer;
			r.box = d->part;
			r.offset = (e - e0) * (d->nstack ? st[0] : 0);
			for (int k = first_dim; k < d->ndim; k++) {
				const struct vps_box *b = &sub[k][pick[k]];
				int g0 = d->grp[k], gn = d->grp[k + 1] - g0;
				int64_t inner = 1;
				for (int j = gn - 1; j >= 0; j--) {
					r.box.lo[g0 + j] = d->part.lo[g0 + j] + b->lo[j];
					r.box.hi[g0 + j] = d->part.lo[g0 + j] + b->hi[j];
					r.strides[g0 + j] = st[k] * inner;
					inner *= d->part.hi[g0 + j] - d->part.lo[g0 + j];
				}
				r.offset += (starts[k][pick[k]] - s->lo[k]) * st[k];
			}
			/* a dim of extent 1 may have any stride: the row-major
			 * stride of the box keeps regions contiguous in files */
			if (!clip || vps_box_intersect(&r.box, clip, NULL)) {
				VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + 1));
				out->v[out->n++] = r;
			}
			int k = d->ndim - 1;
			while (k >= first_dim && ++pick[k] == nsub[k])
				pick[k--] = 0;
			if (k < first_dim)
				break;
		}
	}
	return VPS_OK;
}

/* ---- a rank's view ---- */

/* every state of this family is fp32 (vps_state_dtype's, written here so
 * that dtensor.c does not call layout.c) */
static const int weight_states[] = {VPS_STATE_MAIN_PARAM, VPS_STATE_EXP_AVG, VPS_STATE_EXP_AVG_SQ};
#define NWEIGHT_STATES 3
#define FP32_BYTES 4

bool vps_dtensor_has_state(const struct vps_layout *l, enum vps_state state)
{
	for (int k = 0; k < NWEIGHT_STATES; k++)
		if ((int)state == weight_states[k])
			return true;
	return state == VPS_STATE_MODULE && vps_model_module_buffers(&l->m) > 0;
}

/* The model parts rank's pipeline rank holds: torchtitan's "loop" style,
 * pp rank p holds parts p, p + pp, ... */
static int64_t rank_part(const struct vps_parallel *p, int64_t pp, int64_t k) { return pp + k * p->pp; }

/* The slice and shard of parameter d on a rank. */
static void rank_slot(const struct vps_parallel *p, const struct dparam *d, const struct vps_coords *c, int64_t *ti,
		      int64_t *fi)
{
	if (d->expert && p->ep > 1) {
		*ti = c->ep;
		*fi = c->edp % (p->dp_shard * p->cp * p->tp / p->ep);
	} else {
		*ti = d->tp_dim >= 0 ? c->tp : 0;
		*fi = c->cp + p->cp * (c->dp % p->dp_shard);
	}
}

struct counts {
	size_t weights, buffers; /* on the rank, over its parts */
};

static void rank_counts(const struct dtensor *dt, const struct vps_parallel *p, int64_t pp, struct counts *n)
{
	n->weights = n->buffers = 0;
	for (int64_t k = 0; k < p->vpp; k++) {
		const struct dpart *pt = &dt->pt[rank_part(p, pp, k)];
		n->weights += pt->nweights;
		n->buffers += pt->n - pt->nweights;
	}
}

vps_result_t vps_dtensor_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *v)
{
	const struct vps_parallel *p = &l->p;
	const struct dtensor *dt = l->dt;
	vps_result_t rc = VPS_OK;
	(void)rank; /* v's coordinates are the rank's */
	struct counts n;
	rank_counts(dt, p, v->coords.pp, &n);
	size_t nbuf = n.weights * NWEIGHT_STATES + n.buffers, np = n.weights + n.buffers;
	v->buffers = vps_calloc(nbuf + 1, sizeof(*v->buffers));
	v->params = vps_calloc(np + 1, sizeof(*v->params));
	struct regions rs = {0};
	size_t cap_rp = 0;
	if (!v->buffers || !v->params) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	/* parameters in order, part by part, each part's weights then its
	 * module buffers; buffers: every weight's main_param, then exp_avg,
	 * then exp_avg_sq, then the module buffers */
	size_t w = 0, mb = 0;
	for (int64_t k = 0; k < p->vpp; k++) {
		int64_t part = rank_part(p, v->coords.pp, k);
		const struct dpart *pt = &dt->pt[part];
		for (size_t i = 0; i < pt->n; i++) {
			const struct dparam *d = &pt->p[i];
			struct mesh ms;
			struct shard sh;
			int64_t ti, fi;
			param_mesh(p, d, &ms);
			rank_slot(p, d, &v->coords, &ti, &fi);
			bool weight = i < pt->nweights;
			size_t pi = weight ? w : n.weights + mb;
			struct vps_param *pm = &v->params[pi];
			pm->tensor = d->tensor;
			pm->chunk = (int32_t)k;
			pm->local_layer = d->layer;
			pm->local_expert = -1;
			pm->expert = d->expert;
			pm->bucket = (int32_t)i; /* the parameter's index in its model part */
			if (!weight) {
				/* the whole buffer, on every rank of its stage */
				struct vps_box full = d->part;
				uint32_t b = (uint32_t)(n.weights * NWEIGHT_STATES + mb);
				struct vps_buffer *bf = &v->buffers[b];
				bf->id = b;
				bf->state = VPS_STATE_MODULE;
				bf->dtype = VPS_DTYPE_FP32;
				bf->chunk = (int32_t)k;
				bf->elements = pm->elements = vps_box_volume(&full);
				pm->ndim = full.ndim;
				for (int j = 0; j < full.ndim; j++)
					pm->shape[j] = full.hi[j] - full.lo[j];
				size_t before = rs.n;
				VPS_CHECK_GOTO(VPS_GROW(rs.v, rs.cap, rs.n + 1), rc, fail);
				struct vps_region *r = &rs.v[rs.n++];
				memset(r, 0, sizeof(*r));
				r->tensor = d->tensor;
				r->state = VPS_STATE_MODULE;
				r->dtype = vps_dtype_field(VPS_DTYPE_FP32);
				r->buffer = b;
				r->box = full;
				vps_box_rowmajor_strides(&full, r->strides);
				VPS_CHECK_GOTO(VPS_GROW(v->region_param, cap_rp, rs.n), rc, fail);
				for (size_t j = before; j < rs.n; j++)
					v->region_param[j] = (uint32_t)pi;
				mb++;
				continue;
			}
			local_shard(d, &ms, ti, fi, &sh);
			pm->elements = shard_volume(d, &sh, true);
			pm->ndim = d->ndim;
			for (int j = 0; j < d->ndim; j++)
				pm->shape[j] = sh.hi[j] - sh.lo[j];
			for (int s = 0; s < NWEIGHT_STATES; s++) {
				uint32_t b = (uint32_t)(s * n.weights + w);
				struct vps_buffer *bf = &v->buffers[b];
				bf->id = b;
				bf->state = (uint8_t)weight_states[s];
				bf->dtype = VPS_DTYPE_FP32;
				bf->chunk = (int32_t)k;
				bf->expert = d->expert;
				bf->sharded = ms.F > 1;
				/* FSDP2's padded storage; Adam's zeros_like(local) */
				bf->elements = shard_volume(d, &sh, s == 0);
				size_t before = rs.n;
				VPS_CHECK_GOTO(shard_regions(d, &sh, weight_states[s], b, NULL, UINT32_MAX, &rs), rc, fail);
				VPS_CHECK_GOTO(VPS_GROW(v->region_param, cap_rp, rs.n + 1), rc, fail);
				for (size_t j = before; j < rs.n; j++)
					v->region_param[j] = (uint32_t)pi;
			}
			w++;
		}
	}
	v->nbuffers = nbuf;
	v->nparams = np;
	v->regions = rs.v;
	v->nregions = rs.n;
	if (!v->regions) {
		v->regions = vps_malloc(1);
		if (!v->regions) {
			rc = VPS_ENOMEM;
			goto fail;
		}
	}
	if (!v->region_param) {
		v->region_param = vps_malloc(1);
		if (!v->region_param) {
			rc = VPS_ENOMEM;
			goto fail;
		}
	}
	return VPS_OK;
fail:
	/* the caller releases what v holds */
	v->regions = rs.v;
	v->nregions = rs.n;
	v->nbuffers = nbuf;
	v->nparams = np;
	return rc;
}

/* The index of a weight among its rank's weights, and its buffer's. */
static const struct dparam *find_param(const struct dtensor *dt, const struct vps_param *pm, int64_t pp,
				       const struct vps_parallel *p)
{
	if (pm->chunk < 0 || pm->chunk >= p->vpp)
		return NULL;
	const struct dpart *pt = &dt->pt[rank_part(p, pp, pm->chunk)];
	if (pm->bucket < 0 || (size_t)pm->bucket >= pt->n)
		return NULL;
	return &pt->p[pm->bucket];
}

size_t vps_dtensor_param_name(const struct vps_layout *l, const struct vps_param *pm, char *buf, size_t n)
{
	/* a part's parameters name their layer; any pipeline rank finds the
	 * same parameter at (chunk, index) of the part holding that layer */
	const struct dtensor *dt = l->dt;
	for (int64_t pp = 0; pp < l->p.pp; pp++) {
		const struct dparam *d = find_param(dt, pm, pp, &l->p);
		if (d && d->tensor == pm->tensor) {
			int len = snprintf(buf, n, fqn_fmt[d->name], (int)d->layer);
			return len < 0 ? 0 : (size_t)len;
		}
	}
	return (size_t)snprintf(buf, n, "?");
}

int64_t vps_dtensor_buffer_elements(const struct vps_layout *l, int64_t rank, uint32_t buffer)
{
	const struct vps_parallel *p = &l->p;
	struct vps_coords c;
	vps_dtensor_coords(p, rank, &c);
	struct counts n;
	rank_counts(l->dt, p, c.pp, &n);
	size_t b = buffer;
	if (b >= n.weights * NWEIGHT_STATES + n.buffers)
		return -1;
	bool module = b >= n.weights * NWEIGHT_STATES;
	size_t want = module ? b - n.weights * NWEIGHT_STATES : b % n.weights;
	int s = module ? 0 : (int)(b / n.weights);
	for (int64_t k = 0; k < p->vpp; k++) {
		const struct dpart *pt = &l->dt->pt[rank_part(p, c.pp, k)];
		size_t have = module ? pt->n - pt->nweights : pt->nweights;
		if (want >= have) {
			want -= have;
			continue;
		}
		const struct dparam *d = &pt->p[module ? pt->nweights + want : want];
		if (module)
			return vps_box_volume(&d->part);
		struct mesh ms;
		struct shard sh;
		int64_t ti, fi;
		param_mesh(p, d, &ms);
		rank_slot(p, d, &c, &ti, &fi);
		local_shard(d, &ms, ti, fi, &sh);
		return shard_volume(d, &sh, s == 0);
	}
	return -1;
}

/* ---- holders ---- */

static vps_result_t push_holder(struct vps_holders *h, const struct vps_region *r, int64_t base, int64_t stride,
				int64_t count)
{
	VPS_CHECK(VPS_GROW(h->v, h->cap, h->n + 1));
	h->v[h->n++] = (struct vps_holder){*r, base, stride, count};
	return VPS_OK;
}

/* The range of parameter dim k's index that box touches: the flat indices
 * of its corners in the dim's group (a conservative range for a group of
 * several dims). */
static void dim_range(const struct dparam *d, int k, uint32_t tensor, const struct vps_box *box, int64_t *lo,
		      int64_t *hi)
{
	if (d->nstack && k == 0) {
		*lo = (tensor - d->tensor) / d->stack_stride;
		*hi = *lo + 1;
		return;
	}
	*lo = 0;
	*hi = d->shape[k];
	if (!box)
		return;
	int64_t a = 0, b = 0;
	for (int j = d->grp[k]; j < d->grp[k + 1]; j++) {
		int64_t ext = d->part.hi[j] - d->part.lo[j];
		int64_t x = vps_max64(box->lo[j], d->part.lo[j]) - d->part.lo[j];
		int64_t y = vps_min64(box->hi[j], d->part.hi[j]) - d->part.lo[j];
		if (x >= y) {
			*hi = *lo;
			return;
		}
		a = a * ext + x;
		b = b * ext + (y - 1);
	}
	*lo = a;
	*hi = b + 1;
}

/* Chunk indices of n chunks of ext whose chunk overlaps [lo, hi). */
static void chunk_range(int64_t ext, int64_t n, int64_t lo, int64_t hi, int64_t *i0, int64_t *i1)
{
	int64_t c = vps_ceil_div(ext, n);
	if (hi <= lo || c == 0) {
		*i0 = *i1 = 0;
		return;
	}
	*i0 = lo / c;
	*i1 = vps_min64((hi - 1) / c + 1, n);
}

static vps_result_t param_holders(const struct vps_layout *l, const struct dparam *d, int64_t part, uint32_t tensor,
				  int state, const struct vps_box *box, struct vps_holders *h)
{
	const struct vps_parallel *p = &l->p;
	int64_t pp = part % p->pp, k = part / p->pp;
	int64_t stage_base = pp * p->tp * p->cp * p->dp;
	struct counts n;
	rank_counts(l->dt, p, pp, &n);
	/* the parameter's index among its rank's weights */
	size_t w = 0;
	for (int64_t j = 0; j < k; j++)
		w += l->dt->pt[rank_part(p, pp, j)].nweights;
	const struct dpart *pt = &l->dt->pt[part];
	size_t idx = (size_t)(d - pt->p);
	if (d->module_buffer) {
		size_t mb = idx - pt->nweights;
		for (int64_t j = 0; j < k; j++) {
			const struct dpart *o = &l->dt->pt[rank_part(p, pp, j)];
			mb += o->n - o->nweights;
		}
		struct vps_region r;
		memset(&r, 0, sizeof(r));
		r.tensor = tensor;
		r.state = VPS_STATE_MODULE;
		r.dtype = vps_dtype_field(VPS_DTYPE_FP32);
		r.buffer = (uint32_t)(n.weights * NWEIGHT_STATES + mb);
		r.box = d->part;
		vps_box_rowmajor_strides(&d->part, r.strides);
		return push_holder(h, &r, stage_base, 1, p->tp * p->cp * p->dp);
	}
	w += idx;
	int s = 0;
	while (weight_states[s] != state)
		s++;
	uint32_t buffer = (uint32_t)(s * n.weights + w);
	struct mesh ms;
	param_mesh(p, d, &ms);
	/* the slices and shards the box reaches */
	int64_t t0 = 0, t1 = 1, lo, hi;
	if (d->tp_dim >= 0 && ms.T > 1) {
		dim_range(d, d->tp_dim, tensor, box, &lo, &hi);
		chunk_range(d->shape[d->tp_dim], ms.T, lo, hi, &t0, &t1);
	}
	struct regions rs = {0};
	vps_result_t rc = VPS_OK;
	for (int64_t ti = t0; ti < t1 && !rc; ti++) {
		struct shard whole;
		struct mesh one = ms;
		one.F = 1;
		local_shard(d, &one, ti, 0, &whole);
		int f = d->fsdp_dim;
		int64_t f0, f1;
		dim_range(d, f, tensor, box, &lo, &hi);
		lo = vps_max64(lo, whole.lo[f]) - whole.lo[f];
		hi = vps_min64(hi, whole.hi[f]) - whole.lo[f];
		chunk_range(whole.hi[f] - whole.lo[f], ms.F, lo, hi, &f0, &f1);
		for (int64_t fi = f0; fi < f1 && !rc; fi++) {
			struct shard sh;
			local_shard(d, &ms, ti, fi, &sh);
			rs.n = 0;
			rc = shard_regions(d, &sh, state, buffer, box, tensor, &rs);
			int64_t base = stage_base + ti * ms.sstride + fi * ms.fstride;
			for (size_t i = 0; i < rs.n && !rc; i++) {
				if (ms.xcount == 1 || ms.rcount == 1) {
					/* one progression: tp copies side by side, or replicas */
					bool x = ms.xcount > 1;
					rc = push_holder(h, &rs.v[i], base, x ? ms.xstride : ms.rstride, x ? ms.xcount : ms.rcount);
				} else {
					for (int64_t j = 0; j < ms.rcount && !rc; j++)
						rc = push_holder(h, &rs.v[i], base + j * ms.rstride, ms.xstride, ms.xcount);
				}
			}
		}
	}
	free(rs.v);
	return rc;
}

vps_result_t vps_dtensor_holders(const struct vps_layout *l, const struct vps_tensor *t, uint32_t tensor, int state,
				 const struct vps_box *box, struct vps_holders *h)
{
	const struct dtensor *dt = l->dt;
	/* a routed expert's tensor belongs to its layer's stack, keyed by
	 * expert 0's tensor */
	uint32_t key = tensor;
	if (t->expert >= 0) {
		struct vps_layer_span sp;
		vps_model_layer_span(&l->m, t->layer, &sp);
		key = tensor - (uint32_t)t->expert * sp.per_expert;
	}
	size_t lo = 0, hi = dt->nrefs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (dt->refs[mid].tensor < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < dt->nrefs && dt->refs[i].tensor == key; i++) {
		const struct dparam *d = &dt->pt[dt->refs[i].part].p[dt->refs[i].idx];
		if (box && !vps_box_intersect(box, &d->part, NULL))
			continue;
		if (d->module_buffer != (state == VPS_STATE_MODULE))
			continue;
		VPS_CHECK(param_holders(l, d, dt->refs[i].part, tensor, state, box, h));
	}
	return VPS_OK;
}

/* ---- statistics: each pipeline rank's distinct ranks (one per slice and
 * shard, replicas equal) ---- */

vps_result_t vps_dtensor_stats(const struct vps_layout *l, struct vps_layout_stats *s)
{
	const struct vps_parallel *p = &l->p;
	s->min_rank_bytes = INT64_MAX;
	int64_t per_stage = p->tp * p->cp * p->dp, distinct = p->tp * p->cp * p->dp_shard;
	for (int64_t pp = 0; pp < p->pp; pp++)
		for (int64_t r = 0; r < distinct; r++) {
			int64_t rank = pp * per_stage + r, bytes = 0, padding = 0;
			struct vps_coords c;
			vps_dtensor_coords(p, rank, &c);
			for (int64_t k = 0; k < p->vpp; k++) {
				const struct dpart *pt = &l->dt->pt[rank_part(p, pp, k)];
				for (size_t i = 0; i < pt->n; i++) {
					const struct dparam *d = &pt->p[i];
					if (d->module_buffer) {
						bytes += vps_box_volume(&d->part) * FP32_BYTES;
						continue;
					}
					struct mesh ms;
					struct shard sh;
					int64_t ti, fi;
					param_mesh(p, d, &ms);
					rank_slot(p, d, &c, &ti, &fi);
					local_shard(d, &ms, ti, fi, &sh);
					for (int st = 0; st < NWEIGHT_STATES; st++)
						bytes += shard_volume(d, &sh, st == 0) * FP32_BYTES;
					padding += shard_volume(d, &sh, true) - shard_volume(d, &sh, false);
				}
			}
			s->max_rank_bytes = vps_max64(s->max_rank_bytes, bytes);
			s->min_rank_bytes = vps_min64(s->min_rank_bytes, bytes);
			s->total_bytes += bytes * p->dp_replicate;
			s->padding_elements += padding * p->dp_replicate;
		}
	return VPS_OK;
}
