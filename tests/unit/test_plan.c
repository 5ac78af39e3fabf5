/* The planner: plans move the right bytes (simulated in memory, every
 * element checked), a rank's own plan is the global plan restricted to it,
 * and nothing already resident moves. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/data.h"
#include "vps/io.h"
#include "vps/plan.h"



struct tcase {
	const char *model, *from, *to;
	int64_t gpn_a, first_a, gpn_b, first_b;
};

/* Rank r's plan of case c, planned alone (relay mode relay, weighed on
 * topo), is global plan p's part. */
static void rank_part_same(const struct tcase *c, const struct vps_plan *p, int64_t r, enum vps_relay relay,
			   const struct vps_topology *topo)
{
	struct vps_layout *a2 = test_layout(c->model, c->from, c->gpn_a, c->first_a);
	struct vps_layout *b2 = test_layout(c->model, c->to, c->gpn_b, c->first_b);
	struct vps_plan_opts ro = VPS_PLAN_OPTS_INIT;
	ro.rank = r;
	ro.relay_mode = relay;
	ro.topology = topo;
	struct vps_plan *q = NULL;
	CHECK_OK(vps_plan_compute(&q, a2, b2, &ro));
	if (!q)
		return;
	size_t want;
	if (!job_rank_part(p, q, r, &want))
		harness_fail(__FILE__, __LINE__, "%s %s -> %s: rank %lld's plan (%zu pieces) differs from the "
			     "global plan's (%zu)", c->model, c->from, c->to, (long long)r, q->npieces, want);
	vps_plan_free(q);
}

/* Case c planned globally (exact) and, per_rank, by each rank alone (the
 * global plan's part), with relay mode relay, weighed on topo (NULL: by
 * bytes). */
static void run_case_on(const struct tcase *c, bool per_rank, enum vps_relay relay, const struct vps_topology *topo)
{
	struct vps_layout *a = test_layout(c->model, c->from, c->gpn_a, c->first_a);
	struct vps_layout *b = test_layout(c->model, c->to, c->gpn_b, c->first_b);
	if (!a || !b)
		return;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.relay_mode = relay;
	o.topology = topo;
	struct vps_plan *p = NULL;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p)
		return;
	char what[512];
	snprintf(what, sizeof(what), "%s %s -> %s", c->model, c->from, c->to);
	job_plan_exact(p, what);
	for (int64_t r = 0; per_rank && r < vps_world_size(p->world); r++)
		rank_part_same(c, p, r, relay, topo);
	vps_plan_free(p);
}

static void run_case(const struct tcase *c, bool per_rank, enum vps_relay relay)
{
	run_case_on(c, per_rank, relay, NULL);
}

/* Case c's global plan by default on topo (NULL when it failed). */
static struct vps_plan *plan_on(const struct tcase *c, const struct vps_topology *topo)
{
	struct vps_plan *p = NULL;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.topology = topo;
	CHECK_OK(vps_plan_compute(&p, test_layout(c->model, c->from, c->gpn_a, c->first_a),
				  test_layout(c->model, c->to, c->gpn_b, c->first_b), &o));
	return p;
}

/* The same on a800-testbed (loaded into *topo). */
static struct vps_plan *plan_on_testbed(const struct tcase *c, struct vps_topology *topo)
{
	CHECK_OK(vps_topology_load(topo, "a800-testbed", CONFIGS "/topologies"));
	return plan_on(c, topo);
}

/* Each of ranks' plans of case c on topo, planned alone by default, is
 * global plan p's part; then p is freed. */
static void parts_same_and_free(const struct tcase *c, struct vps_plan *p, const int64_t *ranks, size_t n,
				const struct vps_topology *topo)
{
	for (size_t i = 0; i < n; i++)
		rank_part_same(c, p, ranks[i], VPS_RELAY_AUTO, topo);
	vps_plan_free(p);
}

static const struct tcase cases[] = {
	/* the paper's shapes, tiny */
	{"tiny-llama", "tp=2,pp=2,dp=2,zero=1", "tp=4,pp=4,dp=1,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=4,pp=4,dp=1,zero=1", "tp=2,pp=2,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,pp=2,dp=2,zero=1", "tp=4,pp=1,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,pp=4,dp=1,zero=1", "tp=2,pp=1,dp=4,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,pp=2,dp=2,vpp=2,zero=1", "tp=1,pp=4,dp=2,vpp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=1,pp=2,dp=3,zero=1", "tp=2,pp=1,dp=3,zero=0,grad=0", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,pp=1,dp=3,zero=1,grad=1", "tp=1,pp=3,dp=2,first=2,last=2,zero=1,grad=1", 8, 0, 8, 0},
	{"tiny-gpt", "tp=2,pp=2,dp=2,zero=1", "tp=4,pp=1,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-gpt", "tp=4,pp=2,dp=1,zero=1", "tp=2,pp=4,dp=1,vpp=2,zero=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=4,pp=2,dp=1,ep=4,etp=1,zero=1", "tp=2,pp=1,dp=4,ep=2,etp=1,zero=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=2,zero=1", "tp=2,pp=2,dp=2,ep=4,etp=1,zero=1", 8, 0, 8, 0},
	/* joins: 8 GPUs on node 0 -> 16 on nodes 0-1; leaves: the reverse */
	{"tiny-llama", "tp=2,pp=2,dp=2,zero=1", "tp=4,pp=2,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,pp=2,dp=4,ep=4,etp=1,zero=1", "tp=2,pp=2,dp=1,ep=2,etp=1,zero=1", 8, 0, 8, 0},
	/* migration to other nodes, W = 12 */
	{"tiny-gpt", "tp=2,pp=1,dp=3,zero=1", "tp=2,pp=1,dp=3,zero=1", 4, 0, 4, 1},
	/* worlds that are not powers of two */
	{"tiny-llama", "tp=1,pp=1,dp=5,zero=1", "tp=1,pp=1,dp=3,zero=1", 8, 0, 8, 0},
	{"tiny-gpt", "tp=1,pp=2,dp=3,zero=1", "tp=2,pp=1,dp=5,zero=1", 3, 0, 3, 0},
	/* context parallelism: to and from DP, and with every other dimension */
	{"tiny-llama", "tp=2,cp=2,pp=1,dp=2,zero=1", "tp=2,pp=1,dp=4,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=1,cp=2,pp=2,dp=2,zero=1", "tp=2,cp=1,pp=2,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,cp=2,pp=2,dp=1,zero=1", "tp=2,cp=1,pp=4,dp=1,vpp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,cp=1,pp=1,dp=4,zero=1,grad=1", "tp=1,cp=4,pp=1,dp=2,zero=1,grad=1", 8, 0, 8, 0},
	{"tiny-gpt", "tp=2,cp=2,pp=2,dp=1,zero=1", "tp=2,cp=1,pp=2,dp=2,zero=0", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,cp=2,pp=1,dp=2,ep=4,etp=1,zero=1", "tp=2,cp=1,pp=1,dp=4,ep=2,etp=1,zero=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,cp=2,pp=2,dp=1,zero=1", "tp=2,cp=2,pp=2,dp=1,ep=2,etp=1,zero=1", 8, 0, 8, 0},
	/* grouped-GEMM experts: the same logical tensors in another registration
	 * order; with EDP 3 the shard boundaries cut experts differently */
	{"tiny-qwen3-moe", "tp=2,pp=1,dp=3,ep=2,etp=1,zero=1", "tp=2,pp=1,dp=3,ep=2,etp=1,zero=1,grouped_gemm=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,grouped_gemm=1", "tp=1,pp=1,dp=4,ep=4,etp=1,zero=1", 8, 0, 8, 0},
	{"tiny-qwen3-moe", "tp=2,pp=1,dp=2,zero=1,grouped_gemm=1", "tp=2,pp=2,dp=2,ep=2,etp=2,zero=1,grouped_gemm=1", 8, 0, 8, 0},
	/* a join and a leave by CP: 8 ranks to 12 and back */
	{"tiny-llama", "tp=2,cp=2,pp=1,dp=2,zero=1", "tp=2,cp=3,pp=1,dp=2,zero=1", 8, 0, 8, 0},
	{"tiny-llama", "tp=2,cp=3,pp=1,dp=2,zero=1", "tp=2,cp=2,pp=1,dp=2,zero=1", 8, 0, 8, 0},
};

static bool piece_same(const struct vps_piece *x, const struct vps_piece *y)
{
	return job_piece_eq(x, y) && !memcmp(x->src_strides, y->src_strides, x->box.ndim * sizeof(int64_t)) &&
	       !memcmp(x->dst_strides, y->dst_strides, x->box.ndim * sizeof(int64_t));
}

static struct vps_plan *plan_with(const char *model, const char *from, const char *to, int64_t gpn, int threads,
				  bool compact)
{
	struct vps_layout *a = test_layout(model, from, gpn, 0), *b = test_layout(model, to, gpn, 0);
	/* packed with 3 threads: not hashed while planned, hashed when asked */
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.threads = threads;
	o.compact = compact;
	o.unhashed = threads == 3;
	struct vps_plan *p = NULL;
	if (a && b)
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
	return p;
}

/* Threads take blocks of 32 destinations as they come and the plan may be
 * packed: the pieces, collectives, hash and file are those of one thread. */
TEST(a_global_plan_is_the_same_for_any_threads_packed_or_not)
{
	static const char *const shapes[][3] = {
		{"tiny-llama", "tp=1,pp=1,dp=200,zero=1", "tp=2,pp=2,dp=50,zero=1"},
		{"tiny-qwen3-moe", "tp=2,pp=2,dp=40,ep=4,etp=1,zero=1", "tp=2,pp=1,dp=40,ep=2,etp=2,zero=1"},
		/* leaves: 160 ranks -> 80 */
		{"tiny-gpt", "tp=2,pp=2,dp=40,zero=1", "tp=2,pp=2,dp=20,zero=1"},
	};
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		struct vps_plan *ref = plan_with(shapes[s][0], shapes[s][1], shapes[s][2], 8, 1, false);
		if (!ref)
			continue;
		CHECK(vps_world_size(ref->world) > 3 * 32);
		/* plan order: (dst, src, tensor, state, dst buffer, dst offset), strictly */
		size_t unsorted = 0;
		for (size_t i = 1; i < ref->npieces; i++) {
			const struct vps_piece *x = &ref->pieces[i - 1], *y = &ref->pieces[i];
			int64_t kx[] = {x->dst, x->src, x->tensor, x->state, x->dst_buffer, x->dst_offset};
			int64_t ky[] = {y->dst, y->src, y->tensor, y->state, y->dst_buffer, y->dst_offset};
			size_t k = 0;
			while (k < 6 && kx[k] == ky[k])
				k++;
			unsorted += k == 6 || kx[k] > ky[k];
		}
		CHECK_EQ(unsorted, 0);
		struct vps_bytes rb = {0};
		CHECK_OK(vps_plan_serialize(ref, false, &rb));
		static const int threads[] = {1, 2, 3, 7};
		for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++)
			for (int compact = 0; compact < 2; compact++) {
				struct vps_plan *p = plan_with(shapes[s][0], shapes[s][1], shapes[s][2], 8, threads[t], compact);
				if (!p)
					continue;
				CHECK_EQ(p->npieces, ref->npieces);
				CHECK(compact ? p->pieces == NULL && p->packed != NULL : p->packed == NULL);
				struct vps_piece_iter it;
				const struct vps_piece *x;
				size_t i = 0, differ = 0;
				vps_piece_iter_init(&it, p);
				while ((x = vps_piece_iter_next(&it))) {
					if (i >= ref->npieces || !piece_same(x, &ref->pieces[i]))
						differ++;
					i++;
				}
				if (differ || i != ref->npieces)
					harness_fail(__FILE__, __LINE__, "%s, %d threads%s: %zu of %zu pieces differ", shapes[s][0],
						     threads[t], compact ? ", packed" : "", differ, i);
				CHECK_EQ(p->ncolls, ref->ncolls);
				for (size_t k = 0; k < p->ncolls && k < ref->ncolls; k++) {
					const struct vps_collective *c = &p->colls[k], *d = &ref->colls[k];
					CHECK(c->tensor == d->tensor && c->state == d->state && c->kind == d->kind &&
					      c->root == d->root && c->peers == d->peers && c->bytes == d->bytes);
				}
				CHECK(vps_plan_hash(p) == vps_plan_hash(ref));
				struct vps_bytes pb = {0};
				CHECK_OK(vps_plan_serialize(p, false, &pb));
				CHECK(pb.len == rb.len && !memcmp(pb.data, rb.data, rb.len));
				struct vps_plan_stats ps, rs;
				CHECK_OK(vps_plan_stats(p, NULL, false, &ps));
				CHECK_OK(vps_plan_stats(ref, NULL, false, &rs));
				CHECK(!memcmp(&ps, &rs, sizeof(ps)));
				vps_bytes_release(&pb);
				vps_plan_free(p);
			}
		vps_bytes_release(&rb);
		vps_plan_free(ref);
	}
}

