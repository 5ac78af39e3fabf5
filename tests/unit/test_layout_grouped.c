/* Grouped-GEMM experts (--moe-grouped-gemm): TEGroupedMLP registers
 * linear_fc1 then linear_fc2, each a Transformer Engine GroupedLinear whose
 * weight{i} (and bias{i}) come gemm by gemm (Megatron-LM experts.py
 * TEGroupedMLP.__init__; TE grouped_linear.py GroupedLinear.__init__);
 * SequentialMLP registers expert by expert. Megatron's DDP lays parameters
 * out in reverse registration order, so the order decides offsets and, with
 * the distributed optimizer, which expert-DP rank owns which elements.
 * Cases computed by hand. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/io.h"
#include "vps/layout.h"

/* Elements of (tensor, state) on a rank, and the smallest offset among them. */
static int64_t held(const struct vps_layout *l, int64_t rank, uint32_t tensor, int state, int64_t *first)
{
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, rank, &v));
	int64_t n = test_view_held(&v, tensor, state, first);
	vps_rank_view_release(&v);
	return n;
}

/* tiny-qwen3-moe (hidden 128, 8 layers, 8 experts of moe_ffn 128, SwiGLU)
 * at tp 2, dp 3, ep 2, etp 1, ZeRO-1: 4 experts a rank, an expert buffer
 * sharded over EDP = 6 / 2 = 3. linear_fc1 is 2*128*128 = 32768 elements,
 * linear_fc2 16384; every size is a multiple of 64, so nothing is padded
 * between params, and a layer's experts take 4 * 49152 = 196608. Layer 7,
 * registered last, starts the buffer; layer L starts at (7 - L) * 196608.
 * The buffer is 1572864 = 4096 * lcm(3, 128): each EDP rank's shard is
 * 524288 elements. Expert ranks: rank = ep + 2 * edp (etp 1). */
TEST(grouped_experts_follow_te_registration_order)
{
	const char *name = "decoder.layers.5.mlp.experts.local_experts.1.linear_fc1.weight";
	struct vps_layout *seq = test_layout("tiny-qwen3-moe", "tp=2,dp=3,ep=2,etp=1,zero=1", 8, 0);
	struct vps_layout *grp = test_layout("tiny-qwen3-moe", "tp=2,dp=3,ep=2,etp=1,zero=1,grouped_gemm=1", 8, 0);
	if (!seq || !grp)
		goto out;
	uint32_t t = test_tensor_id(seq, name);
	int64_t off;

	/* Grouped, within layer 5 from its start: fc2 of slots 3..0 at 0,
	 * 16384, 32768, 49152, then fc1 of slots 3..0 at 65536, 98304, 131072,
	 * 163840. Slot 1's fc1: 2 * 196608 + 131072 = 524288. */
	CHECK_EQ(held(grp, 0, t, VPS_STATE_PARAM, &off), 32768);
	CHECK_EQ(off, 524288);
	/* [524288, 557056) is the start of EDP rank 1's shard: world rank 2 */
	CHECK_EQ(held(grp, 2, t, VPS_STATE_MAIN_PARAM, &off), 32768);
	CHECK_EQ(off, 0);
	CHECK_EQ(held(grp, 0, t, VPS_STATE_MAIN_PARAM, &off), 0);
	CHECK_EQ(test_holder_set(grp, t, VPS_STATE_EXP_AVG), (uint64_t)1 << 2);

	/* Sequential, within layer 5: slot 3 (fc2 at 0, fc1 at 16384), slot 2
	 * (49152, 65536), slot 1 (98304, 114688): fc1 at 393216 + 114688 =
	 * 507904, across the shard boundary at 524288: half on EDP rank 0
	 * (world rank 0) at 507904, half on EDP rank 1 (world rank 2) at 0. */
	CHECK_EQ(held(seq, 0, t, VPS_STATE_PARAM, &off), 32768);
	CHECK_EQ(off, 507904);
	CHECK_EQ(held(seq, 0, t, VPS_STATE_MAIN_PARAM, &off), 16384);
	CHECK_EQ(off, 507904);
	CHECK_EQ(held(seq, 2, t, VPS_STATE_MAIN_PARAM, &off), 16384);
	CHECK_EQ(off, 0);
	CHECK_EQ(test_holder_set(seq, t, VPS_STATE_EXP_AVG), ((uint64_t)1 << 0) | ((uint64_t)1 << 2));

	/* expert 5 is slot 1 of EP rank 1: the same place on world rank 1 */
	uint32_t t5 = test_tensor_id(grp, "decoder.layers.5.mlp.experts.local_experts.5.linear_fc1.weight");
	CHECK_EQ(held(grp, 1, t5, VPS_STATE_PARAM, &off), 32768);
	CHECK_EQ(off, 524288);
	CHECK_EQ(test_holder_set(grp, t5, VPS_STATE_MAIN_PARAM), (uint64_t)1 << 3);
out:
	vps_layout_free(seq);
	vps_layout_free(grp);
}

/* With ep 1 and etp = tp the experts share the dense buffer: the grouped
 * order holds there too. tiny-qwen3-moe at tp 1, one stage: the buffer
 * starts with output_layer (vocabulary 1000 padded to 1024, x 128 = 131072)
 * and the final norm (128), then layer 7's experts: fc2 of experts 7..0
 * from 131200, then fc1 of experts 7..0 from 131200 + 8 * 16384 = 262272;
 * fc1 of expert 0 is the last of them, at 262272 + 7 * 32768 = 491648. */
TEST(grouped_experts_in_the_dense_buffer)
{
	struct vps_layout *l = test_layout("tiny-qwen3-moe", "tp=1,dp=1,grouped_gemm=1", 8, 0);
	if (!l)
		return;
	CHECK(!vps_layout_expert_buffer(l));
	int64_t off;
	uint32_t t = test_tensor_id(l, "decoder.layers.7.mlp.experts.local_experts.0.linear_fc1.weight");
	CHECK_EQ(held(l, 0, t, VPS_STATE_PARAM, &off), 32768);
	CHECK_EQ(off, 491648);
	t = test_tensor_id(l, "decoder.layers.7.mlp.experts.local_experts.7.linear_fc2.weight");
	CHECK_EQ(held(l, 0, t, VPS_STATE_PARAM, &off), 16384);
	CHECK_EQ(off, 131200);
	CHECK_EQ(test_holder_set(l, t, VPS_STATE_PARAM), 1);
	vps_layout_free(l);
}

TEST(grouped_gemm_needs_experts)
{
	struct vps_parallel p;
	struct vps_model m;
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, "tp=2,grouped_gemm=1", "--parallel"));
	CHECK(p.grouped_gemm);
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	CHECK(vps_parallel_validate(&p, &m, "--parallel") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "MoE models only") != NULL);
	vps_parallel_init(&p);
	CHECK(vps_parallel_parse(&p, "grouped_gemm=2", "--parallel") == VPS_EINPUT);
}
