#include <inttypes.h>
#include <stdio.h>

#include "internal.h"
#include "vps/plan.h"
#include "vps/stage.h"
#include "vps/verify.h"

void vps_verify_report_release(struct vps_verify_report *r)
{
	for (size_t i = 0; i < r->nmessages; i++)
		free(r->messages[i]);
	free(r->messages);
	memset(r, 0, sizeof(*r));
}

void vps_verify_add(struct vps_verify_report *rep, const char *fmt, ...)
{
	rep->violations++;
	if (rep->nmessages >= VPS_VERIFY_MAX_MESSAGES)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	char **m = realloc(rep->messages, (rep->nmessages + 1) * sizeof(*m));
	if (!m)
		return;
	rep->messages = m;
	m[rep->nmessages] = strdup(buf);
	if (m[rep->nmessages])
		rep->nmessages++;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Slab recursion: split target along `axis` at every box boundary; a slab
 * no box spans entirely is uncovered and goes to visit() (which returns
 * false to stop), otherwise recurse on the next axis with the boxes that
 * span it. @return false when stopped or out of memory (*oom set). */
static bool slabs(const struct vps_box **boxes, size_t n, const struct vps_box *target, int axis,
		  bool (*visit)(void *ctx, const struct vps_box *gap), void *ctx, bool *oom)
{
	if (!n)
		return visit(ctx, target);
	int64_t *cuts = malloc((2 * n + 2) * sizeof(*cuts));
	const struct vps_box **sub = malloc((n + 1) * sizeof(*sub));
	if (!cuts || !sub) {
		free(cuts);
		free(sub);
		*oom = true;
		return false;
	}
	size_t nc = 0;
	cuts[nc++] = target->lo[axis];
	cuts[nc++] = target->hi[axis];
	for (size_t i = 0; i < n; i++) {
		if (boxes[i]->lo[axis] > target->lo[axis] && boxes[i]->lo[axis] < target->hi[axis])
			cuts[nc++] = boxes[i]->lo[axis];
		if (boxes[i]->hi[axis] > target->lo[axis] && boxes[i]->hi[axis] < target->hi[axis])
			cuts[nc++] = boxes[i]->hi[axis];
	}
	qsort(cuts, nc, sizeof(*cuts), cmp_i64);
	bool go = true;
	for (size_t c = 0; c + 1 < nc && go; c++) {
		if (cuts[c] == cuts[c + 1])
			continue;
		struct vps_box slab = *target;
		slab.lo[axis] = cuts[c];
		slab.hi[axis] = cuts[c + 1];
		size_t ns = 0;
		for (size_t i = 0; i < n; i++)
			if (boxes[i]->lo[axis] <= slab.lo[axis] && boxes[i]->hi[axis] >= slab.hi[axis])
				sub[ns++] = boxes[i];
		if (!ns)
			go = visit(ctx, &slab);
		else if (axis + 1 < target->ndim)
			go = slabs(sub, ns, &slab, axis + 1, visit, ctx, oom);
	}
	free(cuts);
	free(sub);
	return go;
}

static bool slabs_of(const struct vps_box *boxes, size_t n, const struct vps_box *target,
		     bool (*visit)(void *ctx, const struct vps_box *gap), void *ctx)
{
	const struct vps_box **ptr = malloc((n + 1) * sizeof(*ptr));
	bool oom = !ptr;
	size_t k = 0;
	for (size_t i = 0; ptr && i < n; i++)
		if (vps_box_intersect(&boxes[i], target, NULL))
			ptr[k++] = &boxes[i];
	if (ptr)
		slabs(ptr, k, target, 0, visit, ctx, &oom);
	free(ptr);
	return !oom;
}

struct gap_list {
	struct vps_box *gaps;
	size_t n, max;
};

/* Collect gaps, extending the previous one when the new one continues it
 * along one axis. */
static bool add_gap(void *ctx, const struct vps_box *g)
{
	struct gap_list *l = ctx;
	if (l->n) {
		struct vps_box *last = &l->gaps[l->n - 1];
		for (int axis = 0; axis < g->ndim; axis++) {
			if (last->hi[axis] != g->lo[axis])
				continue;
			struct vps_box grown = *last, same = *g;
			grown.hi[axis] = g->hi[axis];
			same.lo[axis] = last->lo[axis];
			if (vps_box_equal(&grown, &same)) {
				*last = grown;
				return true;
			}
		}
	}
	l->gaps[l->n++] = *g;
	return l->n < l->max;
}

static bool add_volume(void *ctx, const struct vps_box *g)
{
	*(int64_t *)ctx += vps_box_volume(g);
	return true;
}

int64_t vps_boxes_uncovered(const struct vps_box *boxes, size_t n, const struct vps_box *target)
{
	int64_t total = 0;
	return slabs_of(boxes, n, target, add_volume, &total) ? total : -1;
}

size_t vps_boxes_gaps(const struct vps_box *boxes, size_t n, const struct vps_box *target, struct vps_box *gaps,
		      size_t max)
{
	struct gap_list l = {gaps, 0, max};
	if (!max)
		return 0;
	if (!slabs_of(boxes, n, target, add_gap, &l)) {
		/* out of memory: the whole target is unproven */
		gaps[0] = *target;
		return 1;
	}
	return l.n;
}

/* ---- layouts ---- */

struct held {
	uint32_t tensor;
	uint8_t state;
	struct vps_box box;
	int64_t rank;
};

static int held_cmp(const void *a, const void *b)
{
	const struct held *x = a, *y = b;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	for (int k = 0; k < x->box.ndim; k++) {
		if (x->box.lo[k] != y->box.lo[k])
			return x->box.lo[k] < y->box.lo[k] ? -1 : 1;
		if (x->box.hi[k] != y->box.hi[k])
			return x->box.hi[k] < y->box.hi[k] ? -1 : 1;
	}
	return 0;
}

struct span {
	int64_t lo, hi;
	uint32_t buffer;
	size_t region;
	bool exact; /* contiguous: [lo, hi) is its footprint */
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	if (x->buffer != y->buffer)
		return x->buffer < y->buffer ? -1 : 1;
	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	return x->hi < y->hi ? -1 : x->hi > y->hi;
}

static void box_str(const struct vps_box *b, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = '\0';
	len += (size_t)snprintf(buf + len, n - len, "[");
	for (int k = 0; k < b->ndim && len < n; k++)
		len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64 ":%" PRId64, k ? ", " : "", b->lo[k], b->hi[k]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
}

/* Whether two regions of one buffer share an element, for the rare
 * non-contiguous region: walk the smaller one. */
static bool regions_share(const struct vps_region *a, const struct vps_region *b)
{
	if (vps_box_volume(&a->box) > vps_box_volume(&b->box)) {
		const struct vps_region *t = a;
		a = b;
		b = t;
	}
	int64_t first, end;
	vps_region_extent(b, &first, &end);
	int64_t idx[VPS_MAX_DIMS];
	int64_t vol = vps_box_volume(&a->box), pairs;
	/* the walk below is quadratic: too large to walk, report it */
	if (!vps_mul_ok(vol, vps_box_volume(&b->box), &pairs) || pairs > ((int64_t)1 << 30))
		return true;
	for (int64_t e = 0; e < vol; e++) {
		int64_t rem = e;
		for (int k = a->box.ndim - 1; k >= 0; k--) {
			int64_t ext = a->box.hi[k] - a->box.lo[k];
			idx[k] = a->box.lo[k] + rem % ext;
			rem /= ext;
		}
		int64_t off = vps_region_offset_at(a, idx);
		if (off < first || off >= end)
			continue;
		/* invert b's affine map is not unique in general: walk b too */
		int64_t vb = vps_box_volume(&b->box), jdx[VPS_MAX_DIMS];
		for (int64_t f = 0; f < vb; f++) {
			int64_t rm = f;
			for (int k = b->box.ndim - 1; k >= 0; k--) {
				int64_t ext = b->box.hi[k] - b->box.lo[k];
				jdx[k] = b->box.lo[k] + rm % ext;
				rm /= ext;
			}
			if (vps_region_offset_at(b, jdx) == off)
				return true;
		}
	}
	return false;
}

static void check_rank(const struct vps_layout *l, const struct vps_rank_view *v, struct vps_verify_report *rep,
		       int64_t *nregions)
{
	const struct vps_model *m = vps_layout_model(l);
	char bs[160], name[256];
	*nregions += (int64_t)v->nregions;
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i].id != i)
			vps_verify_add(rep, "rank %" PRId64 ": buffer %zu has id %u", v->rank, i, v->buffers[i].id);
	struct span *spans = malloc((v->nregions + 1) * sizeof(*spans));
	size_t nspans = 0;
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *r = &v->regions[i];
		struct vps_tensor t;
		if (vps_model_tensor(m, r->tensor, &t)) {
			vps_verify_add(rep, "rank %" PRId64 ": region %zu names tensor %u, outside the model", v->rank, i,
				       r->tensor);
			continue;
		}
		vps_tensor_name(&t, name, sizeof(name));
		box_str(&r->box, bs, sizeof(bs));
		struct vps_box full;
		vps_box_full(&full, t.ndim, t.shape);
		if (r->box.ndim != t.ndim || !vps_box_contains(&full, &r->box) || vps_box_volume(&r->box) == 0) {
			vps_verify_add(rep, "rank %" PRId64 ": %s %s: box %s is empty or outside the tensor", v->rank, name,
				       vps_state_name(r->state), bs);
			continue;
		}
		if (r->buffer >= v->nbuffers) {
			vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: buffer %u does not exist", v->rank, name,
				       vps_state_name(r->state), bs, r->buffer);
			continue;
		}
		const struct vps_buffer *b = &v->buffers[r->buffer];
		if (b->state != r->state)
			vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: in buffer %u, which holds %s", v->rank, name,
				       vps_state_name(r->state), bs, r->buffer, vps_state_name(b->state));
		if (b->dtype != vps_state_dtype(b->state))
			vps_verify_add(rep, "rank %" PRId64 ": buffer %u holds %s as %s, expected %s", v->rank, r->buffer,
				       vps_state_name(b->state), vps_dtype_name(b->dtype),
				       vps_dtype_name(vps_state_dtype(b->state)));
		bool aliased = false;
		for (int k = 0; k < r->box.ndim; k++)
			aliased |= r->strides[k] == 0;
		if (aliased) {
			vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: a stride is 0 (rows that alias each other)", v->rank,
				       name, vps_state_name(r->state), bs);
			continue;
		}
		int64_t first, end;
		vps_region_extent(r, &first, &end);
		if (first < 0 || end > b->elements) {
			vps_verify_add(rep,
				       "rank %" PRId64 ": %s %s %s: elements [%" PRId64 ", %" PRId64
				       ") lie outside buffer %u of %" PRId64,
				       v->rank, name, vps_state_name(r->state), bs, first, end, r->buffer, b->elements);
			continue;
		}
		if (spans) {
			spans[nspans].lo = first;
			spans[nspans].hi = end;
			spans[nspans].buffer = r->buffer;
			spans[nspans].region = i;
			spans[nspans].exact = vps_region_is_contiguous(r);
			nspans++;
		}
	}
	if (!spans)
		return;
	/* overlaps: sort each buffer's footprints; compare with the furthest
	 * reaching earlier one of the same buffer */
	qsort(spans, nspans, sizeof(*spans), span_cmp);
	size_t reach = 0;
	for (size_t i = 1; i < nspans; i++) {
		if (spans[i].buffer != spans[reach].buffer) {
			reach = i;
			continue;
		}
		if (spans[i].lo < spans[reach].hi) {
			const struct vps_region *a = &v->regions[spans[reach].region], *b = &v->regions[spans[i].region];
			bool real = (spans[i].exact && spans[reach].exact) || regions_share(a, b);
			if (real) {
				struct vps_tensor ta, tb;
				char na[256], nb[256], ba[160];
				vps_model_tensor(m, a->tensor, &ta);
				vps_model_tensor(m, b->tensor, &tb);
				vps_tensor_name(&ta, na, sizeof(na));
				vps_tensor_name(&tb, nb, sizeof(nb));
				box_str(&a->box, ba, sizeof(ba));
				box_str(&b->box, bs, sizeof(bs));
				vps_verify_add(rep, "rank %" PRId64 ": buffer %u: %s %s %s overlaps %s %s %s at element %" PRId64,
					       v->rank, a->buffer, na, vps_state_name(a->state), ba, nb,
					       vps_state_name(b->state), bs, spans[i].lo);
			}
		}
		if (spans[i].hi > spans[reach].hi)
			reach = i;
	}
	free(spans);
}

