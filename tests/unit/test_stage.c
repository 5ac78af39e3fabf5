/* Staging, as a property: random tiny models, random configurations on
 * both sides (joins, leaves, worlds that are not powers of two), random
 * budgets. Each staged plan must verify, and executing it stage by stage in
 * memory (pack into a staging buffer, "send" it, unpack) must give the same
 * bytes as applying the plan directly. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/data.h"
#include "vps/stage.h"
#include "vps/verify.h"

static uint64_t next(void) { return harness_random(); }

static int64_t pick(const int64_t *v, size_t n) { return v[next() % n]; }

/* A random valid layout of the model on at most 24 ranks. */
static struct vps_layout *random_layout(const struct vps_model *m, bool grad, char *desc, size_t n)
{
	static const int64_t tps[] = {1, 2, 4}, pps[] = {1, 2, 4}, dps[] = {1, 2, 3}, eps[] = {1, 2, 4, 8},
			     gpns[] = {2, 3, 4, 8}, firsts[] = {0, 0, 1};
	for (int attempt = 0; attempt < 1000; attempt++) {
		struct vps_parallel p;
		struct vps_devices d;
		vps_parallel_init(&p);
		p.tp = pick(tps, 3);
		p.pp = pick(pps, 3);
		p.dp = pick(dps, 3);
		p.zero = (int64_t)(next() % 2);
		p.grad = grad;
		if (p.pp > 1 && next() % 3 == 0)
			p.vpp = 2;
		if (m->experts) {
			p.ep = pick(eps, 4);
			p.etp = next() % 2 ? 1 : p.tp;
		}
		if (vps_parallel_world(&p) > 24)
			continue;
		vps_devices_packed(&d, pick(gpns, 4), pick(firsts, 3));
		struct vps_layout *l = NULL;
		if (vps_layout_new(&l, m, &p, &d, "random") == VPS_OK) {
			vps_parallel_format(&p, desc, n);
			size_t len = strlen(desc);
			snprintf(desc + len, n - len, " gpn=%lld first=%lld", (long long)d.gpus_per_node,
				 (long long)d.first_node);
			return l;
		}
	}
	return NULL;
}

/* Execute a staged plan on host buffers, transfer by transfer in stage
 * order: a forward reads the relay's target buffer, which earlier stages
 * filled. */
static void execute(const struct vps_staged *s, struct job *a, struct job *b)
{
	const struct vps_plan *p = s->plan;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		int64_t ra = vps_world_a_rank(p->world, x->src), rb = vps_world_b_rank(p->world, x->dst);
		int64_t relay = vps_world_b_rank(p->world, x->src);
		unsigned char *send = malloc((size_t)x->bytes + 1), *recv = malloc((size_t)x->bytes + 1);
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			int64_t flat[VPS_MAX_DIMS], st = 1;
			for (int d = o->ndim - 1; d >= 0; d--) {
				flat[d] = st;
				st *= o->ext[d];
			}
			unsigned char *src = (o->src_buffer & VPS_BUFFER_TARGET
						      ? b->bufs[relay][vps_buffer_index(o->src_buffer)]
						      : a->bufs[ra][o->src_buffer]) +
					     (size_t)o->src_offset * o->esize;
			unsigned char *dst = b->bufs[rb][o->dst_buffer] + (size_t)o->dst_offset * o->esize;
			if (o->staging < 0)
				vps_copy_strided(dst, o->dst_strides, src, o->src_strides, o->ext, o->ndim, o->esize);
			else
				vps_copy_strided(send + o->staging, flat, src, o->src_strides, o->ext, o->ndim, o->esize);
		}
		memcpy(recv, send, (size_t)x->bytes);
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			if (o->staging < 0)
				continue;
			int64_t flat[VPS_MAX_DIMS], st = 1;
			for (int d = o->ndim - 1; d >= 0; d--) {
				flat[d] = st;
				st *= o->ext[d];
			}
			unsigned char *dst = b->bufs[rb][o->dst_buffer] + (size_t)o->dst_offset * o->esize;
			vps_copy_strided(dst, o->dst_strides, recv + o->staging, flat, o->ext, o->ndim, o->esize);
		}
		free(send);
		free(recv);
	}
}

