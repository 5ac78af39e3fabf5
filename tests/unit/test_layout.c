/* Layouts: Megatron's placement rules checked on hand-computed cases, and the
 * per-(tensor, state) holder index checked against enumerating every rank. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/layout.h"
#include "vps/verify.h"


/* The regions of (tensor, state) on a rank. */
static size_t regions_of(const struct vps_rank_view *v, uint32_t tensor, int state, const struct vps_region **out,
			 size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < v->nregions; i++)
		if (v->regions[i].tensor == tensor && v->regions[i].state == state && n < max)
			out[n++] = &v->regions[i];
	return n;
}

static const struct vps_param *param_of(const struct vps_rank_view *v, uint32_t tensor, bool output_copy)
{
	for (size_t i = 0; i < v->nparams; i++)
		if (v->params[i].tensor == tensor && v->params[i].output_copy == output_copy)
			return &v->params[i];
	return NULL;
}

TEST(rank_order_is_tp_dp_pp)
{
	struct vps_layout *l = test_layout("tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1", 8, 0);
	struct vps_coords c;
	vps_layout_coords(l, 5, &c); /* 5 = tp 1 + 2 * (dp 0 + 2 * pp 1) */
	CHECK_EQ(c.tp, 1);
	CHECK_EQ(c.dp, 0);
	CHECK_EQ(c.pp, 1);
	/* expert generator tp-ep-dp-pp with etp 1, ep 2, edp 2 */
	CHECK_EQ(c.etp, 0);
	CHECK_EQ(c.ep, 1);
	CHECK_EQ(c.edp, 0);
	vps_layout_coords(l, 2, &c);
	CHECK_EQ(c.ep, 0);
	CHECK_EQ(c.edp, 1);
	vps_layout_free(l);
}

TEST(vocabulary_padding_is_rank_local)
{
	/* 1000 rows padded to ceil(1000 / (128 * 4)) * 512 = 1024: 256 per rank */
	struct vps_layout *l = test_layout("tiny-llama", "tp=4", 8, 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 3, &v));
	uint32_t emb = test_tensor_id(l, "embedding.word_embeddings.weight");
	const struct vps_param *p = param_of(&v, emb, false);
	CHECK(p != NULL);
	if (p)
		CHECK_EQ(p->elements, 256 * 256);
	const struct vps_region *r[4];
	CHECK_EQ(regions_of(&v, emb, VPS_STATE_PARAM, r, 4), 1);
	CHECK_EQ(r[0]->box.lo[0], 768);
	CHECK_EQ(r[0]->box.hi[0], 1000);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

TEST(qkv_rows_split_when_tp_exceeds_query_groups)
{
	/* Qwen3-235B: 4 groups of 16 q heads + k + v = 18 slots of 128 rows; tp 8
	 * gives each rank 1152 rows of the interleaved tensor (attention.py
	 * all-gathers them): rank 0 has slots 0-8 of group 0, rank 1 slots 9-17
	 * (q heads 9-15, k, v). */
	struct vps_layout *l = test_layout("qwen3-235b-a22b", "tp=8,pp=16,dp=1,ep=8,etp=1,first=5,last=5", 8, 0);
	uint32_t qkv = test_tensor_id(l, "decoder.layers.0.self_attention.linear_qkv.weight");
	for (int64_t rank = 0; rank < 3; rank++) {
		struct vps_rank_view v;
		CHECK_OK(vps_layout_rank(l, rank, &v));
		const struct vps_region *r[4];
		CHECK_EQ(regions_of(&v, qkv, VPS_STATE_PARAM, r, 4), 1);
		CHECK_EQ(r[0]->box.lo[0], rank / 2);
		CHECK_EQ(r[0]->box.hi[0], rank / 2 + 1);
		CHECK_EQ(r[0]->box.lo[1], rank % 2 ? 9 : 0);
		CHECK_EQ(r[0]->box.hi[1], rank % 2 ? 18 : 9);
		CHECK_EQ(r[0]->box.hi[3], 4096);
		vps_rank_view_release(&v);
	}
	vps_layout_free(l);
}

TEST(swiglu_tp_shard_is_gate_and_up_slices)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=4", 8, 0);
	uint32_t fc1 = test_tensor_id(l, "decoder.layers.2.mlp.linear_fc1.weight");
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	const struct vps_region *r[4];
	CHECK_EQ(regions_of(&v, fc1, VPS_STATE_PARAM, r, 4), 1);
	CHECK_EQ(r[0]->box.lo[0], 0);
	CHECK_EQ(r[0]->box.hi[0], 2);
	CHECK_EQ(r[0]->box.lo[1], 172);
	CHECK_EQ(r[0]->box.hi[1], 344);
	CHECK_EQ(r[0]->strides[0], 172 * 256); /* stored as [gate_1; up_1] */
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

