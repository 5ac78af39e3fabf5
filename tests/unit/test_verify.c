/* Verification of staged plans: a correct staged plan passes, and each
 * check fails on a staged plan broken on purpose in the one way it guards
 * against (copies that overlap, miss or add elements, views outside their
 * buffers, staging bytes misplaced, a stage over budget, two transfers of a
 * pair in a stage, a wrong step, an early free, a plan with a hole). Every
 * break is made on copies of the staged plan's arrays, so one staging
 * serves all of them. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "vps/stage.h"
#include "vps/verify.h"

/* tiny-llama (2,1,2) -> (1,1,3): tensor-parallel splits become whole
 * tensors, so some pieces are strided on one side, and the budget cuts
 * pairs in several chunks. */
static struct vps_staged *make_staged(int64_t budget, int64_t rank)
{
	struct vps_model m;
	struct vps_parallel pa, pb;
	struct vps_devices d;
	struct vps_layout *a, *b;
	struct vps_plan *p;
	struct vps_staged *s = NULL;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	vps_parallel_init(&pa);
	vps_parallel_init(&pb);
	CHECK_OK(vps_parallel_parse(&pa, "tp=2,dp=2,zero=1", "t"));
	CHECK_OK(vps_parallel_parse(&pb, "tp=1,dp=3,zero=1", "t"));
	vps_devices_packed(&d, 8, 0);
	CHECK_OK(vps_layout_new(&a, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b, &m, &pb, &d, "t"));
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	CHECK_OK(vps_stage(&s, p, budget, rank));
	return s;
}

/* A shallow copy whose transfers, copies, frees and pieces may be edited. */
struct broken {
	struct vps_staged s;
	struct vps_plan p;
};

static void *dup_array(const void *v, size_t n, size_t size)
{
	void *c = malloc(n * size + 1);
	if (n)
		memcpy(c, v, n * size);
	return c;
}

static void break_open(struct broken *b, const struct vps_staged *s)
{
	b->s = *s;
	b->p = *s->plan;
	b->p.pieces = dup_array(s->plan->pieces, s->plan->npieces, sizeof(*s->plan->pieces));
	b->p.file_hash = 0;
	b->s.plan = &b->p;
	b->s.xfers = dup_array(s->xfers, s->nxfers, sizeof(*s->xfers));
	b->s.ops = dup_array(s->ops, s->nops, sizeof(*s->ops));
	b->s.frees = dup_array(s->frees, s->nfrees, sizeof(*s->frees));
	b->s.file_hash = 0;
}

static void break_close(struct broken *b)
{
	free(b->p.pieces);
	free(b->s.xfers);
	free(b->s.ops);
	free(b->s.frees);
}

static bool reported(const struct vps_verify_report *rep, const char *what)
{
	for (size_t i = 0; i < rep->nmessages; i++)
		if (strstr(rep->messages[i], what))
			return true;
	return false;
}

/* Verify b and expect a violation whose message contains `what`. */
static void expect_violation(struct broken *b, const char *what, int line)
{
	struct vps_verify_report rep;
	vps_result_t rc = vps_verify_staged(&b->s, &rep);
	if (rc != VPS_OK)
		harness_fail(__FILE__, line, "verification failed: %s", vps_last_error());
	else if (!rep.violations || !reported(&rep, what))
		harness_fail(__FILE__, line, "expected a violation '%s', got %lld%s%s", what, (long long)rep.violations,
			     rep.nmessages ? ", first: " : "", rep.nmessages ? rep.messages[0] : "");
	if (rc == VPS_OK)
		vps_verify_report_release(&rep);
	break_close(b);
}

static void expect_clean(const struct vps_staged *s, int line)
{
	struct vps_verify_report rep;
	vps_result_t rc = vps_verify_staged(s, &rep);
	if (rc != VPS_OK)
		harness_fail(__FILE__, line, "verification failed: %s", vps_last_error());
	else if (rep.violations)
		harness_fail(__FILE__, line, "%lld violations, first: %s", (long long)rep.violations,
			     rep.nmessages ? rep.messages[0] : "");
	if (rc == VPS_OK)
		vps_verify_report_release(&rep);
}