vps_result_t vps_verify_layout(const struct vps_layout *l, struct vps_verify_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_model *m = vps_layout_model(l);
	int64_t world = vps_layout_world(l), nregions = 0;
	struct held *held = NULL;
	size_t nheld = 0, cap = 0;
	memset(rep, 0, sizeof(*rep));
	for (int64_t r = 0; r < world; r++) {
		struct vps_rank_view v;
		VPS_CHECK_GOTO(vps_layout_rank(l, r, &v), rc, done);
		check_rank(l, &v, rep, &nregions);
		rc = VPS_GROW(held, cap, nheld + v.nregions);
		for (size_t i = 0; !rc && i < v.nregions; i++) {
			held[nheld].tensor = v.regions[i].tensor;
			held[nheld].state = v.regions[i].state;
			held[nheld].box = v.regions[i].box;
			held[nheld].rank = r;
			nheld++;
		}
		vps_rank_view_release(&v);
		if (rc)
			goto done;
	}
	qsort(held, nheld, sizeof(*held), held_cmp);
	uint32_t ntensors = vps_model_num_tensors(m);
	int nstates = vps_layout_nstates(l);
	size_t g = 0;
	int64_t replicas = 0, logical = 0;
	struct vps_box gaps[4];
	struct vps_box *uniq = malloc((nheld + 1) * sizeof(*uniq));
	if (!uniq) {
		rc = VPS_NOMEM();
		goto done;
	}
	for (uint32_t t = 0; t < ntensors; t++) {
		struct vps_tensor td;
		char name[256];
		vps_model_tensor(m, t, &td);
		struct vps_box full;
		vps_box_full(&full, td.ndim, td.shape);
		int64_t vol = vps_box_volume(&full);
		for (int st = 0; st < nstates; st++) {
			size_t nu = 0;
			logical += vol;
			while (g < nheld && (held[g].tensor < t || (held[g].tensor == t && held[g].state < st)))
				g++;
			while (g < nheld && held[g].tensor == t && held[g].state == st) {
				replicas += vps_box_volume(&held[g].box);
				if (!nu || !vps_box_equal(&uniq[nu - 1], &held[g].box))
					uniq[nu++] = held[g].box;
				g++;
			}
			size_t ng = vps_boxes_gaps(uniq, nu, &full, gaps, 4);
			for (size_t i = 0; i < ng; i++) {
				char bs[160];
				vps_tensor_name(&td, name, sizeof(name));
				box_str(&gaps[i], bs, sizeof(bs));
				vps_verify_add(rep, "%s %s: elements %s are held by no rank", name, vps_state_name(st), bs);
			}
		}
	}
	free(uniq);
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %" PRId64 " ranks, %u tensors x %d states, %" PRId64 " regions, %.3f copies per element",
		 m->name, world, ntensors, nstates, nregions, logical ? (double)replicas / (double)logical : 0.0);
