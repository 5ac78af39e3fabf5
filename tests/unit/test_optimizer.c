/* The optimizer as part of the layout: which states each parameter has,
 * their dtypes and their sharding, as megatron-core 0.19.2 builds them
 * (make check-megatron checks every element against Megatron's own
 * optimizers; these cases are worked by hand), and plans that refuse to
 * drop or convert a state. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/io.h"
#include "vps/layout.h"
#include "vps/plan.h"

static const char *fc1 = "decoder.layers.0.mlp.linear_fc1.weight";
static const char *norm = "decoder.layers.0.mlp.linear_fc1.layer_norm_weight";
static const char *emb = "embedding.word_embeddings.weight";

static bool tensor_has(const struct vps_layout *l, const char *name, int state)
{
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(vps_layout_model(l), test_tensor_id(l, name), &t));
	return vps_layout_tensor_has_state(l, &t, state);
}

static int64_t held(const struct vps_layout *l, int64_t rank, const char *name, int state, int64_t *first)
{
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, rank, &v));
	int64_t n = test_view_held(&v, test_tensor_id(l, name), state, first);
	vps_rank_view_release(&v);
	return n;
}

/* The buffer of a rank view holding (state, chunk 0, dense, layerwise), or NULL. */
static const struct vps_buffer *buffer_of(const struct vps_rank_view *v, int state, bool layerwise)
{
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i].state == state && v->buffers[i].chunk == 0 && !v->buffers[i].expert &&
		    v->buffers[i].layerwise == layerwise)
			return &v->buffers[i];
	return NULL;
}

/* Adam in fp32 is the layout it was before the optimizer became part of it:
 * the same hash (the one vps-layout printed before, which registries and
 * plans name it by), the same states, the same text. */
TEST(adam_layouts_keep_their_hash_and_states)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,dp=2,zero=1", 8, 0);
	struct vps_layout *same = test_layout("tiny-llama", "tp=2,dp=2,zero=1,optimizer=adam,scalar=adam,exp_avg=fp32", 8, 0);
	if (!l || !same)
		goto out;
	CHECK_EQ(vps_layout_hash(l), 0x91d375860c695369ull);
	CHECK_EQ(vps_layout_hash(same), vps_layout_hash(l));
	CHECK_EQ(vps_layout_nstates(l), 4);
	CHECK(!vps_layout_has_state(l, VPS_STATE_MOMENTUM));
	char spec[256];
	vps_parallel_format(vps_layout_parallel(same), spec, sizeof(spec));
	CHECK(!strcmp(spec, "tp=2,pp=1,dp=2,ep=1,etp=2,vpp=1,zero=1"));
out:
	vps_layout_free(l);
	vps_layout_free(same);
}

/* SGD with momentum runs without the distributed optimizer: every DP rank
 * holds the fp32 main params and torch's momentum_buffer whole, laid out
 * like the param buffer; no Adam moment. */
TEST(sgd_keeps_main_params_and_momentum_whole)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,dp=2,optimizer=sgd", 8, 0);
	if (!l)
		return;
	CHECK(vps_layout_has_state(l, VPS_STATE_MOMENTUM));
	CHECK(!vps_layout_has_state(l, VPS_STATE_EXP_AVG));
	CHECK(!vps_layout_has_state(l, VPS_STATE_EXP_AVG_SQ));
	CHECK(tensor_has(l, norm, VPS_STATE_MOMENTUM));
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 3, &v));
	CHECK_EQ(v.nbuffers, 3);
	const struct vps_buffer *p = buffer_of(&v, VPS_STATE_PARAM, false), *m = buffer_of(&v, VPS_STATE_MOMENTUM, false);
	CHECK(p && m);
	if (p && m) {
		CHECK_EQ(m->elements, p->elements);
		CHECK(!m->sharded);
		CHECK_EQ(m->dtype, VPS_DTYPE_FP32);
	}
	int64_t a, b;
	CHECK_EQ(held(l, 3, fc1, VPS_STATE_MOMENTUM, &a), held(l, 3, fc1, VPS_STATE_PARAM, &b));
	CHECK_EQ(a, b);
	/* every rank holds its TP slice whole, and none another's */
	CHECK_EQ(test_holder_set(l, test_tensor_id(l, fc1), VPS_STATE_MOMENTUM), 0xf);
	struct vps_holders h = {0};
	CHECK_OK(vps_layout_holders(l, test_tensor_id(l, fc1), VPS_STATE_MOMENTUM, NULL, &h));
	CHECK_EQ(h.n, 2);
	for (size_t i = 0; i < h.n; i++) {
		CHECK_EQ(h.v[i].count, 2);
		CHECK_EQ(h.v[i].stride, 2);
	}
	vps_holders_release(&h);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