/* A binary global plan read packed is checked by a second thread while
 * this one parses: the same pieces and hash as read whole, and the same
 * first refused piece, even when a later one fails to parse. */
static void parse_both(const struct vps_plan *p, bool must_fail, const char *what)
{
	struct vps_bytes b = {0};
	char whole[2048] = "", packed[2048] = "";
	CHECK_OK(vps_plan_serialize(p, false, &b));
	for (int compact = 0; compact < 2; compact++) {
		struct vps_plan *q = NULL;
		vps_result_t rc = vps_plan_parse_as(&q, "plan.vps", b.data, b.len, compact);
		if (must_fail != (rc != VPS_OK))
			harness_fail(__FILE__, __LINE__, "%s, %s: %s", what, compact ? "packed" : "whole",
				     rc ? vps_last_error() : "read");
		snprintf(compact ? packed : whole, sizeof(whole), "%s", rc ? vps_last_error() : "");
		if (!rc) {
			CHECK_EQ(q->npieces, p->npieces);
			CHECK(vps_plan_hash(q) == vps_plan_hash(p));
		}
		vps_plan_free(q);
	}
	if (strcmp(whole, packed))
		harness_fail(__FILE__, __LINE__, "%s: read whole '%s', packed '%s'", what, whole, packed);
	vps_bytes_release(&b);
}

TEST(a_packed_plan_read_by_two_threads_refuses_its_first_bad_piece)
{
	struct vps_plan *p = plan_with("tiny-qwen3-moe", "tp=2,pp=2,dp=120,ep=4,etp=1,zero=1",
				       "tp=2,pp=1,dp=120,ep=2,etp=2,zero=1", 8, 1, false);
	if (!p)
		return;
	/* more pieces than the checker's ring holds (8 batches of 4096); the
	 * bad piece and the later one in one batch, past the ring's first
	 * round: the parser fails before the checker sees either */
	CHECK(p->npieces > 10 * 4096);
	parse_both(p, false, "intact");
	size_t bad = 9 * 4096 + 1, later = bad + 2;
	char want[64];
	snprintf(want, sizeof(want), "piece %zu: source", bad);
	int64_t stride = p->pieces[bad].src_strides[0];
	p->pieces[bad].src_strides[0] = 0;
	parse_both(p, true, "a zero stride");
	CHECK(strstr(vps_last_error(), want) != NULL);
	p->pieces[later].dst = vps_world_size(p->world);
	parse_both(p, true, "a zero stride, then a destination outside the world");
	CHECK(strstr(vps_last_error(), want) != NULL);
	p->pieces[bad].src_strides[0] = stride;
	parse_both(p, true, "a destination outside the world");
	CHECK(strstr(vps_last_error(), "out of range") != NULL);
	vps_plan_free(p);
}

/* without relays and by default (relays where they gain) */
TEST(plans_move_every_element_right)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		run_case(&cases[i], false, VPS_RELAY_NEVER);
		run_case(&cases[i], false, VPS_RELAY_AUTO);
	}
}

TEST(a_ranks_plan_is_the_global_plan_restricted_to_it)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i += 3)
		run_case(&cases[i], true, VPS_RELAY_AUTO);
}

/* Relayed joins: a holder serving more than two receivers sends each
 * element once, the receivers pass it on; every element lands right, bytes
 * moved stay the lower bound, a rank's plan is the global plan's part, and
 * the holder sends less than it would alone, with relays always and by
 * default. */
TEST(relayed_joins_move_every_element_right)
{
	static const struct tcase relayed[] = {
		{"tiny-llama", "tp=1,pp=1,dp=1,zero=1", "tp=1,pp=1,dp=4,zero=1", 8, 0, 8, 0},
		{"tiny-llama", "tp=2,pp=1,dp=1,zero=1", "tp=2,pp=1,dp=8,zero=0", 4, 0, 4, 0},
		{"tiny-gpt", "tp=1,pp=2,dp=1,zero=1", "tp=1,pp=2,dp=5,zero=1", 8, 0, 8, 0},
		{"tiny-qwen3-moe", "tp=2,pp=1,dp=1,ep=1,etp=1,zero=1", "tp=2,pp=1,dp=4,ep=2,etp=1,zero=1", 8, 0, 8, 0},
	};
	static const enum vps_relay modes[] = {VPS_RELAY_NEVER, VPS_RELAY_ALWAYS, VPS_RELAY_AUTO};
	for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++) {
		const struct tcase *c = &relayed[i];
		run_case(c, true, VPS_RELAY_ALWAYS);
		run_case(c, true, VPS_RELAY_AUTO);
		struct vps_plan *p[3] = {NULL, NULL, NULL};
		for (int m = 0; m < 3; m++) {
			struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
			o.relay_mode = modes[m];
			CHECK_OK(vps_plan_compute(&p[m], test_layout(c->model, c->from, c->gpn_a, c->first_a),
						  test_layout(c->model, c->to, c->gpn_b, c->first_b), &o));
		}
		struct vps_plan_stats s[3];
		for (int m = 0; m < 3 && p[0] && p[1] && p[2]; m++)
			CHECK_OK(vps_plan_stats(p[m], NULL, false, &s[m]));
		for (int m = 1; m < 3 && p[0] && p[1] && p[2]; m++) {
			size_t forwards = 0;
			for (size_t k = 0; k < p[m]->npieces; k++)
				forwards += (p[m]->pieces[k].src_buffer & VPS_BUFFER_TARGET) != 0;
			CHECK(forwards > 0);
			CHECK_EQ(s[m].bytes_moved, s[0].bytes_moved);
			CHECK(s[m].max_send_bytes < s[0].max_send_bytes);
		}
		for (int m = 0; m < 3; m++) {
			if (p[0] && p[1] && p[2])
				vps_plan_stats_release(&s[m]);
			vps_plan_free(p[m]);
		}
	}
}

