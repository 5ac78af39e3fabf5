/* Staging: turn a global plan into per-stage transfers of packed buffers.
 *
 * 1. Pieces of one (source, destination) pair, in destination address
 *    order, are merged into runs when contiguous on both sides.
 * 2. A pair's runs are laid out in a stream cut into chunks of at most
 *    budget/2 bytes (a unit costs a rank one send and one receive chunk),
 *    each run starting on a 256-byte boundary; a run that does not fit is
 *    split at an element boundary.
 * 3. Step s = i ^ j; chunk c of every pair of step s forms unit (s, c).
 *    A step's demand is three numbers: its chunk count, and what its first
 *    and its last chunk cost the busiest rank (send plus receive). Stages
 *    are cut from the demands alone: taking units in order, a unit joins
 *    the open stage while the stage's demands sum to at most the budget,
 *    and a stage never holds two chunks of one step (a rank has one buffer
 *    per peer per stage). So a rank needs only its own transfers and the
 *    world's demands: O(steps) numbers, all-reduced by the executors.
 * Retains are stage 0 (step 0), copied directly between A and B buffers. */
#include <inttypes.h>
#include <stdio.h>

#include "util/hash.h"
#include "util/internal.h"
#include "plan/piece.h"
#include "stage/op.h"
#include "vps/stage.h"

/* A run: consecutive pieces of one pair that staging copies as one (a
 * flat piece, merged with the flat ones that continue it on both sides,
 * or one strided piece). */
struct run {
	struct vps_run g; /* what it copies (plan/piece.h) */
	size_t piece;     /* first plan piece */
	int32_t npieces;
	bool flat;        /* g is one axis, contiguous on both sides */
};

static int64_t run_elements(const struct run *r)
{
	int64_t n = 1;
	for (int k = 0; k < r->g.ndim; k++)
		n *= r->g.ext[k];
	return n;
}

static void run_of_piece(const struct vps_piece *p, size_t idx, struct run *r)
{
	r->flat = vps_piece_run(p, &r->g);
	r->piece = idx;
	r->npieces = 1;
}

/* Append q to r when both are flat and adjacent on both sides. */
static bool run_merge(struct run *r, const struct run *q)
{
	const struct vps_run *x = &r->g, *y = &q->g;
	if (!r->flat || !q->flat || x->esize != y->esize || x->src_buffer != y->src_buffer ||
	    x->dst_buffer != y->dst_buffer || x->src_offset + x->ext[0] != y->src_offset ||
	    x->dst_offset + x->ext[0] != y->dst_offset)
		return false;
	r->g.ext[0] += y->ext[0];
	r->npieces += q->npieces;
	return true;
}

struct builder {
	struct vps_xfer *x;
	size_t nx, capx;
	struct vps_op *o;
	size_t no, capo;
	int64_t steps; /* the direct steps: each hop of forwards follows them */
};

void vps_op_run(const struct vps_xfer *x, const struct vps_op *o, struct vps_run *r)
{
	r->src = x->src;
	r->dst = x->dst;
	r->ndim = o->ndim;
	r->esize = o->esize;
	r->src_buffer = o->src_buffer;
	r->dst_buffer = o->dst_buffer;
	r->src_offset = o->src_offset;
	r->dst_offset = o->dst_offset;
	for (int k = 0; k < VPS_MAX_DIMS; k++) {
		bool axis = k < o->ndim;
		r->ext[k] = axis ? o->ext[k] : 0;
		r->src_strides[k] = axis ? o->src_strides[k] : 0;
		r->dst_strides[k] = axis ? o->dst_strides[k] : 0;
	}
}

/* Ops for elements [from, from + n) of run r (in its row-major order): at
 * most 2*ndim-1 boxes, each starting on an aligned staging offset from `at`
 * on (at < 0: a retain, no staging). *end receives the byte after the last. */