/* The index of the first copy satisfying want(), in a transfer that is a
 * retain (retain = true) or not; *xfer receives its transfer. */
static size_t find_op(const struct vps_staged *s, bool retain, bool (*want)(const struct vps_op *o), size_t *xfer)
{
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if ((x->src == x->dst) != retain)
			continue;
		for (size_t k = 0; k < x->nops; k++)
			if (want(&s->ops[x->first_op + k])) {
				*xfer = i;
				return x->first_op + k;
			}
	}
	return SIZE_MAX;
}

/* stage.c writes a merged run of contiguous pieces as one axis */
static bool flat(const struct vps_op *o) { return o->ndim == 1 && o->ext[0] > 1; }
static bool strided(const struct vps_op *o) { return o->ndim == 2 && o->ext[0] > 1 && o->ext[1] > 1; }
static bool any(const struct vps_op *o) { return o->ndim >= 1; }

#define EXPECT(b, what) expect_violation(b, what, __LINE__)

TEST(a_correct_staged_plan_verifies)
{
	struct vps_staged *s = make_staged(64 << 10, -1), *one = make_staged(64 << 10, 2);
	expect_clean(s, __LINE__);
	expect_clean(one, __LINE__);
	vps_staged_free(s);
	vps_staged_free(one);
}

TEST(copies_that_miss_add_or_repeat_elements_fail)
{
	struct vps_staged *s = make_staged(64 << 10, -1);
	struct broken b;
	size_t x, f = find_op(s, false, flat, &x), r = find_op(s, true, strided, &x);
	CHECK(f != SIZE_MAX);
	CHECK(r != SIZE_MAX);
	if (f == SIZE_MAX || r == SIZE_MAX)
		goto out;
	/* a flat copy reads one element further on: its elements are not the plan's */
	break_open(&b, s);
	b.s.ops[f].src_offset++;
	EXPECT(&b, "the copies do not cover the plan exactly");
	/* a flat copy one element shorter: that element is carried by no one */
	break_open(&b, s);
	b.s.ops[f].ext[0]--;
	EXPECT(&b, "are carried by no copy");
	/* a copy of a strided piece shifted along its rows */
	break_open(&b, s);
	b.s.ops[r].src_offset++;
	b.s.ops[r].dst_offset++;
	EXPECT(&b, "at the piece's addresses");
	/* a strided copy cut short: the rest of its piece is not carried */
	break_open(&b, s);
	b.s.ops[r].ext[0]--;
	EXPECT(&b, "elements are carried by no copy");
	/* a copy that names a piece the plan does not have */
	break_open(&b, s);
	b.s.ops[f].piece = (int64_t)s->plan->npieces;
	EXPECT(&b, "is not one of the plan's");
out:
	vps_staged_free(s);
}

/* Two retain copies of one strided piece, each the whole piece: every
 * element twice. Then a tiling that is not a row-major range (the piece
 * cut down its columns): correct, and the same cut with one column too many
 * on the left: overlapping. */
TEST(strided_pieces_are_tiled_by_boxes_exactly_once)
{
	struct vps_staged *s = make_staged(64 << 10, -1);
	size_t xi, r = find_op(s, true, strided, &xi);
	CHECK(r != SIZE_MAX);
	if (r == SIZE_MAX) {
		vps_staged_free(s);
		return;
	}
	const struct vps_op *o = &s->ops[r];
	for (int variant = 0; variant < 3; variant++) {
		struct broken b;
		break_open(&b, s);
		/* make room for one more copy right after o, in o's transfer */
		struct vps_op *ops = malloc((s->nops + 2) * sizeof(*ops));
		memcpy(ops, s->ops, (r + 1) * sizeof(*ops));
		memcpy(ops + r + 2, s->ops + r + 1, (s->nops - r - 1) * sizeof(*ops));
		ops[r + 1] = *o;
		free(b.s.ops);
		b.s.ops = ops;
		b.s.nops = s->nops + 1;
		for (size_t i = 0; i < b.s.nxfers; i++) {
			if (i == xi)
				b.s.xfers[i].nops++;
			else if (b.s.xfers[i].first_op > r)
				b.s.xfers[i].first_op++;
		}
		int64_t cols = o->ext[1], left = cols / 2 + (variant == 2);
		if (variant > 0) {
			ops[r].ext[1] = left;
			ops[r + 1].ext[1] = cols - cols / 2;
			ops[r + 1].src_offset += (cols / 2) * o->src_strides[1];
			ops[r + 1].dst_offset += (cols / 2) * o->dst_strides[1];
		}
		if (variant == 1) {
			expect_clean(&b.s, __LINE__);
			break_close(&b);
		} else {
			EXPECT(&b, variant ? "elements are carried more than once" : "another copy carries too");
		}
	}
	vps_staged_free(s);
}