/* The default chooses: a region relays where that makes its busiest
 * sender faster, and never where it does not. tiny-llama without ZeRO
 * (every region replicated) from dp=4 to dp=6: two joining receivers of
 * four holders, each holder sending half a copy directly; relayed each
 * receiver would pass on half a copy: the busiest sender the same, so no
 * region relays and the plan is the direct one, piece for piece. From dp=3
 * to dp=6, three receivers of three holders: a holder sends a copy
 * directly, a third relayed, each receiver passes on two thirds: relayed,
 * though the receivers do not outnumber the holders (ALWAYS does not
 * relay it); each receiver still takes a copy, so the estimate is as
 * direct (it gains where holders have more to send). Across nodes (dp=2 on
 * node 0 to dp=8 on nodes 0 and 1, four GPUs each) a range enters node 1
 * once: faster. With and without a topology to weigh. */
TEST(by_default_a_region_relays_only_where_its_busiest_sender_gains)
{
	struct vps_topology topo = {.name = "t", .gpus_per_node = 4, .intra_node_bandwidth = 200e9,
				    .inter_node_bandwidth = 25e9, .memory_bandwidth = 1.9e12, .latency = 20e-6};
	static const struct {
		const char *from, *to;
		int64_t gpn;
		bool relays, always, faster;
	} joins[] = {
		{"tp=1,pp=1,dp=4,zero=0", "tp=1,pp=1,dp=6,zero=0", 8, false, false, false},
		{"tp=1,pp=1,dp=3,zero=0", "tp=1,pp=1,dp=6,zero=0", 8, true, false, false},
		{"tp=1,pp=1,dp=2,zero=0", "tp=1,pp=1,dp=8,zero=0", 4, true, true, true},
		{"tp=1,pp=1,dp=2,zero=1", "tp=1,pp=1,dp=8,zero=1", 4, true, true, true},
	};
	for (size_t i = 0; i < sizeof(joins) / sizeof(joins[0]); i++)
		for (int weigh = 0; weigh < 2; weigh++) {
			static const enum vps_relay modes[] = {VPS_RELAY_NEVER, VPS_RELAY_ALWAYS, VPS_RELAY_AUTO};
			struct vps_plan *p[3] = {NULL, NULL, NULL};
			struct vps_plan_stats s[3];
			memset(s, 0, sizeof(s));
			for (int m = 0; m < 3; m++) {
				struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
				o.relay_mode = modes[m];
				o.topology = weigh ? &topo : NULL;
				CHECK_OK(vps_plan_compute(&p[m], test_layout("tiny-llama", joins[i].from, joins[i].gpn, 0),
							  test_layout("tiny-llama", joins[i].to, joins[i].gpn, 0), &o));
				if (p[m])
					CHECK_OK(vps_plan_stats(p[m], &topo, false, &s[m]));
			}
			if (p[0] && p[1] && p[2]) {
				char what[256];
				snprintf(what, sizeof(what), "%s -> %s%s", joins[i].from, joins[i].to, weigh ? ", weighed" : "");
				CHECK_EQ(s[1].bytes_relayed > 0, joins[i].always);
				if ((s[2].bytes_relayed > 0) != joins[i].relays)
					harness_fail(__FILE__, __LINE__, "%s: %s relayed", what, joins[i].relays ? "not" : "");
				/* never slower than direct, nor sending more */
				CHECK(s[2].estimate_seconds <= s[0].estimate_seconds);
				CHECK(s[2].max_send_bytes <= s[0].max_send_bytes);
				if (joins[i].relays)
					CHECK(s[2].max_send_bytes < s[0].max_send_bytes);
				CHECK_EQ(s[2].estimate_seconds < s[0].estimate_seconds, joins[i].faster);
				if (!joins[i].relays) {
					/* the direct plan's pieces */
					CHECK_EQ(p[2]->npieces, p[0]->npieces);
					for (size_t k = 0; k < p[0]->npieces && k < p[2]->npieces; k++)
						if (!job_piece_eq(&p[0]->pieces[k], &p[2]->pieces[k])) {
							harness_fail(__FILE__, __LINE__, "%s: piece %zu differs", what, k);
							break;
						}
				}
				job_plan_exact(p[2], what);
			}
			for (int m = 0; m < 3; m++) {
				vps_plan_stats_release(&s[m]);
				vps_plan_free(p[m]);
			}
		}
}

/* Relayed across nodes: each range of a replicated region crosses into a
 * node once (to the node's gateway for it), and the node's other
 * receivers take it from there: a node of joining devices takes in one
 * receiver's bytes, where point-to-point brings in one copy a receiver. */
TEST(a_relayed_range_enters_each_node_once)
{
	struct vps_plan *p[2] = {NULL, NULL};
	for (int relay = 0; relay < 2; relay++) {
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		o.relay_mode = relay ? VPS_RELAY_AUTO : VPS_RELAY_NEVER;
		CHECK_OK(vps_plan_compute(&p[relay], test_layout("tiny-llama", "tp=1,pp=1,dp=1,zero=0", 4, 0),
					  test_layout("tiny-llama", "tp=1,pp=1,dp=8,zero=0", 4, 0), &o));
	}
	if (!p[0] || !p[1])
		return;
	int64_t into_node1[2] = {0, 0}, rank4 = 0, second_hops = 0;
	for (int relay = 0; relay < 2; relay++)
		for (size_t k = 0; k < p[relay]->npieces; k++) {
			const struct vps_piece *x = &p[relay]->pieces[k];
			int32_t from = vps_world_device(p[relay]->world, x->src).node,
				to = vps_world_device(p[relay]->world, x->dst).node;
			if (to == 1 && from != 1)
				into_node1[relay] += vps_piece_bytes(x);
			if (relay && x->dst == 4)
				rank4 += vps_piece_bytes(x);
			if (relay && vps_buffer_hop(x->src_buffer) == 2) {
				second_hops++;
				CHECK_EQ(from, to); /* over the node's own links */
			}
		}
	CHECK(rank4 > 0);
	CHECK_EQ(into_node1[1], rank4);
	CHECK_EQ(into_node1[0], 4 * rank4);
	CHECK(second_hops > 0);
	job_plan_exact(p[1], "tiny-llama dp=1 -> dp=8, two nodes, relayed");
	for (int relay = 0; relay < 2; relay++)
		vps_plan_free(p[relay]);
}

TEST(joins_and_leaves_number_the_world)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,pp=2,dp=2", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=2,pp=2,dp=4", 8, 1);
	struct vps_world *w;
	CHECK_OK(vps_world_new(&w, a, b));
	/* A on node 0, B on nodes 1-2: nothing shared */
	CHECK_EQ(vps_world_size(w), 24);
	CHECK_EQ(vps_world_b_rank(w, 3), -1);
	CHECK_EQ(vps_world_b_rank(w, 8), 0);
	CHECK_EQ(vps_world_of_b(w, 15), 23);
	CHECK_EQ(vps_world_device(w, 23).node, 2);
	vps_world_free(w);
	vps_layout_free(b);
	b = test_layout("tiny-llama", "tp=2,pp=2,dp=4", 8, 0);
	CHECK_OK(vps_world_new(&w, a, b));
	CHECK_EQ(vps_world_size(w), 16);
	CHECK_EQ(vps_world_b_rank(w, 5), 5);
	CHECK_EQ(vps_world_b_rank(w, 9), 9);
	vps_world_free(w);
	vps_layout_free(a);
	vps_layout_free(b);
}

TEST(an_unchanged_layout_moves_nothing)
{
	struct vps_layout *a = test_layout("tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1", 8, 0);
	struct vps_layout *b = test_layout("tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1", 8, 0);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	for (size_t i = 0; i < p->npieces; i++)
		CHECK_EQ(p->pieces[i].src, p->pieces[i].dst);
	vps_plan_free(p);
}

TEST(training_state_splits_the_global_batch)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=4", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=2,dp=3", 8, 0);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.micro_batch_a = 4;
	o.train.global_batch = 48;
	struct vps_plan *p;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	CHECK_EQ(p->train.dp, 3);
	CHECK_EQ(p->train.micro_batch, 4);
	CHECK_EQ(p->train.grad_accum, 4);
	vps_plan_free(p);
	a = test_layout("tiny-llama", "tp=2,dp=4", 8, 0);
	b = test_layout("tiny-llama", "tp=1,dp=5", 8, 0);
	CHECK(vps_plan_compute(&p, a, b, &o) == VPS_EINPUT);
	vps_layout_free(a);
	vps_layout_free(b);
}