static vps_result_t emit_part(struct builder *b, const struct run *r, int64_t from, int64_t n, int64_t at,
			      int64_t *end)
{
	struct vps_box parts[2 * VPS_MAX_DIMS];
	int np = vps_flat_range_boxes(r->g.ndim, r->g.ext, from, from + n, parts, NULL);
	for (int i = 0; i < np; i++) {
		int64_t ext[VPS_MAX_DIMS];
		struct vps_run g;
		for (int k = 0; k < r->g.ndim; k++)
			ext[k] = parts[i].hi[k] - parts[i].lo[k];
		if (!vps_run_part(&r->g, parts[i].lo, ext, &g))
			return vps_fail(VPS_EINPUT, "piece %zu: its addresses overflow", r->piece);
		VPS_CHECK(VPS_GROW(b->o, b->capo, b->no + 1));
		struct vps_op *o = &b->o[b->no++];
		memset(o, 0, sizeof(*o));
		o->piece = (int64_t)r->piece;
		o->npieces = r->npieces;
		o->esize = g.esize;
		o->ndim = g.ndim;
		o->src_buffer = g.src_buffer;
		o->dst_buffer = g.dst_buffer;
		o->src_offset = g.src_offset;
		o->dst_offset = g.dst_offset;
		memcpy(o->ext, g.ext, sizeof(o->ext));
		memcpy(o->src_strides, g.src_strides, sizeof(o->src_strides));
		memcpy(o->dst_strides, g.dst_strides, sizeof(o->dst_strides));
		if (at < 0) {
			o->staging = -1;
		} else {
			o->staging = vps_round_up(at, VPS_STAGE_ALIGN);
			at = o->staging + vps_op_bytes(o);
		}
	}
	if (end)
		*end = at;
	return VPS_OK;
}

static vps_result_t new_xfer(struct builder *b, int64_t src, int64_t dst, int hop, int64_t chunk)
{
	VPS_CHECK(VPS_GROW(b->x, b->capx, b->nx + 1));
	struct vps_xfer *x = &b->x[b->nx++];
	memset(x, 0, sizeof(*x));
	x->src = src;
	x->dst = dst;
	x->step = (src ^ dst) + hop * b->steps;
	x->chunk = chunk;
	x->stage = -1;
	x->first_op = b->no;
	return VPS_OK;
}

/* Lay out one pair's runs in chunks of cap bytes. */
static vps_result_t chunk_pair(struct builder *b, const struct run *runs, size_t nruns, int64_t src, int64_t dst,
			       int hop, int64_t cap)
{
	int64_t chunk = 0, pos = 0;
	VPS_CHECK(new_xfer(b, src, dst, hop, chunk));
	for (size_t i = 0; i < nruns; i++) {
		const struct run *r = &runs[i];
		int64_t total = run_elements(r), done = 0;
		while (done < total) {
			int64_t at = vps_round_up(pos, VPS_STAGE_ALIGN);
			/* a box run may come out as 2*ndim-1 boxes, each aligned */
			int64_t slack = r->flat ? 0 : (2 * r->g.ndim - 2) * VPS_STAGE_ALIGN;
			int64_t room = (cap - at - slack) / r->g.esize;
			if (room <= 0) {
				b->x[b->nx - 1].bytes = vps_round_up(pos, VPS_STAGE_ALIGN);
				b->x[b->nx - 1].nops = b->no - b->x[b->nx - 1].first_op;
				VPS_CHECK(new_xfer(b, src, dst, hop, ++chunk));
				pos = 0;
				continue;
			}
			int64_t take = vps_min64(room, total - done);
			VPS_CHECK(emit_part(b, r, done, take, at, &pos));
			done += take;
		}
	}
	b->x[b->nx - 1].bytes = vps_round_up(pos, VPS_STAGE_ALIGN);
	b->x[b->nx - 1].nops = b->no - b->x[b->nx - 1].first_op;
	return VPS_OK;
}

/* A piece of the pair being staged, with its index in the plan. */
struct pair_piece {
	struct vps_piece x;
	size_t index;
};

static int pair_piece_order(const void *p, const void *q)
{
	const struct pair_piece *a = p, *b = q;
	if (a->x.dst_buffer != b->x.dst_buffer)
		return a->x.dst_buffer < b->x.dst_buffer ? -1 : 1;
	if (a->x.dst_offset != b->x.dst_offset)
		return a->x.dst_offset < b->x.dst_offset ? -1 : 1;
	return a->index < b->index ? -1 : a->index > b->index;
}

/* One (source, destination) pair's pieces, in destination address order,
 * merged into runs and laid out in chunks (a retain: direct copies). */