static void refused(const char *spec, const char *why)
{
	struct vps_model m;
	struct vps_parallel p;
	CHECK_OK(vps_model_load(&m, "tiny-qwen3-moe", CONFIGS "/models"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, spec, "--parallel"));
	vps_result_t rc = vps_parallel_validate(&p, &m, "--parallel");
	CHECK_EQ(rc, VPS_EINPUT);
	if (!strstr(vps_last_error(), why))
		harness_fail(__FILE__, __LINE__, "%s: '%s' does not say '%s'", spec, vps_last_error(), why);
}

/* What megatron-core refuses to build, refused with its rule. */
TEST(configurations_megatron_refuses_are_refused_with_the_rule)
{
	refused("dp=2,zero=1,optimizer=sgd", "init_state_fn");
	refused("dp=2,zero=1,exp_avg=bf16", "need precision_aware=1");
	refused("dp=2,zero=0,precision_aware=1", "needs optimizer=adam and zero=1");
	refused("dp=2,zero=1,optimizer=muon,precision_aware=1", "needs optimizer=adam and zero=1");
	refused("dp=2,zero=1,optimizer=lion,scalar=lion", "applies to optimizer=muon");
	struct vps_parallel p;
	vps_parallel_init(&p);
	CHECK_EQ(vps_parallel_parse(&p, "optimizer=adamw", "--parallel"), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "unknown optimizer 'adamw' (adam, sgd, muon, lion)") != NULL);
	CHECK_EQ(vps_parallel_parse(&p, "exp_avg=fp8", "--parallel"), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "exp_avg=fp8: expected fp32 or bf16") != NULL);
}

/* The precision-aware optimizer: TransformerEngine's FusedAdam keeps the
 * main params' low 16 bits (int16) and the moments in the dtypes asked for;
 * the sharding is the distributed optimizer's, unchanged. */
TEST(precision_aware_states_are_16_bits)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=2,zero=1", 8, 0);
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,dp=2,zero=1,precision_aware=1,exp_avg_sq=bf16", 8, 0);
	if (!a || !l)
		goto out;
	CHECK_EQ(vps_layout_state_dtype(l, VPS_STATE_PARAM), VPS_DTYPE_BF16);
	CHECK_EQ(vps_layout_state_dtype(l, VPS_STATE_MAIN_PARAM), VPS_DTYPE_INT16);
	CHECK_EQ(vps_layout_state_dtype(l, VPS_STATE_EXP_AVG), VPS_DTYPE_FP32);
	CHECK_EQ(vps_layout_state_dtype(l, VPS_STATE_EXP_AVG_SQ), VPS_DTYPE_BF16);
	CHECK(vps_layout_hash(l) != vps_layout_hash(a));
	struct vps_rank_view v, w;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	CHECK_OK(vps_layout_rank(a, 1, &w));
	CHECK_EQ(v.nbuffers, w.nbuffers);
	CHECK_EQ(v.nregions, w.nregions);
	for (size_t i = 0; i < v.nbuffers && i < w.nbuffers; i++) {
		CHECK_EQ(v.buffers[i].elements, w.buffers[i].elements);
		CHECK_EQ(v.buffers[i].dtype, vps_layout_state_dtype(l, v.buffers[i].state));
	}
	for (size_t i = 0; i < v.nregions && i < w.nregions; i++) {
		CHECK_EQ(v.regions[i].offset, w.regions[i].offset);
		CHECK_EQ(vps_region_dtype(&v.regions[i]), v.buffers[v.regions[i].buffer].dtype);
	}
	/* 2 + 2 + 4 + 2 bytes where Adam in fp32 holds 2 + 4 + 4 + 4 */
	struct vps_layout_stats s, t;
	CHECK_OK(vps_layout_stats(l, &s));
	CHECK_OK(vps_layout_stats(a, &t));
	CHECK_EQ(s.logical_bytes * 14, t.logical_bytes * 10);
	vps_rank_view_release(&v);
	vps_rank_view_release(&w);