done:
	free(held);
	return rc;
}

/* ---- plans ---- */

struct view_index {
	struct vps_rank_view v;
	uint32_t *order; /* regions sorted by (tensor, state) */
	bool ready;
};

static int order_cmp(const void *p, const void *q, void *ctx)
{
	const struct vps_rank_view *v = ctx;
	const struct vps_region *x = &v->regions[*(const uint32_t *)p], *y = &v->regions[*(const uint32_t *)q];
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	return *(const uint32_t *)p < *(const uint32_t *)q ? -1 : 1;
}

static vps_result_t view_get(const struct vps_layout *l, struct view_index *cache, int64_t rank,
			     struct view_index **out)
{
	struct view_index *vi = &cache[rank];
	if (!vi->ready) {
		VPS_CHECK(vps_layout_rank(l, rank, &vi->v));
		vi->order = vps_malloc((vi->v.nregions + 1) * sizeof(*vi->order));
		if (!vi->order)
			return VPS_ENOMEM;
		for (size_t i = 0; i < vi->v.nregions; i++)
			vi->order[i] = (uint32_t)i;
		qsort_r(vi->order, vi->v.nregions, sizeof(*vi->order), order_cmp, &vi->v);
		vi->ready = true;
	}
	*out = vi;
	return VPS_OK;
}