static vps_result_t stage_pair(struct builder *b, struct pair_piece *grp, size_t n, struct run **runs, size_t *capr,
			       int64_t cap)
{
	size_t nruns = 0;
	qsort(grp, n, sizeof(*grp), pair_piece_order);
	for (size_t j = 0; j < n; j++) {
		struct run r;
		run_of_piece(&grp[j].x, grp[j].index, &r);
		if (!(nruns && run_merge(&(*runs)[nruns - 1], &r))) {
			VPS_CHECK(vps_grow((void **)runs, capr, nruns + 1, sizeof(**runs)));
			(*runs)[nruns++] = r;
		}
	}
	int64_t src = grp[0].x.src, dst = grp[0].x.dst;
	if (src != dst)
		return chunk_pair(b, *runs, nruns, src, dst, vps_buffer_hop(grp[0].x.src_buffer), cap);
	VPS_CHECK(new_xfer(b, src, dst, 0, 0));
	for (size_t k = 0; k < nruns; k++)
		VPS_CHECK(emit_part(b, &(*runs)[k], 0, run_elements(&(*runs)[k]), -1, NULL));
	b->x[b->nx - 1].nops = b->no - b->x[b->nx - 1].first_op;
	return VPS_OK;
}

/* Transfers in the order a rank executes them: by unit (step, chunk), then
 * pair. Retains are unit (0, 0) and come first; stages, cut later, are
 * consecutive runs of units, so this is also the order by stage. */
static int xfer_order(const void *p, const void *q)
{
	const struct vps_xfer *x = p, *y = q;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	if (x->chunk != y->chunk)
		return x->chunk < y->chunk ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

int64_t vps_stage_steps(int64_t W)
{
	int64_t p = 1;
	while (p < W)
		p <<= 1;
	return p - 1;
}

static int64_t chunk_size(int64_t budget) { return (budget / 2) / VPS_STAGE_ALIGN * VPS_STAGE_ALIGN; }

/* One side of a transfer: what it costs one rank in one unit. */
struct side {
	int64_t step, rank, chunk, bytes;
};

static int side_order(const void *p, const void *q)
{
	const struct side *x = p, *y = q;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int64_t xfer_payload(const struct vps_op *ops, const struct vps_xfer *x)
{
	int64_t bytes = 0;
	for (size_t k = 0; k < x->nops; k++)
		bytes = vps_sat_add(bytes, vps_op_bytes(&ops[x->first_op + k]));
	return bytes;
}

void vps_stage_demand_combine(int64_t *acc, const int64_t *in, size_t n)
{
	for (size_t i = 0; i + 3 <= n; i += 3) {
		/* the world's chunk count, and the last chunk of the ranks that
		 * have that many: a rank with fewer is idle in it */
		if (in[i] > acc[i] || (in[i] == acc[i] && in[i + 1] > acc[i + 1])) {
			acc[i] = in[i];
			acc[i + 1] = in[i + 1];
		}
		acc[i + 2] = vps_max64(acc[i + 2], in[i + 2]);
	}
}

/* The demands of the ranks in scope (-1: every rank) over xfers. */
static vps_result_t demand_of(const struct vps_xfer *xs, size_t n, int64_t steps, int64_t scope, int64_t *d)
{
	size_t count = VPS_DEMAND_COUNT(steps) + VPS_DEMAND_FORWARD_COUNT(steps);
	memset(d, 0, count * sizeof(*d));
	struct side *e = vps_malloc((2 * n + 1) * sizeof(*e));
	if (!e)
		return VPS_ENOMEM;
	size_t ne = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vps_xfer *x = &xs[i];
		if (x->src == x->dst) {
			if (scope < 0 || x->src == scope)
				d[0] = 1;
			continue;
		}
		if (x->step < 1 || x->step > VPS_STAGE_LAST_STEP(steps) || x->chunk < 0 || x->chunk >= VPS_STAGE_MAX_CHUNKS) {
			free(e);
			return vps_fail(VPS_EINPUT, "transfer %zu (%" PRId64 " -> %" PRId64 "): unit (%" PRId64 ", %" PRId64
					") is outside steps 1..%" PRId64 " or past %lld chunks", i, x->src, x->dst, x->step,
					x->chunk, VPS_STAGE_LAST_STEP(steps), (long long)VPS_STAGE_MAX_CHUNKS);
		}
		int64_t r[2] = {x->src, x->dst};
		for (int k = 0; k < 2; k++)
			if (scope < 0 || r[k] == scope) {
				e[ne++] = (struct side){x->step, r[k], x->chunk, x->bytes};
				if (x->step > steps)
					d[2] = vps_max64(d[2], (x->step - 1) / steps);
			}
	}
	qsort(e, ne, sizeof(*e), side_order);
	for (size_t i = 0; i < ne;) {
		int64_t mine[3] = {0, 0, 0};
		size_t j = i;
		for (; j < ne && e[j].step == e[i].step && e[j].rank == e[i].rank; j++)
			mine[0] = vps_max64(mine[0], e[j].chunk + 1);
		for (size_t k = i; k < j; k++) {
			if (e[k].chunk == mine[0] - 1)
				mine[1] = vps_sat_add(mine[1], e[k].bytes);
			if (e[k].chunk == 0)
				mine[2] = vps_sat_add(mine[2], e[k].bytes);
		}
		vps_stage_demand_combine(&d[3 * e[i].step], mine, 3);
		i = j;
	}
	free(e);
	return VPS_OK;
}

vps_result_t vps_staged_demand(const struct vps_staged *s, int64_t **demand)
{
	*demand = vps_malloc((VPS_DEMAND_COUNT(s->steps) + VPS_DEMAND_FORWARD_COUNT(s->steps)) * sizeof(**demand));
	if (!*demand)
		return VPS_ENOMEM;
	vps_result_t rc = demand_of(s->xfers, s->nxfers, s->steps, s->scope, *demand);
	if (rc) {
		free(*demand);
		*demand = NULL;
	}
	return rc;
}

static int unit_cmp(int64_t s1, int64_t c1, int64_t s2, int64_t c2)
{
	if (s1 != s2)
		return s1 < s2 ? -1 : 1;
	return c1 < c2 ? -1 : c1 > c2;
}

/* The stage holding unit (step, chunk), or -1. */
static int64_t stage_of(const struct vps_stage_info *st, size_t n, int64_t step, int64_t chunk)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (unit_cmp(st[mid].last_unit_step, st[mid].last_unit_chunk, step, chunk) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == n || unit_cmp(st[lo].first_unit_step, st[lo].first_unit_chunk, step, chunk) > 0)
		return -1;
	return (int64_t)lo;
}

