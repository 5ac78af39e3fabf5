/* PyTorch DTensor layouts (family dtensor): FSDP2's torch.chunk shards
 * with their padding, HSDP's replicas, tensor parallel's colwise and
 * rowwise cuts, torchtitan's pipeline split and expert parallelism, on
 * cases worked by hand (make check-torch checks them against PyTorch). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/io.h"
#include "vps/layout.h"

#define MOE_E6 "tests/torch/models/qwen3-moe-e6.yaml"
#define MOE_E8 "tests/torch/models/qwen3-moe-e8.yaml"

/* The rank's parameter of this torchtitan name, or NULL. */
static const struct vps_param *param_named(const struct vps_layout *l, const struct vps_rank_view *v,
					   const char *name)
{
	char buf[256];
	for (size_t i = 0; i < v->nparams; i++) {
		vps_layout_param_name(l, &v->params[i], buf, sizeof(buf));
		if (!strcmp(buf, name))
			return &v->params[i];
	}
	return NULL;
}

/* The regions of parameter p (its index in v) in state st: count, and the
 * first in *r. */
static size_t param_regions(const struct vps_rank_view *v, const struct vps_param *p, int st,
			    struct vps_region *r)
{
	size_t n = 0, idx = (size_t)(p - v->params);
	for (size_t i = 0; i < v->nregions; i++)
		if (v->region_param[i] == idx && v->regions[i].state == st && n++ == 0)
			*r = v->regions[i];
	return n;
}

static int64_t buffer_of(const struct vps_rank_view *v, const struct vps_param *p, int st)
{
	struct vps_region r;
	return param_regions(v, p, st, &r) ? v->buffers[r.buffer].elements : -1;
}

TEST(specs_select_the_family_and_format_back)
{
	struct vps_parallel p;
	char buf[128];
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "fsdp=4,tp=2", "t"));
	CHECK_EQ(p.family, VPS_FAMILY_DTENSOR);
	CHECK_EQ(p.dp_shard, 4);
	vps_parallel_format(&p, buf, sizeof(buf));
	CHECK(!strcmp(buf, "dp_shard=4,tp=2"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "dp_replicate=2,dp_shard=3,cp=2", "t"));
	vps_parallel_format(&p, buf, sizeof(buf));
	CHECK(!strcmp(buf, "dp_replicate=2,dp_shard=3,cp=2"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "tp=2,pp=2,family=dtensor", "t"));
	vps_parallel_format(&p, buf, sizeof(buf));
	CHECK(!strcmp(buf, "dp_shard=1,tp=2,pp=2"));
	CHECK(vps_parallel_parse(&p, "family=deepspeed", "t") == VPS_EINPUT);
	CHECK(!strcmp(vps_parallel_family_name(VPS_FAMILY_DTENSOR), "dtensor"));
}

TEST(megatron_keys_and_other_models_are_refused)
{
	struct vps_model m;
	struct vps_devices d;
	struct vps_layout *l = NULL;
	vps_devices_packed(&d, 8, 0);
	static const char *bad[][2] = {
		{"llama3-debug", "fsdp=2,zero=1"},      /* Megatron's distributed optimizer */
		{"llama3-debug", "dp=4,dp_shard=2"},    /* dp is dp_replicate x dp_shard */
		{"llama3-debug", "dp_shard=2,tp=32"},   /* tp must divide the kv heads */
		{"tiny-gpt", "dp_shard=2"},             /* LayerNorm, biases: not a torchtitan decoder */
		{"tiny-deepseek", "dp_shard=2"},        /* MLA: not laid out yet */
		{"tests/torch/models/qwen3-tiny.yaml", "dp_shard=2,pp=2"}, /* tied embeddings with PP: torchtitan refuses */
		{"llama3-debug", "dp_shard=2,ep=2"},    /* ep on a dense model */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct vps_parallel p;
		CHECK_OK(vps_model_load(&m, bad[i][0], CONFIGS "/models"));
		vps_parallel_init(&p);
		CHECK_OK(vps_parallel_parse(&p, bad[i][1], "t"));
		vps_result_t rc = vps_layout_new(&l, &m, &p, &d, "t");
		if (rc != VPS_EINPUT)
			harness_fail(__FILE__, __LINE__, "%s %s: accepted", bad[i][0], bad[i][1]);
		if (!rc)
			vps_layout_free(l);
		l = NULL;
	}
}

