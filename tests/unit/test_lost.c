/* Lost devices (vps-plan --lost): what no survivor holds, counted by hand
 * from Megatron's splits, and plans that take everything else from the
 * survivors, in the global and the per-rank path. The lost ranks' buffers
 * are wiped before a plan is applied: a piece from a lost device would
 * deliver zeros and show as wrong elements. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/data.h"
#include "vps/plan.h"

static const int64_t RANK1[] = {1};

/* Wipe the buffers of A's lost ranks (the device is gone). */
static void wipe(struct job *j, const struct vps_lost *l)
{
	for (size_t i = 0; i < l->nranks; i++) {
		const struct vps_rank_view *v = &j->views[l->ranks[i]];
		for (size_t b = 0; b < v->nbuffers; b++)
			memset(j->bufs[l->ranks[i]][b], 0,
			       (size_t)v->buffers[b].elements * vps_dtype_size(v->buffers[b].dtype));
	}
}

/* Wrong elements of B outside the lost ranges; *holes: elements inside. */
static int64_t check_survivors(struct job *b, const struct vps_lost *l, int64_t *holes)
{
	int64_t bad = 0;
	*holes = 0;
	for (int64_t r = 0; r < b->n; r++) {
		const struct vps_rank_view *v = &b->views[r];
		for (size_t i = 0; i < v->nregions; i++) {
			const struct vps_region *R = &v->regions[i];
			struct vps_tensor t;
			struct vps_box rem[64], out[2 * VPS_MAX_DIMS];
			size_t n = 1;
			rem[0] = R->box;
			vps_model_tensor(vps_layout_model(b->l), R->tensor, &t);
			for (size_t k = 0; k < l->nranges; k++) {
				const struct vps_lost_range *x = &l->ranges[k];
				struct vps_box y;
				if (x->tensor != R->tensor || x->state != R->state)
					continue;
				if (vps_box_intersect(&x->box, &R->box, &y))
					*holes += vps_box_volume(&y);
				struct vps_box next[64];
				size_t m = 0;
				for (size_t j = 0; j < n; j++) {
					int c = vps_box_subtract(&rem[j], &x->box, out);
					for (int q = 0; q < c && m < 64; q++)
						next[m++] = out[q];
				}
				memcpy(rem, next, m * sizeof(*rem));
				n = m;
			}
			for (size_t j = 0; j < n; j++) {
				struct vps_region part;
				vps_region_restrict(R, &rem[j], &part);
				bad += vps_check_region(b->bufs[r][R->buffer], &part, &t, 0);
			}
		}
	}
	return bad;
}

static const struct vps_lost_range *find(const struct vps_lost *l, const struct vps_model *m, const char *name,
					 int state)
{
	uint32_t id;
	if (vps_model_find_tensor(m, name, &id))
		return NULL;
	for (size_t i = 0; i < l->nranges; i++)
		if (l->ranges[i].tensor == id && l->ranges[i].state == state)
			return &l->ranges[i];
	return NULL;
}

static bool box_is(const struct vps_lost_range *x, int ndim, const int64_t *lohi)
{
	if (!x || x->box.ndim != ndim)
		return false;
	for (int k = 0; k < ndim; k++)
		if (x->box.lo[k] != lohi[2 * k] || x->box.hi[k] != lohi[2 * k + 1])
			return false;
	return true;
}

TEST(lost_holders_drop_the_lost_members)
{
	struct vps_holders h = {0};
	struct vps_lost l = {.ranks = (int64_t[]){2, 8, 9}, .nranks = 3};
	struct vps_holder x = {.base = 0, .stride = 2, .count = 5}; /* 0 2 4 6 8 */
	struct vps_holder y = {.base = 9, .stride = 0, .count = 1};
	h.v = malloc(2 * sizeof(*h.v));
	h.cap = 2;
	h.v[h.n++] = x;
	h.v[h.n++] = y;
	CHECK_OK(vps_lost_drop_holders(&l, &h));
	/* 0, then 4 6; 9 is gone */
	CHECK_EQ(h.n, 2);
	CHECK(h.n == 2 && h.v[0].base == 0 && h.v[0].count == 1 && h.v[1].base == 4 && h.v[1].count == 2 &&
	      h.v[1].stride == 2);
	vps_holders_release(&h);
}