int64_t vps_staged_stage_of(const struct vps_staged *s, int64_t step, int64_t chunk)
{
	return stage_of(s->stages, s->nstages, step, chunk);
}

/* Unit (step, chunk) of demand v joins the open stage if the stage's
 * demands stay within the budget, else opens a stage. */
static vps_result_t cut_join(struct vps_stage_info **st, size_t *n, size_t *cap, bool *open, int64_t budget,
			     int64_t step, int64_t chunk, int64_t v)
{
	struct vps_stage_info *g = *n ? &(*st)[*n - 1] : NULL;
	if (*open && g->peak + v <= budget) {
		g->last_unit_step = step;
		g->last_unit_chunk = chunk;
		g->peak += v;
		return VPS_OK;
	}
	VPS_CHECK(VPS_GROW(*st, *cap, *n + 1));
	(*st)[(*n)++] = (struct vps_stage_info){step, chunk, step, chunk, 0, v};
	*open = true;
	return VPS_OK;
}

vps_result_t vps_staged_cut(struct vps_staged *s, const int64_t *d)
{
	vps_result_t rc = VPS_OK;
	struct vps_stage_info *st = NULL;
	size_t n = 0, cap = 0;
	int64_t *stage = vps_malloc((s->nxfers + 1) * sizeof(*stage));
	if (!stage)
		return VPS_ENOMEM;
	if (d[2] < 0 || d[2] > VPS_MAX_HOP) {
		free(stage);
		return vps_fail(VPS_EINPUT, "step 0: %" PRId64 " hops, not 0 to %d", d[2], VPS_MAX_HOP);
	}
	/* the world agreed on the steps of the hops it has only */
	int64_t last_step = (d[2] + 1) * s->steps;
	int64_t limit = vps_sat_add(VPS_STAGE_MAX_CHUNKS, last_step + 1), units = 0, half = chunk_size(s->budget);
	if (d[0]) {
		VPS_CHECK_GOTO(VPS_GROW(st, cap, 1), rc, done);
		st[n++] = (struct vps_stage_info){0, 0, 0, 0, 0, 0};
	}
	bool open = false;
	for (int64_t step = 1; step <= last_step; step++) {
		int64_t chunks = d[3 * step], last = d[3 * step + 1], first = d[3 * step + 2];
		if (step > 1 && (step - 1) % s->steps == 0)
			open = false; /* a hop only after every transfer of the hops before it arrived */
		if (!chunks)
			continue;
		/* what the budget allows, whoever sent the numbers */
		if (chunks < 0 || chunks > VPS_STAGE_MAX_CHUNKS || (units += chunks) > limit || first < 0 || last < 0 ||
		    first > s->budget || last > s->budget || (chunks == 1 && first != last)) {
			rc = vps_fail(VPS_EINPUT, "step %" PRId64 ": a demand of %" PRId64 " chunks, %" PRId64 " bytes in the first, %"
				      PRId64 " in the last, is not one a budget of %" PRId64 " allows", step, chunks, first, last,
				      s->budget);
			goto done;
		}
		VPS_CHECK_GOTO(cut_join(&st, &n, &cap, &open, s->budget, step, 0, first), rc, done);
		if (chunks == 1)
			continue;
		/* one chunk of a step per stage: a rank has one buffer per peer */
		open = false;
		for (int64_t c = 1; c < chunks - 1; c++) {
			VPS_CHECK_GOTO(VPS_GROW(st, cap, n + 1), rc, done);
			st[n++] = (struct vps_stage_info){step, c, step, c, 0, 2 * half};
		}
		VPS_CHECK_GOTO(cut_join(&st, &n, &cap, &open, s->budget, step, chunks - 1, last), rc, done);
	}
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		stage[i] = stage_of(st, n, x->step, x->chunk);
		if (stage[i] < 0) {
			rc = vps_fail(VPS_EINPUT, "transfer %" PRId64 " -> %" PRId64 ", unit (%" PRId64 ", %" PRId64
				      "), lies in no stage the ranks' demands cut: their staged plans disagree",
				      x->src, x->dst, x->step, x->chunk);
			goto done;
		}
		if (x->src != x->dst)
			st[stage[i]].bytes = vps_sat_add(st[stage[i]].bytes, xfer_payload(s->ops, x));
	}
	if (s->cut) {
		bool same = n == s->nstages;
		for (size_t i = 0; same && i < n; i++)
			same = !memcmp(&st[i], &s->stages[i], sizeof(st[i]));
		for (size_t i = 0; same && i < s->nxfers; i++)
			same = stage[i] == s->xfers[i].stage;
		if (!same) {
			rc = vps_fail(VPS_EINPUT, "its stages are not those the ranks' demands cut (%zu stages, the ranks' %zu): "
						  "the ranks' staged plans disagree", s->nstages, n);
			goto done;
		}
	}
	for (size_t i = 0; i < s->nfrees; i++) {
		const struct vps_free *f = &s->frees[i];
		if (f->step >= 0 && stage_of(st, n, f->step, f->chunk) < 0) {
			rc = vps_fail(VPS_EINPUT, "rank %" PRId64 " buffer %u: its last read, unit (%" PRId64 ", %" PRId64
				      "), lies in no stage", f->rank, f->buffer, f->step, f->chunk);
			goto done;
		}
	}
	for (size_t i = 0; i < s->nxfers; i++)
		s->xfers[i].stage = stage[i];
	for (size_t i = 0; i < s->nfrees; i++) {
		struct vps_free *f = &s->frees[i];
		f->stage = f->step < 0 ? -1 : stage_of(st, n, f->step, f->chunk);
	}
	free(s->stages);
	s->stages = st;
	s->nstages = n;
	s->cut = true;
	st = NULL;