/* A tied embedding lives on the first and the last A stage, whose other
 * duties differ: the replicas are weighed (docs/plan.md), and the busiest
 * device stays at the balanced bound. Equal shares put it 4-8% above. The
 * weighed choice is still a function every sender inverts: rank by rank,
 * and past EXACT_REPLICAS B replicas (dp=70), where a sender enumerates
 * the destinations of a weighed group. */
TEST(replicas_in_different_stages_are_weighed_by_their_duties)
{
	static const struct tcase weighed_cases[] = {
		{"tiny-gpt", "tp=1,pp=2,dp=1,zero=1", "tp=1,pp=4,dp=1,zero=1", 8, 0, 8, 0},
		{"tiny-gpt", "tp=2,pp=2,dp=1,zero=1", "tp=2,pp=4,dp=1,zero=1", 8, 0, 8, 0},
		{"tiny-gpt", "tp=1,pp=2,dp=1,zero=1", "tp=1,pp=2,dp=2,zero=1", 8, 0, 8, 0},
	};
	for (size_t i = 0; i < sizeof(weighed_cases) / sizeof(weighed_cases[0]); i++) {
		const struct tcase *c = &weighed_cases[i];
		run_case(c, true, false);
		struct vps_layout *a = test_layout(c->model, c->from, c->gpn_a, c->first_a);
		struct vps_layout *b = test_layout(c->model, c->to, c->gpn_b, c->first_b);
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		struct vps_plan *p = NULL;
		struct vps_plan_stats s;
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (!p)
			continue;
		CHECK_OK(vps_plan_stats(p, NULL, false, &s));
		int64_t busiest = s.max_send_bytes > s.max_recv_bytes ? s.max_send_bytes : s.max_recv_bytes;
		if (busiest * 100 > s.balanced_bound * 101)
			harness_fail(__FILE__, __LINE__, "%s %s -> %s: busiest device %lld bytes, balanced bound %lld",
				     c->model, c->from, c->to, (long long)busiest, (long long)s.balanced_bound);
		vps_plan_stats_release(&s);
		vps_plan_free(p);
	}
	const struct tcase many = {"tiny-gpt", "tp=1,pp=2,dp=4,zero=1", "tp=1,pp=1,dp=70,zero=1", 8, 0, 8, 0};
	struct vps_layout *a = test_layout(many.model, many.from, many.gpn_a, many.first_a);
	struct vps_layout *b = test_layout(many.model, many.to, many.gpn_b, many.first_b);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p = NULL;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p)
		return;
	/* senders of both stages, and receivers on each node */
	static const int64_t ranks[] = {0, 3, 4, 7, 9, 35, 69};
	for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++)
		rank_part_same(&many, p, ranks[i], VPS_RELAY_AUTO, NULL);
	vps_plan_free(p);
}

/* Case c planned without relays (p[0]) and by default (p[1]), weighed on
 * plan_topo (NULL: by bytes), with their statistics on stats_topo. */
static void plan_never_and_auto(const struct tcase *c, const struct vps_topology *plan_topo,
				const struct vps_topology *stats_topo, struct vps_plan *p[2], struct vps_plan_stats s[2])
{
	memset(s, 0, 2 * sizeof(*s));
	for (int m = 0; m < 2; m++) {
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		o.relay_mode = m ? VPS_RELAY_AUTO : VPS_RELAY_NEVER;
		o.topology = plan_topo;
		p[m] = NULL;
		CHECK_OK(vps_plan_compute(&p[m], test_layout(c->model, c->from, c->gpn_a, c->first_a),
					  test_layout(c->model, c->to, c->gpn_b, c->first_b), &o));
		if (p[m])
			CHECK_OK(vps_plan_stats(p[m], stats_topo, false, &s[m]));
	}
}

/* The bytes plan p's devices of A forward (relays that held data under A),
 * by their A pipeline stage (stages below STAGES_COUNTED counted); returns
 * their sum. */
#define STAGES_COUNTED 8
static int64_t forwarded_by_stage(const struct vps_plan *p, int64_t by_stage[STAGES_COUNTED])
{
	int64_t all = 0;
	memset(by_stage, 0, STAGES_COUNTED * sizeof(*by_stage));
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		int64_t ra = vps_world_a_rank(p->world, x->src);
		struct vps_coords at;
		if (!(x->src_buffer & VPS_BUFFER_TARGET) || ra < 0)
			continue;
		vps_layout_coords(p->a, ra, &at);
		all += vps_piece_bytes(x);
		if (at.pp < STAGES_COUNTED)
			by_stage[at.pp] += vps_piece_bytes(x);
	}
	return all;
}

/* The default plan (s[1]) faster and its busiest sender less busy than
 * without relays (s[0]), moving the same bytes; then both freed. */
/* a800-testbed without its latency: a tiny model's bytes weigh as a
 * large one's do on it. */
static void fast_testbed(struct vps_topology *topo)
{
	CHECK_OK(vps_topology_load(topo, "a800-testbed", CONFIGS "/topologies"));
	topo->latency = 1e-9;
}

/* Plans and statistics of plan_never_and_auto, released. */
static void release_both(struct vps_plan *p[2], struct vps_plan_stats s[2])
{
	for (int m = 0; m < 2; m++) {
		vps_plan_stats_release(&s[m]);
		vps_plan_free(p[m]);
	}
}

static void check_faster_and_free(struct vps_plan *p[2], struct vps_plan_stats s[2])
{
	if (p[0] && p[1]) {
		CHECK(s[1].estimate_seconds < s[0].estimate_seconds);
		CHECK(s[1].max_send_bytes < s[0].max_send_bytes);
		CHECK_EQ(s[1].bytes_moved - s[1].bytes_transit, s[0].bytes_moved);
	}
	release_both(p, s);
}

/* By default a device of A that holds none of a region relays it too
 * (docs/relay.md, "Devices that do not join"): where the region's busiest
 * sender gains and the device, relaying all it could on top of its own
 * sends, stays below the busiest holder's own sends (in time on the
 * topology, else in bytes). tiny-llama from pp=4, dp=2 to pp=4, dp=4 on
 * nodes of four, like llama2-7b-dp-up: the new replicas of a pipeline
 * stage are devices of A that held another stage, which relay, and
 * joining devices. From
 * pp=2, dp=1 to dp=4 only the joining devices relay; from pp=8, dp=2 to
 * dp=4, devices of A whose own stages other devices of A relay relay
 * another stage. Every element lands
 * right, a rank's plan is the global plan's part, and the plan is never
 * slower nor busier than without relays. */
TEST(devices_that_do_not_join_relay_where_that_is_never_worse)
{
	struct vps_topology topo = {.name = "t", .gpus_per_node = 4, .intra_node_bandwidth = 200e9,
				    .inter_node_bandwidth = 25e9, .memory_bandwidth = 1.9e12, .latency = 20e-6};
	static const struct {
		struct tcase c;
		bool from_a[2]; /* by bytes, and on the topology */
		int stage; /* not 0: devices of A's pipeline stage this relay too */
	} cases_a[] = {
		{{"tiny-llama", "tp=1,pp=4,dp=2,zero=0", "tp=1,pp=4,dp=4,zero=0", 4, 0, 4, 0}, {true, true}, 0},
		/* their receivers relay by bytes too once a relay is counted
		 * sending its range into each other node, not a copy
		 * (relay_share): 14.17 MB from the busiest, 14.51 MB before */
		{{"tiny-llama", "tp=1,pp=4,dp=2,zero=1", "tp=1,pp=4,dp=4,zero=1", 4, 0, 4, 0}, {true, true}, 0},
		{{"tiny-llama", "tp=1,pp=2,dp=1,zero=0", "tp=1,pp=2,dp=4,zero=0", 4, 0, 4, 0}, {false, false}, 0},
		/* B's stage 1 lies on the devices of A's stages 2 and 3, whose
		 * own stages go to the devices of A's stages 4 to 7, free to
		 * relay them (their own go to joining devices): counted as
		 * sending one copy of their stages (duty_likely), not two, the
		 * devices of A's stage 2 relay stage 1 too (before, they did not) */
		{{"tiny-llama", "tp=1,pp=8,dp=2,zero=0", "tp=1,pp=8,dp=4,zero=0", 4, 0, 4, 0}, {true, true}, 2},
	};
	for (size_t i = 0; i < sizeof(cases_a) / sizeof(cases_a[0]); i++) {
		const struct tcase *c = &cases_a[i].c;
		run_case(c, true, VPS_RELAY_AUTO);
		for (int weigh = 0; weigh < 2; weigh++) {
			struct vps_plan *p[2];
			struct vps_plan_stats s[2];
			plan_never_and_auto(c, weigh ? &topo : NULL, &topo, p, s);
			if (p[0] && p[1]) {
				int64_t by_stage[STAGES_COUNTED], from_a = forwarded_by_stage(p[1], by_stage);
				if ((from_a > 0) != cases_a[i].from_a[weigh])
					harness_fail(__FILE__, __LINE__, "%s -> %s%s: %lld bytes forwarded by devices of A",
						     c->from, c->to, weigh ? " on the topology" : "", (long long)from_a);
				if (cases_a[i].stage && !by_stage[cases_a[i].stage])
					harness_fail(__FILE__, __LINE__, "%s -> %s%s: no forwards from devices of A's stage %d",
						     c->from, c->to, weigh ? " on the topology" : "", cases_a[i].stage);
				job_plan_exact(p[1], c->from);
			}
			check_faster_and_free(p, s);
		}
	}
}