static bool same_bytes(const struct job *x, const struct job *y)
{
	for (int64_t r = 0; r < x->n; r++)
		for (size_t b = 0; b < x->views[r].nbuffers; b++)
			if (memcmp(x->bufs[r][b], y->bufs[r][b],
				   (size_t)x->views[r].buffers[b].elements * vps_dtype_size(x->views[r].buffers[b].dtype)))
				return false;
	return true;
}

static vps_result_t layout_copy(const struct vps_layout *l, struct vps_layout **out)
{
	return vps_layout_new(out, vps_layout_model(l), vps_layout_parallel(l), vps_layout_devices(l), "copy");
}

static bool same_op(const struct vps_op *x, const struct vps_op *y)
{
	/* piece numbers index different plans; everything else is the copy */
	struct vps_op a = *x, b = *y;
	a.piece = b.piece = 0;
	return !memcmp(&a, &b, sizeof(a));
}

/* Rank r's own plan (planned alone, as a rank does, with the relay mode
 * of g's plan), staged with the budget of g; rank_arg is vps_stage's rank
 * argument. */
static struct vps_staged *rank_staging(const struct vps_staged *g, int64_t r, int64_t rank_arg)
{
	struct vps_layout *a, *b;
	struct vps_plan *p = NULL;
	struct vps_staged *s = NULL;
	CHECK_OK(layout_copy(g->plan->a, &a));
	CHECK_OK(layout_copy(g->plan->b, &b));
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.rank = r;
	o.relay_mode = (enum vps_relay)g->plan->relay;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (p)
		CHECK_OK(vps_stage(&s, p, g->budget, rank_arg));
	if (p && !s)
		vps_plan_free(p); /* staging takes the plan only when it succeeds */
	return s;
}

/* Every rank stages its own one-rank plan; the maximum of their demands is
 * the global staging's, and each rank's file, once cut with it, holds
 * exactly the global staging's transfers of that rank, in its stages. */
static void per_rank_case(const struct vps_staged *g, int iter)
{
	size_t count = VPS_DEMAND_COUNT(g->steps) + VPS_DEMAND_FORWARD_COUNT(g->steps);
	int64_t W = vps_world_size(g->plan->world), *want = NULL, *world = calloc(count, 8);
	CHECK_OK(vps_staged_demand(g, &want));
	for (int64_t r = 0; r < W && world && want; r++) {
		struct vps_staged *s = rank_staging(g, r, -1);
		if (!s)
			break;
		CHECK(!s->cut && s->scope == r && s->nstages == 0);
		CHECK_EQ(vps_staged_world_hash(s), vps_staged_world_hash(g));
		int64_t *d;
		CHECK_OK(vps_staged_demand(s, &d));
		vps_stage_demand_combine(world, d, count);
		free(d);
		vps_staged_free(s);
	}
	CHECK(!memcmp(world, want, count * 8));
	for (int64_t r = 0; r < W && world && want; r++) {
		struct vps_staged *s = rank_staging(g, r, r);
		if (!s)
			break;
		CHECK_OK(vps_staged_cut(s, world));
		size_t k = 0;
		for (size_t i = 0; i < g->nxfers; i++) {
			const struct vps_xfer *x = &g->xfers[i];
			if (x->src != r && x->dst != r)
				continue;
			if (k >= s->nxfers) {
				harness_fail(__FILE__, __LINE__, "case %d rank %lld: fewer transfers than the global staging's",
					     iter, (long long)r);
				break;
			}
			const struct vps_xfer *y = &s->xfers[k++];
			bool same = x->src == y->src && x->dst == y->dst && x->step == y->step && x->chunk == y->chunk &&
				    x->stage == y->stage && x->bytes == y->bytes && x->nops == y->nops;
			for (size_t j = 0; same && j < x->nops; j++)
				same = same_op(&g->ops[x->first_op + j], &s->ops[y->first_op + j]);
			if (!same)
				harness_fail(__FILE__, __LINE__, "case %d rank %lld: transfer %zu differs from the global staging's",
					     iter, (long long)r, k - 1);
		}
		CHECK_EQ(k, s->nxfers);
		for (size_t i = 0, j = 0; i < g->nfrees; i++) {
			if (g->frees[i].rank != r)
				continue;
			CHECK(j < s->nfrees && s->frees[j].buffer == g->frees[i].buffer &&
			      s->frees[j].stage == g->frees[i].stage);
			j++;
		}
		vps_staged_free(s);
	}
	free(world);
	free(want);
}