done:
	free(st);
	free(stage);
	return rc;
}

/* The last unit reading each A buffer of the ranks in scope. */
static vps_result_t find_frees(struct vps_staged *s, const struct vps_plan *plan)
{
	int64_t wa = vps_layout_world(plan->a);
	int64_t lo = s->scope < 0 ? 0 : s->scope, hi = s->scope < 0 ? wa : vps_min64(s->scope + 1, wa);
	if (lo >= hi)
		return VPS_OK;
	size_t *base = vps_malloc((size_t)(hi - lo + 1) * sizeof(*base));
	if (!base)
		return VPS_ENOMEM;
	size_t cap = 0;
	vps_result_t rc = VPS_OK;
	for (int64_t r = lo; r < hi; r++) {
		/* a rank's buffers are numbered from 0; counted without building
		 * its whole view (16,384 views cost a second) */
		uint32_t nbuf = 0;
		while (vps_layout_buffer_elements(plan->a, r, nbuf) >= 0)
			nbuf++;
		base[r - lo] = s->nfrees;
		VPS_CHECK_GOTO(VPS_GROW(s->frees, cap, s->nfrees + nbuf + 1), rc, done);
		for (uint32_t k = 0; k < nbuf; k++)
			s->frees[s->nfrees++] = (struct vps_free){r, k, -1, 0, -1};
	}
	base[hi - lo] = s->nfrees;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (x->src < lo || x->src >= hi)
			continue;
		size_t b0 = base[x->src - lo], n = base[x->src - lo + 1] - b0;
		for (size_t k = 0; k < x->nops; k++) {
			/* a forward (flagged, past n) reads a B buffer: no A buffer's free */
			uint32_t buf = s->ops[x->first_op + k].src_buffer;
			if (buf >= n)
				continue;
			struct vps_free *f = &s->frees[b0 + buf];
			if (unit_cmp(f->step, f->chunk, x->step, x->chunk) < 0) {
				f->step = x->step;
				f->chunk = x->chunk;
			}
		}
	}