static void views_free(struct view_index *c, int64_t n)
{
	for (int64_t i = 0; c && i < n; i++) {
		free(c[i].order);
		vps_rank_view_release(&c[i].v);
	}
	free(c);
}

/* The region of (tensor, state) holding box at the given addressing, or -1. */
static int64_t find_holding(const struct view_index *vi, uint32_t tensor, int state, const struct vps_box *box,
			    uint32_t buffer, int64_t offset, const int64_t *strides)
{
	size_t lo = 0, hi = vi->v.nregions;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const struct vps_region *r = &vi->v.regions[vi->order[mid]];
		if (r->tensor < tensor || (r->tensor == tensor && r->state < state))
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < vi->v.nregions; i++) {
		const struct vps_region *r = &vi->v.regions[vi->order[i]];
		if (r->tensor != tensor || r->state != state)
			break;
		if (r->buffer != buffer || !vps_box_contains(&r->box, box) ||
		    vps_region_offset_at(r, box->lo) != offset)
			continue;
		bool same = true;
		for (int k = 0; k < box->ndim; k++)
			if (box->hi[k] - box->lo[k] > 1 && r->strides[k] != strides[k])
				same = false;
		if (same)
			return vi->order[i];
	}
	return -1;
}

struct cover {
	int64_t rb;
	int64_t region;
	size_t piece;
};

static int cover_cmp(const void *p, const void *q)
{
	const struct cover *x = p, *y = q;
	if (x->rb != y->rb)
		return x->rb < y->rb ? -1 : 1;
	if (x->region != y->region)
		return x->region < y->region ? -1 : 1;
	return x->piece < y->piece ? -1 : x->piece > y->piece;
}

static void piece_str(const struct vps_model *m, const struct vps_piece *x, char *buf, size_t n)
{
	struct vps_tensor t;
	char name[256], bs[160];
	vps_model_tensor(m, x->tensor, &t);
	vps_tensor_name(&t, name, sizeof(name));
	box_str(&x->box, bs, sizeof(bs));
	snprintf(buf, n, "%s %s %s", name, vps_state_name(x->state), bs);
}