out:
	vps_layout_free(a);
	vps_layout_free(l);
}

/* Muon with zero=1 is Megatron's layer-wise optimizer. tiny-llama (hidden
 * 256, 8 layers, GQA 8/4 heads of 32, ffn 688, vocabulary 1000 padded to
 * 1024) at dp 2: the 2-D weights of a layer are linear_proj 65536,
 * linear_qkv 512 x 256 = 131072, linear_fc1 1376 x 256 = 352256 and
 * linear_fc2 176128 elements. Walked from the last layer's linear_fc2 back,
 * sorted largest first (ties keep the walk's order) and each put on the
 * less loaded of two shards (the lower on a tie), layer 7's matrices go to
 * shard 0, layer 6's to shard 1, and so on: each shard is 4 x 724992 =
 * 2899968 elements, a multiple of lcm(64, lcm(2, 128) / 2) = 64, and the
 * bucket 5799936. Shard 0: layer 7's fc1 at 0, layer 5's at 352256, ...,
 * layer 1's at 1056768, then layer 7's fc2 at 1409024. The rest
 * (embeddings, output layer, norms) is Adam's under ZeRO-1: 262144 +
 * 256 + 16 x 256 + 262144 = 528640 elements. */
TEST(muon_owns_each_matrix_whole_on_one_dp_rank)
{
	struct vps_layout *l = test_layout("tiny-llama", "dp=2,zero=1,optimizer=muon", 8, 0);
	if (!l)
		return;
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 0, &v));
	const struct vps_buffer *lw = buffer_of(&v, VPS_STATE_PARAM, true), *rest = buffer_of(&v, VPS_STATE_PARAM, false);
	const struct vps_buffer *mom = buffer_of(&v, VPS_STATE_MOMENTUM, true), *sq = buffer_of(&v, VPS_STATE_EXP_AVG_SQ, false);
	CHECK(lw && rest && mom && sq && !buffer_of(&v, VPS_STATE_EXP_AVG, true) && !buffer_of(&v, VPS_STATE_MOMENTUM, false));
	if (lw && rest && mom && sq) {
		CHECK_EQ(lw->elements, 5799936);
		CHECK_EQ(mom->elements, 2899968);
		CHECK(mom->sharded && mom->layerwise);
		CHECK_EQ(rest->elements, 528640);
		CHECK_EQ(sq->elements, 264320);
	}
	vps_rank_view_release(&v);
	int64_t at;
	const char *l7 = "decoder.layers.7.mlp.linear_fc1.weight", *l5 = "decoder.layers.5.mlp.linear_fc1.weight",
		   *l6 = "decoder.layers.6.mlp.linear_fc1.weight", *f7 = "decoder.layers.7.mlp.linear_fc2.weight";
	CHECK_EQ(held(l, 0, l7, VPS_STATE_PARAM, &at), 352256);
	CHECK_EQ(at, 0);
	CHECK_EQ(held(l, 0, l7, VPS_STATE_MOMENTUM, &at), 352256);
	CHECK_EQ(at, 0);
	CHECK_EQ(held(l, 0, l5, VPS_STATE_MAIN_PARAM, &at), 352256);
	CHECK_EQ(at, 352256);
	CHECK_EQ(held(l, 0, f7, VPS_STATE_MOMENTUM, &at), 176128);
	CHECK_EQ(at, 1409024);
	/* layer 6's is rank 1's, at the start of its shard and of shard 1 */
	CHECK_EQ(held(l, 0, l6, VPS_STATE_MOMENTUM, &at), 0);
	CHECK_EQ(held(l, 1, l6, VPS_STATE_MOMENTUM, &at), 352256);
	CHECK_EQ(at, 0);
	CHECK_EQ(held(l, 1, l6, VPS_STATE_PARAM, &at), 352256);
	CHECK_EQ(at, 2899968);
	CHECK_EQ(test_holder_set(l, test_tensor_id(l, l6), VPS_STATE_MAIN_PARAM), 0x2);
	/* Adam takes the rest under ZeRO-1 ranges: the word embeddings,
	 * registered first, end the buffer, in rank 1's half (from 264320) */
	CHECK(tensor_has(l, emb, VPS_STATE_EXP_AVG_SQ) && !tensor_has(l, emb, VPS_STATE_MOMENTUM));
	CHECK(tensor_has(l, l7, VPS_STATE_MOMENTUM) && !tensor_has(l, l7, VPS_STATE_EXP_AVG));
	CHECK_EQ(test_holder_set(l, test_tensor_id(l, emb), VPS_STATE_EXP_AVG), 0x2);
	CHECK_EQ(held(l, 1, emb, VPS_STATE_EXP_AVG, &at), 1000 * 256); /* the padding rows are no state */
	CHECK_EQ(at, 528640 - 262144 - 264320);
	vps_layout_free(l);
}