/* tp=2, dp=1, rank 1 lost: every tensor tensor parallelism splits loses
 * rank 1's half, in every state; the norms every TP rank holds survive on
 * rank 0. tiny-llama (hidden 256, 4 query groups of 2 heads of 32, ffn
 * 688, vocabulary 1000 padded to 1024, 8 layers):
 *   word embeddings and output layer: rows [512, 1000) = 488 x 256
 *   linear_qkv: groups [2, 4) of [4][4][32][256] = 65536
 *   linear_proj: columns [128, 256) of 256 x 256 = 32768
 *   linear_fc1: [2][344, 688)[256] (gate and up halves) = 176128
 *   linear_fc2: columns [344, 688) of 256 x 688 = 88064
 * 2 + 8 * 4 = 34 tensors in 4 states: 136 ranges of 3149824 elements a
 * state, 2 + 3 * 4 = 14 bytes an element over the states: 44097536 bytes. */
TEST(lost_tp2_dp1_rank1_loses_its_tp_half)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=1", 4, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,dp=1", 4, 0);
	if (!a || !b)
		return;
	struct vps_lost l;
	CHECK_OK(vps_lost_compute(&l, a, RANK1, 1));
	CHECK_EQ(l.nranks, 1);
	CHECK_EQ(l.nranges, 136);
	CHECK_EQ(vps_lost_bytes(&l), 44097536);
	int64_t per_state[VPS_NSTATES] = {0};
	for (size_t i = 0; i < l.nranges; i++)
		per_state[l.ranges[i].state] += vps_box_volume(&l.ranges[i].box);
	for (int st = 0; st < 4; st++)
		CHECK_EQ(per_state[st], 3149824);
	const struct vps_model *m = vps_layout_model(a);
	CHECK(box_is(find(&l, m, "embedding.word_embeddings.weight", VPS_STATE_PARAM), 2, (int64_t[]){512, 1000, 0, 256}));
	CHECK(box_is(find(&l, m, "output_layer.weight", VPS_STATE_EXP_AVG_SQ), 2, (int64_t[]){512, 1000, 0, 256}));
	CHECK(box_is(find(&l, m, "decoder.layers.0.self_attention.linear_qkv.weight", VPS_STATE_MAIN_PARAM), 4,
		     (int64_t[]){2, 4, 0, 4, 0, 32, 0, 256}));
	CHECK(box_is(find(&l, m, "decoder.layers.7.self_attention.linear_proj.weight", VPS_STATE_EXP_AVG), 2,
		     (int64_t[]){0, 256, 128, 256}));
	CHECK(box_is(find(&l, m, "decoder.layers.3.mlp.linear_fc1.weight", VPS_STATE_PARAM), 3,
		     (int64_t[]){0, 2, 344, 688, 0, 256}));
	CHECK(box_is(find(&l, m, "decoder.layers.5.mlp.linear_fc2.weight", VPS_STATE_PARAM), 2,
		     (int64_t[]){0, 256, 344, 688}));
	CHECK(!find(&l, m, "decoder.final_layernorm.weight", VPS_STATE_PARAM));
	CHECK(!find(&l, m, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight", VPS_STATE_EXP_AVG));

	/* refused unless allowed; allowed, the plan has holes exactly there */
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.lost = RANK1;
	o.nlost = 1;
	struct vps_plan *p = NULL;
	CHECK_EQ(vps_plan_compute(&p, a, b, &o), VPS_ECHECK);
	CHECK(!p);
	o.allow_loss = true;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (p) {
		struct job ja, jb;
		int64_t holes;
		job_alloc(&ja, p->a);
		job_alloc(&jb, p->b);
		job_fill(&ja);
		wipe(&ja, &l);
		job_apply_plan(p, &ja, &jb);
		CHECK_EQ(check_survivors(&jb, &p->lost, &holes), 0);
		CHECK_EQ(holes, 4 * 3149824);
		CHECK_EQ(p->lost.nranges, 136);
		for (size_t i = 0; i < p->npieces; i++)
			CHECK(p->pieces[i].src != 1);
		/* rank 0 keeps its half; the other half no plan can move */
		struct vps_plan_stats st;
		CHECK_OK(vps_plan_stats(p, NULL, false, &st));
		CHECK_EQ(st.bytes_moved, 0);
		CHECK_EQ(st.bytes_lower_bound, 0);
		vps_plan_stats_release(&st);
		job_free(&ja);
		job_free(&jb);
		vps_plan_free(p);
	} else {
		vps_layout_free(a);
		vps_layout_free(b);
	}
	vps_lost_release(&l);
}

/* tp=2, dp=2 without ZeRO, rank 1 lost: rank 3 holds the same, so nothing
 * is lost and every piece of rank 1's half comes from rank 3, in the
 * global plan and in each surviving rank's own. B, tp=2 on two new
 * devices of node 1, receives everything. */
TEST(lost_tp2_dp2_rank1_loses_nothing)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=2", 4, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=2,dp=1", 4, 1);
	if (!a || !b)
		return;
	struct vps_lost l;
	CHECK_OK(vps_lost_compute(&l, a, RANK1, 1));
	CHECK_EQ(l.nranges, 0);
	vps_lost_release(&l);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.lost = RANK1;
	o.nlost = 1;
	struct vps_plan *p = NULL;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p)
		return;
	struct job ja, jb;
	job_alloc(&ja, p->a);
	job_alloc(&jb, p->b);
	job_fill(&ja);
	wipe(&ja, &p->lost);
	job_apply_plan(p, &ja, &jb);
	CHECK_EQ(job_check(&jb), 0);
	int64_t from3 = 0;
	for (size_t i = 0; i < p->npieces; i++) {
		CHECK(p->pieces[i].src != 1);
		/* B's TP rank 1 (world rank 5) gets A's TP rank 1 half: from 3 */
		if (p->pieces[i].dst == 5)
			from3 += p->pieces[i].src == 3;
	}
	CHECK(from3 > 0);
	/* each surviving rank's own plan is the global plan restricted to it */
	int64_t W = vps_world_size(p->world);
	for (int64_t r = 0; r < W; r++) {
		struct vps_layout *a2 = test_layout("tiny-llama", "tp=2,dp=2", 4, 0);
		struct vps_layout *b2 = test_layout("tiny-llama", "tp=2,dp=1", 4, 1);
		struct vps_plan_opts ro = VPS_PLAN_OPTS_INIT;
		ro.rank = r;
		ro.lost = RANK1;
		ro.nlost = 1;
		struct vps_plan *q = NULL;
		vps_result_t rc = vps_plan_compute(&q, a2, b2, &ro);
		if (r == 1) {
			/* a lost device has no part to plan */
			CHECK_EQ(rc, VPS_EINPUT);
			CHECK(!q);
			if (!q) {
				vps_layout_free(a2);
				vps_layout_free(b2);
			}
			continue;
		}
		CHECK_OK(rc);
		if (!q)
			continue;
		size_t want;
		if (!job_rank_part(p, q, r, &want))
			harness_fail(__FILE__, __LINE__, "rank %lld's plan (%zu pieces) differs from the global plan's (%zu)",
				     (long long)r, q->npieces, want);
		vps_plan_free(q);
	}
	job_free(&ja);
	job_free(&jb);
	vps_plan_free(p);
}

/* A target that still places a rank on a lost device is bad input. */
TEST(lost_device_in_the_target_is_refused)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=1", 4, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=2,dp=1", 4, 0);
	if (!a || !b)
		return;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.lost = RANK1;
	o.nlost = 1;
	o.allow_loss = true;
	struct vps_plan *p = NULL;
	CHECK_EQ(vps_plan_compute(&p, a, b, &o), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "rank 1 of the source is lost") != NULL);
	CHECK(!p);
	if (!p) {
		vps_layout_free(a);
		vps_layout_free(b);
	}
}
