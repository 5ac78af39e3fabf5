/* Context parallelism: Megatron-LM's rules (core v0.15, parallel_state.py
 * initialize_model_parallel and generate_masked_orthogonal_rank_groups;
 * distributed_data_parallel.py DistributedDataParallel.__init__;
 * distrib_optimizer.py DistributedOptimizer._build_model_gbuf_range) on
 * cases computed by hand. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/io.h"
#include "vps/layout.h"

/* Order tp-cp-ep-dp-pp, first fastest: rank = tp + TP*(cp + CP*(dp + DP*pp)).
 * The expert generator is the same order with cp = 1 over the same world:
 * rank = etp + ETP*(ep + EP*(edp + EDP*pp)), EDP = world / (ETP*EP*PP). */
TEST(rank_order_is_tp_cp_dp_pp_and_round_trips)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,cp=2,dp=2,pp=2", 8, 0);
	if (!l)
		return;
	CHECK_EQ(vps_layout_world(l), 16);
	struct vps_coords c;
	vps_layout_coords(l, 13, &c); /* 13 = tp 1 + 2 * (cp 0 + 2 * (dp 1 + 2 * pp 1)) */
	CHECK_EQ(c.tp, 1);
	CHECK_EQ(c.cp, 0);
	CHECK_EQ(c.dp, 1);
	CHECK_EQ(c.pp, 1);
	vps_layout_coords(l, 2, &c);
	CHECK_EQ(c.tp, 0);
	CHECK_EQ(c.cp, 1);
	CHECK_EQ(c.dp, 0);
	CHECK_EQ(c.pp, 0);
	for (int64_t r = 0; r < 16; r++) {
		vps_layout_coords(l, r, &c);
		CHECK(c.tp < 2 && c.cp < 2 && c.dp < 2 && c.pp < 2);
		CHECK_EQ(c.tp + 2 * (c.cp + 2 * (c.dp + 2 * c.pp)), r);
	}
	vps_layout_free(l);

	/* MoE, tp 2, cp 2, dp 2, ep 4, etp 1: EDP = 8 / 4 = 2, so expert data
	 * parallelism spans CP and DP; Megatron's expert 'dp' groups are
	 * [0, 4], [1, 5], [2, 6], [3, 7] */
	l = test_layout("tiny-qwen3-moe", "tp=2,cp=2,dp=2,ep=4,etp=1", 8, 0);
	if (!l)
		return;
	vps_layout_coords(l, 5, &c);
	CHECK_EQ(c.tp, 1);
	CHECK_EQ(c.cp, 0);
	CHECK_EQ(c.dp, 1);
	CHECK_EQ(c.etp, 0);
	CHECK_EQ(c.ep, 1);
	CHECK_EQ(c.edp, 1);
	for (int64_t r = 0; r < 8; r++) {
		vps_layout_coords(l, r, &c);
		CHECK_EQ(c.etp + 1 * (c.ep + 4 * c.edp), r);
		CHECK_EQ(c.tp + 2 * (c.cp + 2 * c.dp), r);
	}
	vps_layout_free(l);
}

/* tiny-llama at tp 2, cp 2, dp 2, ZeRO-1, one stage: the dense buffer of a
 * TP rank is 8 layers of 32768 (linear_proj) + 256 + 65536 (linear_qkv) +
 * 256 + 176128 (linear_fc1) + 88064 (linear_fc2) = 363008, plus 131072 each
 * for the embedding and output_layer (1024 padded rows / 2 x 256) and 256
 * for the final norm: 3166464, a multiple of lcm(4, 128), so no end padding.
 * It is sharded over the dp_cp group (4 ranks): 791616 elements each.
 * Megatron lists the group's ranks with cp varying fastest (get_ranks
 * ('dp-cp') masks [cp, dp] in the order tp-cp-ep-dp-pp), and a rank's shard
 * is its place in that list: TP rank 0's group is [0, 2, 4, 6], so rank 2
 * (cp 1, dp 0) holds shard 1 and rank 4 (cp 0, dp 1) shard 2.
 * Layer 6's linear_qkv.weight sits at 758784 (reverse registration order:
 * output_layer, final norm, layer 7's six params, layer 6's fc2, fc1,
 * fc1 norm) for 65536 elements, across the boundary of shards 0 and 1 at
 * 791616: 32832 elements in shard 0, 32704 in shard 1. */