/* Devices of A that relay for each other two levels deep (LIKELY_DEPTH):
 * tiny-llama from tp=4 to tp=2 (pp=4, dp=4, eight GPUs a node, half the
 * devices leave), like llama2-*-tp-down. Weighed one level deep, the
 * receivers of the devices that stay looked as busy as the holders and
 * few relayed (the estimate 0.86x the plan without relays); two levels
 * deep, they relay (0.43x). The plan stays exact, and a rank's plan the
 * global plan's part. */
TEST(devices_of_a_relay_for_each_other_two_levels_deep)
{
	static const struct tcase c = {"tiny-llama", "tp=4,pp=4,dp=4,zero=0", "tp=2,pp=4,dp=4,zero=0", 8, 0, 8, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[0] && p[1]) {
		CHECK(s[1].estimate_seconds < 0.6 * s[0].estimate_seconds);
		CHECK_EQ(s[1].bytes_moved - s[1].bytes_transit, s[0].bytes_moved);
		job_plan_exact(p[1], c.from);
	}
	release_both(p, s);
}

/* Busy receivers take a region node by node from its holders
 * (relay_entry): tiny-llama from pp=2 to pp=4 (dp=4, ZeRO-1, two GPUs a
 * node, on a800-testbed), like llama2-*-pp-down-back. B's stage 1 lies on
 * the devices of A's stage 1 (two nodes), which send their own stage to
 * the joining devices; passing stage 1's ranges on into each other's node
 * made them the busiest. Now each range enters each node from a holder and
 * the devices of A pass it on only to their node-mates: they forward, no
 * forward of theirs leaves its node, the plan is exact, a rank's plan the
 * global plan's part, and it is faster than without relays and than the
 * relayed floor's 1.45x (1.52x routed through the receivers' NICs). */
TEST(busy_receivers_take_a_region_node_by_node_from_its_holders)
{
	static const struct tcase c = {"tiny-llama", "tp=1,pp=2,dp=4,zero=1", "tp=1,pp=4,dp=4,zero=1", 2, 0, 2, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[0] && p[1]) {
		int64_t by_stage[STAGES_COUNTED], away = 0;
		CHECK(forwarded_by_stage(p[1], by_stage) > 0);
		for (size_t k = 0; k < p[1]->npieces; k++) {
			const struct vps_piece *x = &p[1]->pieces[k];
			if ((x->src_buffer & VPS_BUFFER_TARGET) && vps_world_a_rank(p[1]->world, x->src) >= 0 &&
			    vps_world_device(p[1]->world, x->src).node != vps_world_device(p[1]->world, x->dst).node)
				away += vps_piece_bytes(x);
		}
		CHECK_EQ(away, 0);
		struct vps_time_floor floor;
		CHECK_OK(vps_time_floor_relayed(p[1]->a, p[1]->b, &topo, &floor));
		CHECK(s[1].estimate_seconds < 1.45 * floor.seconds);
		job_plan_exact(p[1], c.from);
	}
	check_faster_and_free(p, s);
}

/* Transit (docs/relay.md, "Transit"): tiny-llama from tp=2, pp=2 on two
 * nodes of two to tp=1, pp=2 on node 0 alone, like gpt3-*-tp-up-back.
 * Node 1's stage comes to GPU 1 over its NIC alone while GPU 0 takes its
 * stage from its node-mate over NVLink: its NIC idles. Planned on the
 * topology, GPU 0 takes part of GPU 1's stage in over its NIC into its
 * transit area and passes it on over NVLink: every element lands right
 * (the areas as vps-exec sizes them), a rank's plan is the global plan's
 * part, what moves beside the transit arrivals is the lower bound, and the
 * plan takes 1.5x less than without relays and lies within 1.1x of the
 * relayed floor (1.8x before). Without a topology, or with relays always
 * (the first rule) or never, nothing goes through an area. */
TEST(idle_nics_carry_what_their_node_mates_need)
{
	static const struct tcase c = {"tiny-llama", "tp=2,pp=2,dp=1,zero=1", "tp=1,pp=2,dp=1,zero=1", 2, 0, 2, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[0] && p[1]) {
		int64_t into = 0, area = 0;
		for (size_t k = 0; k < p[1]->npieces; k++) {
			const struct vps_piece *x = &p[1]->pieces[k];
			if (!vps_piece_to_transit(x))
				continue;
			CHECK_EQ(x->dst, 0);
			CHECK_EQ(vps_world_device(p[1]->world, x->src).node, 1);
			into += vps_piece_bytes(x);
		}
		CHECK(into > 0);
		CHECK_EQ(into, s[1].bytes_transit);
		CHECK_OK(vps_plan_transit_bytes(p[1], 0, &area));
		CHECK(area >= into);
		CHECK_OK(vps_plan_transit_bytes(p[1], 1, &area));
		CHECK_EQ(area, 0);
		struct vps_time_floor floor;
		CHECK_OK(vps_time_floor_relayed(p[1]->a, p[1]->b, &topo, &floor));
		CHECK(s[1].estimate_seconds < 1.1 * floor.seconds);
		CHECK(1.5 * s[1].estimate_seconds < s[0].estimate_seconds);
		CHECK_EQ(s[1].bytes_moved - s[1].bytes_transit, s[0].bytes_moved);
	}
	release_both(p, s);
	static const struct {
		enum vps_relay relay;
		bool topo;
	} none[] = {{VPS_RELAY_AUTO, false}, {VPS_RELAY_ALWAYS, true}, {VPS_RELAY_NEVER, true}};
	for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		o.relay_mode = none[i].relay;
		o.topology = none[i].topo ? &topo : NULL;
		struct vps_plan *q = NULL;
		CHECK_OK(vps_plan_compute(&q, test_layout(c.model, c.from, c.gpn_a, c.first_a),
					  test_layout(c.model, c.to, c.gpn_b, c.first_b), &o));
		for (size_t k = 0; q && k < q->npieces; k++)
			CHECK(!vps_piece_to_transit(&q->pieces[k]) && !vps_piece_from_transit(&q->pieces[k]));
		vps_plan_free(q);
	}
}

/* Sharing once over NVLink (docs/relay.md): tiny-llama from pp=4 (dp=1)
 * to dp=4 (pp=1) on one node of four, like llama2-13b-ablation-s1-s2, on
 * a800-testbed without its latency (a tiny model's bytes weigh less than
 * a message's 20 us there; with it, nothing is shared). Each holder sends
 * its stage to three node-mates, the holders of the embedding and of the
 * output layer busier than the others: node-mates pass on to each other
 * what they took in, from their B buffers a hop later. Every element
 * lands right, a rank's plan is the global plan's part, nothing goes
 * through an area, and the busiest sender sends less, the plan faster,
 * than without relays. */
TEST(node_mates_share_what_a_busy_sender_sends_them_alike)
{
	static const struct tcase c = {"tiny-llama", "tp=1,pp=4,dp=1,zero=1", "tp=1,pp=1,dp=4,zero=1", 4, 0, 4, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	struct vps_topology fast = topo;
	fast.latency = 0;
	run_case_on(&c, true, VPS_RELAY_AUTO, &fast);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &fast, &fast, p, s);
	if (p[1]) {
		int64_t shared = 0;
		for (size_t k = 0; k < p[1]->npieces; k++) {
			const struct vps_piece *x = &p[1]->pieces[k];
			CHECK(!vps_piece_to_transit(x) && !vps_piece_from_transit(x));
			if (x->src_buffer & VPS_BUFFER_TARGET) {
				CHECK(vps_world_a_rank(p[1]->world, x->src) >= 0);
				CHECK_EQ(vps_world_device(p[1]->world, x->src).node, vps_world_device(p[1]->world, x->dst).node);
				shared += vps_piece_bytes(x);
			}
		}
		CHECK(shared > 0);
		CHECK_EQ(shared, s[1].bytes_relayed);
	}
	check_faster_and_free(p, s);
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[1])
		CHECK_EQ(s[1].bytes_relayed, 0);
	release_both(p, s);
}

/* Replicas whose own shards differ share the rest by weights (weighed):
 * tiny-llama from tp=2 to tp=4 (pp=1, dp=4, ZeRO-1, four GPUs a node, on
 * a800-testbed), like llama2-*-tp-down-back. On node 0 data-parallel
 * ranks 0 and 1 keep their shards on the node and ranks 2 and 3 send
 * theirs to node 1 over their NICs; sharing the parameters equally, ranks
 * 0 and 1 sent 3.4 MB over their NICs and ranks 2 and 3 12.5 MB (1.62x
 * the time bound). By weights ranks 0 and 1 serve more of them: each of
 * node 0's NICs carries at least half what the busiest does, and the
 * plan is within 1.55x the time bound (1.48x); it is exact, and a rank's
 * plan the global plan's part. */