done:
	free(base);
	return rc;
}

/* Any budget above the floor works, but one that cuts the plan in hundreds
 * of millions of chunks of cap bytes is a mistake, not a schedule. */
static vps_result_t check_chunks(const struct vps_plan *plan, int64_t budget, int64_t cap)
{
	int64_t moved = 0;
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, plan);
	for (const struct vps_piece *x; (x = vps_piece_iter_next(&it));)
		if (x->src != x->dst)
			moved = vps_sat_add(moved, vps_piece_bytes(x));
	if (moved / cap > VPS_STAGE_MAX_CHUNKS)
		return vps_fail(VPS_EINPUT,
				"budget: %" PRId64 " bytes cuts the %" PRId64 " bytes this plan moves in more than %lld chunks; "
				"give at least %" PRId64 " bytes",
				budget, moved, (long long)VPS_STAGE_MAX_CHUNKS,
				vps_round_up(2 * (moved / VPS_STAGE_MAX_CHUNKS + 1), VPS_STAGE_ALIGN));
	return VPS_OK;
}

/* Every pair's transfers and copies into b, in chunks of cap bytes. Pieces
 * come in plan order, by destination and then source: a pair's pieces are
 * consecutive, and the plan is read once, packed or not. */
static vps_result_t stage_pairs(struct builder *b, const struct vps_plan *plan, int64_t cap)
{
	struct run *runs = NULL;
	struct pair_piece *grp = NULL;
	size_t capr = 0, ng = 0, capg = 0;
	vps_result_t rc = VPS_OK;
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, plan);
	int64_t pdst = -1, psrc = -1;
	int phop = 0;
	for (size_t gi = 0; !rc; gi++) {
		const struct vps_piece *x = vps_piece_iter_next(&it);
		int hop = x ? vps_buffer_hop(x->src_buffer) : 0;
		if (!x || x->dst != pdst || x->src != psrc || hop != phop) {
			if (ng)
				VPS_CHECK_GOTO(stage_pair(b, grp, ng, &runs, &capr, cap), rc, done);
			ng = 0;
			if (!x)
				break;
			if (x->dst < pdst || (x->dst == pdst && x->src < psrc) ||
			    (x->dst == pdst && x->src == psrc && hop < phop)) {
				rc = vps_fail(VPS_EINPUT, "piece %zu (%" PRId64 " -> %" PRId64 ") is out of the plan's order "
							  "(by destination, then source, then hop)", gi, x->src, x->dst);
				break;
			}
			if (hop < 0) {
				rc = vps_fail(VPS_EINPUT, "piece %zu (%" PRId64 " -> %" PRId64 "): source buffer %#x is a second "
							  "hop that is not a forward", gi, x->src, x->dst, x->src_buffer);
				break;
			}
			pdst = x->dst;
			psrc = x->src;
			phop = hop;
		}
		rc = VPS_GROW(grp, capg, ng + 1);
		if (!rc)
			grp[ng++] = (struct pair_piece){*x, gi};
	}
done:
	free(grp);
	free(runs);
	return rc;
}