/* torch.chunk over 3: ceil(2048 / 3) = 683 rows, the last shard 682 and
 * FSDP2's storage padded to 683; a 256-wide norm: 86, 86, 84. */
TEST(fsdp_shards_are_torch_chunks_padded_to_the_first)
{
	struct vps_layout *l = test_layout("llama3-debug", "dp_shard=3", 8, 0);
	if (!l)
		return;
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 2, &v));
	const struct vps_param *emb = param_named(l, &v, "tok_embeddings.weight");
	const struct vps_param *norm = param_named(l, &v, "norm.weight");
	CHECK(emb && norm);
	if (emb && norm) {
		CHECK_EQ(emb->ndim, 2);
		CHECK_EQ(emb->shape[0], 682);
		CHECK_EQ(emb->elements, 683 * 256);
		CHECK_EQ(buffer_of(&v, emb, VPS_STATE_MAIN_PARAM), 683 * 256);
		CHECK_EQ(buffer_of(&v, emb, VPS_STATE_EXP_AVG), 682 * 256);
		struct vps_region r;
		CHECK_EQ(param_regions(&v, emb, VPS_STATE_EXP_AVG_SQ, &r), 1);
		CHECK_EQ(r.box.lo[0], 1366);
		CHECK_EQ(r.box.hi[0], 2048);
		CHECK_EQ(r.offset, 0);
		CHECK_EQ(norm->shape[0], 84);
		CHECK_EQ(buffer_of(&v, norm, VPS_STATE_MAIN_PARAM), 86);
		CHECK_OK(param_regions(&v, norm, VPS_STATE_MAIN_PARAM, &r) == 1 ? VPS_OK : VPS_ECHECK);
		CHECK_EQ(r.box.lo[0], 172);
		CHECK_EQ(r.box.hi[0], 256);
	}
	/* each local shard is its own buffer: a buffer per parameter and state */
	CHECK_EQ(v.nbuffers, 3 * v.nparams);
	CHECK_EQ(vps_layout_buffer_elements(l, 2, 0), 683 * 256);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* 6 experts over 4 FSDP shards: chunks of 2, 2, 2 and an empty fourth,
 * whose storage is still padded to 2 experts and whose Adam state is
 * empty. */
TEST(an_empty_fsdp_shard_holds_padding_only)
{
	struct vps_layout *l = test_layout(MOE_E6, "dp_shard=4", 8, 0);
	if (!l)
		return;
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 3, &v));
	const struct vps_param *w1 = param_named(l, &v, "layers.0.moe.routed_experts.inner_experts.w1_EFD");
	CHECK(w1 != NULL);
	if (w1) {
		struct vps_region r;
		CHECK_EQ(w1->shape[0], 0);
		CHECK_EQ(w1->elements, 2 * 32 * 64);
		CHECK_EQ(param_regions(&v, w1, VPS_STATE_MAIN_PARAM, &r), 0);
		CHECK_EQ(param_regions(&v, w1, VPS_STATE_EXP_AVG, &r), 0);
	}
	vps_rank_view_release(&v);
	/* rank 2 holds experts 4 and 5: each expert's fc1 half a region */
	CHECK_OK(vps_layout_rank(l, 2, &v));
	w1 = param_named(l, &v, "layers.0.moe.routed_experts.inner_experts.w1_EFD");
	if (w1) {
		struct vps_region r;
		CHECK_EQ(param_regions(&v, w1, VPS_STATE_MAIN_PARAM, &r), 2);
		CHECK_EQ(r.tensor, test_tensor_id(l, "decoder.layers.0.mlp.experts.local_experts.4.linear_fc1.weight"));
		CHECK_EQ(r.box.lo[0], 0);
		CHECK_EQ(r.box.hi[0], 1);
	}
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* HSDP: ranks r and r + dp_shard hold the same shard; the holders say so
 * as one progression. */
TEST(hsdp_replicas_hold_the_same_shard)
{
	struct vps_layout *l = test_layout("llama3-debug", "dp_replicate=2,dp_shard=2", 8, 0);
	if (!l)
		return;
	uint32_t qkv = test_tensor_id(l, "decoder.layers.3.self_attention.linear_qkv.weight");
	struct vps_holders h = {0};
	CHECK_OK(vps_layout_holders(l, qkv, VPS_STATE_EXP_AVG, NULL, &h));
	CHECK_EQ(h.n, 2);
	for (size_t i = 0; i < h.n; i++) {
		CHECK_EQ(h.v[i].count, 2);
		CHECK_EQ(h.v[i].stride, 2);
	}
	vps_holders_release(&h);
	CHECK_EQ(test_holder_set(l, qkv, VPS_STATE_MAIN_PARAM), 0xf);
	vps_layout_free(l);
}

