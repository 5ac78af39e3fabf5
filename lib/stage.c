/* Staging: turn a global plan into per-stage transfers of packed buffers.
 *
 * 1. Pieces of one (source, destination) pair, in destination address
 *    order, are merged into runs when contiguous on both sides.
 * 2. A pair's runs are laid out in a stream cut into chunks of at most
 *    budget/2 bytes (a unit costs a rank one send and one receive chunk),
 *    each run starting on a 256-byte boundary; a run that does not fit is
 *    split at an element boundary.
 * 3. Step s = i ^ j; chunk c of every pair of step s forms unit (s, c).
 *    Units are taken in order and a stage is closed when a unit would push
 *    any rank over the budget (or when the next unit is another chunk of the
 *    same step, so that a rank has one buffer per peer per stage).
 * Retains are stage 0 (step 0), copied directly between A and B buffers. */
#include <inttypes.h>
#include <stdio.h>

#include "internal.h"
#include "vps/stage.h"

struct run {
	size_t piece; /* first plan piece */
	int32_t npieces;
	uint8_t esize;
	bool flat; /* contiguous on both sides: ext[0] elements */
	int ndim;
	int64_t ext[VPS_MAX_DIMS];
	uint32_t src_buffer, dst_buffer;
	int64_t src_offset, dst_offset;
	int64_t src_strides[VPS_MAX_DIMS], dst_strides[VPS_MAX_DIMS];
};

static bool view_contiguous(const int64_t *ext, const int64_t *strides, int ndim)
{
	int64_t s = 1;
	for (int k = ndim - 1; k >= 0; k--) {
		if (ext[k] != 1 && strides[k] != s)
			return false;
		s *= ext[k];
	}
	return true;
}

static int64_t run_elements(const struct run *r)
{
	int64_t n = 1;
	for (int k = 0; k < r->ndim; k++)
		n *= r->ext[k];
	return n;
}

static void run_of_piece(const struct vps_piece *p, size_t idx, struct run *r)
{
	memset(r, 0, sizeof(*r));
	r->piece = idx;
	r->npieces = 1;
	r->esize = (uint8_t)vps_dtype_size(vps_state_dtype(p->state));
	r->ndim = p->box.ndim;
	for (int k = 0; k < p->box.ndim; k++)
		r->ext[k] = p->box.hi[k] - p->box.lo[k];
	r->src_buffer = p->src_buffer;
	r->dst_buffer = p->dst_buffer;
	r->src_offset = p->src_offset;
	r->dst_offset = p->dst_offset;
	memcpy(r->src_strides, p->src_strides, sizeof(r->src_strides));
	memcpy(r->dst_strides, p->dst_strides, sizeof(r->dst_strides));
	if (view_contiguous(r->ext, r->src_strides, r->ndim) && view_contiguous(r->ext, r->dst_strides, r->ndim)) {
		r->flat = true;
		int64_t n = run_elements(r);
		r->ndim = 1;
		r->ext[0] = n;
		r->src_strides[0] = r->dst_strides[0] = 1;
		for (int k = 1; k < VPS_MAX_DIMS; k++)
			r->ext[k] = r->src_strides[k] = r->dst_strides[k] = 0;
	}
}

/* Append q to r when both are flat and adjacent on both sides. */
static bool run_merge(struct run *r, const struct run *q)
{
	if (!r->flat || !q->flat || r->esize != q->esize || r->src_buffer != q->src_buffer ||
	    r->dst_buffer != q->dst_buffer || r->src_offset + r->ext[0] != q->src_offset ||
	    r->dst_offset + r->ext[0] != q->dst_offset)
		return false;
	r->ext[0] += q->ext[0];
	r->npieces += q->npieces;
	return true;
}

struct builder {
	struct vps_xfer *x;
	size_t nx, capx;
	struct vps_op *o;
	size_t no, capo;
};