TEST(views_and_staging_bytes_out_of_place_fail)
{
	struct vps_staged *s = make_staged(64 << 10, -1);
	struct broken b;
	size_t xi, f = find_op(s, false, any, &xi);
	CHECK(f != SIZE_MAX);
	if (f == SIZE_MAX)
		goto out;
	break_open(&b, s);
	b.s.ops[f].dst_offset = (int64_t)1 << 40;
	EXPECT(&b, "destination view outside buffer");
	break_open(&b, s);
	b.s.ops[f].src_buffer = 1000;
	EXPECT(&b, "source view outside buffer 1000");
	break_open(&b, s);
	b.s.ops[f].src_strides[0] = 0;
	EXPECT(&b, "is 0 (rows that alias each other)");
	break_open(&b, s);
	b.s.ops[f].staging += 8;
	EXPECT(&b, "is not 256-byte aligned");
	break_open(&b, s);
	b.s.xfers[xi].bytes = b.s.ops[f].staging;
	EXPECT(&b, "leave the buffer");
	/* two copies of a transfer on the same staging bytes */
	bool two = false;
	for (size_t i = 0; i < s->nxfers && !two; i++)
		if (s->xfers[i].src != s->xfers[i].dst && s->xfers[i].nops > 1) {
			break_open(&b, s);
			b.s.ops[s->xfers[i].first_op + 1].staging = b.s.ops[s->xfers[i].first_op].staging;
			EXPECT(&b, "overlap another op");
			two = true;
		}
	CHECK(two);
out:
	vps_staged_free(s);
}

TEST(the_schedule_is_checked)
{
	struct vps_staged *s = make_staged(64 << 10, -1);
	struct broken b;
	size_t moved = SIZE_MAX;
	for (size_t i = 0; i < s->nxfers && moved == SIZE_MAX; i++)
		if (s->xfers[i].src != s->xfers[i].dst)
			moved = i;
	CHECK(moved != SIZE_MAX);
	if (moved == SIZE_MAX)
		goto out;
	break_open(&b, s);
	b.s.budget = s->xfers[moved].bytes - 1;
	EXPECT(&b, "over the budget of");
	break_open(&b, s);
	b.s.xfers[moved].step ^= 1;
	EXPECT(&b, "is not");
	break_open(&b, s);
	b.s.steps++;
	EXPECT(&b, "steps is");
	/* every transfer in one stage: a pair cut in chunks sends twice */
	break_open(&b, s);
	b.s.budget = INT64_MAX;
	for (size_t i = 0; i < b.s.nxfers; i++)
		if (b.s.xfers[i].src != b.s.xfers[i].dst)
			b.s.xfers[i].stage = 1;
	EXPECT(&b, "has two transfers");
	/* a free one stage before the last stage that reads the buffer */
	int early = 0;
	for (size_t f = 0; f < s->nfrees && early < 2; f++)
		if (s->frees[f].stage > 0) {
			break_open(&b, s);
			b.s.frees[f].stage = early ? -1 : b.s.frees[f].stage - 1;
			EXPECT(&b, early ? "is marked never read" : "still reads it");
			early++;
		}
	CHECK_EQ(early, 2);
out:
	vps_staged_free(s);
}

