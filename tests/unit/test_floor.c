/* The time floor (vps_time_floor) from two layouts, on cases worked out by
 * hand: without ZeRO and with tp = pp = 1 every rank holds the whole state,
 * F = P * (2 + 4 + 4 + 4) bytes (bf16 parameters, fp32 master parameters
 * and two Adam moments), so what each device must receive or send follows
 * from where the devices sit. NVLink 8 bytes/s, the NIC 1: the floor is a
 * multiple of F / 8. */
#include <math.h>

#include "harness.h"
#include "jobs.h"
#include "vps/plan.h"

static const struct vps_topology topo = {
	.name = "hand", .gpus_per_node = 8, .intra_node_bandwidth = 8, .inter_node_bandwidth = 1,
	.memory_bandwidth = 64, .latency = 0,
};

struct fcase {
	const char *what, *from, *to;
	int64_t gpn_a, gpn_b;
	double floor_in_f;    /* seconds, in units of F bytes */
	bool receives;        /* the floor is a receiver's */
	struct vps_device dev; /* the device that sets it */
	int64_t loc_f, rem_f, any_f; /* its bytes, in units of F */
};

static double floor_of(const struct fcase *c, int64_t *state_bytes, struct vps_time_floor *f)
{
	struct vps_layout *a = test_layout("tiny-llama", c->from, c->gpn_a, 0);
	struct vps_layout *b = test_layout("tiny-llama", c->to, c->gpn_b, 0);
	double s = -1;
	*state_bytes = 0;
	if (a && b) {
		*state_bytes = vps_model_parameters(vps_layout_model(a)) * 14;
		CHECK_OK(vps_time_floor(a, b, &topo, f));
		s = f->seconds;
	}
	vps_layout_free(a);
	vps_layout_free(b);
	return s;
}

TEST(the_floor_is_the_busiest_devices_bytes_over_its_links)
{
	static const struct fcase cases[] = {
		/* two replicas on node 0; devices 2 and 3 join on node 1 and
		 * can only be reached over their NICs: F / 1 */
		{"remote only", "tp=1,pp=1,dp=2,zero=0", "tp=1,pp=1,dp=4,zero=0", 2, 2, 1.0, true, {1, 0}, 0, 1, 0},
		/* replicas on nodes 0 and 1; (0,1) and (1,1) join and have one
		 * replica on their node and one elsewhere: F / (8 + 1) */
		{"either", "tp=1,pp=1,dp=2,zero=0", "tp=1,pp=1,dp=4,zero=0", 1, 2, 1.0 / 9, true, {0, 1}, 0, 0, 1},
		/* one holder, three devices join on its node: it sends F to each
		 * over NVLink (3F / 8), while each receives F (F / 8) */
		{"sole sender, NVLink", "tp=1,pp=1,dp=1,zero=0", "tp=1,pp=1,dp=4,zero=0", 4, 4, 3.0 / 8, false, {0, 0}, 3,
		 0, 0},
		/* one holder at (0,0); (0,1) joins beside it, (1,0) and (1,1) on
		 * node 1: it sends F over NVLink and 2F over its NIC, 2F / 1 */
		{"sole sender, NIC", "tp=1,pp=1,dp=1,zero=0", "tp=1,pp=1,dp=4,zero=0", 2, 2, 2.0, false, {0, 0}, 1, 2, 0},
		/* nothing to move */
		{"unchanged", "tp=1,pp=1,dp=2,zero=0", "tp=1,pp=1,dp=2,zero=0", 2, 2, 0, false, {0, 0}, 0, 0, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct fcase *c = &cases[i];
		int64_t F;
		struct vps_time_floor f = {0};
		double s = floor_of(c, &F, &f);
		double want = c->floor_in_f * (double)F;
		if (fabs(s - want) > 1e-9 * (want + 1))
			harness_fail(__FILE__, __LINE__, "%s: floor %.6g s, want %.6g s (F = %lld bytes)", c->what, s, want,
				     (long long)F);
		if (!c->floor_in_f)
			continue;
		if (f.receives != c->receives || f.device.node != c->dev.node || f.device.gpu != c->dev.gpu)
			harness_fail(__FILE__, __LINE__, "%s: set by (%d, %d) %s, want (%d, %d) %s", c->what, f.device.node,
				     f.device.gpu, f.receives ? "receiving" : "sending", c->dev.node, c->dev.gpu,
				     c->receives ? "receiving" : "sending");
		CHECK_EQ(f.local_bytes, c->loc_f * F);
		CHECK_EQ(f.remote_bytes, c->rem_f * F);
		CHECK_EQ(f.either_bytes, c->any_f * F);
	}
}

/* The plans' estimate counts every byte a plan moves over the links of its
 * ends: it can never fall below a floor computed from the layouts alone. */
TEST(no_plan_beats_the_floor)
{
	static const char *pairs[][2] = {
		{"tp=2,pp=2,dp=2,zero=1", "tp=4,pp=4,dp=1,zero=1"},
		{"tp=4,pp=4,dp=1,zero=1", "tp=2,pp=2,dp=2,zero=1"},
		{"tp=2,pp=4,dp=1,zero=1", "tp=2,pp=1,dp=4,zero=1"},
		{"tp=1,pp=2,dp=3,zero=1", "tp=2,pp=1,dp=3,zero=0,grad=0"},
	};
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		struct vps_layout *a = test_layout("tiny-llama", pairs[i][0], 4, 0);
		struct vps_layout *b = test_layout("tiny-llama", pairs[i][1], 4, 0);
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		struct vps_plan *p = NULL;
		struct vps_plan_stats s;
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (!p)
			continue;
		CHECK_OK(vps_plan_stats(p, &topo, false, &s));
		if (!(s.time_floor_seconds > 0) || s.time_floor_seconds > s.estimate_seconds * (1 + 1e-9))
			harness_fail(__FILE__, __LINE__, "%s -> %s: floor %.6g s, estimate %.6g s", pairs[i][0], pairs[i][1],
				     s.time_floor_seconds, s.estimate_seconds);
		vps_plan_stats_release(&s);
		vps_plan_free(p);
	}
}