vps_result_t vps_verify_plan(const struct vps_plan *p, struct vps_verify_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_model *m = vps_layout_model(p->a);
	int64_t W = vps_world_size(p->world), wa = vps_layout_world(p->a), wb = vps_layout_world(p->b);
	memset(rep, 0, sizeof(*rep));
	if (p->file_hash && p->file_hash != vps_plan_hash(p))
		vps_verify_add(rep, "the plan states hash 0x%016" PRIx64 " but its content hashes to 0x%016" PRIx64,
			       p->file_hash, vps_plan_hash(p));
	struct view_index *va = vps_calloc((size_t)wa, sizeof(*va)), *vb = vps_calloc((size_t)wb, sizeof(*vb));
	struct cover *cov = vps_malloc((p->npieces + 1) * sizeof(*cov));
	struct vps_box *boxes = NULL;
	size_t ncov = 0, capb = 0;
	int64_t moved = 0, retains = 0;
	char ps[512];
	if (!va || !vb || !cov) {
		rc = VPS_ENOMEM;
		goto done;
	}
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		struct view_index *vi;
		piece_str(m, x, ps, sizeof(ps));
		if (x->src == x->dst)
			retains++;
		else
			moved = vps_sat_add(moved, vps_piece_bytes(x));
		if (p->scope >= 0 && x->src != p->scope && x->dst != p->scope)
			vps_verify_add(rep, "piece %zu (%s, %" PRId64 " -> %" PRId64 ") does not involve rank %" PRId64
				       ", the plan's scope", i, ps, x->src, x->dst, p->scope);
		int64_t ra = vps_world_a_rank(p->world, x->src), rb = vps_world_b_rank(p->world, x->dst);
		if (ra < 0) {
			vps_verify_add(rep, "piece %zu (%s): source %" PRId64 " is a joining device, it holds nothing", i, ps,
				       x->src);
		} else {
			VPS_CHECK_GOTO(view_get(p->a, va, ra, &vi), rc, done);
			if (find_holding(vi, x->tensor, x->state, &x->box, x->src_buffer, x->src_offset, x->src_strides) < 0)
				vps_verify_add(rep,
					       "piece %zu (%s): source %" PRId64 " does not hold it at buffer %u offset %" PRId64
					       " under the source layout",
					       i, ps, x->src, x->src_buffer, x->src_offset);
		}
		if (rb < 0) {
			vps_verify_add(rep, "piece %zu (%s): destination %" PRId64 " is a leaving device", i, ps, x->dst);
			continue;
		}
		VPS_CHECK_GOTO(view_get(p->b, vb, rb, &vi), rc, done);
		int64_t reg = find_holding(vi, x->tensor, x->state, &x->box, x->dst_buffer, x->dst_offset, x->dst_strides);
		if (reg < 0) {
			vps_verify_add(rep,
				       "piece %zu (%s): destination %" PRId64 " has no region for it at buffer %u offset %" PRId64
				       " (padding or a wrong address)",
				       i, ps, x->dst, x->dst_buffer, x->dst_offset);
			continue;
		}
		cov[ncov++] = (struct cover){rb, reg, i};
	}
	qsort(cov, ncov, sizeof(*cov), cover_cmp);
	/* every destination region in scope covered exactly once */
	size_t c = 0;
	for (int64_t d = 0; d < W; d++) {
		if (p->scope >= 0 && d != p->scope)
			continue;
		int64_t rb = vps_world_b_rank(p->world, d);
		if (rb < 0)
			continue;
		struct view_index *vi;
		VPS_CHECK_GOTO(view_get(p->b, vb, rb, &vi), rc, done);
		c = 0;
		while (c < ncov && cov[c].rb < rb)
			c++;
		for (size_t r = 0; r < vi->v.nregions; r++) {
			const struct vps_region *R = &vi->v.regions[r];
			size_t n = 0;
			int64_t sum = 0;
			while (c < ncov && cov[c].rb == rb && cov[c].region < (int64_t)r)
				c++;
			while (c < ncov && cov[c].rb == rb && cov[c].region == (int64_t)r) {
				VPS_CHECK_GOTO(VPS_GROW(boxes, capb, n + 1), rc, done);
				boxes[n++] = p->pieces[cov[c].piece].box;
				sum += vps_box_volume(&p->pieces[cov[c].piece].box);
				c++;
			}
			int64_t vol = vps_box_volume(&R->box), gap = vps_boxes_uncovered(boxes, n, &R->box);
			if (gap || sum != vol) {
				struct vps_piece fake = {.tensor = R->tensor, .state = R->state, .box = R->box};
				piece_str(m, &fake, ps, sizeof(ps));
				if (gap)
					vps_verify_add(rep, "rank %" PRId64 ": %s: %" PRId64 " elements are received from no one", d,
						       ps, gap);
				if (sum + gap != vol)
					vps_verify_add(rep, "rank %" PRId64 ": %s: %" PRId64 " elements are received more than once",
						       d, ps, sum + gap - vol);
			}
		}
	}
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %s plan over %" PRId64 " world ranks, %zu pieces (%" PRId64 " retains), %" PRId64 " bytes moved", m->name,
		 p->scope < 0 ? "global" : "one rank's", W, p->npieces, retains, moved);
done:
	views_free(va, wa);
	views_free(vb, wb);
	free(cov);
	free(boxes);
	return rc;
}

/* ---- staged plans ---- */

/* A run of elements contiguous on both sides: the address map a copy
 * realizes. Ops and plan pieces are both reduced to these, sorted and
 * merged, so coverage is compared whatever the cuts and merges. */
struct seg {
	int64_t src, dst;
	uint32_t src_buffer, dst_buffer;
	int64_t src_off, dst_off, len;
	uint8_t esize;
};

struct segs {
	struct seg *v;
	size_t n, cap;
};

static vps_result_t segs_of_view(struct segs *out, int64_t src, int64_t dst, uint32_t sb, uint32_t db, int64_t so,
				 int64_t doff, const int64_t *ext, const int64_t *ss, const int64_t *ds, int ndim,
				 uint8_t esize)
{
	int last = ndim - 1;
	bool rows = ss[last] == 1 && ds[last] == 1;
	int64_t len = rows ? ext[last] : 1, outer = 1;
	for (int k = 0; k < ndim; k++)
		outer *= k == last && rows ? 1 : ext[k];
	int64_t idx[VPS_MAX_DIMS] = {0};
	int top = rows ? last - 1 : last;
	for (int64_t o = 0; o < outer; o++) {
		int64_t a = so, b = doff;
		for (int k = 0; k <= top; k++) {
			a += idx[k] * ss[k];
			b += idx[k] * ds[k];
		}
		VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + 1));
		out->v[out->n++] = (struct seg){src, dst, sb, db, a, b, len, esize};
		for (int k = top; k >= 0; k--) {
			if (++idx[k] < ext[k])
				break;
			idx[k] = 0;
		}
	}
	return VPS_OK;
}