/* The plan inside the staged plan is checked too: a piece cut one row short
 * leaves part of its destination region received from no one (its copies
 * still carry the row, which the plan no longer asks for). */
TEST(a_plan_with_a_hole_fails_in_its_staged_plan)
{
	struct vps_staged *s = make_staged(64 << 10, -1), *one = make_staged(64 << 10, 1);
	struct vps_staged *both[2] = {s, one};
	int holes = 0;
	for (int w = 0; w < 2; w++) {
		const struct vps_staged *t = both[w];
		for (size_t i = 0; i < t->plan->npieces; i++) {
			const struct vps_piece *x = &t->plan->pieces[i];
			if (x->box.hi[0] - x->box.lo[0] < 2 || (w && x->dst != 1))
				continue;
			struct broken b;
			break_open(&b, t);
			b.p.pieces[i].box.hi[0]--;
			EXPECT(&b, "elements are received from no one");
			holes++;
			break;
		}
	}
	CHECK_EQ(holes, 2);
	/* the file of rank 1 holds no transfer of others */
	bool foreign = false;
	for (size_t i = 0; i < s->nxfers && !foreign; i++)
		if (s->xfers[i].src != 1 && s->xfers[i].dst != 1) {
			struct broken b;
			break_open(&b, one);
			b.s.xfers[0] = s->xfers[i];
			b.s.xfers[0].first_op = 0;
			b.s.xfers[0].nops = 0;
			EXPECT(&b, "does not involve rank 1");
			foreign = true;
		}
	CHECK(foreign);
	vps_staged_free(s);
	vps_staged_free(one);
}

/* Box coverage (the slab sweep under every coverage check) against a count
 * of the elements themselves, on random boxes in a small 3-D target, some
 * reaching outside it. */
TEST(uncovered_elements_match_a_count_of_elements)
{
	for (int iter = 0; iter < 400; iter++) {
		struct vps_box t = {.ndim = 3, .lo = {1, 0, 2}, .hi = {7, 5, 6}}, boxes[12];
		size_t n = harness_random() % 12;
		for (size_t i = 0; i < n; i++) {
			boxes[i].ndim = 3;
			for (int k = 0; k < 3; k++) {
				int64_t a = (int64_t)(harness_random() % 9), b = (int64_t)(harness_random() % 9);
				boxes[i].lo[k] = a < b ? a : b;
				boxes[i].hi[k] = (a < b ? b : a) + 1;
			}
		}
		int64_t want = 0;
		for (int64_t x = t.lo[0]; x < t.hi[0]; x++)
			for (int64_t y = t.lo[1]; y < t.hi[1]; y++)
				for (int64_t z = t.lo[2]; z < t.hi[2]; z++) {
					bool in = false;
					for (size_t i = 0; i < n && !in; i++)
						in = x >= boxes[i].lo[0] && x < boxes[i].hi[0] && y >= boxes[i].lo[1] &&
						     y < boxes[i].hi[1] && z >= boxes[i].lo[2] && z < boxes[i].hi[2];
					want += !in;
				}
		CHECK_EQ(vps_boxes_uncovered(boxes, n, &t), want);
		struct vps_box gaps[64];
		size_t ng = vps_boxes_gaps(boxes, n, &t, gaps, 64);
		int64_t vol = 0;
		for (size_t g = 0; g < ng; g++)
			vol += vps_box_volume(&gaps[g]);
		if (ng < 64)
			CHECK_EQ(vol, want);
	}
}

/* A region received in 20,000 column strips: the sweep hands each slab the
 * one strip that spans it (slabs times boxes would be 4e8 steps). */
TEST(many_strips_cover_a_region)
{
	enum { N = 20000 };
	struct vps_box *strips = malloc(N * sizeof(*strips)), t = {.ndim = 2, .lo = {0, 0}, .hi = {4, N}};
	for (int64_t i = 0; i < N; i++)
		strips[i] = (struct vps_box){.ndim = 2, .lo = {0, N - 1 - i}, .hi = {4, N - i}};
	CHECK_EQ(vps_boxes_uncovered(strips, N, &t), 0);
	strips[N / 2].hi[0] = 3;
	CHECK_EQ(vps_boxes_uncovered(strips, N, &t), 1);
	free(strips);
}

