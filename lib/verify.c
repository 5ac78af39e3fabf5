#include <inttypes.h>
#include <stdio.h>

#include "internal.h"
#include "vps/plan.h"
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

/* Slab recursion: split target along `axis` at every box boundary; a slab no
 * box spans entirely is a gap, otherwise recurse on the next axis with the
 * boxes that span it. */
static size_t gaps_rec(const struct vps_box **boxes, size_t n, const struct vps_box *target, int axis,
		       struct vps_box *gaps, size_t ng, size_t max)
{
	if (ng >= max)
		return ng;
	int64_t *cuts = malloc((2 * n + 2) * sizeof(*cuts));
	const struct vps_box **sub = malloc((n + 1) * sizeof(*sub));
	if (!cuts || !sub) {
		free(cuts);
		free(sub);
		/* out of memory: report the whole target as unproven */
		gaps[ng] = *target;
		return ng + 1;
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
	size_t u = 0;
	for (size_t i = 0; i < nc; i++)
		if (!u || cuts[u - 1] != cuts[i])
			cuts[u++] = cuts[i];
	for (size_t c = 0; c + 1 < u && ng < max; c++) {
		struct vps_box slab = *target;
		slab.lo[axis] = cuts[c];
		slab.hi[axis] = cuts[c + 1];
		size_t ns = 0;
		for (size_t i = 0; i < n; i++)
			if (boxes[i]->lo[axis] <= slab.lo[axis] && boxes[i]->hi[axis] >= slab.hi[axis])
				sub[ns++] = boxes[i];
		if (!ns) {
			/* extend the previous gap when it is the adjacent slab */
			if (ng && gaps[ng - 1].hi[axis] == slab.lo[axis]) {
				struct vps_box grown = gaps[ng - 1];
				grown.hi[axis] = slab.hi[axis];
				struct vps_box same = slab;
				same.lo[axis] = grown.lo[axis];
				if (vps_box_equal(&grown, &same)) {
					gaps[ng - 1] = grown;
					continue;
				}
			}
			gaps[ng++] = slab;
		} else if (axis + 1 < target->ndim) {
			ng = gaps_rec(sub, ns, &slab, axis + 1, gaps, ng, max);
		}
	}
	free(cuts);
	free(sub);
	return ng;
}

/* Same recursion, summing the volume no box covers. */
static int64_t uncovered_rec(const struct vps_box **boxes, size_t n, const struct vps_box *target, int axis)
{
	if (!n)
		return vps_box_volume(target);
	int64_t *cuts = malloc((2 * n + 2) * sizeof(*cuts));
	const struct vps_box **sub = malloc((n + 1) * sizeof(*sub));
	if (!cuts || !sub) {
		free(cuts);
		free(sub);
		return -1;
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
	int64_t total = 0;
	for (size_t c = 0; c + 1 < nc && total >= 0; c++) {
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
			total += vps_box_volume(&slab);
		else if (axis + 1 < target->ndim) {
			int64_t u = uncovered_rec(sub, ns, &slab, axis + 1);
			total = u < 0 ? -1 : total + u;
		}
	}
	free(cuts);
	free(sub);
	return total;
}

int64_t vps_boxes_uncovered(const struct vps_box *boxes, size_t n, const struct vps_box *target)
{
	const struct vps_box **ptr = malloc((n + 1) * sizeof(*ptr));
	if (!ptr)
		return -1;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (vps_box_intersect(&boxes[i], target, NULL))
			ptr[k++] = &boxes[i];
	int64_t u = uncovered_rec(ptr, k, target, 0);
	free(ptr);
	return u;
}

size_t vps_boxes_gaps(const struct vps_box *boxes, size_t n, const struct vps_box *target, struct vps_box *gaps,
		      size_t max)
{
	const struct vps_box **ptr = malloc((n + 1) * sizeof(*ptr));
	if (!ptr) {
		gaps[0] = *target;
		return 1;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (vps_box_intersect(&boxes[i], target, NULL))
			ptr[k++] = &boxes[i];
	size_t ng = gaps_rec(ptr, k, target, 0, gaps, 0, max);
	free(ptr);
	return ng;
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
	size_t region;
	bool exact; /* contiguous: [lo, hi) is its footprint */
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
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
	int64_t vol = vps_box_volume(&a->box);
	if (vol > ((int64_t)1 << 24))
		return true; /* too large to walk: report it */
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
			spans[nspans].region = i;
			spans[nspans].exact = vps_region_is_contiguous(r);
			nspans++;
		}
	}
	if (!spans)
		return;
	/* overlaps: sort each buffer's footprints; compare with the furthest
	 * reaching earlier one */
	for (size_t i = 0; i < nspans; i++)
		spans[i].lo += (int64_t)v->regions[spans[i].region].buffer << 48;
	for (size_t i = 0; i < nspans; i++)
		spans[i].hi += (int64_t)v->regions[spans[i].region].buffer << 48;
	qsort(spans, nspans, sizeof(*spans), span_cmp);
	size_t reach = 0;
	for (size_t i = 1; i < nspans; i++) {
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
					       vps_state_name(b->state), bs, spans[i].lo & (((int64_t)1 << 48) - 1));
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

static const struct vps_rank_view *idx_view;
static int order_cmp(const void *p, const void *q)
{
	const struct vps_region *x = &idx_view->regions[*(const uint32_t *)p],
				*y = &idx_view->regions[*(const uint32_t *)q];
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
		idx_view = &vi->v;
		qsort(vi->order, vi->v.nregions, sizeof(*vi->order), order_cmp);
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
			moved += vps_piece_bytes(x);
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