/* TP 2: wqkv colwise (rows: kv groups 8..15 on tp rank 1), wo rowwise
 * (columns 128..255), norms replicated; w1 and w3 are the halves of
 * linear_fc1, each cut on its rows. */
TEST(tp_cuts_colwise_rows_and_rowwise_columns)
{
	struct vps_layout *l = test_layout("llama3-debug", "dp_shard=1,tp=2", 8, 0);
	if (!l)
		return;
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	struct vps_region r;
	const struct vps_param *qkv = param_named(l, &v, "layers.0.attention.qkv_linear.wqkv.weight");
	const struct vps_param *wo = param_named(l, &v, "layers.0.attention.wo.weight");
	const struct vps_param *w3 = param_named(l, &v, "layers.0.feed_forward.w3.weight");
	const struct vps_param *an = param_named(l, &v, "layers.0.attention_norm.weight");
	CHECK(qkv && wo && w3 && an);
	if (qkv && wo && w3 && an) {
		CHECK_EQ(param_regions(&v, qkv, VPS_STATE_MAIN_PARAM, &r), 1);
		CHECK_EQ(r.box.lo[0], 8); /* [groups 16, slots 3, head 16, hidden 256] */
		CHECK_EQ(r.box.hi[0], 16);
		CHECK_EQ(qkv->shape[0], 384);
		CHECK_EQ(param_regions(&v, wo, VPS_STATE_MAIN_PARAM, &r), 1);
		CHECK_EQ(r.box.lo[1], 128);
		CHECK_EQ(r.strides[0], 128);
		CHECK_EQ(param_regions(&v, w3, VPS_STATE_MAIN_PARAM, &r), 1);
		CHECK_EQ(r.box.lo[0], 1);
		CHECK_EQ(r.box.lo[1], 384);
		CHECK_EQ(r.box.hi[1], 768);
		CHECK_EQ(an->shape[0], 256);
	}
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* torchtitan's split counts the embedding and the output as a layer each:
 * 6 layers over 4 stages are tok + 1, 2, 2, 1 + norm and lm_head. */
TEST(pipeline_stages_follow_torchtitans_split)
{
	struct vps_layout *l = test_layout("llama3-debug", "dp_shard=1,pp=4", 8, 0);
	if (!l)
		return;
	static const char *first[] = {"tok_embeddings.weight", "layers.1.attention.qkv_linear.wqkv.weight",
				      "layers.3.attention.qkv_linear.wqkv.weight",
				      "layers.5.attention.qkv_linear.wqkv.weight"};
	static const int64_t nparams[] = {1 + 7, 14, 14, 7 + 2};
	for (int64_t s = 0; s < 4; s++) {
		struct vps_rank_view v;
		char name[128];
		CHECK_OK(vps_layout_rank(l, s, &v));
		CHECK_EQ(v.coords.pp, s);
		CHECK_EQ((int64_t)v.nparams, nparams[s]);
		vps_layout_param_name(l, &v.params[0], name, sizeof(name));
		if (strcmp(name, first[s]))
			harness_fail(__FILE__, __LINE__, "stage %ld starts with %s, not %s", (long)s, name, first[s]);
		vps_rank_view_release(&v);
	}
	vps_layout_free(l);
}

/* EP 2 over dp_shard 4: the sparse mesh (efsdp 2, ep 2), ep fastest;
 * rank 1 (ep 1, efsdp 0) holds experts 4 and 5 of each layer. */
TEST(expert_parallel_ranks_hold_their_experts)
{
	struct vps_layout *l = test_layout(MOE_E8, "dp_shard=4,ep=2", 8, 0);
	if (!l)
		return;
	struct vps_coords c;
	vps_layout_coords(l, 1, &c);
	CHECK_EQ(c.ep, 1);
	CHECK_EQ(c.edp, 0);
	CHECK_EQ(c.dp, 1);
	uint32_t e5 = test_tensor_id(l, "decoder.layers.1.mlp.experts.local_experts.5.linear_fc2.weight");
	CHECK_EQ(test_holder_set(l, e5, VPS_STATE_EXP_AVG), 1u << 1);
	uint32_t e2 = test_tensor_id(l, "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight");
	CHECK_EQ(test_holder_set(l, e2, VPS_STATE_EXP_AVG), 1u << 2);
	/* the router's expert_bias: whole on every rank */
	uint32_t bias = test_tensor_id(l, "decoder.layers.1.mlp.router.expert_bias");
	CHECK_EQ(test_holder_set(l, bias, VPS_STATE_MODULE), 0xf);
	vps_layout_free(l);
}

/* ---- holders against enumeration, and plans ---- */

TEST(holders_equal_enumeration_of_all_ranks)
{
	static const char *cases[][2] = {
		{"llama3-debug", "dp_shard=3"},
		{"llama3-debug", "dp_replicate=2,dp_shard=3,tp=2"},
		{"llama3-debug", "dp_shard=2,cp=2,tp=2,pp=2"},
		{"llama3-debug", "dp_shard=1,tp=4,pp=2,vpp=2"},
		{"tiny-qwen3-moe", "dp_shard=4,ep=2"},
		{"tiny-qwen3-moe", "dp_replicate=2,dp_shard=2,tp=2,ep=4,pp=2"},
		{"tiny-qwen3-moe", "dp_shard=3,tp=2"},
		{MOE_E6, "dp_shard=4"},
		{MOE_E6, "dp_shard=8"}, /* Shard(1): the FSDP mesh outnumbers the experts */
		{"tiny-llama", "dp_shard=5,tp=2"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		test_holders_match(cases[i][0], cases[i][1]);
}

/* A plan between two DTensor layouts moves every element, within the
 * lower bound (job_plan_exact), and a layout reads back from its file
 * with its hash. */
TEST(plans_between_dtensor_layouts_are_exact)
{
	static const char *cases[][3] = {
		{"llama3-debug", "dp_shard=4", "dp_shard=2,tp=2"},
		{"llama3-debug", "dp_shard=3", "dp_replicate=2,dp_shard=2"},
		{"llama3-debug", "dp_shard=2,tp=2", "dp_shard=1,tp=2,pp=2"},
		{"tiny-qwen3-moe", "dp_shard=4,ep=2", "dp_shard=2,tp=2"},
		{MOE_E6, "dp_shard=4", "dp_shard=3"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *a = test_layout(cases[i][0], cases[i][1], 8, 0);
		struct vps_layout *b = test_layout(cases[i][0], cases[i][2], 8, 0);
		struct vps_plan *p = NULL;
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		if (a && b)
			CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (p) {
			char what[256];
			snprintf(what, sizeof(what), "%s %s -> %s", cases[i][0], cases[i][1], cases[i][2]);
			job_plan_exact(p, what);
			vps_plan_free(p); /* and the layouts it owns */
		} else {
			vps_layout_free(a);
			vps_layout_free(b);
		}
	}
	struct vps_layout *l = test_layout("llama3-debug", "dp_replicate=2,dp_shard=2,tp=2", 8, 0);
	for (int yaml = 0; l && yaml < 2; yaml++) {
		struct vps_bytes out;
		struct vps_layout *back = NULL;
		int64_t ranks[] = {5};
		CHECK_OK(vps_layout_serialize(l, ranks, 1, yaml, &out));
		CHECK_OK(vps_layout_parse(&back, "a", out.data, out.len));
		if (back) {
			CHECK_EQ(vps_layout_parallel(back)->family, VPS_FAMILY_DTENSOR);
			CHECK_EQ(vps_layout_parallel(back)->dp_replicate, 2);
			CHECK(vps_layout_hash(back) == vps_layout_hash(l));
		}
		vps_layout_free(back);
		vps_bytes_release(&out);
	}
	vps_layout_free(l);
}

/* A Megatron layout and a DTensor one hold different states: no plan. */
TEST(no_plan_between_families)
{
	struct vps_layout *a = test_layout("llama3-debug", "dp=4,zero=1", 8, 0);
	struct vps_layout *b = test_layout("llama3-debug", "dp_shard=4", 8, 0);
	struct vps_plan *p = NULL;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	if (a && b)
		CHECK(vps_plan_compute(&p, a, b, &o) == VPS_EINPUT);
	vps_plan_free(p);
	vps_layout_free(a);
	vps_layout_free(b);
}