TEST(zero1_shards_dense_buffers_over_the_dp_cp_group_in_megatrons_order)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,cp=2,dp=2,zero=1", 8, 0);
	if (!l)
		return;
	uint32_t qkv = test_tensor_id(l, "decoder.layers.6.self_attention.linear_qkv.weight");
	int64_t want[8] = {32832, 32832, 32704, 32704, 0, 0, 0, 0};
	int64_t want_at[8] = {758784, 758784, 0, 0, -1, -1, -1, -1};
	for (int64_t r = 0; r < 8; r++) {
		struct vps_rank_view v;
		CHECK_OK(vps_layout_rank(l, r, &v));
		CHECK_EQ(v.buffers[0].elements, 3166464);
		CHECK_EQ(v.buffers[1].elements, 791616);
		CHECK(v.buffers[1].sharded);
		int64_t first;
		CHECK_EQ(test_view_held(&v, qkv, VPS_STATE_MAIN_PARAM, &first), want[r]);
		CHECK_EQ(first, want_at[r]);
		CHECK_EQ(test_view_held(&v, qkv, VPS_STATE_EXP_AVG_SQ, &first), want[r]);
		/* the bf16 parameter is whole on every CP and DP replica */
		CHECK_EQ(test_view_held(&v, qkv, VPS_STATE_PARAM, &first), 65536);
		CHECK_EQ(first, 758784);
		vps_rank_view_release(&v);
	}
	/* the holders say the same without enumerating: the param of TP rank 0
	 * on ranks 0, 2, 4, 6; the master shard on ranks 0 and 2 */
	CHECK_EQ(test_holder_set(l, qkv, VPS_STATE_PARAM), 0xffu);
	CHECK_EQ(test_holder_set(l, qkv, VPS_STATE_MAIN_PARAM), 0x0fu);
	struct vps_holders h = {0};
	CHECK_OK(vps_layout_holders(l, qkv, VPS_STATE_PARAM, NULL, &h));
	CHECK_EQ(h.n, 2);
	for (size_t i = 0; i < h.n; i++) {
		CHECK_EQ(h.v[i].stride, 2);
		CHECK_EQ(h.v[i].count, 4);
	}
	vps_holders_release(&h);
	vps_layout_free(l);
}

/* With cp 3 the dp_cp group has 3 ranks: each bucket ends on a multiple of
 * lcm(3, 128) = 384 (param_and_grad_buffer.py, _ParamAndGradBuffer: the
 * data-parallel group it is given is the dp_cp one) and the shard is a
 * third. */
TEST(bucket_padding_and_shard_size_follow_the_dp_cp_group)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=1,cp=3,dp=1,zero=1", 8, 0);
	if (!l)
		return;
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	CHECK_EQ(v.buffers[0].elements % 384, 0);
	CHECK_EQ(v.buffers[1].elements * 3, v.buffers[0].elements);
	CHECK_EQ(v.coords.cp, 1);
	CHECK_EQ(v.coords.dp, 0);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* bucket=auto is the training path's size, max(40,000,000, 1,000,000 x the
 * dp_cp group's size) (megatron/training/training.py,
 * resolve_ddp_bucket_size, core_v0.19.0): with dp 32 and cp 2 that is
 * 64,000,000 elements, not the 40,000,000 that DP alone gives. LLaMA-2 7B's
 * buffer is large enough for the two to cut different buckets. */
TEST(bucket_auto_is_the_training_paths_size_over_dp_times_cp)
{
	struct vps_layout *a = test_layout("llama2-7b", "dp=32,cp=2,zero=1,bucket=auto", 8, 0);
	struct vps_layout *dpcp = test_layout("llama2-7b", "dp=32,cp=2,zero=1,bucket=64000000", 8, 0);
	struct vps_layout *dp = test_layout("llama2-7b", "dp=32,cp=2,zero=1,bucket=40000000", 8, 0);
	if (!a || !dpcp || !dp)
		goto out;
	struct vps_rank_view va, vdpcp, vdp;
	CHECK_OK(vps_layout_rank(a, 0, &va));
	CHECK_OK(vps_layout_rank(dpcp, 0, &vdpcp));
	CHECK_OK(vps_layout_rank(dp, 0, &vdp));
	CHECK_EQ(va.nparams, vdpcp.nparams);
	CHECK_EQ(va.nparams, vdp.nparams);
	size_t differ = 0;
	for (size_t i = 0; i < va.nparams && i < vdpcp.nparams && i < vdp.nparams; i++) {
		CHECK_EQ(va.params[i].bucket, vdpcp.params[i].bucket);
		CHECK_EQ(va.params[i].offset, vdpcp.params[i].offset);
		differ += va.params[i].bucket != vdp.params[i].bucket;
	}
	CHECK(differ > 0);
	CHECK_EQ(va.buffers[0].elements, vdpcp.buffers[0].elements);
	vps_rank_view_release(&va);
	vps_rank_view_release(&vdpcp);
	vps_rank_view_release(&vdp);
out:
	vps_layout_free(a);
	vps_layout_free(dpcp);
	vps_layout_free(dp);
}