TEST(pipeline_layers_with_virtual_and_uneven_stages)
{
	/* 8 layers, pp 3, first 2, last 2, vpp 2: chunks of 1, 2, 1 layers;
	 * chunk 0: stage0 {0}, stage1 {1,2}, stage2 {3}; chunk 1: {4}, {5,6}, {7} */
	static const struct {
		int64_t stage, layer, chunk;
	} want[] = {{0, 0, 0}, {1, 1, 0}, {1, 2, 0}, {2, 3, 0}, {0, 4, 1}, {1, 5, 1}, {1, 6, 1}, {2, 7, 1}};
	struct vps_layout *l = test_layout("tiny-llama", "pp=3,vpp=2,first=2,last=2", 8, 0);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct vps_rank_view v;
		char name[128];
		snprintf(name, sizeof(name), "decoder.layers.%lld.mlp.linear_fc2.weight", (long long)want[i].layer);
		uint32_t id = test_tensor_id(l, name);
		CHECK_OK(vps_layout_rank(l, want[i].stage, &v));
		const struct vps_param *p = param_of(&v, id, false);
		CHECK(p != NULL);
		if (p)
			CHECK_EQ(p->chunk, want[i].chunk);
		vps_rank_view_release(&v);
	}
	vps_layout_free(l);
}