/* Lion's one state; as Muon's scalar optimizer it takes what Muon leaves;
 * learned position embeddings are a matrix (LanguageModule marks only the
 * word embeddings and the output layer); a dp_cp group of one shards
 * nothing, though expert DP is 2 (LayerWiseDistributedOptimizer.shard_params). */
TEST(lion_and_muon_take_the_states_of_their_tensors)
{
	struct vps_layout *lion = test_layout("tiny-gpt", "dp=2,zero=1,optimizer=lion", 8, 0);
	struct vps_layout *ml = test_layout("tiny-gpt", "dp=2,zero=1,optimizer=muon,scalar=lion", 8, 0);
	struct vps_layout *one = test_layout("tiny-qwen3-moe", "tp=2,etp=1,zero=1,optimizer=muon", 8, 0);
	if (!lion || !ml || !one)
		goto out;
	const char *pos = "embedding.position_embeddings.weight";
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(vps_layout_model(lion), test_tensor_id(lion, pos), &t));
	CHECK(vps_layout_tensor_matrix(lion, &t));
	CHECK_EQ(vps_layout_tensor_optimizer(lion, &t), VPS_OPT_LION);
	CHECK_OK(vps_model_tensor(vps_layout_model(lion), test_tensor_id(lion, emb), &t));
	CHECK_EQ(vps_layout_tensor_optimizer(lion, &t), VPS_OPT_ADAM);
	CHECK_EQ(vps_layout_tensor_optimizer(ml, &t), VPS_OPT_LION);
	CHECK(tensor_has(lion, pos, VPS_STATE_EXP_AVG) && !tensor_has(lion, pos, VPS_STATE_EXP_AVG_SQ));
	CHECK(tensor_has(lion, emb, VPS_STATE_EXP_AVG_SQ));
	CHECK(!vps_layout_has_state(ml, VPS_STATE_EXP_AVG_SQ));
	CHECK(vps_layout_has_state(ml, VPS_STATE_MOMENTUM) && vps_layout_has_state(ml, VPS_STATE_EXP_AVG));
	const char *e0 = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight";
	int64_t a, b;
	CHECK_EQ(held(one, 0, e0, VPS_STATE_MOMENTUM, &a), held(one, 0, e0, VPS_STATE_PARAM, &b));
	CHECK_EQ(test_holder_set(one, test_tensor_id(one, e0), VPS_STATE_MOMENTUM), 0x3);
out:
	vps_layout_free(lion);
	vps_layout_free(ml);
	vps_layout_free(one);
}