/* ---- transit areas ----
 *
 * tiny-llama (tp=2, pp=2) -> (tp=1, pp=2), two GPUs a node, on
 * a800-testbed: node 0 (ranks 0 and 1) takes stage 1 of B from node 1,
 * and part of what rank 1 needs lands in rank 0's transit area, to be
 * passed on over NVLink. */
static struct vps_plan *transit_plan(int64_t rank)
{
	struct vps_model m;
	struct vps_parallel pa, pb;
	struct vps_devices d;
	struct vps_layout *a, *b;
	struct vps_plan *p = NULL;
	struct vps_topology topo;
	struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
	CHECK_OK(vps_model_load(&m, "tiny-llama", CONFIGS "/models"));
	CHECK_OK(vps_topology_load(&topo, "a800-testbed", CONFIGS "/topologies"));
	vps_parallel_init(&pa);
	vps_parallel_init(&pb);
	CHECK_OK(vps_parallel_parse(&pa, "tp=2,pp=2,dp=1", "t"));
	CHECK_OK(vps_parallel_parse(&pb, "tp=1,pp=2,dp=1", "t"));
	vps_devices_packed(&d, 2, 0);
	CHECK_OK(vps_layout_new(&a, &m, &pa, &d, "t"));
	CHECK_OK(vps_layout_new(&b, &m, &pb, &d, "t"));
	o.topology = &topo;
	o.rank = rank;
	CHECK_OK(vps_plan_compute(&p, a, b, &o));
	return p;
}

/* A copy of a plan whose pieces may be edited. */
static void plan_open(struct vps_plan *c, const struct vps_plan *p)
{
	*c = *p;
	c->pieces = dup_array(p->pieces, p->npieces, sizeof(*p->pieces));
	c->file_hash = 0;
}

/* Rank r's part of global plan p, as a copy (plan_open's): its plan, which
 * is the global plan's part (test_plan checks that). Rank 0, which sends
 * nothing here, is taken so rather than planned: its own plan sorts an
 * empty list from NULL (plan_sends, lib/plan/plan.c), which UBSan stops
 * at. */
static void plan_part(struct vps_plan *c, const struct vps_plan *p, int64_t r)
{
	plan_open(c, p);
	c->scope = r;
	c->npieces = 0;
	for (size_t i = 0; i < p->npieces; i++)
		if (p->pieces[i].src == r || p->pieces[i].dst == r)
			c->pieces[c->npieces++] = p->pieces[i];
}

static void expect_plan(struct vps_plan *c, const char *what, int line)
{
	struct vps_verify_report rep;
	vps_result_t rc = vps_verify_plan(c, &rep);
	if (rc != VPS_OK)
		harness_fail(__FILE__, line, "verification failed: %s", vps_last_error());
	else if (!what && rep.violations)
		harness_fail(__FILE__, line, "%lld violations, first: %s", (long long)rep.violations,
			     rep.nmessages ? rep.messages[0] : "");
	else if (what && (!rep.violations || !reported(&rep, what)))
		harness_fail(__FILE__, line, "expected a violation '%s', got %lld%s%s", what, (long long)rep.violations,
			     rep.nmessages ? ", first: " : "", rep.nmessages ? rep.messages[0] : "");
	if (rc == VPS_OK)
		vps_verify_report_release(&rep);
	free(c->pieces);
}

#define EXPECT_PLAN(c, what) expect_plan(c, what, __LINE__)

/* The first forward out of a transit area, and the arrival it passes on
 * (the one whose box holds its box, into the relay's area). */
static bool find_transit_pair(const struct vps_plan *p, size_t *fwd, size_t *arr)
{
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if (!vps_piece_from_transit(x))
			continue;
		for (size_t k = 0; k < p->npieces; k++) {
			const struct vps_piece *y = &p->pieces[k];
			if (vps_piece_to_transit(y) && y->dst == x->src && y->tensor == x->tensor &&
			    y->state == x->state && vps_box_contains(&y->box, &x->box)) {
				*fwd = i;
				*arr = k;
				return true;
			}
		}
	}
	return false;
}