TEST(replicas_whose_own_shards_differ_share_by_weights)
{
	static const struct tcase c = {"tiny-llama", "tp=2,pp=1,dp=4,zero=1", "tp=4,pp=1,dp=4,zero=1", 4, 0, 4, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p = plan_on(&c, &topo);
	if (!p)
		return;
	struct vps_plan_stats s = {0};
	CHECK_OK(vps_plan_stats(p, &topo, true, &s));
	if (s.nic_send) {
		int64_t least = INT64_MAX, most = 0;
		for (int r = 0; r < 4; r++) {
			least = s.nic_send[r] < least ? s.nic_send[r] : least;
			most = s.nic_send[r] > most ? s.nic_send[r] : most;
		}
		CHECK(2 * least >= most);
		CHECK(s.estimate_seconds < 1.55 * s.time_bound_seconds);
	}
	job_plan_exact(p, c.from);
	vps_plan_stats_release(&s);
	vps_plan_free(p);
}

/* The rotation's ranges are equal parts of what moves (moved_map):
 * gpt3-1.3b from pp=2, dp=2 to pp=2, dp=1 (tp=4, ZeRO-1, eight GPUs a
 * node), gpt3-1.3b-dp-up-back (a tiny model's pieces are too small to
 * cut, SPLIT_MIN_BYTES). B's stage 1 lies on the devices of
 * A's stage 0, replica 1, which keep the tied embedding; A's two replicas
 * of stage 1 (node 1) serve the rest of its parameters, each half of what
 * moves. Cut by the buffer, the replica whose half held the embedding sent
 * 41% of them, not 50%. A rank's plan is the global plan's part (the
 * model is too large to execute here: the tiny cases above do). */
TEST(replicas_serve_equal_parts_of_what_moves)
{
	static const struct tcase c = {"gpt3-1.3b", "tp=4,pp=2,dp=2,zero=1", "tp=4,pp=2,dp=1,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	struct vps_plan *p = plan_on_testbed(&c, &topo);
	if (!p)
		return;
	int64_t params[16] = {0};
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		if (x->src != x->dst && x->state == VPS_STATE_PARAM && x->src >= 8 && x->src < 16)
			params[x->src] += vps_piece_bytes(x);
	}
	for (int t = 0; t < 4; t++) {
		int64_t a = params[8 + t], b = params[12 + t];
		CHECK(a > 0 && b > 0);
		/* equal but for the pieces too small to cut (SPLIT_MIN_BYTES) */
		CHECK(a - b < (a + b) / 100 && b - a < (a + b) / 100);
	}
	/* the senders and a receiver plan their parts alike */
	const int64_t ranks[] = {4, 8, 12};
	parts_same_and_free(&c, p, ranks, sizeof(ranks) / sizeof(ranks[0]), &topo);
}

/* A busy preferred holder of a replicated tensor shares it by weights
 * (prefer_weighed): gpt3-1.3b from tp=2 to tp=4 (pp=2, ZeRO-1, one node of
 * eight), gpt3-1.3b-tp-down-back. B's ranks 2 and 3 (stage 0) take the
 * position embeddings, which A's ranks 0 and 1 both hold; their slices lie
 * in rank 1's, which sends 4.6 GB of its own, rank 0 2.7 GB. Rank 0 now
 * serves them (rank 1 alone did: the plan 1.03x its floor), and a rank's
 * plan is the global plan's part. */
TEST(a_busy_preferred_holder_leaves_a_replicated_tensor_to_the_others)
{
	static const struct tcase c = {"gpt3-1.3b", "tp=2,pp=2,dp=1,zero=1", "tp=4,pp=2,dp=1,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	struct vps_plan *p = plan_on_testbed(&c, &topo);
	if (!p)
		return;
	int64_t from[2] = {0, 0};
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		struct vps_tensor t;
		char name[256];
		CHECK_OK(vps_model_tensor(vps_layout_model(p->b), x->tensor, &t));
		vps_tensor_name(&t, name, sizeof(name));
		if (!strcmp(name, "embedding.position_embeddings.weight") && x->src != x->dst && x->src < 2 &&
		    (x->dst == 2 || x->dst == 3))
			from[x->src] += vps_piece_bytes(x);
	}
	CHECK(from[0] > from[1]);
	const int64_t ranks[] = {0, 1, 2, 3};
	parts_same_and_free(&c, p, ranks, sizeof(ranks) / sizeof(ranks[0]), &topo);
}

/* Weighed holders bring relayed ranges in by their weights, each weighed
 * by what it shares over the destination's link: llama-32b from tp=2,
 * pp=8, dp=2 to tp=4, pp=4, dp=2 (ZeRO-1, eight GPUs a node),
 * llama-32b-s8-s7. A's ranks 8 and 10 (node 1) both hold parameters
 * that B's ranks 0 and 1 (node 0) take and relay to each other; rank
 * 10's NIC carries 3.2 GB of its own optimizer shards to node 0, rank 8's
 * next to none. Each receiver's range came from the holder the rotation
 * gave it, 0.27 GB from each (the plan 1.08x its floor); now rank 8
 * brings in all of it, and a rank's plan is the global plan's part. */
TEST(a_busy_holder_leaves_a_relayed_region_to_its_replica)
{
	static const struct tcase c = {"llama-32b", "tp=2,pp=8,dp=2,first=6,last=6,zero=1", "tp=4,pp=4,dp=2,zero=1",
				       8, 0, 8, 0};
	struct vps_topology topo;
	struct vps_plan *p = plan_on_testbed(&c, &topo);
	if (!p)
		return;
	int64_t params[2] = {0, 0};
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		if (x->state == VPS_STATE_PARAM && x->dst < 8 && (x->src == 8 || x->src == 10))
			params[x->src == 10] += vps_piece_bytes(x);
	}
	CHECK(params[0] > 0 && params[1] * 10 < params[0]);
	const int64_t ranks[] = {0, 1, 8, 10};
	parts_same_and_free(&c, p, ranks, sizeof(ranks) / sizeof(ranks[0]), &topo);
}

/* The least and the most of n byte counts. */
static void least_most(const int64_t *v, size_t n, int64_t *least, int64_t *most)
{
	*least = INT64_MAX;
	*most = 0;
	for (size_t i = 0; i < n; i++) {
		*least = v[i] < *least ? v[i] : *least;
		*most = v[i] > *most ? v[i] : *most;
	}
}

/* llama2-7b from pp=4, dp=4 to dp=8 (tp=4, ZeRO-1, eight GPUs a node),
 * llama2-7b-dp-up: A's stage 1 (ranks 16 to 31, nodes 2 and 3) goes to
 * B's stage 1, on the devices of A's stages 2 and 3 (nodes 4 to 7), in
 * ranges sized to their room and a range straight from the holders into
 * each node; stage 0 enters nodes 2 and 3 from its holders, node by node.
 * - The holders serve the ranges the receivers take from them alike, each
 *   range in equal parts (serve_ranges): whole ranges to the least loaded
 *   holder, turning with the tensor, left them 1.44 to 1.59 GB over their
 *   NICs.
 * - Stage 1's holders and its relays send alike over their NICs, as the
 *   floor by nodes has the six nodes do (relay.md): counted as passing
 *   stage 0 on over their NICs as well (relay_likely without
 *   entry_likely), the holders took a direct range for 1.51 GB and left
 *   the relays 1.73 (the plan 1.048x its relayed floor).
 * A rank's plan is the global plan's part. */
TEST(holders_and_relays_of_a_stage_send_alike)
{
	static const struct tcase c = {"llama2-7b", "tp=4,pp=4,dp=4,zero=1", "tp=4,pp=4,dp=8,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	struct vps_plan *p = plan_on_testbed(&c, &topo);
	if (!p)
		return;
	int64_t own[16] = {0}, nic[48] = {0}, least, most;
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		int64_t ra = vps_world_a_rank(p->world, x->src);
		if (ra < 16 || ra >= 64 || vps_world_device(p->world, x->src).node == vps_world_device(p->world, x->dst).node)
			continue;
		nic[ra - 16] += vps_piece_bytes(x);
		if (ra < 32 && !(x->src_buffer & VPS_BUFFER_TARGET))
			own[ra - 16] += vps_piece_bytes(x);
	}
	least_most(own, 16, &least, &most);
	if (!(least > 0 && (double)most < 1.005 * (double)least))
		harness_fail(__FILE__, __LINE__, "stage 1's holders send %lld to %lld bytes of their own into other nodes",
			     (long long)least, (long long)most);
	least_most(nic, 48, &least, &most);
	if (!(least > 0 && (double)most < 1.01 * (double)least))
		harness_fail(__FILE__, __LINE__, "the devices of A's stages 1 to 3 send %lld to %lld bytes over their NICs",
			     (long long)least, (long long)most);
	const int64_t ranks[] = {16, 27, 36, 60, 100};
	parts_same_and_free(&c, p, ranks, sizeof(ranks) / sizeof(ranks[0]), &topo);
}