static int seg_cmp(const void *p, const void *q)
{
	const struct seg *x = p, *y = q;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->dst_buffer != y->dst_buffer)
		return x->dst_buffer < y->dst_buffer ? -1 : 1;
	if (x->dst_off != y->dst_off)
		return x->dst_off < y->dst_off ? -1 : 1;
	return x->len < y->len ? -1 : x->len > y->len;
}

static void segs_normalize(struct segs *s)
{
	qsort(s->v, s->n, sizeof(*s->v), seg_cmp);
	size_t w = 0;
	for (size_t i = 0; i < s->n; i++) {
		struct seg *p = w ? &s->v[w - 1] : NULL, *q = &s->v[i];
		if (p && p->src == q->src && p->dst == q->dst && p->src_buffer == q->src_buffer &&
		    p->dst_buffer == q->dst_buffer && p->esize == q->esize && p->dst_off + p->len == q->dst_off &&
		    p->src_off + p->len == q->src_off)
			p->len += q->len;
		else
			s->v[w++] = *q;
	}
	s->n = w;
}

/* A read of an A buffer: the last stage that reads it, by which transfer. */
struct buffer_read {
	int64_t rank;
	uint32_t buffer;
	int64_t stage;
	size_t xfer;
};

static int read_cmp(const void *p, const void *q)
{
	const struct buffer_read *x = p, *y = q;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->buffer != y->buffer)
		return x->buffer < y->buffer ? -1 : 1;
	return x->stage > y->stage ? -1 : x->stage < y->stage; /* latest first */
}

/* A free lets the trainer release a source buffer after its stage: no
 * later stage may read it (vps-exec would copy from released memory). */
static vps_result_t check_frees(const struct vps_staged *s, struct vps_verify_report *rep)
{
	struct buffer_read *rd = vps_malloc((s->nops + 1) * sizeof(*rd));
	size_t n = 0;
	if (!rd)
		return VPS_ENOMEM;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		for (size_t k = 0; k < x->nops && x->first_op + k < s->nops; k++)
			rd[n++] = (struct buffer_read){x->src, s->ops[x->first_op + k].src_buffer, x->stage, i};
	}
	qsort(rd, n, sizeof(*rd), read_cmp);
	size_t u = 0;
	for (size_t i = 0; i < n; i++)
		if (!u || rd[u - 1].rank != rd[i].rank || rd[u - 1].buffer != rd[i].buffer)
			rd[u++] = rd[i];
	for (size_t f = 0; f < s->nfrees; f++) {
		const struct vps_free *fr = &s->frees[f];
		struct buffer_read key = {fr->rank, fr->buffer, INT64_MAX, 0};
		size_t lo = 0, hi = u;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (read_cmp(&rd[mid], &key) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < u && rd[lo].rank == fr->rank && rd[lo].buffer == fr->buffer && rd[lo].stage > fr->stage) {
			if (fr->stage < 0)
				vps_verify_add(rep,
					       "free %zu: rank %" PRId64 " buffer %u is marked never read, but stage %" PRId64
					       " reads it (transfer %zu)",
					       f, fr->rank, fr->buffer, rd[lo].stage, rd[lo].xfer);
			else
				vps_verify_add(rep,
					       "free %zu: rank %" PRId64 " buffer %u is freed after stage %" PRId64
					       ", but stage %" PRId64 " still reads it (transfer %zu)",
					       f, fr->rank, fr->buffer, fr->stage, rd[lo].stage, rd[lo].xfer);
		}
	}
	free(rd);
	return VPS_OK;
}