static void plan_refused(const char *model, const char *from, const char *to, const char *why)
{
	struct vps_layout *a = test_layout(model, from, 8, 0), *b = test_layout(model, to, 8, 0);
	struct vps_plan *p = NULL;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	if (a && b) {
		CHECK_EQ(vps_plan_compute(&p, a, b, &o), VPS_EINPUT);
		if (!strstr(vps_last_error(), why))
			harness_fail(__FILE__, __LINE__, "%s -> %s: '%s' does not say '%s'", from, to, vps_last_error(), why);
	}
	vps_layout_free(a);
	vps_layout_free(b);
}

/* A plan moves each state once: a state one optimizer has and the other
 * has not is refused with the reason, never dropped; so is a dtype that
 * differs, and a switch between two optimizers of the same states. */
TEST(plans_between_optimizers_are_refused)
{
	plan_refused("tiny-llama", "dp=2,zero=1", "dp=2,zero=1,optimizer=muon",
		     "steps the 2-D weights with adam, the target with muon: the source holds exp_avg, which the target "
		     "has not; vps moves each state once and drops none (switching optimizers is out of scope)");
	plan_refused("tiny-llama", "dp=2,zero=1,optimizer=muon", "dp=2,zero=1,optimizer=muon,scalar=lion",
		     "the source holds exp_avg_sq");
	plan_refused("tiny-llama", "dp=2,optimizer=sgd", "dp=2,optimizer=muon",
		     "their momentum_buffer is not the same state");
	plan_refused("tiny-llama", "dp=2,zero=1", "dp=2,zero=1,precision_aware=1",
		     "the source holds main_param as fp32, the target as int16");
	plan_refused("tiny-llama", "dp=2,zero=1", "dp=2,zero=1,grad=1", "grad=1 must be set in both layouts");
}

/* Each (model, A, B): the plan from A to B, applied in memory, moves every
 * element right and nothing resident. */
static void plans_exact(const char *const (*cases)[3], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct vps_layout *a = test_layout(cases[i][0], cases[i][1], 8, 0);
		struct vps_layout *b = test_layout(cases[i][0], cases[i][2], 8, 0);
		struct vps_plan *p = NULL;
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		if (!a || !b || vps_plan_compute(&p, a, b, &o)) {
			harness_fail(__FILE__, __LINE__, "%s -> %s: %s", cases[i][1], cases[i][2], vps_last_error());
			vps_layout_free(a);
			vps_layout_free(b);
			continue;
		}
		job_plan_exact(p, cases[i][2]);
		vps_plan_free(p);
	}
}

/* Between layouts of one optimizer every state moves, element for element:
 * the layer-wise optimizer's shards to another DP size and to Muon without
 * the distributed optimizer, SGD over a new TP, the precision-aware
 * optimizer's 16-bit states. */
TEST(plans_of_one_optimizer_move_every_state)
{
	static const char *cases[][3] = {
		{"tiny-llama", "dp=2,zero=1,optimizer=muon", "tp=2,dp=2,zero=1,optimizer=muon"},
		{"tiny-llama", "tp=2,dp=2,zero=1,optimizer=muon,scalar=lion", "dp=4,zero=0,optimizer=muon,scalar=lion"},
		{"tiny-gpt", "pp=2,dp=2,zero=1,optimizer=lion", "tp=2,dp=2,zero=1,optimizer=lion,bucket=100000"},
		{"tiny-qwen3-moe", "ep=2,dp=2,zero=1,optimizer=muon", "tp=2,etp=1,zero=1,optimizer=muon"},
		{"tiny-llama", "tp=2,dp=2,optimizer=sgd,grad=1", "pp=2,dp=2,optimizer=sgd,grad=1"},
		{"tiny-llama", "dp=4,zero=1,precision_aware=1,exp_avg=bf16,exp_avg_sq=bf16",
		 "tp=2,dp=2,zero=1,precision_aware=1,exp_avg=bf16,exp_avg_sq=bf16"},
	};
	plans_exact(cases, sizeof(cases) / sizeof(cases[0]));
}

/* A layout of Muon's written and read back, YAML and binary: the keys come
 * back and so does the hash; an explicit rank keeps its layer-wise buffers. */