/* The transfers of b, in the execution order, into s: all of them, or
 * those of s's scope with their copies. */
static vps_result_t take_transfers(struct vps_staged *s, struct builder *b)
{
	/* a transfer's copies stay where they are made */
	if (b->nx) /* a rank with nothing to move has no transfer */
		qsort(b->x, b->nx, sizeof(*b->x), xfer_order);
	if (s->scope < 0) {
		s->xfers = b->x;
		s->nxfers = b->nx;
		s->ops = b->o;
		s->nops = b->no;
		b->x = NULL;
		b->o = NULL;
		return VPS_OK;
	}
	s->ops = vps_malloc((b->no + 1) * sizeof(*s->ops));
	s->xfers = vps_malloc((b->nx + 1) * sizeof(*s->xfers));
	if (!s->ops || !s->xfers)
		return VPS_ENOMEM;
	for (size_t i = 0; i < b->nx; i++) {
		struct vps_xfer x = b->x[i];
		if (x.src != s->scope && x.dst != s->scope)
			continue;
		if (x.nops)
			memcpy(&s->ops[s->nops], &b->o[x.first_op], x.nops * sizeof(*s->ops));
		x.first_op = s->nops;
		s->nops += x.nops;
		s->xfers[s->nxfers++] = x;
	}
	return VPS_OK;
}

vps_result_t vps_stage(struct vps_staged **out, struct vps_plan *plan, int64_t budget, int64_t rank)
{
	vps_result_t rc = VPS_OK;
	if (plan->scope >= 0 && rank >= 0 && rank != plan->scope)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 ", but the plan holds world rank %" PRId64 "'s part only",
				rank, plan->scope);
	if (budget < VPS_STAGE_BUDGET_FLOOR)
		return vps_fail(VPS_EINPUT, "budget: %" PRId64 " bytes is below the floor of %" PRId64
				" bytes (one aligned element each way)", budget, VPS_STAGE_BUDGET_FLOOR);
	int64_t W = vps_world_size(plan->world), cap = chunk_size(budget);
	if (rank >= W)
		return vps_fail(VPS_EINPUT, "world rank %" PRId64 " is outside the transition world of %" PRId64 " ranks",
				rank, W);
	VPS_CHECK(check_chunks(plan, budget, cap));
	struct vps_staged *s = vps_calloc(1, sizeof(*s));
	int64_t *demand = NULL;
	struct builder b = {0};
	if (!s)
		return VPS_ENOMEM;
	s->budget = budget;
	s->scope = plan->scope >= 0 ? plan->scope : rank;
	s->steps = vps_stage_steps(W);
	b.steps = s->steps;
	VPS_CHECK_GOTO(stage_pairs(&b, plan, cap), rc, fail);
	/* a global plan knows every rank's demands: cut its stages now */
	if (plan->scope < 0) {
		demand = vps_malloc((VPS_DEMAND_COUNT(s->steps) + VPS_DEMAND_FORWARD_COUNT(s->steps)) * sizeof(*demand));
		if (!demand) {
			rc = VPS_ENOMEM;
			goto fail;
		}
		VPS_CHECK_GOTO(demand_of(b.x, b.nx, s->steps, -1, demand), rc, fail);
	}
	VPS_CHECK_GOTO(take_transfers(s, &b), rc, fail);
	VPS_CHECK_GOTO(find_frees(s, plan), rc, fail);
	s->plan = plan;
	if (demand && (rc = vps_staged_cut(s, demand))) {
		s->plan = NULL;
		goto fail;
	}
	free(demand);
	free(b.x);
	free(b.o);
	*out = s;
	return VPS_OK;
fail:
	free(demand);
	free(b.x);
	free(b.o);
	free(s->stages);
	free(s->xfers);
	free(s->ops);
	free(s->frees);
	free(s);
	return rc;
}

void vps_staged_free(struct vps_staged *s)
{
	if (!s)
		return;
	vps_plan_free(s->plan);
	free(s->stages);
	free(s->xfers);
	free(s->ops);
	free(s->frees);
	free(s);
}