static void one_case(int iter)
{
	static const char *models[] = {"tiny-llama", "tiny-gpt", "tiny-qwen3-moe"};
	struct vps_model m;
	char da[160], db[160];
	CHECK_OK(vps_model_load(&m, models[next() % 3], CONFIGS "/models"));
	bool grad = next() % 4 == 0;
	struct vps_layout *a = random_layout(&m, grad, da, sizeof(da)), *b = random_layout(&m, grad, db, sizeof(db));
	if (!a || !b) {
		harness_fail(__FILE__, __LINE__, "no random layout of %s", m.name);
		return;
	}
	/* budgets from the floor to 64 MiB, log-uniform */
	int64_t budget = VPS_STAGE_BUDGET_FLOOR << (next() % 15);
	budget += (int64_t)(next() % (uint64_t)budget);
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p = NULL;
	struct vps_staged *s = NULL;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	if (!p)
		return;
	CHECK_OK(vps_stage(&s, p, budget, -1));
	if (!s) {
		vps_plan_free(p);
		return;
	}
	struct vps_verify_report rep;
	CHECK_OK(vps_verify_staged(s, &rep));
	if (rep.violations)
		harness_fail(__FILE__, __LINE__, "case %d %s: %s -> %s budget %lld: %lld violations, first: %s", iter, m.name, da,
			     db, (long long)budget, (long long)rep.violations, rep.nmessages ? rep.messages[0] : "");
	vps_verify_report_release(&rep);
	per_rank_case(s, iter);
	struct job ja, staged, direct;
	job_alloc(&ja, s->plan->a);
	job_alloc(&staged, s->plan->b);
	job_alloc(&direct, s->plan->b);
	job_fill(&ja);
	execute(s, &ja, &staged);
	job_apply_plan(s->plan, &ja, &direct);
	int64_t bad = job_check(&staged);
	if (bad || !same_bytes(&staged, &direct))
		harness_fail(__FILE__, __LINE__, "case %d %s: %s -> %s budget %lld: %lld wrong elements after staging", iter,
			     m.name, da, db, (long long)budget, (long long)bad);
	job_free(&ja);
	job_free(&staged);
	job_free(&direct);
	vps_staged_free(s);
}

TEST(random_staged_plans_verify_and_move_the_same_bytes)
{
	for (int i = 0; i < 16; i++)
		one_case(i);
}

TEST(the_budget_floor_is_refused_below_and_works_at)
{
	struct vps_model m;
	struct vps_parallel pa, pb;
	struct vps_devices d;
	struct vps_layout *a, *b;
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	vps_parallel_init(&pa);
	vps_parallel_init(&pb);
	CHECK_OK(vps_parallel_parse(&pa, "tp=2,dp=3,zero=1", "t"));
	CHECK_OK(vps_parallel_parse(&pb, "tp=1,pp=2,dp=2", "t"));
	vps_devices_packed(&d, 8, 0);
	CHECK_OK(vps_layout_new(&a, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b, &m, &pb, &d, "t"));
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p;
	struct vps_staged *s = NULL;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	CHECK(vps_stage(&s, p, VPS_STAGE_BUDGET_FLOOR - 1, -1) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "below the floor of 4096 bytes") != NULL);
	CHECK_OK(vps_stage(&s, p, VPS_STAGE_BUDGET_FLOOR, -1));
	struct vps_verify_report rep;
	CHECK_OK(vps_verify_staged(s, &rep));
	CHECK_EQ(rep.violations, 0);
	vps_verify_report_release(&rep);
	/* steps run to 2^ceil(log2 6) - 1 = 7, not W - 1 = 5: pairs like
	 * (1, 6) are step 7 */
	CHECK_EQ(s->steps, 7);
	vps_staged_free(s);
}