TEST(layouts_of_two_models_have_no_floor)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=1,pp=1,dp=2", 8, 0);
	struct vps_layout *b = test_layout("tiny-gpt", "tp=1,pp=1,dp=2", 8, 0);
	struct vps_time_floor f;
	if (a && b)
		CHECK(vps_time_floor(a, b, &topo, &f) == VPS_EINPUT);
	vps_layout_free(a);
	vps_layout_free(b);
}

/* A plan whose receivers relay is bounded as relays allow: one holder
 * serving three joiners need send each element once (F), not once a
 * receiver (3F), so the balanced send bound is F. Where every receiver
 * shares the holder's node, the holder sends F once over NVLink (F / 8),
 * as each receiver takes F in over NVLink, and the time bound and the
 * floor from the layouts alone agree. Over two
 * nodes of two devices, the second node needs all of F and holds none of
 * it: F enters it over its two NICs (F / 2), whatever relays there are;
 * the floor says so, and the time bound takes it. None lies above the
 * plan's estimate. */
TEST(a_relayed_plan_is_bounded_as_relays_allow)
{
	static const struct {
		int64_t gpn;
		double bound_in_f;
	} cases[] = {{4, 1.0 / 8}, {2, 1.0 / 2}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *a = test_layout("tiny-llama", "tp=1,pp=1,dp=1,zero=0", cases[i].gpn, 0);
		struct vps_layout *b = test_layout("tiny-llama", "tp=1,pp=1,dp=4,zero=0", cases[i].gpn, 0);
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		o.relay = true;
		struct vps_plan *p = NULL;
		struct vps_plan_stats s;
		struct vps_time_floor f;
		if (!a || !b)
			goto next;
		int64_t F = vps_model_parameters(vps_layout_model(a)) * 14;
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (!p)
			goto next;
		CHECK_OK(vps_plan_stats(p, &topo, false, &s));
		CHECK(s.bytes_relayed > 0);
		CHECK_EQ(s.balanced_send_bound, F);
		CHECK(s.max_send_bytes >= s.balanced_send_bound);
		double want = cases[i].bound_in_f * (double)F;
		if (fabs(s.time_bound_seconds - want) > 1e-5 * want)
			harness_fail(__FILE__, __LINE__, "%lld a node: time bound %.6g s, want %.6g s", (long long)cases[i].gpn,
				     s.time_bound_seconds, want);
		CHECK(s.estimate_seconds >= s.time_bound_seconds * (1 - 1e-9));
		CHECK_OK(vps_time_floor_relayed(a, b, &topo, &f));
		/* one node: F over NVLink, the holder's sends or a receiver's
		 * receives alike (NICs carry nothing within a node); two: F
		 * through a node's two NICs, into the second or out of the first
		 * alike */
		if (cases[i].gpn == 4 ? f.local_bytes != F : f.remote_bytes != F)
			harness_fail(__FILE__, __LINE__, "%lld a node: the floor is %s side (node %d, %lld senders, %lld "
				     "bytes over NVLink, %lld over NICs)", (long long)cases[i].gpn,
				     f.receives ? "a receiver's" : "the senders'", f.device.node, (long long)f.senders,
				     (long long)f.local_bytes, (long long)f.remote_bytes);
		if (fabs(f.seconds - want) > 1e-9 * want || fabs(s.time_floor_seconds - f.seconds) > 1e-12 * f.seconds)
			harness_fail(__FILE__, __LINE__, "floor %.6g s (stats %.6g s), want %.6g s", f.seconds,
				     s.time_floor_seconds, want);
		vps_plan_stats_release(&s);
	next:
		if (p) {
			vps_plan_free(p); /* and the layouts it took */
		} else {
			vps_layout_free(a);
			vps_layout_free(b);
		}
	}
}