TEST(a_transit_plan_verifies)
{
	struct vps_plan *p = transit_plan(-1);
	if (!p)
		return;
	size_t f, a;
	CHECK(find_transit_pair(p, &f, &a));
	struct vps_plan c;
	plan_open(&c, p);
	EXPECT_PLAN(&c, NULL);
	/* every rank's plan, and the staged plans, global and of one rank */
	plan_part(&c, p, 0);
	EXPECT_PLAN(&c, NULL);
	for (int64_t r = 1; r < 4; r++) {
		struct vps_plan *one = transit_plan(r);
		if (!one)
			continue;
		plan_open(&c, one);
		EXPECT_PLAN(&c, NULL);
		struct vps_staged *s = NULL;
		CHECK_OK(vps_stage(&s, one, 64 << 20, -1));
		if (s)
			expect_clean(s, __LINE__);
		else
			vps_plan_free(one);
		vps_staged_free(s);
	}
	struct vps_staged *s = NULL, *s0 = NULL;
	struct vps_plan *p0 = transit_plan(-1);
	if (p0) {
		CHECK_OK(vps_stage(&s0, p0, 64 << 20, 0));
		if (s0)
			expect_clean(s0, __LINE__);
		else
			vps_plan_free(p0);
		vps_staged_free(s0);
	}
	CHECK_OK(vps_stage(&s, p, 64 << 20, -1));
	if (!s) {
		vps_plan_free(p);
		return;
	}
	expect_clean(s, __LINE__);
	vps_staged_free(s);
}

TEST(forwards_out_of_a_transit_area_pass_on_what_arrived_there)
{
	struct vps_plan *p = transit_plan(-1), c;
	size_t f, a;
	if (!p)
		return;
	CHECK(find_transit_pair(p, &f, &a));
	const struct vps_piece *x = &p->pieces[f], *y = &p->pieces[a];
	int64_t area;
	CHECK_OK(vps_plan_transit_bytes(p, x->src, &area));
	CHECK(area > 0);
	/* bytes beyond every arrival */
	plan_open(&c, p);
	c.pieces[f].src_offset = area;
	EXPECT_PLAN(&c, "what no piece brings there");
	/* other elements: the position of another arrival into the area */
	size_t other = SIZE_MAX;
	for (size_t k = 0; k < p->npieces && other == SIZE_MAX; k++)
		if (vps_piece_to_transit(&p->pieces[k]) && p->pieces[k].dst == x->src &&
		    (p->pieces[k].tensor != x->tensor || p->pieces[k].state != x->state) &&
		    vps_piece_dtype(&p->pieces[k]) == vps_piece_dtype(x))
			other = k;
	CHECK(other != SIZE_MAX);
	if (other != SIZE_MAX) {
		plan_open(&c, p);
		c.pieces[f].src_offset = p->pieces[other].dst_offset;
		EXPECT_PLAN(&c, "other elements");
	}
	/* one row on within the arrival: the same bytes, other positions */
	plan_open(&c, p);
	c.pieces[f].src_offset += y->dst_strides[0];
	EXPECT_PLAN(&c, "other elements");
	/* the arrival at the forward's hop: not before it */
	plan_open(&c, p);
	c.pieces[a].src_buffer = vps_buffer_at_hop(y->src_buffer, vps_buffer_hop(x->src_buffer));
	EXPECT_PLAN(&c, "not before");
	/* in the relay's own plan too; the receiver's plan holds no arrival
	 * into the relay's area, and cannot tell */
	for (int w = 0; w < 2; w++) {
		plan_part(&c, p, w ? x->dst : x->src);
		size_t i = 0;
		while (i < c.npieces && !vps_piece_from_transit(&c.pieces[i]))
			i++;
		CHECK(i < c.npieces);
		if (i < c.npieces)
			c.pieces[i].src_offset = area;
		EXPECT_PLAN(&c, w ? NULL : "what no piece brings there");
	}
	vps_plan_free(p);
}