TEST(a_rank_file_holds_its_transfers_and_the_worlds_stages)
{
	struct vps_model m;
	struct vps_parallel pa, pb;
	struct vps_devices d;
	struct vps_layout *a, *b, *a2, *b2;
	CHECK_OK(vps_model_load(&m, "tiny-gpt", CONFIGS "/models"));
	vps_parallel_init(&pa);
	vps_parallel_init(&pb);
	CHECK_OK(vps_parallel_parse(&pa, "tp=2,pp=2,dp=1,zero=1", "t"));
	CHECK_OK(vps_parallel_parse(&pb, "tp=1,pp=2,dp=3,zero=1", "t"));
	vps_devices_packed(&d, 8, 0);
	CHECK_OK(vps_layout_new(&a, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b, &m, &pb, &d, "t"));
	CHECK_OK(vps_layout_new(&a2, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b2, &m, &pb, &d, "t"));
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	struct vps_plan *p, *p2;
	struct vps_staged *all, *one;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	CHECK_OK(vps_plan_compute(&p2, a2, b2, &o));
	CHECK_OK(vps_stage(&all, p, 1 << 20, -1));
	CHECK_OK(vps_stage(&one, p2, 1 << 20, 3));
	CHECK_EQ(all->nstages, one->nstages);
	size_t mine = 0;
	for (size_t i = 0; i < all->nxfers; i++)
		mine += all->xfers[i].src == 3 || all->xfers[i].dst == 3;
	CHECK_EQ(one->nxfers, mine);
	struct vps_verify_report rep;
	CHECK_OK(vps_verify_staged(one, &rep));
	CHECK_EQ(rep.violations, 0);
	vps_verify_report_release(&rep);
	vps_staged_free(all);
	vps_staged_free(one);
}

/* The executors all-reduce a relayed plan's forward steps only when step 0
 * says some rank forwards: a plan without relays agrees on the direct
 * steps alone. A holder that forwards nothing says no forwards itself;
 * the world's demands, combined, still cut every rank's relayed file into
 * the global staging's stages. */
/* tiny-llama from dp=1 to dp=4 on one node: three joining receivers of
 * one holder, relayed as the mode says (topo: the bandwidths AUTO weighs);
 * rank -1 for the whole world's plan. */
static struct vps_plan *join_plan(int64_t rank, enum vps_relay mode, const struct vps_topology *topo)
{
	struct vps_model m;
	struct vps_parallel pa, pb;
	struct vps_devices d;
	struct vps_layout *a = NULL, *b = NULL;
	struct vps_plan *p = NULL;
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	vps_parallel_init(&pa);
	vps_parallel_init(&pb);
	CHECK_OK(vps_parallel_parse(&pa, "tp=1,dp=1,zero=1", "t"));
	CHECK_OK(vps_parallel_parse(&pb, "tp=1,dp=4,zero=1", "t"));
	vps_devices_packed(&d, 8, 0);
	CHECK_OK(vps_layout_new(&a, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b, &m, &pb, &d, "t"));
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	o.rank = rank;
	o.relay_mode = mode;
	o.topology = topo;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	return p;
}

TEST(only_a_relayed_plan_agrees_on_forward_steps)
{
	/* the default (AUTO) relays this join as ALWAYS does */
	static const enum vps_relay modes[] = {VPS_RELAY_NEVER, VPS_RELAY_ALWAYS, VPS_RELAY_AUTO};
	for (int m = 0; m < 3; m++) {
		bool relay = modes[m] != VPS_RELAY_NEVER;
		struct vps_plan *p = join_plan(-1, modes[m], NULL);
		struct vps_staged *s = NULL;
		if (!p)
			continue;
		CHECK_OK(vps_stage(&s, p, 1 << 20, -1));
		if (!s)
			continue;
		int64_t *d0 = NULL;
		CHECK_OK(vps_staged_demand(s, &d0));
		size_t direct = VPS_DEMAND_COUNT(s->steps), forward = 0;
		for (size_t i = 0; d0 && i < VPS_DEMAND_FORWARD_COUNT(s->steps); i++)
			forward += d0[direct + i] != 0;
		CHECK_EQ(d0 && VPS_DEMAND_HAS_FORWARDS(d0), relay);
		CHECK_EQ(forward > 0, relay);
		free(d0);
		if (relay) {
			struct vps_staged *holder = rank_staging(s, 0, -1);
			int64_t *dh = NULL;
			if (holder)
				CHECK_OK(vps_staged_demand(holder, &dh));
			CHECK(dh && !VPS_DEMAND_HAS_FORWARDS(dh));
			free(dh);
			vps_staged_free(holder);
		}
		per_rank_case(s, 0);
		vps_staged_free(s);
	}
}

/* A rank that plans its part with relays and one that plans without, or
 * with another relay mode, or weighing another topology's bandwidths,
 * disagree on who sends what, so they must not agree on the world: the
 * mode (and the bandwidths AUTO weighed) is part of what ranks compare, and
 * it survives a plan file, YAML or binary. A plan without relays prints
 * as before them, one of ALWAYS as plans of vps-plan --relay did. */