/* NICs carry only what crosses nodes: in a world of one node a receiver
 * takes its bytes over NVLink alone, relays or none. tiny-llama from tp=4
 * to tp=1 on one node of four: the relayed floor has B's rank take the
 * three quarters it does not hold (about 3F / 4) over NVLink (3F / 32 at
 * 8 bytes a second), not over NVLink and a NIC together (F / 12, which no
 * plan can do); over four nodes of one device, they enter its node over
 * its NIC (3F / 4). And from dp=2 to dp=6 on one node of eight, relayed, each joining
 * receiver takes F over NVLink: the time bound and the floor are F / 8
 * (they were F / 9). */
TEST(in_a_world_of_one_node_no_byte_takes_a_nic)
{
	static const struct {
		int64_t gpn;
		double bound_in_f;
	} cases[] = {{4, 3.0 / 32}, {1, 3.0 / 4}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *a = test_layout("tiny-llama", "tp=4,pp=1,dp=1,zero=0", cases[i].gpn, 0);
		struct vps_layout *b = test_layout("tiny-llama", "tp=1,pp=1,dp=1,zero=0", cases[i].gpn, 0);
		struct vps_time_floor f;
		if (a && b) {
			double want = cases[i].bound_in_f * (double)vps_model_parameters(vps_layout_model(a)) * 14;
			CHECK_OK(vps_time_floor_relayed(a, b, &topo, &f));
			/* tp slices share the norms: a little less than 3F / 4 moves */
			if (!(f.seconds > 0.95 * want && f.seconds <= want))
				harness_fail(__FILE__, __LINE__, "%lld a node: relayed floor %.6g s, want about %.6g s",
					     (long long)cases[i].gpn, f.seconds, want);
		}
		vps_layout_free(a);
		vps_layout_free(b);
	}
	struct vps_layout *a = test_layout("tiny-llama", "tp=1,pp=1,dp=2,zero=0", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,pp=1,dp=6,zero=0", 8, 0);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.relay = true;
	struct vps_plan *p = NULL;
	struct vps_plan_stats s;
	if (!a || !b) {
		vps_layout_free(a);
		vps_layout_free(b);
		return;
	}
	double want = (double)vps_model_parameters(vps_layout_model(a)) * 14 / 8;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p)
		return;
	CHECK_OK(vps_plan_stats(p, &topo, false, &s));
	CHECK(s.bytes_relayed > 0);
	if (fabs(s.time_bound_seconds - want) > 1e-9 * want || fabs(s.time_floor_seconds - want) > 1e-9 * want)
		harness_fail(__FILE__, __LINE__, "time bound %.6g s, floor %.6g s, want %.6g s", s.time_bound_seconds,
			     s.time_floor_seconds, want);
	CHECK(s.estimate_seconds >= s.time_bound_seconds * (1 - 1e-9));
	vps_plan_stats_release(&s);
	vps_plan_free(p);
}