vps_result_t vps_verify_staged(const struct vps_staged *s, struct vps_verify_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_plan *p = s->plan;
	int64_t W = vps_world_size(p->world), wa = vps_layout_world(p->a), wb = vps_layout_world(p->b);
	memset(rep, 0, sizeof(*rep));
	if (s->file_hash && s->file_hash != vps_staged_hash(s))
		vps_verify_add(rep, "the staged plan states hash 0x%016" PRIx64 " but its content hashes to 0x%016" PRIx64,
			       s->file_hash, vps_staged_hash(s));
	if (p->file_hash && p->file_hash != vps_plan_hash(p))
		vps_verify_add(rep, "its plan states hash 0x%016" PRIx64 " but hashes to 0x%016" PRIx64, p->file_hash,
			       vps_plan_hash(p));
	int64_t steps = 1;
	while (steps < W)
		steps <<= 1;
	steps--;
	if (s->steps != steps)
		vps_verify_add(rep, "steps is %" PRId64 ", the world of %" PRId64 " needs 1 .. %" PRId64, s->steps, W, steps);
	struct view_index *va = vps_calloc((size_t)wa, sizeof(*va)), *vb = vps_calloc((size_t)wb, sizeof(*vb));
	int64_t *load = vps_calloc((size_t)W, sizeof(*load)), *peer_step = vps_malloc((size_t)W * 2 * sizeof(int64_t));
	struct segs have = {0}, want = {0};
	if (!va || !vb || !load || !peer_step) {
		rc = VPS_ENOMEM;
		goto done;
	}
	int64_t prev_stage = -1, prev_step = -1, prev_chunk = -1, prev_unit_stage = -1;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		bool retain = x->src == x->dst;
		if (x->stage != prev_stage) {
			if (x->stage < prev_stage)
				vps_verify_add(rep, "transfer %zu: stage %" PRId64 " after stage %" PRId64, i, x->stage, prev_stage);
			/* close the previous stage's budget check */
			memset(load, 0, (size_t)W * sizeof(*load));
			for (int64_t r = 0; r < 2 * W; r++)
				peer_step[r] = -1;
			prev_stage = x->stage;
		}
		if (!retain) {
			/* units (step, chunk) never go back, and one unit is in one
			 * stage: the stage boundaries are the same on every rank */
			if (x->step < prev_step || (x->step == prev_step && x->chunk < prev_chunk))
				vps_verify_add(rep, "transfer %zu: unit (%" PRId64 ", %" PRId64 ") after (%" PRId64 ", %" PRId64 ")", i,
					       x->step, x->chunk, prev_step, prev_chunk);
			else if (x->step == prev_step && x->chunk == prev_chunk && x->stage != prev_unit_stage)
				vps_verify_add(rep, "unit (%" PRId64 ", %" PRId64 ") spans stages %" PRId64 " and %" PRId64, x->step,
					       x->chunk, prev_unit_stage, x->stage);
			prev_step = x->step;
			prev_chunk = x->chunk;
			prev_unit_stage = x->stage;
		}
		if (x->step != (x->src ^ x->dst))
			vps_verify_add(rep, "transfer %zu (%" PRId64 " -> %" PRId64 "): step %" PRId64 " is not %" PRId64 " ^ %" PRId64,
				       i, x->src, x->dst, x->step, x->src, x->dst);
		if (x->step > s->steps)
			vps_verify_add(rep, "transfer %zu: step %" PRId64 " beyond the last step %" PRId64, i, x->step, s->steps);
		if (retain && (x->stage != 0 || x->bytes))
			vps_verify_add(rep, "transfer %zu: a retain outside stage 0 or with a staging buffer", i);
		if (!retain) {
			/* one transfer per direction per peer per stage, peers by step */
			int64_t *ps = &peer_step[2 * x->src], *pr = &peer_step[2 * x->dst + 1];
			if (*ps == x->step || *pr == x->step)
				vps_verify_add(rep, "stage %" PRId64 ": %" PRId64 " -> %" PRId64 " has two transfers", x->stage, x->src,
					       x->dst);
			*ps = x->step;
			*pr = x->step;
			load[x->src] = vps_sat_add(load[x->src], x->bytes);
			load[x->dst] = vps_sat_add(load[x->dst], x->bytes);
			if (load[x->src] > s->budget || load[x->dst] > s->budget)
				vps_verify_add(rep, "stage %" PRId64 ": rank %" PRId64 " needs %" PRId64 " bytes, over the budget of %" PRId64,
					       x->stage, load[x->src] > s->budget ? x->src : x->dst,
					       vps_max64(load[x->src], load[x->dst]), s->budget);
		}
		if (s->scope >= 0 && x->src != s->scope && x->dst != s->scope)
			vps_verify_add(rep, "transfer %zu does not involve rank %" PRId64 ", the file's scope", i, s->scope);
		int64_t ra = vps_world_a_rank(p->world, x->src), rb = vps_world_b_rank(p->world, x->dst);
		if (ra < 0 || rb < 0) {
			vps_verify_add(rep, "transfer %zu: %" PRId64 " -> %" PRId64 " from a joining or to a leaving device", i,
				       x->src, x->dst);
			continue;
		}
		struct view_index *vs, *vd;
		VPS_CHECK_GOTO(view_get(p->a, va, ra, &vs), rc, done);
		VPS_CHECK_GOTO(view_get(p->b, vb, rb, &vd), rc, done);
		int64_t end = 0;
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			int64_t bytes = vps_ext_volume(o->ndim, o->ext);
			if (bytes < 0 || !vps_mul_ok(bytes, o->esize, &bytes))
				bytes = -1; /* reported below as a view outside its buffer */
			struct vps_region sr = {0}, dr = {0};
			sr.box.ndim = dr.box.ndim = o->ndim;
			for (int d = 0; d < o->ndim; d++)
				sr.box.hi[d] = dr.box.hi[d] = o->ext[d];
			sr.offset = o->src_offset;
			dr.offset = o->dst_offset;
			memcpy(sr.strides, o->src_strides, sizeof(sr.strides));
			memcpy(dr.strides, o->dst_strides, sizeof(dr.strides));
			int64_t f0, f1;
			bool walkable = bytes > 0;
			for (int d = 0; d < o->ndim; d++)
				if (o->src_strides[d] == 0 || o->dst_strides[d] == 0) {
					vps_verify_add(rep, "transfer %zu op %zu: stride %d is 0 (rows that alias each other)", i,
						       k, d);
					walkable = false;
					break;
				}
			vps_region_extent(&sr, &f0, &f1);
			if (o->src_buffer >= vs->v.nbuffers || f0 < 0 || f1 > vs->v.buffers[o->src_buffer].elements) {
				vps_verify_add(rep, "transfer %zu op %zu: source view outside buffer %u of rank %" PRId64, i, k,
					       o->src_buffer, x->src);
				walkable = false;
			}
			vps_region_extent(&dr, &f0, &f1);
			if (o->dst_buffer >= vd->v.nbuffers || f0 < 0 || f1 > vd->v.buffers[o->dst_buffer].elements) {
				vps_verify_add(rep, "transfer %zu op %zu: destination view outside buffer %u of rank %" PRId64, i,
					       k, o->dst_buffer, x->dst);
				walkable = false;
			}
			if (retain) {
				if (o->staging != -1)
					vps_verify_add(rep, "transfer %zu op %zu: a retain with a staging offset", i, k);
			} else {
				if (o->staging % VPS_STAGE_ALIGN)
					vps_verify_add(rep, "transfer %zu op %zu: staging offset %" PRId64 " is not %d-byte aligned",
						       i, k, o->staging, VPS_STAGE_ALIGN);
				if (o->staging < end || !walkable || o->staging > x->bytes - bytes)
					vps_verify_add(rep,
						       "transfer %zu op %zu: staging bytes [%" PRId64 ", %" PRId64
						       ") overlap another op or leave the buffer of %" PRId64,
						       i, k, o->staging, o->staging + bytes, x->bytes);
				if (walkable)
					end = o->staging + bytes;
			}
			/* a view that cannot be real is reported, never walked:
			 * its elements may number in the trillions */
			if (walkable)
				VPS_CHECK_GOTO(segs_of_view(&have, x->src, x->dst, o->src_buffer, o->dst_buffer, o->src_offset,
							    o->dst_offset, o->ext, o->src_strides, o->dst_strides, o->ndim,
							    o->esize),
					       rc, done);
		}
	}
	VPS_CHECK_GOTO(check_frees(s, rep), rc, done);
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if (s->scope >= 0 && x->src != s->scope && x->dst != s->scope)
			continue;
		int64_t ext[VPS_MAX_DIMS], f0, f1;
		for (int d = 0; d < x->box.ndim; d++)
			ext[d] = x->box.hi[d] - x->box.lo[d];
		if (!vps_view_span(x->box.ndim, ext, x->src_offset, x->src_strides, &f0, &f1) ||
		    !vps_view_span(x->box.ndim, ext, x->dst_offset, x->dst_strides, &f0, &f1) ||
		    vps_box_volume(&x->box) > VPS_MAX_ELEMENTS) {
			vps_verify_add(rep, "piece %zu: a zero stride or a view beyond any buffer", i);
			continue;
		}
		VPS_CHECK_GOTO(segs_of_view(&want, x->src, x->dst, x->src_buffer, x->dst_buffer, x->src_offset, x->dst_offset,
					    ext, x->src_strides, x->dst_strides, x->box.ndim,
					    (uint8_t)vps_dtype_size(vps_state_dtype(x->state))),
			       rc, done);
	}
	segs_normalize(&have);
	segs_normalize(&want);
	size_t mism = 0;
	for (size_t i = 0; i < have.n || i < want.n; i++) {
		const struct seg *h = i < have.n ? &have.v[i] : NULL, *w = i < want.n ? &want.v[i] : NULL;
		if (h && w && !memcmp(h, w, offsetof(struct seg, esize)) && h->esize == w->esize)
			continue;
		if (mism++ < 4) {
			const struct seg *e = w ? w : h;
			vps_verify_add(rep,
				       "the copies do not cover the plan exactly: near %" PRId64 " -> %" PRId64 " buffer %u element %" PRId64
				       " (%s)",
				       e->src, e->dst, e->dst_buffer, e->dst_off, !h ? "a piece is not carried" :
				       !w ? "a copy carries what the plan does not" : "the plan and the copies differ");
		}
	}
	if (mism > 4)
		vps_verify_add(rep, "... %zu differences between the copies and the plan in all", mism);
	struct vps_stage_stats st;
	vps_staged_stats(s, &st);
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %" PRId64 " stages within %" PRId64 " bytes, %" PRId64 " transfers, %" PRId64 " copies for %" PRId64
		 " pieces, peak %" PRId64 " bytes",
		 vps_layout_model(p->a)->name, st.stages, s->budget, st.transfers, st.ops, st.pieces, st.peak_max);
done:
	views_free(va, wa);
	views_free(vb, wb);
	free(load);
	free(peer_step);
	free(have.v);
	free(want.v);
	return rc;
}