TEST(ranks_planned_with_other_relay_modes_do_not_agree)
{
	struct vps_topology t1 = {.name = "t1", .gpus_per_node = 8, .intra_node_bandwidth = 200e9,
				  .inter_node_bandwidth = 25e9, .memory_bandwidth = 1e12},
			    t2 = t1;
	t2.inter_node_bandwidth = 50e9;
	static const enum vps_relay modes[] = {VPS_RELAY_NEVER, VPS_RELAY_ALWAYS, VPS_RELAY_AUTO, VPS_RELAY_AUTO,
					       VPS_RELAY_AUTO};
	const struct vps_topology *topos[] = {NULL, &t1, NULL, &t1, &t2};
	static const char *const yaml_says[] = {NULL, "relay: true\n", "relay: auto\n", "relay: auto\n",
						"relay: auto\n"};
	uint64_t world[5] = {0};
	for (int m = 0; m < 5; m++) {
		struct vps_plan *p = join_plan(2, modes[m], topos[m]);
		struct vps_staged *s = NULL;
		if (!p)
			continue;
		CHECK_EQ(p->relay, modes[m]);
		/* only AUTO weighs a topology */
		CHECK(p->relay_inter_bandwidth == (m >= 3 ? topos[m]->inter_node_bandwidth : 0));
		for (int yaml = 0; yaml < 2; yaml++) {
			struct vps_bytes f = {0};
			struct vps_plan *q = NULL;
			CHECK_OK(vps_plan_serialize(p, yaml, &f));
			CHECK_OK(vps_plan_parse(&q, "p", f.data, f.len));
			CHECK(q && q->relay == p->relay && q->relay_intra_bandwidth == p->relay_intra_bandwidth &&
			      q->relay_inter_bandwidth == p->relay_inter_bandwidth);
			CHECK(q && vps_plan_hash(q) == vps_plan_hash(p));
			if (yaml)
				CHECK_EQ(memmem(f.data, f.len, "relay:", 6) != NULL, yaml_says[m] != NULL);
			if (yaml && yaml_says[m])
				CHECK(memmem(f.data, f.len, yaml_says[m], strlen(yaml_says[m])) != NULL);
			if (yaml)
				CHECK_EQ(memmem(f.data, f.len, "relay_inter_node_bandwidth:", 27) != NULL, m >= 3);
			vps_plan_free(q);
			vps_bytes_release(&f);
		}
		CHECK_OK(vps_stage(&s, p, 1 << 20, -1));
		if (s)
			world[m] = vps_staged_world_hash(s);
		vps_staged_free(s);
	}
	for (int m = 0; m < 5; m++)
		for (int k = 0; k < m; k++)
			if (!world[m] || world[m] == world[k])
				harness_fail(__FILE__, __LINE__, "modes %d and %d agree on the world (%016llx)", k, m,
					     (unsigned long long)world[m]);
}

/* A plan file of vps-plan --relay before relay modes (YAML `relay: true`)
 * still reads, as VPS_RELAY_ALWAYS, and hashes as it did; one whose relay
 * says something else is refused. */
TEST(a_relay_true_plan_reads_as_always)
{
	struct vps_plan *p = join_plan(2, VPS_RELAY_ALWAYS, NULL);
	struct vps_bytes f = {0};
	if (!p)
		return;
	CHECK_OK(vps_plan_serialize(p, true, &f));
	char *at = f.data ? memmem(f.data, f.len, "relay: true\n", 12) : NULL;
	CHECK(at != NULL);
	struct vps_plan *q = NULL;
	CHECK_OK(vps_plan_parse(&q, "p", f.data, f.len));
	CHECK(q && q->relay == VPS_RELAY_ALWAYS && vps_plan_hash(q) == vps_plan_hash(p));
	vps_plan_free(q);
	q = NULL;
	if (at) {
		memcpy(at, "relay: what\n", 12);
		CHECK(vps_plan_parse(&q, "p", f.data, f.len) == VPS_EINPUT);
		CHECK(strstr(vps_last_error(), "relay") != NULL);
	}
	vps_plan_free(q);
	vps_bytes_release(&f);
	vps_plan_free(p);
}