TEST(experts_are_contiguous_per_ep_rank)
{
	/* tp 2, dp 2, ep 2, etp 1: expert rank = etp + 1*(ep + 2*(edp + 2*pp)),
	 * so rank 1 is ep 1 and holds experts 4..7 as local experts 0..3 */
	struct vps_layout *l = test_layout("tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1", 8, 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	uint32_t e4 = test_tensor_id(l, "decoder.layers.0.mlp.experts.local_experts.4.linear_fc1.weight");
	uint32_t e3 = test_tensor_id(l, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight");
	const struct vps_param *p = param_of(&v, e4, false);
	CHECK(p != NULL);
	CHECK(param_of(&v, e3, false) == NULL);
	if (p) {
		CHECK_EQ(p->local_expert, 0);
		CHECK(p->expert);
		/* etp 1: the whole expert, [2, 128, 128] */
		CHECK_EQ(p->elements, 2 * 128 * 128);
	}
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* The distributed optimizer's buffer, computed by hand from
 * _compute_per_buffer_param_layout for tiny-gpt at tp 2, pp 2, dp 2 on the
 * last stage (layers 4-7, final norm, the tied output copy). */
TEST(distributed_optimizer_buffer_order_padding_and_buckets)
{
	struct vps_layout *l = test_layout("tiny-gpt", "tp=2,pp=2,dp=2,zero=1", 8, 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 7, &v));
	uint32_t emb = test_tensor_id(l, "embedding.word_embeddings.weight");
	uint32_t fnb = test_tensor_id(l, "decoder.final_layernorm.bias");
	uint32_t fnw = test_tensor_id(l, "decoder.final_layernorm.weight");
	uint32_t fc2b = test_tensor_id(l, "decoder.layers.7.mlp.linear_fc2.bias");
	uint32_t fc2w = test_tensor_id(l, "decoder.layers.7.mlp.linear_fc2.weight");
	uint32_t proj4 = test_tensor_id(l, "decoder.layers.4.self_attention.linear_proj.weight");
	const struct vps_param *out = param_of(&v, emb, true);
	CHECK(out != NULL);
	if (!out)
		return;
	/* registered last, so first in the buffer; shared_embedding: a bucket of
	 * its own: 1024/2 padded rows x 256 = 131072, already a multiple of
	 * lcm(2, 128) */
	CHECK_EQ(out->offset, 0);
	CHECK_EQ(out->elements, 512 * 256);
	CHECK_EQ(out->bucket, 0);
	const struct vps_param *b = param_of(&v, fnb, false), *w = param_of(&v, fnw, false);
	CHECK_EQ(b->offset, 131072);
	CHECK_EQ(b->bucket, 1);
	CHECK_EQ(w->offset, 131072 + 256);
	const struct vps_param *f2b = param_of(&v, fc2b, false), *f2w = param_of(&v, fc2w, false);
	CHECK_EQ(f2b->offset, 131072 + 512);
	/* fc2 bias is 256 elements: the weight starts at the next multiple of 64 */
	CHECK_EQ(f2w->offset, 131072 + 768);
	CHECK_EQ(f2w->elements, 256 * 512);
	/* every start on a multiple of 64; layer 4's linear_proj, registered
	 * first among the layers, comes last */
	for (size_t i = 0; i < v.nparams; i++)
		CHECK_EQ(v.params[i].offset % 64, 0);
	const struct vps_param *pj = param_of(&v, proj4, false);
	for (size_t i = 0; i < v.nparams; i++)
		CHECK(v.params[i].offset <= pj->offset);
	/* the buffer ends on a multiple of lcm(dp, 128) and the shard is half */
	CHECK_EQ(v.buffers[0].elements % 128, 0);
	CHECK_EQ(v.buffers[1].elements * 2, v.buffers[0].elements);
	CHECK(v.buffers[1].sharded);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

TEST(no_padding_without_the_distributed_optimizer)
{
	struct vps_layout *l = test_layout("tiny-gpt", "tp=2,pp=2,dp=2,zero=0", 8, 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 7, &v));
	uint32_t fnb = test_tensor_id(l, "decoder.final_layernorm.bias");
	const struct vps_param *b = param_of(&v, fnb, false);
	CHECK_EQ(b->offset, 131072);
	int64_t sum = 0;
	for (size_t i = 0; i < v.nparams; i++)
		sum += v.params[i].elements;
	CHECK_EQ(v.buffers[0].elements, sum);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

TEST(buckets_split_at_the_bucket_size_on_stage_0_only)
{
	struct vps_layout *l = test_layout("tiny-llama", "pp=2,dp=2,zero=1,bucket=300000", 8, 0);
	struct vps_rank_view v0, v1;
	CHECK_OK(vps_layout_rank(l, 0, &v0));
	CHECK_OK(vps_layout_rank(l, 2, &v1));
	int32_t max0 = 0, max1 = 0;
	for (size_t i = 0; i < v0.nparams; i++)
		max0 = v0.params[i].bucket > max0 ? v0.params[i].bucket : max0;
	for (size_t i = 0; i < v1.nparams; i++)
		max1 = v1.params[i].bucket > max1 ? v1.params[i].bucket : max1;
	CHECK(max0 > 1);
	CHECK_EQ(max1, 0);
	vps_rank_view_release(&v0);
	vps_rank_view_release(&v1);
	vps_layout_free(l);
}

/* ---- holders against enumeration ---- */

TEST(holders_equal_enumeration_of_all_ranks)
{
	static const char *cases[][2] = {
		{"tiny-llama", "tp=2,pp=2,dp=2"},
		{"tiny-llama", "tp=2,pp=2,dp=2,zero=1"},
		{"tiny-llama", "tp=4,pp=2,dp=3,vpp=2,zero=1,grad=1"},
		{"tiny-llama", "tp=1,pp=3,dp=5,first=2,last=2,zero=1,bucket=100000"},
		{"tiny-gpt", "tp=2,pp=2,dp=2,zero=1"},
		{"tiny-gpt", "tp=8,pp=4,dp=2,vpp=2,zero=1"},
		{"tiny-gpt", "tp=4,pp=1,dp=3,zero=1"},
		{"tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1"},
		{"tiny-qwen3-moe", "tp=4,pp=2,dp=2,ep=4,etp=2,zero=1"},
		{"tiny-qwen3-moe", "tp=2,pp=1,dp=3,zero=1"},
		{"tiny-qwen3-moe", "tp=2,pp=4,dp=3,ep=2,etp=1,zero=1,vpp=2"},
		{"tiny-qwen3-moe", "tp=8,pp=1,dp=1,ep=8,etp=1,zero=1"},
		/* MLA, shared experts, dense first layers on their own stage */
		{"tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1"},
		{"tiny-deepseek", "tp=2,pp=3,dp=2,ep=4,etp=1,first=1,last=1,vpp=1,zero=1,grad=1"},
		{"tiny-deepseek", "tp=4,cp=2,pp=1,dp=1,ep=8,etp=1,zero=1"},
		/* context parallelism: replicas over cp x dp, shards over dp_cp */
		{"tiny-llama", "tp=2,cp=2,pp=2,dp=2,zero=1"},
		{"tiny-llama", "tp=1,cp=3,pp=2,dp=2,vpp=2,zero=1,grad=1,bucket=100000"},
		{"tiny-gpt", "tp=2,cp=2,pp=2,dp=1,zero=1"},
		{"tiny-qwen3-moe", "tp=2,cp=2,pp=1,dp=2,ep=4,etp=1,zero=1"},
		{"tiny-qwen3-moe", "tp=2,cp=2,pp=2,dp=1,zero=1"},
		{"tiny-qwen3-moe", "tp=2,cp=3,pp=1,dp=1,ep=2,etp=1,zero=1"},
		/* the optimizer's states: the layer-wise optimizer's whole
		 * parameters, SGD's and Muon's zero=0 whole states, 16 bits */
		{"tiny-llama", "tp=2,pp=2,dp=2,zero=1,optimizer=muon"},
		{"tiny-gpt", "tp=2,pp=2,dp=3,zero=1,optimizer=lion,bucket=200000"},
		{"tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,optimizer=muon,scalar=lion"},
		{"tiny-qwen3-moe", "tp=2,etp=1,zero=1,optimizer=muon"},
		{"tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,optimizer=muon"},
		{"tiny-llama", "tp=2,dp=2,zero=0,optimizer=muon"},
		{"tiny-llama", "tp=2,pp=2,dp=2,optimizer=sgd,grad=1"},
		{"tiny-llama", "tp=2,dp=3,zero=1,precision_aware=1,exp_avg=bf16"},
		/* offload=F: the optimizer states of each shard split between a
		 * host buffer and the GPU one */
		{"tiny-llama", "tp=2,pp=2,dp=2,zero=1,offload=0.5"},
		{"tiny-gpt", "tp=2,dp=3,zero=1,offload=1,bucket=200000"},
		{"tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,vpp=2,offload=0.3"},
		{"tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,offload=0.7,grad=1"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		test_holders_match(cases[i][0], cases[i][1]);
}

TEST(holders_of_a_box_are_those_that_intersect_it)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=4,dp=2,zero=1", 8, 0);
	uint32_t fc1 = test_tensor_id(l, "decoder.layers.1.mlp.linear_fc1.weight");
	struct vps_box box = {3, {1, 0, 0}, {2, 10, 256}}; /* up half, rows 0-9 */
	struct vps_holders h = {0};
	CHECK_OK(vps_layout_holders(l, fc1, VPS_STATE_PARAM, &box, &h));
	/* tp rank 0 only, two DP replicas: ranks 0 and 4 */
	CHECK_EQ(h.n, 1);
	if (h.n) {
		CHECK_EQ(h.v[0].base, 0);
		CHECK_EQ(h.v[0].stride, 4);
		CHECK_EQ(h.v[0].count, 2);
	}
	vps_holders_release(&h);
	vps_layout_free(l);
}

TEST(every_paper_configuration_verifies)
{
	static const char *cases[][2] = {
		{"llama2-7b", "tp=2,pp=2,dp=2,zero=1"},
		{"llama2-70b", "tp=8,pp=16,dp=1,zero=1"},
		{"llama-32b", "tp=1,pp=16,dp=2,first=2,last=2,zero=1"},
		{"qwen3-30b-a3b", "tp=2,pp=4,dp=4,ep=2,etp=1,zero=1"},
		{"qwen3-235b-a22b", "tp=4,pp=8,dp=4,ep=16,etp=1,first=11,last=11,zero=1"},
		{"gpt3-1.3b", "tp=4,pp=2,dp=2,zero=1"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *l = test_layout(cases[i][0], cases[i][1], 8, 0);
		struct vps_verify_report rep;
		CHECK_OK(vps_verify_layout(l, &rep));
		CHECK_EQ(rep.violations, 0);
		vps_verify_report_release(&rep);
		vps_layout_free(l);
	}
}

TEST(verify_reports_a_hole_and_an_overlap)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,dp=1", 8, 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	/* shrink one region (a hole) and move another onto its neighbour */
	v.regions[0].box.hi[0] -= 1;
	v.regions[2].offset = v.regions[1].offset;
	CHECK_OK(vps_layout_set_explicit(l, &v));
	struct vps_verify_report rep;
	CHECK_OK(vps_verify_layout(l, &rep));
	CHECK(rep.violations >= 2);
	bool hole = false, overlap = false;
	for (size_t i = 0; i < rep.nmessages; i++) {
		hole |= strstr(rep.messages[i], "held by no rank") != NULL;
		overlap |= strstr(rep.messages[i], "overlaps") != NULL;
	}
	CHECK(hole);
	CHECK(overlap);
	vps_verify_report_release(&rep);
	vps_layout_free(l);
}

TEST(holders_follow_explicit_ranks)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=1,dp=4", 8, 0);
	uint32_t emb = test_tensor_id(l, "embedding.word_embeddings.weight");
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 2, &v));
	for (size_t i = 0; i < v.nregions; i++)
		if (v.regions[i].tensor == emb)
			v.regions[i].offset += 7;
	CHECK_OK(vps_layout_set_explicit(l, &v));
	struct vps_holders h = {0};
	CHECK_OK(vps_layout_holders(l, emb, VPS_STATE_PARAM, NULL, &h));
	int64_t total = 0;
	bool moved = false;
	for (size_t i = 0; i < h.n; i++) {
		total += h.v[i].count;
		for (int64_t k = 0; k < h.v[i].count; k++)
			if (h.v[i].base + k * h.v[i].stride == 2)
				moved = h.v[i].region.offset % 64 == 7;
	}
	CHECK_EQ(total, 4);
	CHECK(moved);
	vps_holders_release(&h);
	vps_layout_free(l);
}