/* Experts in their own buffer (ep 4 > 1) are sharded over expert DP, which
 * CP folds into: tp 2, cp 2, dp 2, ep 4, etp 1 gives EDP 2 while dp_cp is
 * 4. Expert 2 lives on EP rank 1 (2 experts per rank): ranks 1 and 5, the
 * expert 'dp' group [1, 5]; its fp32 master shard is split between them. */
TEST(expert_buffers_are_sharded_over_expert_dp_which_absorbs_cp)
{
	struct vps_layout *l = test_layout("tiny-qwen3-moe", "tp=2,cp=2,dp=2,ep=4,etp=1,zero=1", 8, 0);
	if (!l)
		return;
	uint32_t e2 = test_tensor_id(l, "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight");
	CHECK_EQ(test_holder_set(l, e2, VPS_STATE_PARAM), (1u << 1) | (1u << 5));
	uint64_t shards = test_holder_set(l, e2, VPS_STATE_MAIN_PARAM);
	CHECK(shards != 0 && (shards & ~(uint64_t)((1u << 1) | (1u << 5))) == 0);
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 1, &v));
	int64_t dense = -1, dense_shard = -1, expert = -1, expert_shard = -1;
	for (size_t i = 0; i < v.nbuffers; i++) {
		const struct vps_buffer *b = &v.buffers[i];
		if (b->state == VPS_STATE_PARAM)
			*(b->expert ? &expert : &dense) = b->elements;
		if (b->state == VPS_STATE_MAIN_PARAM)
			*(b->expert ? &expert_shard : &dense_shard) = b->elements;
	}
	CHECK(dense > 0 && expert > 0);
	CHECK_EQ(dense_shard * 4, dense);
	CHECK_EQ(expert_shard * 2, expert);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

TEST(cp_parses_formats_and_is_bounded)
{
	struct vps_parallel p;
	vps_parallel_init(&p);
	CHECK_EQ(p.cp, 1);
	CHECK_OK(vps_parallel_parse(&p, "tp=2,cp=4,dp=2,zero=1", "--parallel"));
	CHECK_EQ(p.cp, 4);
	char buf[256];
	p.etp = 2;
	vps_parallel_format(&p, buf, sizeof(buf));
	CHECK(strcmp(buf, "tp=2,pp=1,dp=2,cp=4,ep=1,etp=2,vpp=1,zero=1") == 0);
	/* without CP the text is what it always was */
	p.cp = 1;
	vps_parallel_format(&p, buf, sizeof(buf));
	CHECK(strcmp(buf, "tp=2,pp=1,dp=2,ep=1,etp=2,vpp=1,zero=1") == 0);
	vps_parallel_init(&p);
	CHECK(vps_parallel_parse(&p, "cp=0", "--parallel") == VPS_EINPUT);
	/* a world past 2^24 is refused before anything multiplies it further */
	struct vps_model m;
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "cp=1048576,dp=16777216", "--parallel"));
	CHECK(vps_parallel_validate(&p, &m, "--parallel") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "too large") != NULL);
	/* expert data parallelism must come out whole: tp x cp x dp over etp x ep */
	CHECK_OK(vps_model_load(&m, "tiny-qwen3-moe", CONFIGS "/models"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "tp=1,cp=2,dp=1,ep=4,etp=1", "--parallel"));
	CHECK(vps_parallel_validate(&p, &m, "--parallel") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "tp x cp x dp") != NULL);
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "tp=1,cp=2,dp=2,ep=4,etp=1", "--parallel"));
	CHECK_OK(vps_parallel_validate(&p, &m, "--parallel"));
}

/* The hash names a layout (registries and staged plans are checked by it):
 * cp 2 is another layout than cp 1 with the same other sizes, on the same
 * packed node; a file written and read back keeps cp. */
TEST(cp_is_part_of_the_layout_identity_and_its_file)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,cp=2,dp=2,zero=1", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=2,dp=2,zero=1", 8, 0);
	if (!a || !b)
		goto done;
	CHECK(vps_layout_hash(a) != vps_layout_hash(b));
	for (int yaml = 0; yaml < 2; yaml++) {
		struct vps_bytes out;
		struct vps_layout *back = NULL;
		int64_t ranks[] = {2};
		CHECK_OK(vps_layout_serialize(a, ranks, 1, yaml, &out));
		CHECK_OK(vps_layout_parse(&back, "a", out.data, out.len));
		if (back) {
			CHECK_EQ(vps_layout_parallel(back)->cp, 2);
			CHECK(vps_layout_hash(back) == vps_layout_hash(a));
			struct vps_rank_view v;
			CHECK_OK(vps_layout_rank(back, 2, &v));
			CHECK_EQ(v.coords.cp, 1);
			vps_rank_view_release(&v);
		}
		vps_layout_free(back);
		vps_bytes_release(&out);
	}
done:
	vps_layout_free(a);
	vps_layout_free(b);
}