/* A tied embedding has two copies under A, one on each stage's devices: a
 * slice of it has two single-rank holders, each of which also holds much
 * that only it has. From tp=2, pp=2 to tp=4, pp=2 on one node every device
 * of A sends nearly all it holds, and no plan can have either copy's
 * holder leave the embedding to the other: the pair sends its own bytes
 * and the embedding together. The floor bounds the pair so (it took each
 * alone, and lay 1.2x below the least any plan sends: gpt3's
 * -tp-down-back 1.06-1.16x; here 1.06x), and meets the direct plan's
 * time bound; the relayed floor, where a receiver may pass the slice on to
 * the other stage's, lies at most 10% below it, and no plan beats either. */
TEST(a_tied_embeddings_two_holders_send_together)
{
	for (int relayed = 0; relayed < 2; relayed++) {
		/* the plan owns the layouts */
		struct vps_layout *a = test_layout("tiny-gpt", "tp=2,pp=2,dp=1,zero=1", 8, 0);
		struct vps_layout *b = test_layout("tiny-gpt", "tp=4,pp=2,dp=1,zero=1", 8, 0);
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		o.relay_mode = relayed ? VPS_RELAY_AUTO : VPS_RELAY_NEVER;
		struct vps_plan *p = NULL;
		struct vps_plan_stats s;
		struct vps_time_floor f;
		if (!a || !b) {
			vps_layout_free(a);
			vps_layout_free(b);
			return;
		}
		CHECK_OK((relayed ? vps_time_floor_relayed : vps_time_floor)(a, b, &topo, &f));
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (!p)
			continue;
		CHECK_OK(vps_plan_stats(p, &topo, false, &s));
		double low = relayed ? 0.9 : 1 - 1e-9;
		if (f.seconds > s.estimate_seconds * (1 + 1e-9) || f.seconds < low * s.time_bound_seconds)
			harness_fail(__FILE__, __LINE__, "%s: floor %.6g s, time bound %.6g s, estimate %.6g s",
				     relayed ? "relayed" : "direct", f.seconds, s.time_bound_seconds, s.estimate_seconds);
		if (!relayed)
			CHECK(f.by == VPS_FLOOR_SENDERS && f.senders == 2);
		vps_plan_stats_release(&s);
		vps_plan_free(p);
	}
}

/* The bytes of rank r's regions under layout l. */
static int64_t rank_bytes(const struct vps_layout *l, int64_t r)
{
	struct vps_rank_view v;
	int64_t bytes = 0;
	CHECK_OK(vps_layout_rank(l, r, &v));
	for (size_t i = 0; i < v.nregions; i++)
		bytes += vps_box_volume(&v.regions[i].box) * (int64_t)vps_dtype_size(vps_region_dtype(&v.regions[i]));
	vps_rank_view_release(&v);
	return bytes;
}

/* The default plan from a to b (the plan takes the layouts) lies at or
 * above `floor` and its own statistics' floor. */
static void no_plan_below(struct vps_layout *a, struct vps_layout *b, double floor)
{
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p = NULL;
	struct vps_plan_stats s;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p) {
		vps_layout_free(a);
		vps_layout_free(b);
		return;
	}
	CHECK_OK(vps_plan_stats(p, &topo, false, &s));
	if (s.estimate_seconds < fmax(floor, s.time_floor_seconds) * (1 - 1e-9))
		harness_fail(__FILE__, __LINE__, "estimate %.6g s, floor %.6g s, its statistics' %.6g s", s.estimate_seconds,
			     floor, s.time_floor_seconds);
	vps_plan_stats_release(&s);
	vps_plan_free(p);
}