/* A holder's regions that enter their receivers' nodes from it count as
 * they go where a direct range of its other regions is sized
 * (holder_entries): llama2-7b from pp=4 to pp=8 (llama2-7b-pp-up on the
 * A800 testbed), where stage 1's holders (nodes 2 and 3) bring its later
 * layers into nodes 6 and 7 node by node and send a range of its earlier
 * ones straight into nodes 4 and 5, whose devices relay the rest. Sized
 * as though the later layers went as the earlier, that range made the
 * holders send 4.5% more over their NICs than the devices of stage 2;
 * now within 0.5%. Ranks' plans are the global plan's parts. */
TEST(a_holders_entries_leave_less_room_for_its_direct_range)
{
	static const struct tcase c = {"llama2-7b", "tp=4,pp=4,dp=4,zero=1", "tp=4,pp=8,dp=4,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	struct vps_plan *p = plan_on_testbed(&c, &topo);
	if (!p)
		return;
	int64_t nic[32] = {0}, least, most;
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		int64_t ra = vps_world_a_rank(p->world, x->src);
		if (ra >= 16 && ra < 48 && vps_world_device(p->world, x->src).node != vps_world_device(p->world, x->dst).node)
			nic[ra - 16] += vps_piece_bytes(x);
	}
	least_most(nic, 32, &least, &most);
	if (!(least > 0 && (double)most < 1.005 * (double)least))
		harness_fail(__FILE__, __LINE__, "the devices of A's stages 1 and 2 send %lld to %lld bytes over their NICs",
			     (long long)least, (long long)most);
	const int64_t ranks[] = {16, 29, 33, 50, 70, 127};
	parts_same_and_free(&c, p, ranks, sizeof(ranks) / sizeof(ranks[0]), &topo);
}

/* Relays pass on ranges sized to what they have to spare (relay_weigh):
 * tiny-llama from pp=4, dp=4 to dp=8 (ZeRO-1, two GPUs a node), like
 * llama2-7b-dp-up: B's stage 1 lies on the devices of A's stages 2 and
 * 3, which relay it on top of sending their own stages, and stage 3's
 * devices send more of their own. Their forwards carry less than stage
 * 2's (with equal ranges, the same), on the topology and by bytes; the
 * plan is exact, a rank's plan the global plan's part, and faster and
 * less busy than without relays. */
TEST(busy_relays_pass_on_smaller_ranges)
{
	static const struct tcase c = {"tiny-llama", "tp=1,pp=4,dp=4,zero=1", "tp=1,pp=4,dp=8,zero=1", 2, 0, 2, 0};
	struct vps_topology topo = {.name = "t", .gpus_per_node = 2, .intra_node_bandwidth = 200e9,
				    .inter_node_bandwidth = 25e9, .memory_bandwidth = 1.9e12, .latency = 20e-6};
	for (int weigh = 0; weigh < 2; weigh++) {
		run_case_on(&c, true, VPS_RELAY_AUTO, weigh ? &topo : NULL);
		struct vps_plan *p[2];
		struct vps_plan_stats s[2];
		plan_never_and_auto(&c, weigh ? &topo : NULL, &topo, p, s);
		if (p[0] && p[1]) {
			int64_t forwarded[STAGES_COUNTED];
			forwarded_by_stage(p[1], forwarded);
			if (!(forwarded[3] > 0 && (double)forwarded[2] > 1.1 * (double)forwarded[3]))
				harness_fail(__FILE__, __LINE__, "%s: stage 2's devices forward %lld bytes, stage 3's %lld",
					     weigh ? "on the topology" : "by bytes", (long long)forwarded[2],
					     (long long)forwarded[3]);
		}
		check_faster_and_free(p, s);
	}
}

/* Replicas in different pipeline stages (a tied embedding) share a piece
 * in time on the topology, each one's link to the destination apart:
 * gpt3-1.3b from tp=4 to tp=8 (pp=2), B's last stage on a joining node
 * (gpt3-1.3b-tp-up; tiny-gpt's bytes are too few to outweigh latency).
 * The last stage's devices send that stage over their NICs; the first
 * stage's send theirs over NVLink, their NICs idle, and take the
 * embedding rows for the other node. Faster than weighed by
 * bytes (--no-relay, or without a topology). tiny-gpt's plan so weighed
 * is exact and a rank's plan the global plan's part (gpt3-1.3b's 18 GB of
 * state would not fit the test's memory). */
TEST(a_tied_embedding_is_shared_in_time)
{
	static const struct tcase c = {"gpt3-1.3b", "tp=4,pp=2,dp=1,zero=1", "tp=8,pp=2,dp=1,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	static const struct tcase tiny = {"tiny-gpt", "tp=4,pp=2,dp=1,zero=1", "tp=8,pp=2,dp=1,zero=1", 8, 0, 8, 0};
	run_case_on(&tiny, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2], *bytes = NULL;
	struct vps_plan_stats s[2], sb;
	plan_never_and_auto(&c, &topo, &topo, p, s);
	memset(&sb, 0, sizeof(sb));
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	CHECK_OK(vps_plan_compute(&bytes, test_layout(c.model, c.from, c.gpn_a, c.first_a),
				  test_layout(c.model, c.to, c.gpn_b, c.first_b), &o));
	if (bytes)
		CHECK_OK(vps_plan_stats(bytes, &topo, false, &sb));
	if (p[0] && p[1] && bytes) {
		if (!(s[1].estimate_seconds < 0.97 * s[0].estimate_seconds &&
		      s[1].estimate_seconds < 0.97 * sb.estimate_seconds))
			harness_fail(__FILE__, __LINE__, "estimate %.6g s, by bytes %.6g s, without relays %.6g s",
				     s[1].estimate_seconds, sb.estimate_seconds, s[0].estimate_seconds);
		CHECK_EQ(s[1].bytes_moved - s[1].bytes_transit, s[0].bytes_moved);
		CHECK_EQ(s[1].bytes_moved, s[1].bytes_lower_bound);
	}
	release_both(p, s);
	vps_plan_stats_release(&sb);
	vps_plan_free(bytes);
}

/* Bytes that a receiver of a relayed tensor takes straight from a holder
 * while another receiver takes the same elements straight from a holder
 * too (a weighted buffer's direct range: relayed by none), each such piece
 * counted once a destination. */
static int64_t sent_to_every_receiver(const struct vps_plan *p)
{
	int64_t bytes = 0;
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if (x->src == x->dst || (x->src_buffer & VPS_BUFFER_TARGET) || x->dst_buffer == VPS_BUFFER_TRANSIT)
			continue;
		bool forwarded_here = false, also_direct = false;
		for (size_t j = 0; j < p->npieces && !(forwarded_here && also_direct); j++) {
			const struct vps_piece *y = &p->pieces[j];
			struct vps_box o;
			if (j == i || y->tensor != x->tensor || y->state != x->state)
				continue;
			if (y->dst == x->dst && (y->src_buffer & VPS_BUFFER_TARGET))
				forwarded_here = true;
			else if (y->dst != x->dst && y->src != y->dst && !(y->src_buffer & VPS_BUFFER_TARGET) &&
				 vps_box_intersect(&x->box, &y->box, &o))
				also_direct = true;
		}
		if (forwarded_here && also_direct)
			bytes += vps_piece_bytes(x);
	}
	return bytes;
}

/* Where the receivers of a relayed region are devices of A busy with their
 * own stages and its holders have time to spare, the holders send a last
 * range of its buffer to every receiver, relayed by none (docs/relay.md,
 * "A range for every receiver"): tiny-llama at pp=4, dp=4 on nodes of two,
 * like llama2-*-tp-up and -dp-up: B's stage 1 lies on the devices of A's
 * stages 2 and 3, which send their own stages to the joining devices.
 * From tp=1 to tp=2 each receiver of a slice has a node of its own; from
 * dp=4 to dp=8 two share a node (the range enters it once; on a fabric
 * whose latency is nothing against the bytes, as a800-testbed's against
 * llama2's). Every element lands right, a rank's plan is the global plan's
 * part, and the plan is faster and its busiest sender less busy than
 * without relays. */
TEST(holders_with_time_to_spare_send_a_range_to_every_receiver)
{
	static const struct {
		struct tcase c;
		double latency;
	} spare[] = {
		{{"tiny-llama", "tp=1,pp=4,dp=4,zero=1", "tp=2,pp=4,dp=4,zero=1", 2, 0, 2, 0}, 20e-6},
		{{"tiny-llama", "tp=1,pp=4,dp=4,zero=1", "tp=1,pp=4,dp=8,zero=1", 2, 0, 2, 0}, 1e-9},
	};
	for (size_t i = 0; i < sizeof(spare) / sizeof(spare[0]); i++) {
		const struct tcase *c = &spare[i].c;
		struct vps_topology topo = {.name = "t", .gpus_per_node = 2, .intra_node_bandwidth = 200e9,
					    .inter_node_bandwidth = 25e9, .memory_bandwidth = 1.9e12,
					    .latency = spare[i].latency};
		run_case_on(c, true, VPS_RELAY_AUTO, &topo);
		struct vps_plan *p[2];
		struct vps_plan_stats s[2];
		plan_never_and_auto(c, &topo, &topo, p, s);
		if (p[1]) {
			int64_t direct = sent_to_every_receiver(p[1]);
			if (!(direct > 0 && s[1].bytes_relayed > 0))
				harness_fail(__FILE__, __LINE__, "%s: %lld bytes of relayed tensors sent to every receiver, %lld relayed",
					     c->to, (long long)direct, (long long)s[1].bytes_relayed);
		}
		check_faster_and_free(p, s);
	}
}