TEST(optimizer_keys_survive_the_formats)
{
	struct vps_layout *l = test_layout("tiny-llama", "dp=2,zero=1,optimizer=muon,scalar=lion", 8, 0);
	if (!l)
		return;
	int64_t rank = 1;
	for (int yaml = 0; yaml < 2; yaml++) {
		struct vps_bytes out = {0};
		struct vps_layout *back = NULL;
		CHECK_OK(vps_layout_serialize(l, &rank, 1, yaml, &out));
		CHECK_OK(vps_layout_parse(&back, "mem", out.data, out.len));
		if (back) {
			const struct vps_parallel *p = vps_layout_parallel(back);
			CHECK_EQ(p->optimizer, VPS_OPT_MUON);
			CHECK_EQ(p->scalar_optimizer, VPS_OPT_LION);
			CHECK_EQ(vps_layout_hash(back), vps_layout_hash(l));
			struct vps_rank_view v;
			CHECK_OK(vps_layout_rank(back, 1, &v));
			CHECK(buffer_of(&v, VPS_STATE_MOMENTUM, true) != NULL);
			vps_rank_view_release(&v);
		}
		vps_layout_free(back);
		vps_bytes_release(&out);
	}
	vps_layout_free(l);
}

/* ---- offload=F: Megatron's HybridDeviceOptimizer ---- */

/* One rank's elements of an optimizer state: in its host buffers, in all
 * its buffers of that state, and the largest part of one parameter in a
 * host buffer. */
struct host_part {
	int64_t host, all, largest;
	bool vector_on_host;
};

static struct host_part host_part(const struct vps_layout *l, const struct vps_rank_view *v, int state)
{
	struct host_part hp = {0};
	const struct vps_model *m = vps_layout_model(l);
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *r = &v->regions[i];
		if (r->state != state)
			continue;
		int64_t n = vps_box_volume(&r->box);
		hp.all += n;
		if (!v->buffers[r->buffer].host)
			continue;
		hp.host += n;
		struct vps_tensor t;
		CHECK_OK(vps_model_tensor(m, r->tensor, &t));
		hp.vector_on_host |= t.ndim == 1;
		int64_t part = 0;
		for (size_t j = 0; j < v->nregions; j++)
			if (v->region_param[j] == v->region_param[i] && v->regions[j].state == state &&
			    v->buffers[v->regions[j].buffer].host)
				part += vps_box_volume(&v->regions[j].box);
		hp.largest = part > hp.largest ? part : hp.largest;
	}
	return hp;
}

/* Each shard's optimizer states split as the hybrid optimizer splits them:
 * the host buffers hold the first parameters' parts, matrices before
 * vectors, until F of the shard's elements are there (the last part that
 * crosses F whole); host and GPU buffers add up to the shard buffer of the
 * layout without offload, the host one packed; vps_layout_buffer_elements
 * says the same as the view; the parameters stay on the GPU. */
TEST(offload_splits_each_shard_as_the_hybrid_optimizer_does)
{
	static const char *specs[] = {"tp=2,dp=2,zero=1,offload=0.05", "tp=2,dp=2,zero=1,offload=0.5",
				      "tp=2,dp=2,zero=1,offload=1"};
	static const double fraction[] = {0.05, 0.5, 1};
	struct vps_layout *plain = test_layout("tiny-llama", "tp=2,dp=2,zero=1", 8, 0);
	for (size_t c = 0; plain && c < sizeof(specs) / sizeof(specs[0]); c++) {
		struct vps_layout *l = test_layout("tiny-llama", specs[c], 8, 0);
		if (!l)
			continue;
		for (int64_t r = 0; r < vps_layout_world(l); r++) {
			struct vps_rank_view v, pv;
			CHECK_OK(vps_layout_rank(l, r, &v));
			CHECK_OK(vps_layout_rank(plain, r, &pv));
			for (int st = VPS_STATE_MAIN_PARAM; st <= VPS_STATE_EXP_AVG_SQ; st++) {
				/* a host buffer also holds the vocabulary padding of the
				 * embedding's part, which no region covers */
				struct host_part hp = host_part(l, &v, st);
				const struct vps_buffer *gpu = buffer_of(&v, st, false), *whole = buffer_of(&pv, st, false);
				int64_t host_el = 0;
				for (size_t b = 0; b < v.nbuffers; b++)
					if (v.buffers[b].host && v.buffers[b].state == st)
						host_el += v.buffers[b].elements;
				CHECK(host_el >= hp.host && host_el >= fraction[c] * (double)hp.all);
				CHECK(gpu && whole && gpu->elements + host_el == whole->elements);
				if (gpu)
					CHECK(hp.host - hp.largest < fraction[c] * (double)(gpu->elements + host_el));
				CHECK(c == 2 || !hp.vector_on_host);
				CHECK_EQ(hp.all, host_part(plain, &pv, st).all);
			}
			CHECK_EQ(host_part(l, &v, VPS_STATE_PARAM).host, 0);
			for (size_t b = 0; b < v.nbuffers; b++)
				CHECK_EQ(vps_layout_buffer_elements(l, r, (uint32_t)b), v.buffers[b].elements);
			vps_rank_view_release(&v);
			vps_rank_view_release(&pv);
		}
		vps_layout_free(l);
	}
	vps_layout_free(plain);
}