/* Ops for elements [from, from + n) of run r (in its row-major order): at
 * most 2*ndim-1 boxes, each starting on an aligned staging offset from `at`
 * on (at < 0: a retain, no staging). *end receives the byte after the last. */
static vps_result_t emit_part(struct builder *b, const struct run *r, int64_t from, int64_t n, int64_t at,
			      int64_t *end)
{
	struct vps_box parts[2 * VPS_MAX_DIMS];
	int np = vps_flat_range_boxes(r->ndim, r->ext, from, from + n, parts, NULL);
	for (int i = 0; i < np; i++) {
		VPS_CHECK(VPS_GROW(b->o, b->capo, b->no + 1));
		struct vps_op *o = &b->o[b->no++];
		memset(o, 0, sizeof(*o));
		o->piece = (int64_t)r->piece;
		o->npieces = r->npieces;
		o->esize = r->esize;
		o->ndim = r->ndim;
		o->src_buffer = r->src_buffer;
		o->dst_buffer = r->dst_buffer;
		o->src_offset = r->src_offset;
		o->dst_offset = r->dst_offset;
		for (int k = 0; k < r->ndim; k++) {
			o->ext[k] = parts[i].hi[k] - parts[i].lo[k];
			o->src_strides[k] = r->src_strides[k];
			o->dst_strides[k] = r->dst_strides[k];
			o->src_offset += parts[i].lo[k] * r->src_strides[k];
			o->dst_offset += parts[i].lo[k] * r->dst_strides[k];
		}
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

static vps_result_t new_xfer(struct builder *b, int64_t src, int64_t dst, int64_t chunk)
{
	VPS_CHECK(VPS_GROW(b->x, b->capx, b->nx + 1));
	struct vps_xfer *x = &b->x[b->nx++];
	memset(x, 0, sizeof(*x));
	x->src = src;
	x->dst = dst;
	x->step = src ^ dst;
	x->chunk = chunk;
	x->first_op = b->no;
	return VPS_OK;
}

/* Lay out one pair's runs in chunks of cap bytes. */
static vps_result_t chunk_pair(struct builder *b, const struct run *runs, size_t nruns, int64_t src, int64_t dst,
			       int64_t cap)
{
	int64_t chunk = 0, pos = 0;
	VPS_CHECK(new_xfer(b, src, dst, chunk));
	for (size_t i = 0; i < nruns; i++) {
		const struct run *r = &runs[i];
		int64_t total = run_elements(r), done = 0;
		while (done < total) {
			int64_t at = vps_round_up(pos, VPS_STAGE_ALIGN);
			/* a box run may come out as 2*ndim-1 boxes, each aligned */
			int64_t slack = r->flat ? 0 : (2 * r->ndim - 2) * VPS_STAGE_ALIGN;
			int64_t room = (cap - at - slack) / r->esize;
			if (room <= 0) {
				b->x[b->nx - 1].bytes = vps_round_up(pos, VPS_STAGE_ALIGN);
				b->x[b->nx - 1].nops = b->no - b->x[b->nx - 1].first_op;
				VPS_CHECK(new_xfer(b, src, dst, ++chunk));
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

static int pair_order(const void *p, const void *q, void *ctx)
{
	const struct vps_piece *pieces = ctx;
	const struct vps_piece *x = &pieces[*(const size_t *)p], *y = &pieces[*(const size_t *)q];
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->dst_buffer != y->dst_buffer)
		return x->dst_buffer < y->dst_buffer ? -1 : 1;
	return x->dst_offset < y->dst_offset ? -1 : x->dst_offset > y->dst_offset;
}

static int xfer_order(const void *p, const void *q)
{
	const struct vps_xfer *x = p, *y = q;
	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	if (x->chunk != y->chunk)
		return x->chunk < y->chunk ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int unit_order(const void *p, const void *q)
{
	const struct vps_xfer *x = *(const struct vps_xfer *const *)p, *y = *(const struct vps_xfer *const *)q;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	if (x->chunk != y->chunk)
		return x->chunk < y->chunk ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int64_t steps_for(int64_t W)
{
	int64_t p = 1;
	while (p < W)
		p <<= 1;
	return p - 1;
}

struct loads {
	int64_t *v;       /* bytes per world rank in the open stage */
	int64_t *touched; /* ranks with a non-zero entry */
	size_t ntouched;
};

static void loads_add(struct loads *l, const struct vps_xfer *x, int sign)
{
	int64_t r[2] = {x->src, x->dst};
	for (int i = 0; i < 2; i++) {
		if (sign > 0 && !l->v[r[i]] && x->bytes)
			l->touched[l->ntouched++] = r[i];
		l->v[r[i]] += sign * x->bytes;
	}
}

/* Form stages over the units; fills x->stage and the stage table. */
static vps_result_t form_stages(struct vps_staged *s, struct builder *b, int64_t W, bool have_retains)
{
	vps_result_t rc = VPS_OK;
	struct vps_xfer **u = vps_malloc((b->nx + 1) * sizeof(*u));
	struct loads l = {vps_calloc((size_t)W, sizeof(int64_t)), vps_malloc((4 * b->nx + 1) * sizeof(int64_t)), 0};
	size_t cap = 0, nu = 0;
	if (!u || !l.v || !l.touched) {
		rc = VPS_ENOMEM;
		goto done;
	}
	int64_t stage = -1, prev_step = -1;
	if (have_retains) {
		stage = 0;
		VPS_CHECK_GOTO(VPS_GROW(s->stages, cap, 1), rc, done);
		memset(&s->stages[0], 0, sizeof(s->stages[0]));
		s->nstages = 1;
	}
	for (size_t i = 0; i < b->nx; i++) {
		if (b->x[i].src == b->x[i].dst)
			b->x[i].stage = 0;
		else
			u[nu++] = &b->x[i];
	}
	qsort(u, nu, sizeof(*u), unit_order);
	bool open = false;
	for (size_t i = 0; i < nu;) {
		/* one unit: every transfer of (step, chunk) */
		size_t j = i;
		while (j < nu && u[j]->step == u[i]->step && u[j]->chunk == u[i]->chunk)
			j++;
		bool fits = open && u[i]->step != prev_step;
		if (fits) {
			for (size_t k = i; k < j; k++)
				loads_add(&l, u[k], +1);
			for (size_t k = i; k < j && fits; k++)
				fits = l.v[u[k]->src] <= s->budget && l.v[u[k]->dst] <= s->budget;
			if (!fits)
				for (size_t k = i; k < j; k++)
					loads_add(&l, u[k], -1);
		}
		if (!fits) {
			for (size_t k = 0; k < l.ntouched; k++)
				l.v[l.touched[k]] = 0;
			l.ntouched = 0;
			stage++;
			VPS_CHECK_GOTO(VPS_GROW(s->stages, cap, (size_t)stage + 1), rc, done);
			memset(&s->stages[stage], 0, sizeof(s->stages[stage]));
			s->stages[stage].first_unit_step = u[i]->step;
			s->stages[stage].first_unit_chunk = u[i]->chunk;
			s->nstages = (size_t)stage + 1;
			open = true;
			for (size_t k = i; k < j; k++)
				loads_add(&l, u[k], +1);
		}
		for (size_t k = i; k < j; k++) {
			u[k]->stage = stage;
			int64_t peak = vps_max64(l.v[u[k]->src], l.v[u[k]->dst]);
			s->stages[stage].peak = vps_max64(s->stages[stage].peak, peak);
			if (peak > s->budget) {
				rc = vps_fail(VPS_EINPUT, "internal: a unit exceeds the budget");
				goto done;
			}
		}
		s->stages[stage].last_unit_step = u[i]->step;
		s->stages[stage].last_unit_chunk = u[i]->chunk;
		prev_step = u[i]->step;
		i = j;
	}
done:
	free(u);
	free(l.v);
	free(l.touched);
	return rc;
}

vps_result_t vps_stage(struct vps_staged **out, struct vps_plan *plan, int64_t budget, int64_t rank)
{
	vps_result_t rc = VPS_OK;
	if (plan->scope >= 0)
		return vps_fail(VPS_EINPUT, "staging needs the global plan: stage boundaries are the same on every rank "
					    "(this plan is rank %" PRId64 "'s)", plan->scope);
	if (budget < VPS_STAGE_BUDGET_FLOOR)
		return vps_fail(VPS_EINPUT, "budget: %" PRId64 " bytes is below the floor of %" PRId64
				" bytes (one aligned element each way)", budget, VPS_STAGE_BUDGET_FLOOR);
	int64_t W = vps_world_size(plan->world);
	if (rank >= W)
		return vps_fail(VPS_EINPUT, "--rank: %" PRId64 " is outside the transition world of %" PRId64, rank, W);
	struct vps_staged *s = vps_calloc(1, sizeof(*s));
	size_t *idx = vps_malloc((plan->npieces + 1) * sizeof(*idx));
	struct run *runs = NULL;
	size_t nruns = 0, capr = 0;
	struct builder b = {0};
	if (!s || !idx) {
		free(s);
		free(idx);
		return VPS_ENOMEM;
	}
	s->budget = budget;
	s->scope = rank;
	s->steps = steps_for(W);
	for (size_t i = 0; i < plan->npieces; i++)
		idx[i] = i;
	qsort_r(idx, plan->npieces, sizeof(*idx), pair_order, plan->pieces);
	bool have_retains = false;
	int64_t cap = (budget / 2) / VPS_STAGE_ALIGN * VPS_STAGE_ALIGN;
	/* any budget above the floor works, but one that cuts the plan in
	 * hundreds of millions of chunks is a mistake, not a schedule */
	int64_t moved = 0;
	for (size_t i = 0; i < plan->npieces; i++)
		if (plan->pieces[i].src != plan->pieces[i].dst)
			moved = vps_sat_add(moved, vps_piece_bytes(&plan->pieces[i]));
	if (moved / cap > VPS_STAGE_MAX_CHUNKS) {
		free(s);
		free(idx);
		return vps_fail(VPS_EINPUT,
				"budget: %" PRId64 " bytes cuts the %" PRId64 " bytes this plan moves in more than %lld chunks; "
				"give at least %" PRId64 " bytes",
				budget, moved, (long long)VPS_STAGE_MAX_CHUNKS,
				vps_round_up(2 * (moved / VPS_STAGE_MAX_CHUNKS + 1), VPS_STAGE_ALIGN));
	}
	for (size_t i = 0; i < plan->npieces;) {
		const struct vps_piece *p0 = &plan->pieces[idx[i]];
		size_t j = i;
		nruns = 0;
		while (j < plan->npieces && plan->pieces[idx[j]].src == p0->src && plan->pieces[idx[j]].dst == p0->dst) {
			struct run r;
			run_of_piece(&plan->pieces[idx[j]], idx[j], &r);
			if (!(nruns && run_merge(&runs[nruns - 1], &r))) {
				VPS_CHECK_GOTO(VPS_GROW(runs, capr, nruns + 1), rc, fail);
				runs[nruns++] = r;
			}
			j++;
		}
		if (p0->src == p0->dst) {
			have_retains = true;
			VPS_CHECK_GOTO(new_xfer(&b, p0->src, p0->dst, 0), rc, fail);
			for (size_t k = 0; k < nruns; k++)
				VPS_CHECK_GOTO(emit_part(&b, &runs[k], 0, run_elements(&runs[k]), -1, NULL), rc, fail);
			b.x[b.nx - 1].nops = b.no - b.x[b.nx - 1].first_op;
		} else {
			VPS_CHECK_GOTO(chunk_pair(&b, runs, nruns, p0->src, p0->dst, cap), rc, fail);
		}
		i = j;
	}
	VPS_CHECK_GOTO(form_stages(s, &b, W, have_retains), rc, fail);
	/* order transfers by stage and rebuild the op list in that order,
	 * keeping only the rank's own when asked */
	qsort(b.x, b.nx, sizeof(*b.x), xfer_order);
	s->ops = vps_malloc((b.no + 1) * sizeof(*s->ops));
	s->xfers = vps_malloc((b.nx + 1) * sizeof(*s->xfers));
	if (!s->ops || !s->xfers) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < b.nx; i++) {
		struct vps_xfer x = b.x[i];
		int64_t bytes = 0;
		for (size_t k = 0; k < x.nops; k++)
			bytes = vps_sat_add(bytes, vps_op_bytes(&b.o[x.first_op + k]));
		s->stages[x.stage].bytes = vps_sat_add(s->stages[x.stage].bytes, x.src == x.dst ? 0 : bytes);
		if (rank >= 0 && x.src != rank && x.dst != rank)
			continue;
		if (x.nops)
			memcpy(&s->ops[s->nops], &b.o[x.first_op], x.nops * sizeof(*s->ops));
		x.first_op = s->nops;
		s->nops += x.nops;
		s->xfers[s->nxfers++] = x;
	}
	/* the last stage reading each A buffer */
	int64_t wa = vps_layout_world(plan->a);
	for (int64_t r = 0; r < wa; r++) {
		if (rank >= 0 && r != rank)
			continue;
		struct vps_rank_view v;
		VPS_CHECK_GOTO(vps_layout_rank(plan->a, r, &v), rc, fail);
		size_t base = s->nfrees;
		struct vps_free *nf = vps_realloc_array(s->frees, s->nfrees + v.nbuffers + 1, sizeof(*s->frees));
		if (!nf) {
			vps_rank_view_release(&v);
			rc = VPS_ENOMEM;
			goto fail;
		}
		s->frees = nf;
		for (size_t k = 0; k < v.nbuffers; k++)
			s->frees[s->nfrees++] = (struct vps_free){r, (uint32_t)k, -1};
		vps_rank_view_release(&v);
		for (size_t i = 0; i < b.nx; i++) {
			if (b.x[i].src != r)
				continue;
			for (size_t k = 0; k < b.x[i].nops; k++) {
				uint32_t buf = b.o[b.x[i].first_op + k].src_buffer;
				if (base + buf < s->nfrees)
					s->frees[base + buf].stage = vps_max64(s->frees[base + buf].stage, b.x[i].stage);
			}
		}
	}
	free(b.x);
	free(b.o);
	free(idx);
	free(runs);
	s->plan = plan;
	*out = s;
	return VPS_OK;
fail:
	free(b.x);
	free(b.o);
	free(idx);
	free(runs);
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
	for (size_t i = 0; i < s->plan->npieces; i++) {
		const struct vps_piece *p = &s->plan->pieces[i];
		if (s->scope < 0 || p->src == s->scope || p->dst == s->scope)
			st->pieces++;
	}
}

vps_result_t vps_parse_bytes(const char *s, int64_t *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || v < 0)
		return vps_fail(VPS_EINPUT, "'%s' is not a size (bytes, or a number with KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
				s);
	static const struct {
		const char *unit;
		double mult;
	} units[] = {{"", 1},
		     {"B", 1},
		     {"KiB", 1024.0},
		     {"MiB", 1024.0 * 1024},
		     {"GiB", 1024.0 * 1024 * 1024},
		     {"TiB", 1024.0 * 1024 * 1024 * 1024},
		     {"KB", 1e3},
		     {"MB", 1e6},
		     {"GB", 1e9},
		     {"TB", 1e12}};
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcmp(end, units[i].unit)) {
			double b = v * units[i].mult;
			if (b > 9.0e18)
				return vps_fail(VPS_EINPUT, "'%s' is too large", s);
			*out = (int64_t)b;
			return VPS_OK;
		}
	return vps_fail(VPS_EINPUT, "'%s': unknown unit '%s' (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s, end);
}