/* Nodes that relay a stage among themselves carry its entries beside their
 * own stages' exits. tiny-llama from tp=1, pp=4 to tp=1, pp=4, dp=2 (no
 * ZeRO), one GPU a node: A's stage k sits on node k, B's stage k on nodes
 * 2k and 2k + 1, so stage 1 (S1 bytes, on node 1 alone) must enter nodes 2
 * and 3, whose NICs carry stages 2 and 3 out. Whatever relays, only nodes
 * 1-3 hold or need stage 1: their three NICs send 2 S1 + S2 + S3 at least,
 * more than any node alone (S3, the last stage's, is the largest); the
 * relayed floor is that, over 3 NICs of 1 byte a second. The floor without
 * relays, and the relayed plan's estimate, lie at or above it. */
TEST(nodes_that_relay_a_stage_send_its_entries_beside_their_own_exits)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=1,pp=4,dp=1,zero=0", 1, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,pp=4,dp=2,zero=0", 1, 0);
	int64_t S[4];
	struct vps_time_floor f, direct;
	if (!a || !b) {
		vps_layout_free(a);
		vps_layout_free(b);
		return;
	}
	for (int k = 0; k < 4; k++)
		S[k] = rank_bytes(a, k);
	CHECK(S[3] > S[1] && S[3] > S[2] && S[3] > S[0]);
	double want = (double)(2 * S[1] + S[2] + S[3]) / 3;
	CHECK_OK(vps_time_floor_relayed(a, b, &topo, &f));
	if (fabs(f.seconds - want) > 1e-9 * want || f.by != VPS_FLOOR_NODES_OUT || f.senders != 3 || f.device.node != 1)
		harness_fail(__FILE__, __LINE__, "relayed floor %.6g s (by %d, %lld NICs from node %d), want %.6g s",
			     f.seconds, (int)f.by, (long long)f.senders, f.device.node, want);
	CHECK_OK(vps_time_floor(a, b, &topo, &direct));
	CHECK(direct.seconds >= f.seconds);
	no_plan_below(a, b, want);
}

/* What only a device's node holds and only its node needs never leaves
 * the node: its receivers take it over NVLink alone, relays or none.
 * tiny-llama from tp=1, pp=8 to tp=1, pp=2, dp=4 (no ZeRO), four GPUs a
 * node: B's stage 0 is A's stages 0-3, all on node 0, and node 1 needs
 * none of it; each of node 0's devices takes the three stages it does not
 * hold from its node-mates, over NVLink (8 bytes a second), not over
 * NVLink and a NIC together (9), as the relayed floor had it (llama2-13b-
 * ablation-s1-s2, qwen3-30b-s11-s12: 1.126x above a floor no plan can
 * reach). The floor is the busiest receiver's bytes over 8. */
TEST(what_only_a_node_holds_and_needs_crosses_its_nvlink_alone)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=1,pp=8,dp=1,zero=0", 4, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,pp=2,dp=4,zero=0", 4, 0);
	struct vps_time_floor f;
	int64_t most = 0;
	if (!a || !b) {
		vps_layout_free(a);
		vps_layout_free(b);
		return;
	}
	/* the device of A rank r and of B rank r is one: B's rank needs what
	 * it holds under B less what A's holds there */
	for (int64_t r = 0; r < 8; r++) {
		int64_t need = rank_bytes(b, r) - rank_bytes(a, r);
		most = need > most ? need : most;
	}
	double want = (double)most / 8;
	CHECK_OK(vps_time_floor_relayed(a, b, &topo, &f));
	if (fabs(f.seconds - want) > 1e-9 * want || f.by != VPS_FLOOR_RECEIVER)
		harness_fail(__FILE__, __LINE__, "relayed floor %.6g s (by %d), want %.6g s", f.seconds, (int)f.by, want);
	no_plan_below(a, b, want);
}