/* Plans between offloaded layouts, and between one and the same layout
 * without offload, move every element and nothing resident. */
TEST(plans_move_offloaded_states)
{
	static const char *cases[][3] = {
		{"tiny-llama", "tp=2,dp=2,zero=1,offload=0.5", "dp=4,zero=1,offload=0.5"},
		{"tiny-llama", "tp=2,dp=2,zero=1,offload=0.5", "tp=2,dp=2,zero=1"},
		{"tiny-qwen3-moe", "ep=2,dp=2,zero=1,offload=0.3", "tp=2,etp=1,pp=2,zero=1,offload=1"},
	};
	plans_exact(cases, sizeof(cases) / sizeof(cases[0]));
}

/* offload survives both encodings, with the hash and an explicit rank's
 * host buffers; what Megatron cannot build is refused with its rule. */
TEST(offload_survives_the_formats_and_is_refused_where_megatron_refuses_it)
{
	struct vps_layout *l = test_layout("tiny-llama", "dp=2,zero=1,offload=0.3,precision_aware=1", 8, 0);
	if (l) {
		char spec[256];
		vps_parallel_format(vps_layout_parallel(l), spec, sizeof(spec));
		CHECK(!strcmp(spec, "tp=1,pp=1,dp=2,ep=1,etp=1,vpp=1,zero=1,offload=0.3"));
		int64_t rank = 1;
		for (int yaml = 0; yaml < 2; yaml++) {
			struct vps_bytes out = {0};
			struct vps_layout *back = NULL;
			CHECK_OK(vps_layout_serialize(l, &rank, 1, yaml, &out));
			CHECK_OK(vps_layout_parse(&back, "mem", out.data, out.len));
			if (back) {
				CHECK(vps_layout_parallel(back)->offload == 0.3);
				CHECK_EQ(vps_layout_hash(back), vps_layout_hash(l));
				struct vps_rank_view v;
				CHECK_OK(vps_layout_rank(back, 1, &v));
				CHECK(host_part(back, &v, VPS_STATE_EXP_AVG).host > 0);
				vps_rank_view_release(&v);
			}
			vps_layout_free(back);
			vps_bytes_release(&out);
		}
	}
	vps_layout_free(l);
	refused("dp=2,zero=0,offload=0.5", "offload needs optimizer=adam and zero=1");
	refused("dp=2,zero=1,optimizer=muon,offload=0.5", "offload needs optimizer=adam and zero=1");
	refused("dp=2,zero=1,offload=0.5,precision_aware=1,exp_avg=bf16", "offload keeps every state in fp32");
	struct vps_parallel p;
	vps_parallel_init(&p);
	CHECK_EQ(vps_parallel_parse(&p, "offload=1.5", "--parallel"), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "offload=1.5: expected a fraction in [0, 1]") != NULL);
	CHECK_EQ(vps_parallel_parse(&p, "offload=nan", "--parallel"), VPS_EINPUT);
}