TEST(arrivals_into_a_transit_area_are_apart_and_from_holders)
{
	struct vps_plan *p = transit_plan(-1), c;
	size_t f, a;
	if (!p)
		return;
	CHECK(find_transit_pair(p, &f, &a));
	const struct vps_piece *y = &p->pieces[a];
	int64_t ey = (int64_t)vps_dtype_size(vps_piece_dtype(y));
	/* another arrival into the area, of another dtype, moved onto y's
	 * first byte: its offset counts its own elements */
	size_t other = SIZE_MAX;
	for (size_t k = 0; k < p->npieces && other == SIZE_MAX; k++) {
		const struct vps_piece *z = &p->pieces[k];
		int64_t ez = (int64_t)vps_dtype_size(vps_piece_dtype(z));
		if (vps_piece_to_transit(z) && z->dst == y->dst && ez != ey && y->dst_offset * ey % ez == 0)
			other = k;
	}
	CHECK(other != SIZE_MAX);
	if (other != SIZE_MAX) {
		plan_open(&c, p);
		c.pieces[other].dst_offset = y->dst_offset * ey / (int64_t)vps_dtype_size(vps_piece_dtype(&p->pieces[other]));
		EXPECT_PLAN(&c, "transit area: piece");
	}
	/* from a rank of the other pipeline stage, which holds none of it */
	plan_open(&c, p);
	c.pieces[a].src = (y->src ^ 2) != y->dst ? y->src ^ 2 : y->src ^ 3;
	EXPECT_PLAN(&c, "does not hold it");
	/* a view that is not row-major, one beyond 2^48 elements */
	bool strided = false;
	for (int k = 0; k < y->box.ndim; k++)
		if (y->box.hi[k] - y->box.lo[k] > 1) {
			plan_open(&c, p);
			c.pieces[a].dst_strides[k] *= 2;
			EXPECT_PLAN(&c, "not row-major contiguous");
			strided = true;
			break;
		}
	CHECK(strided);
	plan_open(&c, p);
	c.pieces[a].dst_offset = ((int64_t)1 << 48) - 1;
	EXPECT_PLAN(&c, "beyond 2^48 elements");
	vps_plan_free(p);
}

/* Staged: a forward out of an area in the stage its arrival lands in. */
TEST(a_forward_out_of_a_transit_area_follows_its_arrival)
{
	struct vps_plan *p = transit_plan(-1);
	struct vps_staged *s = NULL;
	if (!p)
		return;
	CHECK_OK(vps_stage(&s, p, 64 << 20, -1));
	if (!s) {
		vps_plan_free(p);
		return;
	}
	size_t fx = SIZE_MAX, ax = SIZE_MAX;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			if (fx == SIZE_MAX && (o->src_buffer & VPS_BUFFER_TARGET) &&
			    vps_buffer_index(o->src_buffer) == VPS_BUFFER_TRANSIT)
				fx = i;
			if (ax == SIZE_MAX && o->dst_buffer == VPS_BUFFER_TRANSIT)
				ax = i;
		}
	}
	CHECK(fx != SIZE_MAX && ax != SIZE_MAX);
	if (fx != SIZE_MAX && ax != SIZE_MAX) {
		CHECK(s->xfers[fx].stage > s->xfers[ax].stage);
		struct broken b;
		break_open(&b, s);
		b.s.xfers[fx].stage = s->xfers[ax].stage;
		EXPECT(&b, "passes on in stage");
		/* the staged plan's pieces are the plan's: a forward of what
		 * never arrived is caught there too */
		break_open(&b, s);
		for (size_t i = 0; i < b.p.npieces; i++)
			if (vps_piece_from_transit(&b.p.pieces[i])) {
				b.p.pieces[i].src_offset = (int64_t)1 << 40;
				break;
			}
		EXPECT(&b, "what no piece brings there");
	}
	vps_staged_free(s);
}