/* The parameters' bytes each A rank of plan p sends into nodes other than
 * its own from its A buffers (not relays' forwards), by A rank (below
 * RANKS_COUNTED). */
#define RANKS_COUNTED 64
static void entries_by_holder(const struct vps_plan *p, int64_t by_rank[RANKS_COUNTED])
{
	memset(by_rank, 0, RANKS_COUNTED * sizeof(*by_rank));
	for (size_t k = 0; k < p->npieces; k++) {
		const struct vps_piece *x = &p->pieces[k];
		int64_t ra = vps_world_a_rank(p->world, x->src);
		if (x->src == x->dst || (x->src_buffer & VPS_BUFFER_TARGET) || ra < 0 || ra >= RANKS_COUNTED ||
		    x->state != VPS_STATE_PARAM ||
		    vps_world_device(p->world, x->src).node == vps_world_device(p->world, x->dst).node)
			continue;
		by_rank[ra] += vps_piece_bytes(x);
	}
}

/* Where a relayed region enters each of its receivers' nodes from its
 * holders (relay_entry), they bring the entries in by their time to spare,
 * not in turn (docs/relay.md, "Entries by time to spare"): tiny-llama from
 * pp=2, dp=4 to pp=4 on nodes of two, like llama2-7b-pp-up: B's stage 1
 * (the second half of A's stage 0) lies on the devices of A's stage 1,
 * busy with their own; of A's stage 0 (A ranks 0 to 3), the last
 * data-parallel rank keeps its ZeRO-1 shards (B's stage 0 holds the same
 * part of the same layers there) and has its NIC to spare. It brings in
 * more than twice the parameters any other does (in turn, as before, they
 * brought in alike), every element lands right, a rank's plan is the
 * global plan's part, and the plan is faster than without relays. */
TEST(holders_bring_entries_in_by_their_time_to_spare)
{
	const struct tcase c = {"tiny-llama", "tp=1,pp=2,dp=4,zero=1", "tp=1,pp=4,dp=4,zero=1", 2, 0, 2, 0};
	struct vps_topology topo = {.name = "t", .gpus_per_node = 2, .intra_node_bandwidth = 200e9,
				    .inter_node_bandwidth = 25e9, .memory_bandwidth = 1.9e12, .latency = 1e-9};
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[1]) {
		int64_t by[RANKS_COUNTED];
		entries_by_holder(p[1], by);
		for (int r = 0; r < 3; r++)
			if (!(by[3] > 2 * by[r]))
				harness_fail(__FILE__, __LINE__, "A rank 3 brings in %lld bytes of parameters, rank %d %lld",
					     (long long)by[3], r, (long long)by[r]);
	}
	check_faster_and_free(p, s);
}

/* Where a region may go node by node from its holders and through its
 * receivers in ranges sized to what each spares, it takes the one whose
 * busiest device is the less busy (relay_route): llama2-70b (its layouts
 * too large to fill: each route is proven exact on tiny models above)
 * from tp=2 to tp=4 (pp=4, dp=4, ZeRO-1, half the devices joining) on
 * a800-testbed.
 * B's stage 1 lies on nodes 2 and 3, the devices of A's stages 2 and 3:
 * node 2's send their stage to joining devices that relay it, and have
 * time to spare; node 3's none. Node by node, stage 1's holders brought
 * all of it in, 1.13x the relayed floor; ranged, node 2's devices pass on
 * what they spare, within 1.08x. A rank's plan is the global plan's part,
 * all of B is planned once (check_faster_and_free: the bytes of the plan
 * without relays), and faster than without relays. */
TEST(a_region_goes_node_by_node_or_ranged_whichever_is_faster)
{
	static const struct tcase c = {"llama2-70b", "tp=2,pp=4,dp=4,zero=1", "tp=4,pp=4,dp=4,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[1]) {
		/* a holder (node 1), receivers on nodes 2 and 3, a joining device */
		static const int64_t ranks[] = {13, 17, 25, 40};
		for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++)
			rank_part_same(&c, p[1], ranks[i], VPS_RELAY_AUTO, &topo);
		struct vps_time_floor floor;
		CHECK_OK(vps_time_floor_relayed(p[1]->a, p[1]->b, &topo, &floor));
		if (!(s[1].estimate_seconds < 1.08 * floor.seconds))
			harness_fail(__FILE__, __LINE__, "the estimate %.4f s, %.3fx the relayed floor", s[1].estimate_seconds,
				     s[1].estimate_seconds / floor.seconds);
	}
	check_faster_and_free(p, s);
}

/* A destination busy over NVLink takes part of what its node holds from
 * replicas on other nodes over its NIC (nic_share), like
 * qwen3-30b-ep4-ep8: tiny-qwen3-moe from ep=2 to ep=4 (dp=8) on nodes of
 * four, where each new expert-parallel rank takes its experts from a
 * node-mate, 1.12x the relayed floor over NVLink alone, NICs idle. With
 * the shares the plan is within 1.02x, none of it relayed nor in transit:
 * the bytes that cross nodes are replicas' parameters, sent straight to
 * their receivers. Every element lands right and a rank's plan is the
 * global plan's part; on a fabric whose latency outweighs what the shares
 * save (a800-testbed's, against a tiny model's bytes) no byte crosses. */
TEST(busy_receivers_take_part_from_replicas_on_other_nodes)
{
	static const struct tcase c = {"tiny-qwen3-moe", "tp=1,dp=8,ep=2,zero=1", "tp=1,dp=8,ep=4,zero=1", 4, 0, 4, 0};
	struct vps_topology slow, topo;
	CHECK_OK(vps_topology_load(&slow, "a800-testbed", CONFIGS "/topologies"));
	fast_testbed(&topo);
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[0] && p[1]) {
		struct vps_time_floor floor;
		CHECK_OK(vps_time_floor_relayed(p[1]->a, p[1]->b, &topo, &floor));
		if (!(s[0].estimate_seconds > 1.1 * floor.seconds && s[1].estimate_seconds < 1.02 * floor.seconds))
			harness_fail(__FILE__, __LINE__, "without relays %.3fx the relayed floor, by default %.3fx",
				     s[0].estimate_seconds / floor.seconds, s[1].estimate_seconds / floor.seconds);
		CHECK_EQ(s[0].bytes_inter_node, 0);
		CHECK(s[1].bytes_inter_node > 0);
		CHECK_EQ(s[1].bytes_relayed, 0);
		CHECK_EQ(s[1].bytes_transit, 0);
		CHECK_EQ(s[1].bytes_moved, s[0].bytes_moved);
		for (size_t k = 0; k < p[1]->npieces; k++) {
			const struct vps_piece *x = &p[1]->pieces[k];
			if (vps_world_device(p[1]->world, x->src).node != vps_world_device(p[1]->world, x->dst).node)
				CHECK(x->state == VPS_STATE_PARAM && !(x->src_buffer & VPS_BUFFER_TARGET));
		}
	}
	release_both(p, s);
	plan_never_and_auto(&c, &slow, &slow, p, s);
	if (p[1])
		CHECK_EQ(s[1].bytes_inter_node, 0);
	release_both(p, s);
}

/* A destination that is not busy itself, served by a node-mate that is,
 * takes part from replicas on other nodes as well, by what the node-mate
 * would shed (nic_share's relief), like qwen3-30b-ep8-ep4: tiny-qwen3-moe
 * from ep=8 to ep=4 (dp=16) on nodes of eight, where A's expert-parallel
 * ranks 1-6 of a node send 1.7x what ranks 0 and 7 do, and 0 and 7 take
 * their experts from the busy ones. The busy destinations' own shares
 * alone left the plan 1.07x the relayed floor; with the relief, within
 * 1.02x. Every element lands right and a rank's plan is the global plan's
 * part. */
TEST(light_receivers_relieve_busy_node_mates)
{
	static const struct tcase c = {"tiny-qwen3-moe", "tp=1,dp=16,ep=8,zero=1", "tp=1,dp=16,ep=4,zero=1", 8, 0, 8, 0};
	struct vps_topology topo;
	fast_testbed(&topo);
	run_case_on(&c, true, VPS_RELAY_AUTO, &topo);
	struct vps_plan *p[2];
	struct vps_plan_stats s[2];
	plan_never_and_auto(&c, &topo, &topo, p, s);
	if (p[1]) {
		struct vps_time_floor floor;
		CHECK_OK(vps_time_floor_relayed(p[1]->a, p[1]->b, &topo, &floor));
		if (!(s[1].estimate_seconds < 1.02 * floor.seconds))
			harness_fail(__FILE__, __LINE__, "by default %.3fx the relayed floor",
				     s[1].estimate_seconds / floor.seconds);
		CHECK_EQ(s[1].bytes_relayed, 0);
		CHECK_EQ(s[1].bytes_moved, s[0].bytes_moved);
	}
	release_both(p, s);
}