void vps_staged_stats(const struct vps_staged *s, struct vps_stage_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->stages = (int64_t)s->nstages;
	st->transfers = (int64_t)s->nxfers;
	int64_t last_step = -1, last_chunk = -1;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		int64_t bytes = 0;
		for (size_t k = 0; k < x->nops; k++)
			bytes = vps_sat_add(bytes, vps_op_bytes(&s->ops[x->first_op + k]));
		if (x->src == x->dst) {
			st->bytes_retained = vps_sat_add(st->bytes_retained, bytes);
		} else {
			st->bytes_moved = vps_sat_add(st->bytes_moved, bytes);
			if (x->step != last_step || x->chunk != last_chunk)
				st->units++;
			if (x->step != last_step)
				st->steps_used++;
			last_step = x->step;
			last_chunk = x->chunk;
		}
	}
	for (size_t i = 0; i < s->nstages; i++)
		st->peak_max = vps_max64(st->peak_max, s->stages[i].peak);
	st->ops = (int64_t)s->nops;
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, s->plan);
	for (const struct vps_piece *p; (p = vps_piece_iter_next(&it));)
		if (s->scope < 0 || p->src == s->scope || p->dst == s->scope)
			st->pieces++;
}

/* ---- hashes ---- */

/* The inputs every rank's staged plan is made from: the two layouts, the
 * training state, the budget and the planner's rules. The world's plan and
 * its stages follow from them, so ranks holding their own parts compare
 * this before a byte moves. */
uint64_t vps_staged_world_hash(const struct vps_staged *s)
{
	const struct vps_plan *p = s->plan;
	const struct vps_training *t = &p->train;
	int64_t head[] = {VPS_PLANNER_RULES, (int64_t)vps_layout_hash(p->a), (int64_t)vps_layout_hash(p->b),
			  vps_world_size(p->world), s->budget, s->steps, t->known, t->step, t->consumed_samples,
			  t->scheduler_step, t->global_batch, t->micro_batch, t->grad_accum, t->dp};
	uint64_t h = vps_hash64(head, sizeof(head), 0);
	/* relays change who sends what: a rank planned with them and one
	 * without, or with another mode or the bandwidths of another
	 * topology, must not agree (plans without them hash as before) */
	h = vps_relay_hash(p, h);
	/* ranks planning around different lost devices must not agree */
	return p->lost.nranks ? vps_hash64(p->lost.ranks, p->lost.nranks * sizeof(*p->lost.ranks), h) : h;
}

uint64_t vps_staged_hash(const struct vps_staged *s)
{
	uint64_t h = vps_plan_hash(s->plan);
	int64_t head[] = {s->budget, s->scope, s->steps, s->cut, (int64_t)s->nstages, (int64_t)s->nxfers, (int64_t)s->nops};
	h = vps_hash64(head, sizeof(head), h);
	for (size_t i = 0; i < s->nstages; i++) {
		const struct vps_stage_info *g = &s->stages[i];
		int64_t f[] = {g->first_unit_step, g->first_unit_chunk, g->last_unit_step, g->last_unit_chunk, g->bytes,
			       g->peak};
		h = vps_hash64(f, sizeof(f), h);
	}
	/* each transfer with its copies, wherever they lie in memory (a file
	 * read back holds them in transfer order, a fresh staging may not) */
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		int64_t f[] = {x->src, x->dst, x->step, x->chunk, x->stage, x->bytes, (int64_t)x->nops};
		h = vps_hash64(f, sizeof(f), h);
		for (size_t k = 0; k < x->nops && x->first_op + k < s->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			int64_t g[8 + 3 * VPS_MAX_DIMS] = {o->piece, o->npieces, o->esize, o->ndim, o->src_buffer, o->dst_buffer,
							   o->src_offset, o->dst_offset};
			for (int d = 0; d < o->ndim && d < VPS_MAX_DIMS; d++) {
				g[8 + d] = o->ext[d];
				g[8 + VPS_MAX_DIMS + d] = o->src_strides[d];
				g[8 + 2 * VPS_MAX_DIMS + d] = o->dst_strides[d];
			}
			h = vps_hash64(g, sizeof(g), h);
			h = vps_hash64(&o->staging, sizeof(o->staging), h);
		}
	}
	for (size_t i = 0; i < s->nfrees; i++) {
		int64_t f[] = {s->frees[i].rank, s->frees[i].buffer, s->frees[i].step, s->frees[i].chunk};
		h = vps_hash64(f, sizeof(f), h);
	}
	/* 0 marks a staged plan computed here (file_hash): no file states it */
	return h ? h : 1;
}
