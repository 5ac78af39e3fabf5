#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "plan/piece.h"
#include "stage/op.h"
#include "vps/plan.h"
#include "vps/stage.h"
#include "vps/units.h"
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

/* Out of memory, naming what did not fit (vps-verify adds the file): every
 * VPS_ENOMEM of a check says what, for a caller to print as it is. */
static vps_result_t too_large(const char *what, size_t n, size_t size)
{
	return vps_fail(VPS_ENOMEM, "out of memory: %zu %s (%.1f MB) do not fit", n, what,
			(double)n * (double)size / 1e6);
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
	return vps_box_order(&x->box, &y->box);
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

/* Region i of rank view v: a known tensor, a box inside it, in a buffer of
 * its state, strides that do not alias and elements inside the buffer.
 * @return whether it passed, with its footprint in *sp. */
static bool check_region(const struct vps_layout *l, const struct vps_rank_view *v, size_t i,
			 struct vps_verify_report *rep, struct span *sp)
{
	const struct vps_model *m = vps_layout_model(l);
	const struct vps_region *r = &v->regions[i];
	char bs[160], name[256];
	struct vps_tensor t;
	if (vps_model_tensor(m, r->tensor, &t)) {
		vps_verify_add(rep, "rank %" PRId64 ": region %zu names tensor %u, outside the model", v->rank, i,
			       r->tensor);
		return false;
	}
	vps_tensor_name(&t, name, sizeof(name));
	box_str(&r->box, bs, sizeof(bs));
	struct vps_box full;
	vps_box_full(&full, t.ndim, t.shape);
	if (r->box.ndim != t.ndim || !vps_box_contains(&full, &r->box) || vps_box_volume(&r->box) == 0) {
		vps_verify_add(rep, "rank %" PRId64 ": %s %s: box %s is empty or outside the tensor", v->rank, name,
			       vps_state_name(r->state), bs);
		return false;
	}
	if (r->buffer >= v->nbuffers) {
		vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: buffer %u does not exist", v->rank, name,
			       vps_state_name(r->state), bs, r->buffer);
		return false;
	}
	const struct vps_buffer *b = &v->buffers[r->buffer];
	if (b->state != r->state)
		vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: in buffer %u, which holds %s", v->rank, name,
			       vps_state_name(r->state), bs, r->buffer, vps_state_name(b->state));
	enum vps_dtype want = vps_layout_state_dtype(l, b->state);
	if (b->dtype != want)
		vps_verify_add(rep, "rank %" PRId64 ": buffer %u holds %s as %s, expected %s", v->rank, r->buffer,
			       vps_state_name(b->state), vps_dtype_name(b->dtype), vps_dtype_name(want));
	else if (vps_region_dtype(r) != b->dtype)
		vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: a region of %s in buffer %u of %s", v->rank, name,
			       vps_state_name(r->state), bs, vps_dtype_name(vps_region_dtype(r)), r->buffer,
			       vps_dtype_name(b->dtype));
	bool aliased = false;
	for (int k = 0; k < r->box.ndim; k++)
		aliased |= r->strides[k] == 0;
	if (aliased) {
		vps_verify_add(rep, "rank %" PRId64 ": %s %s %s: a stride is 0 (rows that alias each other)", v->rank,
			       name, vps_state_name(r->state), bs);
		return false;
	}
	int64_t first, end;
	vps_region_extent(r, &first, &end);
	if (first < 0 || end > b->elements) {
		vps_verify_add(rep,
			       "rank %" PRId64 ": %s %s %s: elements [%" PRId64 ", %" PRId64
			       ") lie outside buffer %u of %" PRId64,
			       v->rank, name, vps_state_name(r->state), bs, first, end, r->buffer, b->elements);
		return false;
	}
	*sp = (struct span){first, end, r->buffer, i, vps_region_is_contiguous(r)};
	return true;
}

/* Regions of one buffer that share elements: sort each buffer's footprints;
 * compare each with the furthest reaching earlier one of the same buffer. */
static void report_overlaps(const struct vps_model *m, const struct vps_rank_view *v, struct span *spans,
			    size_t nspans, struct vps_verify_report *rep)
{
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
				char na[256], nb[256], ba[160], bs[160];
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
}

static vps_result_t check_rank(const struct vps_layout *l, const struct vps_rank_view *v,
			       struct vps_verify_report *rep, int64_t *nregions)
{
	const struct vps_model *m = vps_layout_model(l);
	*nregions += (int64_t)v->nregions;
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i].id != i)
			vps_verify_add(rep, "rank %" PRId64 ": buffer %zu has id %u", v->rank, i, v->buffers[i].id);
	/* without room for the footprints the overlaps go unchecked: refuse */
	struct span *spans = malloc((v->nregions + 1) * sizeof(*spans));
	size_t nspans = 0;
	if (!spans)
		return too_large("region footprints of one rank", v->nregions + 1, sizeof(*spans));
	for (size_t i = 0; i < v->nregions; i++)
		if (check_region(l, v, i, rep, &spans[nspans]))
			nspans++;
	report_overlaps(m, v, spans, nspans, rep);
	free(spans);
	return VPS_OK;
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
		rc = vps_layout_rank(l, r, &v);
		if (rc == VPS_ENOMEM)
			rc = vps_fail(rc, "out of memory: the layout view of rank %" PRId64 " does not fit", r);
		if (rc)
			goto done;
		rc = check_rank(l, &v, rep, &nregions);
		if (!rc && VPS_GROW(held, cap, nheld + v.nregions))
			rc = too_large("regions of the layout's ranks", nheld + v.nregions, sizeof(*held));
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
		rc = too_large("distinct boxes of the layout", nheld + 1, sizeof(*uniq));
		goto done;
	}
	for (uint32_t t = 0; t < ntensors; t++) {
		struct vps_tensor td;
		char name[256];
		vps_model_tensor(m, t, &td);
		struct vps_box full;
		vps_box_full(&full, td.ndim, td.shape);
		int64_t vol = vps_box_volume(&full);
		for (int st = 0; st < VPS_NSTATES; st++) {
			size_t nu = 0;
			if (!vps_layout_tensor_has_state(l, &td, st))
				continue;
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
	uint32_t params = vps_model_module_first(m);
	char modules[48] = "";
	if (params < ntensors)
		snprintf(modules, sizeof(modules), " + %u module buffers", ntensors - params);
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %" PRId64 " ranks, %u tensors x %d states%s, %" PRId64 " regions, %.3f copies per element",
		 m->name, world, params, nstates, modules, nregions,
		 logical ? (double)replicas / (double)logical : 0.0);
done:
	free(held);
	if (rc)
		vps_verify_report_release(rep);
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

/* The views of the ranks a check touches, made on first use: a rank's
 * staged plan touches its peers, not the world, and pays for them alone. */
struct view_cache {
	struct view_index **slot; /* per rank, NULL until used */
	int64_t n;
	int64_t *touched;
	size_t ntouched, cap;
};

static vps_result_t view_get(const struct vps_layout *l, struct view_cache *c, int64_t rank, struct view_index **out)
{
	if (!c->slot[rank]) {
		if (vps_grow((void **)&c->touched, &c->cap, c->ntouched + 1, sizeof(*c->touched)))
			return too_large("touched ranks", c->ntouched + 1, sizeof(*c->touched));
		c->slot[rank] = calloc(1, sizeof(**c->slot));
		if (!c->slot[rank])
			return too_large("a rank's view", 1, sizeof(**c->slot));
		c->touched[c->ntouched++] = rank;
	}
	struct view_index *vi = c->slot[rank];
	if (!vi->ready) {
		vps_result_t rc = vps_layout_rank(l, rank, &vi->v);
		if (rc == VPS_ENOMEM)
			return vps_fail(rc, "out of memory: the layout view of rank %" PRId64 " does not fit", rank);
		if (rc)
			return rc;
		vi->order = malloc((vi->v.nregions + 1) * sizeof(*vi->order));
		if (!vi->order)
			return too_large("region indices of one rank", vi->v.nregions + 1, sizeof(*vi->order));
		for (size_t i = 0; i < vi->v.nregions; i++)
			vi->order[i] = (uint32_t)i;
		qsort_r(vi->order, vi->v.nregions, sizeof(*vi->order), order_cmp, &vi->v);
		vi->ready = true;
	}
	*out = vi;
	return VPS_OK;
}

static void views_free(struct view_cache *c)
{
	for (size_t i = 0; c->slot && i < c->ntouched; i++) {
		struct view_index *vi = c->slot[c->touched[i]];
		free(vi->order);
		vps_rank_view_release(&vi->v);
		free(vi);
	}
	free(c->slot);
	free(c->touched);
	memset(c, 0, sizeof(*c));
}

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

/* The layout views of the ranks a plan names, each computed once. */
struct views {
	struct view_cache a, b;
};

static vps_result_t views_new(struct views *vw, const struct vps_plan *p)
{
	int64_t wa = vps_layout_world(p->a), wb = vps_layout_world(p->b);
	vw->a = (struct view_cache){calloc((size_t)wa + 1, sizeof(*vw->a.slot)), wa, NULL, 0, 0};
	vw->b = (struct view_cache){calloc((size_t)wb + 1, sizeof(*vw->b.slot)), wb, NULL, 0, 0};
	if (!vw->a.slot || !vw->b.slot) {
		views_free(&vw->a);
		views_free(&vw->b);
		return too_large("rank views", (size_t)(wa + wb), sizeof(*vw->a.slot));
	}
	return VPS_OK;
}

static void views_release(struct views *vw)
{
	views_free(&vw->a);
	views_free(&vw->b);
}

/* A piece's name for a message, made only when one is written. */
#define NAME() \
	do { \
		if (!ps[0]) \
			piece_str(m, x, ps, sizeof(ps)); \
	} while (0)

/* First lost range of (tensor, state) in the plan's sorted list. */
static size_t lost_first(const struct vps_lost *l, uint32_t tensor, int state)
{
	size_t lo = 0, hi = l->nranges;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct vps_lost_range *r = &l->ranges[mid];
		if (r->tensor < tensor || (r->tensor == tensor && r->state < state))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool lost_rank(const struct vps_lost *l, int64_t ra)
{
	for (size_t i = 0; i < l->nranks; i++)
		if (l->ranks[i] == ra)
			return true;
	return false;
}

/* The lost ranges a plan records: in (tensor, state) order, disjoint, and
 * held under A by lost ranks only (what a survivor holds must be planned
 * from it); a plan may leave exactly these unfilled and nothing more. */
static vps_result_t lost_checks(const struct vps_plan *p, struct vps_verify_report *rep)
{
	const struct vps_lost *l = &p->lost;
	const struct vps_model *m = vps_layout_model(p->a);
	struct vps_holders h = {0};
	char ps[512];
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < l->nranges && !rc; i++) {
		const struct vps_lost_range *r = &l->ranges[i];
		struct vps_piece fake = {.tensor = r->tensor, .state = r->state, .box = r->box};
		piece_str(m, &fake, ps, sizeof(ps));
		if (i && (l->ranges[i - 1].tensor > r->tensor ||
			  (l->ranges[i - 1].tensor == r->tensor && l->ranges[i - 1].state > r->state)))
			vps_verify_add(rep, "lost range %zu (%s) is out of (tensor, state) order", i, ps);
		for (size_t j = lost_first(l, r->tensor, r->state); j < i; j++)
			if (l->ranges[j].tensor == r->tensor && l->ranges[j].state == r->state &&
			    vps_box_intersect(&l->ranges[j].box, &r->box, NULL))
				vps_verify_add(rep, "lost ranges %zu and %zu (%s) overlap", j, i, ps);
		h.n = 0;
		rc = vps_layout_holders(p->a, r->tensor, r->state, &r->box, &h);
		if (rc == VPS_ENOMEM)
			rc = vps_fail(rc, "out of memory: the holders of lost range %zu (%s) do not fit", i, ps);
		for (size_t k = 0; k < h.n && !rc; k++) {
			const struct vps_holder *x = &h.v[k];
			if (!vps_box_intersect(&x->region.box, &r->box, NULL))
				continue;
			for (int64_t j = 0; j < x->count; j++) {
				int64_t ra = x->base + j * x->stride;
				if (!lost_rank(l, ra)) {
					vps_verify_add(rep, "lost range %zu (%s) is held by rank %" PRId64
						       " of the source, which is not lost: it must be planned from there",
						       i, ps, ra);
					break;
				}
			}
		}
	}
	vps_holders_release(&h);
	return rc;
}

/* What a plan around lost devices leaves, said in the summary. */
static void lost_summary(const struct vps_plan *p, struct vps_verify_report *rep)
{
	size_t k = strlen(rep->summary);
	char b[VPS_UNITS_LEN];
	if (p->lost.nranks && k < sizeof(rep->summary))
		snprintf(rep->summary + k, sizeof(rep->summary) - k,
			 "; %zu lost rank%s, %zu lost range%s (%s) left for the trainer to reload", p->lost.nranks,
			 p->lost.nranks == 1 ? "" : "s", p->lost.nranges, p->lost.nranges == 1 ? "" : "s",
			 vps_format_bytes(vps_lost_bytes(&p->lost), b, sizeof(b)));
}

/* The element at idx of a box addressed from its first element. Boxes come
 * from checked plans: no overflow. */
static int64_t address_at(int64_t offset, const int64_t *strides, const struct vps_box *b, const int64_t *idx)
{
	for (int k = 0; k < b->ndim; k++)
		offset += (idx[k] - b->lo[k]) * strides[k];
	return offset;
}

/* A piece's extents, axis by axis. */
static void piece_ext(const struct vps_piece *x, int64_t *ext)
{
	for (int k = 0; k < x->box.ndim; k++)
		ext[k] = x->box.hi[k] - x->box.lo[k];
}

/* ---- transit areas ----
 *
 * A transit area (VPS_BUFFER_TRANSIT) is memory of a device's own, of
 * neither layout: what lands there covers no element of B, and what is
 * passed on from there must be what one arrival put there. Arrivals are
 * compared by the bytes they take (offsets count elements of the piece's
 * own dtype), so that arrivals of different dtypes are compared too. */

/* An arrival into a transit area whose view is sound: the bytes it takes. */
struct arrival {
	int64_t dst;   /* whose area */
	int64_t lo, hi; /* bytes from the area's start */
	int64_t reach; /* the furthest hi of this and the earlier arrivals into the area */
	size_t piece;
};

struct arrivals {
	struct arrival *v;
	size_t n;
};

static int arrival_cmp(const void *p, const void *q)
{
	const struct arrival *x = p, *y = q;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	if (x->hi != y->hi)
		return x->hi < y->hi ? -1 : 1;
	return x->piece < y->piece ? -1 : x->piece > y->piece;
}

/* The elements piece x's view on one side spans: [*first, *end), false
 * when they leave [0, 2^48) or the view cannot be real. */
static bool view_in_area(const struct vps_piece *x, int64_t offset, const int64_t *strides, int64_t *first,
			 int64_t *end)
{
	int64_t ext[VPS_MAX_DIMS];
	piece_ext(x, ext);
	return vps_view_span(x->box.ndim, ext, offset, strides, first, end) && *first >= 0 &&
	       *end <= VPS_MAX_ELEMENTS;
}

/* Arrival x's view, as the planner makes it and vps_plan_transit_bytes
 * sizes the area by: row-major contiguous, inside 2^48 elements. */
static bool arrival_sound(const struct vps_piece *x, int64_t *first, int64_t *end)
{
	int64_t ext[VPS_MAX_DIMS];
	piece_ext(x, ext);
	return vps_strides_rowmajor(x->box.ndim, ext, x->dst_strides) &&
	       view_in_area(x, x->dst_offset, x->dst_strides, first, end);
}

/* Every sound arrival of the plan (its scope aside: a forward of this file
 * may read what a piece of another rank's brought), by area and bytes. */
static vps_result_t arrivals_new(const struct vps_plan *p, struct arrivals *ar)
{
	size_t n = 0;
	ar->v = NULL;
	ar->n = 0;
	for (size_t i = 0; i < p->npieces; i++)
		n += vps_piece_to_transit(&p->pieces[i]);
	if (!n)
		return VPS_OK;
	ar->v = malloc(n * sizeof(*ar->v));
	if (!ar->v)
		return too_large("arrivals into transit areas", n, sizeof(*ar->v));
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		int64_t first, end, esize = (int64_t)vps_dtype_size(vps_piece_dtype(x));
		/* an unsound one is reported by check_arrival; 2^48 elements of
		 * at most 8 bytes: no overflow */
		if (vps_piece_to_transit(x) && arrival_sound(x, &first, &end))
			ar->v[ar->n++] = (struct arrival){x->dst, first * esize, end * esize, 0, i};
	}
	qsort(ar->v, ar->n, sizeof(*ar->v), arrival_cmp);
	for (size_t k = 0; k < ar->n; k++)
		ar->v[k].reach = k && ar->v[k - 1].dst == ar->v[k].dst ? vps_max64(ar->v[k - 1].reach, ar->v[k].hi)
								      : ar->v[k].hi;
	return VPS_OK;
}

/* The destination side of piece i, an arrival into its destination's
 * transit area: a row-major contiguous view inside 2^48 elements. */
static void check_arrival(const struct vps_plan *p, size_t i, struct vps_verify_report *rep)
{
	const struct vps_piece *x = &p->pieces[i];
	int64_t ext[VPS_MAX_DIMS], first, end;
	char ps[512];
	piece_ext(x, ext);
	if (arrival_sound(x, &first, &end))
		return;
	piece_str(vps_layout_model(p->a), x, ps, sizeof(ps));
	if (!vps_strides_rowmajor(x->box.ndim, ext, x->dst_strides))
		vps_verify_add(rep, "piece %zu (%s): lands in the transit area of %" PRId64
			       " at offset %" PRId64 " in a view that is not row-major contiguous", i, ps, x->dst,
			       x->dst_offset);
	else
		vps_verify_add(rep, "piece %zu (%s): lands in the transit area of %" PRId64 " at offset %" PRId64
			       ", beyond 2^48 elements", i, ps, x->dst, x->dst_offset);
}

/* Forward i, out of its source's transit area: its view inside 2^48
 * elements and, where this plan holds the arrivals into that area (a
 * global plan, or the relay's own), the bytes it reads are those of one
 * arrival, of the same elements at the same positions (its box inside the
 * arrival's, its view the arrival's restricted to it), which came at a
 * lower hop. Whether they arrive in an earlier stage is the staged plan's
 * check (check_relay_order). */
static void check_transit_forward(const struct vps_plan *p, const struct arrivals *ar, size_t i,
				  struct vps_verify_report *rep)
{
	const struct vps_model *m = vps_layout_model(p->a);
	const struct vps_piece *x = &p->pieces[i];
	int hop = vps_buffer_hop(x->src_buffer);
	int64_t first, end, esize = (int64_t)vps_dtype_size(vps_piece_dtype(x));
	char ps[512], ys[512];
	/* named only for a message: naming a tensor rebuilds the model's schema */
	ps[0] = '\0';
	if (hop < 0) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s): source buffer %#x has hop bits that name no hop", i, ps,
			       x->src_buffer);
		return;
	}
	if (!view_in_area(x, x->src_offset, x->src_strides, &first, &end)) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " reads its transit area at offset %" PRId64
			       ", beyond 2^48 elements", i, ps, x->src, x->src_offset);
		return;
	}
	if (p->scope >= 0 && p->scope != x->src)
		return; /* what lands in another rank's area is in that rank's plan */
	/* the arrivals into the relay's area that hold the forward's first
	 * byte (one, in a plan whose arrivals do not overlap) */
	int64_t at = x->src_offset * esize;
	size_t lo = 0, hi = ar->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ar->v[mid].dst < x->src || (ar->v[mid].dst == x->src && ar->v[mid].lo <= at))
			lo = mid + 1;
		else
			hi = mid;
	}
	const struct vps_piece *late = NULL, *other = NULL;
	size_t late_i = 0, other_i = 0;
	for (size_t k = lo; k-- > 0 && ar->v[k].dst == x->src && ar->v[k].reach > at;) {
		if (ar->v[k].hi <= at)
			continue;
		const struct vps_piece *y = &p->pieces[ar->v[k].piece];
		bool same = y->tensor == x->tensor && y->state == x->state && y->dtype == x->dtype &&
			    vps_box_contains(&y->box, &x->box) &&
			    address_at(y->dst_offset, y->dst_strides, &y->box, x->box.lo) == x->src_offset;
		for (int d = 0; same && d < x->box.ndim; d++)
			same = x->box.hi[d] - x->box.lo[d] == 1 || x->src_strides[d] == y->dst_strides[d];
		int yhop = vps_buffer_hop(y->src_buffer);
		if (same && yhop >= 0 && yhop < hop)
			return;
		if (same) {
			late = y;
			late_i = ar->v[k].piece;
		} else {
			other = y;
			other_i = ar->v[k].piece;
		}
	}
	NAME();
	if (late) {
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " passes on at hop %d what piece %zu brings to its "
			       "transit area at hop %d, not before", i, ps, x->src, hop, late_i,
			       vps_buffer_hop(late->src_buffer));
	} else if (other) {
		piece_str(m, other, ys, sizeof(ys));
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " passes on from its transit area at offset %" PRId64
			       " other elements: piece %zu (%s) brings them there", i, ps, x->src, x->src_offset, other_i,
			       ys);
	} else {
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " passes on from its transit area at offset %" PRId64
			       " what no piece brings there", i, ps, x->src, x->src_offset);
	}
}

/* No two arrivals into one area share a byte: sorted by their first
 * bytes, each against the furthest reaching earlier one of its area. A
 * file of one rank reports those that involve it. */
static void check_transit_overlaps(const struct vps_plan *p, int64_t scope, const struct arrivals *ar,
				   struct vps_verify_report *rep)
{
	const struct vps_model *m = vps_layout_model(p->a);
	size_t far = 0;
	for (size_t k = 1; k < ar->n; k++) {
		const struct arrival *a = &ar->v[far], *b = &ar->v[k];
		if (b->dst != a->dst) {
			far = k;
			continue;
		}
		const struct vps_piece *x = &p->pieces[a->piece], *y = &p->pieces[b->piece];
		if (b->lo < a->hi &&
		    (scope < 0 || x->src == scope || x->dst == scope || y->src == scope || y->dst == scope)) {
			char xs[512], ys[512];
			piece_str(m, x, xs, sizeof(xs));
			piece_str(m, y, ys, sizeof(ys));
			vps_verify_add(rep, "rank %" PRId64 ": transit area: piece %zu (%s) overlaps piece %zu (%s) at byte %" PRId64,
				       b->dst, a->piece, xs, b->piece, ys, b->lo);
		}
		if (b->hi > a->hi)
			far = k;
	}
}

/* Forward i (a relay passing on a piece): the relay holds it under B at
 * the source address, and, where this plan has the relay's receives, it
 * received every element of it there by pieces of an earlier hop (a
 * forward from holders, a later hop from holders or earlier hops). */
static vps_result_t check_forward(const struct vps_plan *p, struct views *vw, size_t i, struct vps_verify_report *rep)
{
	const struct vps_piece *x = &p->pieces[i];
	uint32_t buffer = vps_buffer_index(x->src_buffer);
	int64_t rs = vps_world_b_rank(p->world, x->src);
	struct view_index *vi;
	char ps[512];
	piece_str(vps_layout_model(p->a), x, ps, sizeof(ps));
	if (rs < 0) {
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " is a leaving device, it receives nothing", i, ps,
			       x->src);
		return VPS_OK;
	}
	VPS_CHECK(view_get(p->b, &vw->b, rs, &vi));
	if (find_holding(vi, x->tensor, x->state, &x->box, buffer, x->src_offset, x->src_strides) < 0) {
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " has no region for it at target buffer %u offset %" PRId64,
			       i, ps, x->src, buffer, x->src_offset);
		return VPS_OK;
	}
	if (p->scope >= 0 && p->scope != x->src)
		return VPS_OK;
	/* the relay's pieces: the plan is sorted by destination */
	size_t lo = 0, hi = p->npieces;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->pieces[mid].dst < x->src)
			lo = mid + 1;
		else
			hi = mid;
	}
	int64_t got = 0;
	int hop = vps_buffer_hop(x->src_buffer);
	for (size_t k = lo; k < p->npieces && p->pieces[k].dst == x->src; k++) {
		const struct vps_piece *y = &p->pieces[k];
		struct vps_box z;
		int yhop = vps_buffer_hop(y->src_buffer);
		if (y->tensor != x->tensor || y->state != x->state || yhop < 0 || yhop >= hop ||
		    y->dst_buffer != buffer || !vps_box_intersect(&y->box, &x->box, &z))
			continue;
		/* received where it is read: one element's address on both */
		if (address_at(y->dst_offset, y->dst_strides, &y->box, z.lo) !=
		    address_at(x->src_offset, x->src_strides, &x->box, z.lo))
			continue;
		got += vps_box_volume(&z);
	}
	if (got != vps_box_volume(&x->box))
		vps_verify_add(rep, "piece %zu (%s): relay %" PRId64 " passes on %" PRId64 " elements, of which it receives %"
			       PRId64 " from %s", i, ps, x->src, vps_box_volume(&x->box), got,
			       hop == 1 ? "holders" : "holders and earlier hops");
	return VPS_OK;
}

/* Piece i of plan p, when it involves `scope` or the plan is one rank's:
 * counted (retained or moved); its source holds it under A at its source
 * address (a forward: what it received, from its B buffer or its transit
 * area), and its destination has a B region for it at its destination
 * address, which goes to cov with the piece, or else takes it into its
 * transit area (ar: the plan's arrivals there), which covers nothing. */
static vps_result_t check_piece(const struct vps_plan *p, int64_t scope, struct views *vw, const struct arrivals *ar,
				size_t i, struct vps_verify_report *rep, int64_t *retains, int64_t *moved,
				struct cover *cov, size_t *ncov)
{
	const struct vps_model *m = vps_layout_model(p->a);
	const struct vps_piece *x = &p->pieces[i];
	struct view_index *vi;
	char ps[512];
	ps[0] = '\0';
	bool mine = scope < 0 || x->src == scope || x->dst == scope;
	if (!mine && p->scope < 0)
		return VPS_OK;
	if (x->src == x->dst)
		(*retains)++;
	else
		*moved = vps_sat_add(*moved, vps_piece_bytes(x));
	if (!mine) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s, %" PRId64 " -> %" PRId64 ") does not involve rank %" PRId64
			       ", the plan's scope", i, ps, x->src, x->dst, scope);
	}
	int64_t ra = vps_world_a_rank(p->world, x->src), rb = vps_world_b_rank(p->world, x->dst);
	if (vps_piece_from_transit(x)) {
		check_transit_forward(p, ar, i, rep);
	} else if (x->src_buffer & VPS_BUFFER_TARGET) {
		VPS_CHECK(check_forward(p, vw, i, rep));
	} else if (ra < 0) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s): source %" PRId64 " is a joining device, it holds nothing", i, ps,
			       x->src);
	} else if (lost_rank(&p->lost, ra)) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s): source %" PRId64 " is a lost device", i, ps, x->src);
	} else {
		VPS_CHECK(view_get(p->a, &vw->a, ra, &vi));
		if (find_holding(vi, x->tensor, x->state, &x->box, x->src_buffer, x->src_offset, x->src_strides) < 0) {
			NAME();
			vps_verify_add(rep,
				       "piece %zu (%s): source %" PRId64 " does not hold it at buffer %u offset %" PRId64
				       " under the source layout",
				       i, ps, x->src, x->src_buffer, x->src_offset);
		}
	}
	/* an area is the executor's, on any device of the switch: no B rank
	 * needed */
	if (vps_piece_to_transit(x)) {
		check_arrival(p, i, rep);
		return VPS_OK;
	}
	if (rb < 0) {
		NAME();
		vps_verify_add(rep, "piece %zu (%s): destination %" PRId64 " is a leaving device", i, ps, x->dst);
		return VPS_OK;
	}
	VPS_CHECK(view_get(p->b, &vw->b, rb, &vi));
	int64_t reg = find_holding(vi, x->tensor, x->state, &x->box, x->dst_buffer, x->dst_offset, x->dst_strides);
	if (reg < 0) {
		NAME();
		vps_verify_add(rep,
			       "piece %zu (%s): destination %" PRId64 " has no region for it at buffer %u offset %" PRId64
			       " (padding or a wrong address)",
			       i, ps, x->dst, x->dst_buffer, x->dst_offset);
		return VPS_OK;
	}
	cov[(*ncov)++] = (struct cover){rb, reg, i};
	return VPS_OK;
}

#undef NAME

/* Region R (number r of B rank rb) of world rank d receives each element once: the boxes of the
 * pieces cov[*c ..] brings it (sorted, those of R next), and the recorded
 * lost ranges in it, counted as covered once (a piece into one of them is
 * then received "more than once"). boxes is working space. */
static vps_result_t check_region_cover(const struct vps_plan *p, int64_t d, int64_t rb, size_t r,
				       const struct vps_region *R, const struct cover *cov, size_t ncov, size_t *c,
				       struct vps_boxes *boxes, struct vps_verify_report *rep)
{
	int64_t sum = 0;
	boxes->n = 0;
	while (*c < ncov && cov[*c].rb == rb && cov[*c].region < (int64_t)r)
		(*c)++;
	for (; *c < ncov && cov[*c].rb == rb && cov[*c].region == (int64_t)r; (*c)++) {
		if (VPS_GROW(boxes->v, boxes->cap, boxes->n + 1))
			return too_large("pieces of one destination region", boxes->n + 1, sizeof(*boxes->v));
		boxes->v[boxes->n++] = p->pieces[cov[*c].piece].box;
		sum += vps_box_volume(&p->pieces[cov[*c].piece].box);
	}
	for (size_t k = lost_first(&p->lost, R->tensor, R->state);
	     k < p->lost.nranges && p->lost.ranges[k].tensor == R->tensor && p->lost.ranges[k].state == R->state; k++) {
		struct vps_box y;
		if (!vps_box_intersect(&p->lost.ranges[k].box, &R->box, &y))
			continue;
		if (VPS_GROW(boxes->v, boxes->cap, boxes->n + 1))
			return too_large("lost ranges of one destination region", boxes->n + 1, sizeof(*boxes->v));
		boxes->v[boxes->n++] = y;
		sum += vps_box_volume(&y);
	}
	int64_t vol = vps_box_volume(&R->box), gap = vps_boxes_uncovered(boxes->v, boxes->n, &R->box);
	if (gap < 0)
		return too_large("pieces of one destination region, cut in slabs", boxes->n, sizeof(*boxes->v));
	if (!gap && sum == vol)
		return VPS_OK;
	char ps[512];
	struct vps_piece fake = {.tensor = R->tensor, .state = R->state, .box = R->box};
	piece_str(vps_layout_model(p->a), &fake, ps, sizeof(ps));
	if (gap)
		vps_verify_add(rep, "rank %" PRId64 ": %s: %" PRId64 " elements are received from no one", d, ps, gap);
	if (sum + gap != vol)
		vps_verify_add(rep, "rank %" PRId64 ": %s: %" PRId64 " elements are received more than once", d, ps,
			       sum + gap - vol);
	return VPS_OK;
}

/* Every destination region in scope covered exactly once: box arithmetic
 * over the pieces each region receives (cov, sorted). */
static vps_result_t check_cover(const struct vps_plan *p, int64_t scope, struct views *vw, const struct cover *cov,
				size_t ncov, struct vps_verify_report *rep)
{
	int64_t W = vps_world_size(p->world);
	struct vps_boxes boxes = {0};
	vps_result_t rc = VPS_OK;
	for (int64_t d = scope < 0 ? 0 : scope; d < (scope < 0 ? W : scope + 1) && !rc; d++) {
		int64_t rb = vps_world_b_rank(p->world, d);
		struct view_index *vi;
		if (rb < 0)
			continue;
		rc = view_get(p->b, &vw->b, rb, &vi);
		size_t c = 0;
		while (c < ncov && cov[c].rb < rb)
			c++;
		for (size_t r = 0; !rc && r < vi->v.nregions; r++)
			rc = check_region_cover(p, d, rb, r, &vi->v.regions[r], cov, ncov, &c, &boxes, rep);
	}
	vps_boxes_release(&boxes);
	return rc;
}

/* The plan's checks over the pieces that involve `scope` (-1: all). A plan
 * of one rank reports its pieces outside that rank; a global plan inside
 * the staged file of one rank has them, and they are not that file's. */
static vps_result_t plan_checks(const struct vps_plan *p, int64_t scope, struct views *vw,
				struct vps_verify_report *rep, int64_t *retains, int64_t *moved)
{
	/* hashing is a pass over the whole plan: once */
	uint64_t hash = p->file_hash ? vps_plan_hash(p) : 0;
	if (p->file_hash && p->file_hash != hash)
		vps_verify_add(rep, "the plan states hash 0x%016" PRIx64 " but its content hashes to 0x%016" PRIx64,
			       p->file_hash, hash);
	struct cover *cov = malloc((p->npieces + 1) * sizeof(*cov));
	size_t ncov = 0;
	struct arrivals ar;
	if (!cov)
		return too_large("pieces to match with their destinations", p->npieces + 1, sizeof(*cov));
	vps_result_t rc = arrivals_new(p, &ar);
	if (!rc)
		rc = lost_checks(p, rep);
	for (size_t i = 0; i < p->npieces && !rc; i++)
		rc = check_piece(p, scope, vw, &ar, i, rep, retains, moved, cov, &ncov);
	if (!rc)
		check_transit_overlaps(p, scope, &ar, rep);
	if (!rc) {
		qsort(cov, ncov, sizeof(*cov), cover_cmp);
		rc = check_cover(p, scope, vw, cov, ncov, rep);
	}
	free(ar.v);
	free(cov);
	return rc;
}

vps_result_t vps_verify_plan(const struct vps_plan *p, struct vps_verify_report *rep)
{
	struct views vw;
	int64_t retains = 0, moved = 0;
	memset(rep, 0, sizeof(*rep));
	vps_result_t rc = views_new(&vw, p);
	if (rc)
		return rc;
	rc = plan_checks(p, p->scope, &vw, rep, &retains, &moved);
	views_release(&vw);
	if (rc) {
		vps_verify_report_release(rep);
		return rc;
	}
	/* the units of the tools' summaries (vps(7) UNITS) */
	char mv[VPS_UNITS_LEN];
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %s plan over %" PRId64 " world ranks, %zu pieces (%" PRId64 " retains), %s moved",
		 vps_layout_model(p->a)->name, p->scope < 0 ? "global" : "one rank's", vps_world_size(p->world),
		 p->npieces, retains, vps_format_bytes(moved, mv, sizeof(mv)));
	lost_summary(p, rep);
	return VPS_OK;
}

/* ---- staged plans ----
 *
 * Everything here is arithmetic over transfers, copies and pieces, never
 * over elements or rows: a copy is matched to the piece it names (op->piece)
 * by vps_piece_match (plan/piece.h, the geometry staging cuts copies with)
 * and compared with it as a whole.
 *   - A piece contiguous on both sides (and the copies of the runs it was
 *     merged into) is one segment: source and destination offsets and a
 *     length. The segments of the copies and of the pieces, each list sorted
 *     and merged where adjacent on both sides, must be equal.
 *   - A strided piece is never merged: each copy of it must be a sub-box of
 *     the piece with the piece's own addressing, and the sub-boxes must tile
 *     the piece's box, each element once (ranges of its row-major order,
 *     sorted; boxes and slab arithmetic when a cut is not such a range).
 * Checks that depend on the stage table are apart, in check_schedule(). */

/* Elements contiguous on both sides: what a flat piece, or a flat copy,
 * does. `from` (a piece or a transfer) only names it in messages. */
struct seg {
	int64_t src, dst;
	uint32_t src_buffer, dst_buffer;
	int64_t src_off, dst_off, len;
	uint8_t esize;
	size_t from;
};

/* Where a segment writes: pairs and destinations never overlap in a correct
 * plan, so this orders segments uniquely there. A transit area holds
 * pieces of several dtypes, each addressed in elements of its own (a B
 * buffer, one): their offsets compare only within one element size. */
static int seg_key_cmp(const struct seg *x, const struct seg *y)
{
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->dst_buffer != y->dst_buffer)
		return x->dst_buffer < y->dst_buffer ? -1 : 1;
	if (x->esize != y->esize)
		return x->esize < y->esize ? -1 : 1;
	if (x->dst_off != y->dst_off)
		return x->dst_off < y->dst_off ? -1 : 1;
	return 0;
}

static bool seg_same(const struct seg *x, const struct seg *y)
{
	return !seg_key_cmp(x, y) && x->src_buffer == y->src_buffer && x->src_off == y->src_off && x->len == y->len &&
	       x->esize == y->esize;
}

static int seg_cmp(const void *p, const void *q)
{
	const struct seg *x = p, *y = q;
	int c = seg_key_cmp(x, y);
	if (c)
		return c;
	if (x->src_buffer != y->src_buffer)
		return x->src_buffer < y->src_buffer ? -1 : 1;
	if (x->src_off != y->src_off)
		return x->src_off < y->src_off ? -1 : 1;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	if (x->esize != y->esize)
		return x->esize < y->esize ? -1 : 1;
	return x->from < y->from ? -1 : x->from > y->from;
}

/* Sort and merge what is adjacent on both sides: however a stream of
 * elements was cut (pieces, merged runs, chunks), the result is the same. */
static size_t segs_normalize(struct seg *v, size_t n)
{
	qsort(v, n, sizeof(*v), seg_cmp);
	size_t w = 0;
	for (size_t i = 0; i < n; i++) {
		struct seg *p = w ? &v[w - 1] : NULL, *q = &v[i];
		if (p && p->src == q->src && p->dst == q->dst && p->src_buffer == q->src_buffer &&
		    p->dst_buffer == q->dst_buffer && p->esize == q->esize && p->dst_off + p->len == q->dst_off &&
		    p->src_off + p->len == q->src_off)
			p->len += q->len;
		else
			v[w++] = *q;
	}
	return w;
}

/* A copy of part of a strided piece: its box in the piece's coordinates
 * (from 0) and, when the box is one range of the piece's row-major order,
 * where that range starts. */
struct part {
	size_t piece;
	int64_t start; /* -1: not one range */
	int64_t count;
	struct vps_box box;
	size_t xfer, op;
};

static int part_cmp(const void *p, const void *q)
{
	const struct part *x = p, *y = q;
	if (x->piece != y->piece)
		return x->piece < y->piece ? -1 : 1;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	if (x->xfer != y->xfer)
		return x->xfer < y->xfer ? -1 : 1;
	return x->op < y->op ? -1 : x->op > y->op;
}

/* Where box b starts in the row-major order of extents E, when its
 * elements are one range of that order (leading axes of one element, then
 * one axis cut anywhere, then whole axes); -1 otherwise. */
static int64_t box_range_start(const struct vps_box *b, const int64_t *E)
{
	int k = 0;
	while (k < b->ndim - 1 && b->hi[k] - b->lo[k] == 1)
		k++;
	for (int j = k + 1; j < b->ndim; j++)
		if (b->lo[j] != 0 || b->hi[j] != E[j])
			return -1;
	int64_t start = 0;
	for (int j = 0; j < b->ndim; j++)
		start = start * E[j] + b->lo[j];
	return start;
}

/* The copies of one strided piece tile its box, each element once. */
static vps_result_t check_tiling(const struct vps_plan *p, size_t pi, const struct part *pt, size_t n,
				 struct vps_verify_report *rep)
{
	const struct vps_piece *pc = &p->pieces[pi];
	int64_t E[VPS_MAX_DIMS], vol = vps_box_volume(&pc->box);
	char ps[512];
	piece_ext(pc, E);
	bool ranges = true;
	for (size_t i = 0; i < n; i++)
		ranges &= pt[i].start >= 0;
	int64_t gap = 0, twice = 0;
	size_t first_twice = 0;
	if (ranges) {
		/* sorted by start: a sweep */
		int64_t at = 0;
		for (size_t i = 0; i < n; i++) {
			if (pt[i].start > at)
				gap += pt[i].start - at;
			int64_t end = pt[i].start + pt[i].count;
			if (pt[i].start < at && !twice++)
				first_twice = i;
			at = vps_max64(at, end);
		}
		gap += vol - at;
	} else {
		struct vps_box *boxes = malloc((n + 1) * sizeof(*boxes)), full = {.ndim = pc->box.ndim};
		if (!boxes)
			return too_large("copies of one piece", n + 1, sizeof(*boxes));
		int64_t sum = 0;
		for (size_t i = 0; i < n; i++) {
			boxes[i] = pt[i].box;
			sum += pt[i].count;
		}
		for (int k = 0; k < full.ndim; k++)
			full.hi[k] = E[k];
		gap = vps_boxes_uncovered(boxes, n, &full);
		free(boxes);
		if (gap < 0)
			return too_large("copies of one piece, cut in slabs", n, sizeof(*boxes));
		twice = sum - (vol - gap);
	}
	if (gap || twice)
		piece_str(vps_layout_model(p->a), pc, ps, sizeof(ps));
	if (gap)
		vps_verify_add(rep, "piece %zu (%s, %" PRId64 " -> %" PRId64 "): %" PRId64 " of its %" PRId64
			       " elements are carried by no copy", pi, ps, pc->src, pc->dst, gap, vol);
	if (twice && ranges)
		vps_verify_add(rep, "piece %zu (%s, %" PRId64 " -> %" PRId64 "): transfer %zu op %zu carries elements "
			       "another copy carries too", pi, ps, pc->src, pc->dst, pt[first_twice].xfer, pt[first_twice].op);
	else if (twice)
		vps_verify_add(rep, "piece %zu (%s, %" PRId64 " -> %" PRId64 "): %" PRId64 " elements are carried more than once",
			       pi, ps, pc->src, pc->dst, twice);
	return VPS_OK;
}

/* The flat segments of the copies against those of the pieces. */
static void compare_segs(const struct seg *have, size_t nh, const struct seg *want, size_t nw,
			 struct vps_verify_report *rep)
{
	size_t i = 0, j = 0, mism = 0;
	while (i < nh || j < nw) {
		const struct seg *h = i < nh ? &have[i] : NULL, *w = j < nw ? &want[j] : NULL;
		int c = !h ? 1 : !w ? -1 : seg_key_cmp(h, w);
		if (!c && seg_same(h, w)) {
			i++;
			j++;
			continue;
		}
		if (mism++ < 4) {
			if (c < 0)
				vps_verify_add(rep,
					       "the copies do not cover the plan exactly: %" PRId64 " -> %" PRId64 " buffer %u elements [%" PRId64
					       ", %" PRId64 ") are written by transfer %zu, and no piece asks for them",
					       h->src, h->dst, h->dst_buffer, h->dst_off, h->dst_off + h->len, h->from);
			else if (c > 0)
				vps_verify_add(rep,
					       "the copies do not cover the plan exactly: %" PRId64 " -> %" PRId64 " buffer %u elements [%" PRId64
					       ", %" PRId64 ") (piece %zu on) are carried by no copy",
					       w->src, w->dst, w->dst_buffer, w->dst_off, w->dst_off + w->len, w->from);
			else if (h->src_buffer == w->src_buffer && h->src_off == w->src_off && h->esize == w->esize)
				vps_verify_add(rep,
					       "the copies do not cover the plan exactly: %" PRId64 " -> %" PRId64 " buffer %u elements [%" PRId64
					       ", %" PRId64 ") %s",
					       w->src, w->dst, w->dst_buffer, w->dst_off + vps_min64(h->len, w->len),
					       w->dst_off + vps_max64(h->len, w->len),
					       h->len < w->len ? "are carried by no copy" : "are written, and no piece asks for them");
			else
				vps_verify_add(rep,
					       "the copies do not cover the plan exactly: %" PRId64 " -> %" PRId64 " buffer %u from element %" PRId64
					       ": transfer %zu copies %" PRId64 " elements from %u:%" PRId64 ", piece %zu on asks for %" PRId64
					       " from %u:%" PRId64,
					       w->src, w->dst, w->dst_buffer, w->dst_off, h->from, h->len, h->src_buffer, h->src_off,
					       w->from, w->len, w->src_buffer, w->src_off);
		}
		if (c <= 0)
			i++;
		if (c >= 0)
			j++;
	}
	if (mism > 4)
		vps_verify_add(rep, "... %zu differences between the copies and the plan in all", mism);
}

/* ---- the schedule: every check that depends on the stage table ----
 *
 * Stage numbers enter the verification here and nowhere else: the checks
 * per transfer, copy and piece above hold whatever the stages. */

/* A read of an A buffer: the last stage (uncut: unit) that reads it, by
 * which transfer. */
struct buffer_read {
	int64_t rank;
	uint32_t buffer;
	int64_t stage, step, chunk;
	size_t xfer;
};

static int when_cmp(int64_t s1, int64_t u1, int64_t c1, int64_t s2, int64_t u2, int64_t c2)
{
	if (s1 != s2)
		return s1 < s2 ? -1 : 1;
	if (u1 != u2)
		return u1 < u2 ? -1 : 1;
	return c1 < c2 ? -1 : c1 > c2;
}

static int read_cmp(const void *p, const void *q)
{
	const struct buffer_read *x = p, *y = q;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->buffer != y->buffer)
		return x->buffer < y->buffer ? -1 : 1;
	return -when_cmp(x->stage, x->step, x->chunk, y->stage, y->step, y->chunk); /* latest first */
}

/* A free lets the trainer release a source buffer after its stage: no
 * later stage may read it (vps-exec would copy from released memory). Not
 * cut yet, the same holds unit by unit: no unit after the free's. */
static vps_result_t check_frees(const struct vps_staged *s, struct vps_verify_report *rep)
{
	struct buffer_read *rd = malloc((s->nops + 1) * sizeof(*rd));
	size_t n = 0;
	if (!rd)
		return too_large("buffer reads", s->nops + 1, sizeof(*rd));
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		for (size_t k = 0; k < x->nops && x->first_op + k < s->nops; k++)
			if (!(s->ops[x->first_op + k].src_buffer & VPS_BUFFER_TARGET)) /* frees are of source buffers */
				rd[n++] = (struct buffer_read){x->src, s->ops[x->first_op + k].src_buffer, s->cut ? x->stage : 0,
						       x->step, x->chunk, i};
	}
	qsort(rd, n, sizeof(*rd), read_cmp);
	size_t u = 0;
	for (size_t i = 0; i < n; i++)
		if (!u || rd[u - 1].rank != rd[i].rank || rd[u - 1].buffer != rd[i].buffer)
			rd[u++] = rd[i];
	for (size_t f = 0; f < s->nfrees; f++) {
		const struct vps_free *fr = &s->frees[f];
		struct buffer_read key = {fr->rank, fr->buffer, INT64_MAX, INT64_MAX, INT64_MAX, 0};
		size_t lo = 0, hi = u;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (read_cmp(&rd[mid], &key) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo >= u || rd[lo].rank != fr->rank || rd[lo].buffer != fr->buffer)
			continue;
		const struct buffer_read *last = &rd[lo];
		bool never = fr->step < 0;
		if (s->cut && last->stage > fr->stage) {
			if (fr->stage < 0)
				vps_verify_add(rep,
					       "free %zu: rank %" PRId64 " buffer %u is marked never read, but stage %" PRId64
					       " reads it (transfer %zu)",
					       f, fr->rank, fr->buffer, last->stage, last->xfer);
			else
				vps_verify_add(rep,
					       "free %zu: rank %" PRId64 " buffer %u is freed after stage %" PRId64
					       ", but stage %" PRId64 " still reads it (transfer %zu)",
					       f, fr->rank, fr->buffer, fr->stage, last->stage, last->xfer);
		} else if (!s->cut && (never || when_cmp(0, last->step, last->chunk, 0, fr->step, fr->chunk) > 0)) {
			vps_verify_add(rep,
				       "free %zu: rank %" PRId64 " buffer %u is freed after unit (%" PRId64 ", %" PRId64
				       "), but unit (%" PRId64 ", %" PRId64 ") still reads it (transfer %zu)",
				       f, fr->rank, fr->buffer, fr->step, fr->chunk, last->step, last->chunk, last->xfer);
		}
	}
	free(rd);
	return VPS_OK;
}

/* What one rank has in flight in the stage being checked. */
struct rank_stage {
	int64_t mark;      /* the stage (in order of appearance) the rest is for */
	int64_t load;      /* send plus receive buffers */
	int64_t sent, got; /* the last step it sends, receives in */
};

/* Transfers come in stage order, units (step, chunk) never go back and a
 * unit lies in one stage, so stage boundaries are the same on every rank;
 * retains are in stage 0; in a stage a rank sends and receives at most one
 * transfer per step, and its buffers fit the budget; no free comes before
 * the last stage reading the buffer. A file without a stage table (no
 * stages cut yet) is held to the same per unit, the least any cut holds. */
static vps_result_t check_schedule(const struct vps_staged *s, int64_t W, struct vps_verify_report *rep)
{
	bool cut = s->cut;
	/* a rank's file holds the loads of that rank only (its peers' are
	 * in their files): follow it alone, not the world */
	int64_t lo = s->scope < 0 ? 0 : s->scope, nr = s->scope < 0 ? W : 1;
	struct rank_stage *rs = malloc(((size_t)nr + 1) * sizeof(*rs));
	if (!rs)
		return too_large("ranks' stage loads", (size_t)nr + 1, sizeof(*rs));
	for (int64_t r = 0; r < nr; r++)
		rs[r].mark = -1;
	int64_t prev_stage = -1, prev_step = -1, prev_chunk = -1, prev_unit_stage = -1, seq = 0;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		bool retain = x->src == x->dst;
		if (cut && x->stage != prev_stage) {
			if (x->stage < prev_stage)
				vps_verify_add(rep, "transfer %zu: stage %" PRId64 " after stage %" PRId64, i, x->stage, prev_stage);
			prev_stage = x->stage;
			seq++;
		}
		if (retain) {
			if (cut && x->stage != 0)
				vps_verify_add(rep, "transfer %zu: a retain outside stage 0", i);
			continue;
		}
		if (x->step < prev_step || (x->step == prev_step && x->chunk < prev_chunk))
			vps_verify_add(rep, "transfer %zu: unit (%" PRId64 ", %" PRId64 ") after (%" PRId64 ", %" PRId64 ")", i,
				       x->step, x->chunk, prev_step, prev_chunk);
		else if (cut && x->step == prev_step && x->chunk == prev_chunk && x->stage != prev_unit_stage)
			vps_verify_add(rep, "unit (%" PRId64 ", %" PRId64 ") spans stages %" PRId64 " and %" PRId64, x->step,
				       x->chunk, prev_unit_stage, x->stage);
		if (!cut && (x->step != prev_step || x->chunk != prev_chunk))
			seq++;
		prev_step = x->step;
		prev_chunk = x->chunk;
		prev_unit_stage = x->stage;
		/* ranks are inside the world: the file's reader bounds them */
		if (x->src < 0 || x->src >= W || x->dst < 0 || x->dst >= W)
			continue;
		struct rank_stage ta, tb;
		struct rank_stage *a = x->src - lo >= 0 && x->src - lo < nr ? &rs[x->src - lo] : &ta;
		struct rank_stage *b = x->dst - lo >= 0 && x->dst - lo < nr ? &rs[x->dst - lo] : &tb;
		if (a == &ta)
			ta.mark = -1;
		if (b == &tb)
			tb.mark = -1;
		for (struct rank_stage *r = a;; r = b) {
			if (r->mark != seq)
				*r = (struct rank_stage){seq, 0, -1, -1};
			if (r == b)
				break;
		}
		char where[64];
		if (cut)
			snprintf(where, sizeof(where), "stage %" PRId64, x->stage);
		else
			snprintf(where, sizeof(where), "unit (%" PRId64 ", %" PRId64 ")", x->step, x->chunk);
		/* one transfer per direction per peer per stage, peers by step */
		if (a->sent == x->step || b->got == x->step)
			vps_verify_add(rep, "%s: %" PRId64 " -> %" PRId64 " has two transfers", where, x->src, x->dst);
		a->sent = x->step;
		b->got = x->step;
		a->load = vps_sat_add(a->load, x->bytes);
		b->load = vps_sat_add(b->load, x->bytes);
		if (a->load > s->budget || b->load > s->budget)
			vps_verify_add(rep, "%s: rank %" PRId64 " needs %" PRId64 " bytes, over the budget of %" PRId64, where,
				       a->load > s->budget ? x->src : x->dst, vps_max64(a->load, b->load), s->budget);
	}
	free(rs);
	return check_frees(s, rep);
}

/* A staged plan being checked: what its copies carry, gathered to compare
 * with the plan's pieces. */
struct staged_check {
	const struct vps_staged *s;
	const struct vps_plan *p;
	struct vps_verify_report *rep;
	struct views vw;
	struct seg *have;   /* the flat copies, as segments */
	struct part *parts; /* the copies of strided pieces */
	size_t nh, np;
};

/* Whether a copy reads from its source's transit area, writes into its
 * destination's. */
static bool op_from_transit(const struct vps_op *o)
{
	return (o->src_buffer & VPS_BUFFER_TARGET) && vps_buffer_index(o->src_buffer) == VPS_BUFFER_TRANSIT;
}

static bool op_to_transit(const struct vps_op *o) { return o->dst_buffer == VPS_BUFFER_TRANSIT; }

/* Copy k of transfer i: its views inside their buffers (vs, vd: the
 * views of the transfer's ranks, NULL where every copy of the transfer
 * reads, or writes, a transit area, sized by no layout: inside 2^48
 * elements), its staging bytes aligned and inside the transfer's after
 * those of the copies before it (*end), and what it carries of the piece
 * it names, kept to compare (the pieces' checks place it in the area). */
static void check_op(struct staged_check *c, size_t i, size_t k, const struct view_index *vs,
		     const struct view_index *vd, int64_t *end)
{
	const struct vps_xfer *x = &c->s->xfers[i];
	const struct vps_op *o = &c->s->ops[x->first_op + k];
	const struct vps_plan *p = c->p;
	struct vps_verify_report *rep = c->rep;
	bool retain = x->src == x->dst;
	int64_t bytes = vps_ext_volume(o->ndim, o->ext);
	if (bytes < 0 || !vps_mul_ok(bytes, o->esize, &bytes))
		bytes = -1; /* reported below as a view outside its buffer */
	int64_t f0, f1;
	bool real = bytes > 0;
	for (int d = 0; d < o->ndim; d++)
		if (o->src_strides[d] == 0 || o->dst_strides[d] == 0) {
			vps_verify_add(rep, "transfer %zu op %zu: stride %d is 0 (rows that alias each other)", i, k, d);
			real = false;
			break;
		}
	uint32_t sb = vps_buffer_index(o->src_buffer);
	int64_t src_n = op_from_transit(o) ? VPS_MAX_ELEMENTS : vs && sb < vs->v.nbuffers ? vs->v.buffers[sb].elements : -1;
	int64_t dst_n = op_to_transit(o)			? VPS_MAX_ELEMENTS
			: vd && o->dst_buffer < vd->v.nbuffers ? vd->v.buffers[o->dst_buffer].elements
								: -1;
	if (!vps_view_span(o->ndim, o->ext, o->src_offset, o->src_strides, &f0, &f1) || f0 < 0 || f1 > src_n) {
		vps_verify_add(rep, "transfer %zu op %zu: source view outside buffer %u of rank %" PRId64, i, k,
			       o->src_buffer, x->src);
		real = false;
	}
	if (!vps_view_span(o->ndim, o->ext, o->dst_offset, o->dst_strides, &f0, &f1) || f0 < 0 || f1 > dst_n) {
		vps_verify_add(rep, "transfer %zu op %zu: destination view outside buffer %u of rank %" PRId64, i, k,
			       o->dst_buffer, x->dst);
		real = false;
	}
	if (retain) {
		if (o->staging != -1)
			vps_verify_add(rep, "transfer %zu op %zu: a retain with a staging offset", i, k);
	} else {
		if (o->staging % VPS_STAGE_ALIGN)
			vps_verify_add(rep, "transfer %zu op %zu: staging offset %" PRId64 " is not %d-byte aligned", i, k,
				       o->staging, VPS_STAGE_ALIGN);
		if (o->staging < *end || !real || o->staging > x->bytes - bytes)
			vps_verify_add(rep,
				       "transfer %zu op %zu: staging bytes [%" PRId64 ", %" PRId64
				       ") overlap another op or leave the buffer of %" PRId64,
				       i, k, o->staging, o->staging + bytes, x->bytes);
		if (real)
			*end = o->staging + bytes;
	}
	/* a view that cannot be real is reported, never matched */
	if (!real)
		return;
	if (o->piece < 0 || (uint64_t)o->piece >= p->npieces) {
		vps_verify_add(rep, "transfer %zu op %zu: piece %" PRId64 " is not one of the plan's %zu", i, k, o->piece,
			       p->npieces);
		return;
	}
	const struct vps_piece *pc = &p->pieces[o->piece];
	struct vps_run run;
	struct part *pt = &c->parts[c->np];
	vps_op_run(x, o, &run);
	enum vps_match match = vps_piece_match(pc, &run, &pt->box);
	if (match == VPS_MATCH_FLAT) {
		c->have[c->nh++] = (struct seg){x->src,	   x->dst,	     o->src_buffer, o->dst_buffer,
						o->src_offset, o->dst_offset, bytes / o->esize, o->esize, i};
		return;
	}
	if (match == VPS_MATCH_BOX) {
		int64_t E[VPS_MAX_DIMS];
		piece_ext(pc, E);
		pt->piece = (size_t)o->piece;
		pt->count = vps_box_volume(&pt->box);
		pt->xfer = i;
		pt->op = k;
		pt->start = box_range_start(&pt->box, E);
		c->np++;
		return;
	}
	char ps[512];
	piece_str(vps_layout_model(p->a), pc, ps, sizeof(ps));
	vps_verify_add(rep,
		       "transfer %zu op %zu (%" PRId64 " -> %" PRId64 "): not a part of piece %" PRId64 " (%s, %" PRId64
		       " -> %" PRId64 ") at the piece's addresses",
		       i, k, x->src, x->dst, o->piece, ps, pc->src, pc->dst);
}

/* Transfer i: its copies within the file, its step i ^ j, no staging for a
 * retain, its ranks in the file's scope and the world; then its copies. */
static vps_result_t check_xfer(struct staged_check *c, size_t i)
{
	const struct vps_staged *s = c->s;
	const struct vps_plan *p = c->p;
	const struct vps_xfer *x = &s->xfers[i];
	struct vps_verify_report *rep = c->rep;
	if (x->first_op > s->nops || x->nops > s->nops - x->first_op) {
		vps_verify_add(rep, "transfer %zu: copies %zu .. %zu of a file of %zu", i, x->first_op,
			       x->first_op + x->nops, s->nops);
		return VPS_OK;
	}
	/* forwards (a relay's sends from its target buffers) follow the direct
	 * steps, each hop the one before */
	int hop = x->nops ? vps_buffer_hop(s->ops[x->first_op].src_buffer) : 0;
	if (hop < 0) {
		vps_verify_add(rep, "transfer %zu: op 0's source buffer %#x has hop bits that name no hop", i,
			       s->ops[x->first_op].src_buffer);
		hop = VPS_MAX_HOP;
	}
	bool forward = hop > 0;
	for (size_t k = 1; k < x->nops; k++)
		if (vps_buffer_hop(s->ops[x->first_op + k].src_buffer) != hop)
			vps_verify_add(rep, "transfer %zu: op %zu is not of hop %d, as op 0 is", i, k, hop);
	if (x->step != (x->src ^ x->dst) + hop * s->steps)
		vps_verify_add(rep, "transfer %zu (%" PRId64 " -> %" PRId64 ", hop %d): step %" PRId64 " is not %d x %" PRId64
			       " + %" PRId64 " ^ %" PRId64, i, x->src, x->dst, hop, x->step, hop, s->steps, x->src, x->dst);
	if (x->step > VPS_STAGE_LAST_STEP(s->steps))
		vps_verify_add(rep, "transfer %zu: step %" PRId64 " beyond the last step %" PRId64, i, x->step,
			       VPS_STAGE_LAST_STEP(s->steps));
	if (forward && x->src == x->dst)
		vps_verify_add(rep, "transfer %zu: a retain from a target buffer", i);
	if (x->src == x->dst && x->bytes)
		vps_verify_add(rep, "transfer %zu: a retain with a staging buffer", i);
	if (s->scope >= 0 && x->src != s->scope && x->dst != s->scope)
		vps_verify_add(rep, "transfer %zu does not involve rank %" PRId64 ", the file's scope", i, s->scope);
	int64_t ra = forward ? vps_world_b_rank(p->world, x->src) : vps_world_a_rank(p->world, x->src),
		rb = vps_world_b_rank(p->world, x->dst);
	/* a side whose copies all use a transit area needs no layout's rank */
	bool need_src = false, need_dst = false;
	for (size_t k = 0; k < x->nops; k++) {
		need_src |= !op_from_transit(&s->ops[x->first_op + k]);
		need_dst |= !op_to_transit(&s->ops[x->first_op + k]);
	}
	if ((need_src && ra < 0) || (need_dst && rb < 0)) {
		vps_verify_add(rep, "transfer %zu: %" PRId64 " -> %" PRId64 " from a %s or to a leaving device", i, x->src,
			       x->dst, forward ? "leaving device's target buffer" : "joining device");
		return VPS_OK;
	}
	struct view_index *vs = NULL, *vd = NULL;
	if (need_src)
		VPS_CHECK(view_get(forward ? p->b : p->a, forward ? &c->vw.b : &c->vw.a, ra, &vs));
	if (need_dst)
		VPS_CHECK(view_get(p->b, &c->vw.b, rb, &vd));
	int64_t end = 0;
	for (size_t k = 0; k < x->nops; k++)
		check_op(c, i, k, vs, vd, &end);
	return VPS_OK;
}

/* The pieces of this file against what the copies carry: the flat ones as
 * segments, the strided ones tiled by the copies that name them. */
static vps_result_t check_carried(struct staged_check *c)
{
	const struct vps_plan *p = c->p;
	int64_t scope = c->s->scope >= 0 ? c->s->scope : p->scope;
	size_t nflat = 0, nw = 0, q = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if ((scope < 0 || x->src == scope || x->dst == scope) && vps_piece_flat(x))
			nflat++;
	}
	struct seg *want = malloc((nflat + 1) * sizeof(*want));
	if (!want)
		return too_large("contiguous pieces", nflat + 1, sizeof(*want));
	qsort(c->parts, c->np, sizeof(*c->parts), part_cmp);
	for (size_t i = 0; i < p->npieces && !rc; i++) {
		const struct vps_piece *x = &p->pieces[i];
		size_t q0 = q;
		while (q < c->np && c->parts[q].piece == i)
			q++;
		if (scope >= 0 && x->src != scope && x->dst != scope)
			continue;
		if (vps_box_volume(&x->box) > VPS_MAX_ELEMENTS) {
			vps_verify_add(c->rep, "piece %zu: more than 2^48 elements", i);
			continue;
		}
		if (vps_piece_flat(x))
			want[nw++] = (struct seg){x->src,	 x->dst, x->src_buffer, x->dst_buffer, x->src_offset,
						  x->dst_offset, vps_box_volume(&x->box),
						  (uint8_t)vps_dtype_size(vps_piece_dtype(x)), i};
		else
			rc = check_tiling(p, i, &c->parts[q0], q - q0, c->rep);
	}
	if (!rc) {
		size_t nh = segs_normalize(c->have, c->nh);
		nw = segs_normalize(want, nw);
		compare_segs(c->have, nh, want, nw, c->rep);
	}
	free(want);
	return rc;
}

/* A relay sends on only what has arrived: each rank's first send of hop h
 * lies in a stage after its last receive of every hop below h (with
 * check_forward, which proves those receives bring every element passed
 * on, every byte passed on arrived before it is sent). Files of one rank
 * hold its own receives only when it is that rank. */
static vps_result_t check_relay_order(const struct vps_staged *s, int64_t W, struct vps_verify_report *rep)
{
	if (!s->cut)
		return VPS_OK;
	/* last_in[h W + r]: rank r's last receive of hop h (0 .. MAX_HOP - 1);
	 * first_out[(h - 1) W + r]: its first send of hop h (1 .. MAX_HOP) */
	size_t n = VPS_MAX_HOP * (size_t)W;
	int64_t *t = malloc(2 * n * sizeof(*t)), *last_in = t, *first_out = t ? t + n : NULL;
	if (!t)
		return too_large("ranks", (size_t)W, 2 * VPS_MAX_HOP * sizeof(int64_t));
	for (size_t k = 0; k < n; k++) {
		last_in[k] = -1;
		first_out[k] = INT64_MAX;
	}
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (x->src < 0 || x->src >= W || x->dst < 0 || x->dst >= W || !x->nops || x->first_op >= s->nops)
			continue; /* check_xfer and check_schedule name these */
		int hop = vps_buffer_hop(s->ops[x->first_op].src_buffer);
		if (hop < 0)
			continue; /* check_xfer names it */
		if (hop > 0) {
			int64_t *f = &first_out[(size_t)(hop - 1) * (size_t)W + (size_t)x->src];
			*f = vps_min64(*f, x->stage);
		}
		if (hop < VPS_MAX_HOP) {
			int64_t *l = &last_in[(size_t)hop * (size_t)W + (size_t)x->dst];
			*l = vps_max64(*l, x->stage);
		}
	}
	for (int64_t r = 0; r < W; r++) {
		if (s->scope >= 0 && s->scope != r)
			continue;
		int64_t got = -1;
		for (int h = 1; h <= VPS_MAX_HOP; h++) {
			got = vps_max64(got, last_in[(size_t)(h - 1) * (size_t)W + (size_t)r]);
			int64_t out = first_out[(size_t)(h - 1) * (size_t)W + (size_t)r];
			if (out != INT64_MAX && out <= got)
				vps_verify_add(rep, "rank %" PRId64 " passes on in stage %" PRId64 " what it may receive as late "
					       "as stage %" PRId64 " (hop %d)", r, out, got, h);
		}
	}
	free(t);
	return VPS_OK;
}

vps_result_t vps_verify_staged(const struct vps_staged *s, struct vps_verify_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_plan *p = s->plan;
	int64_t W = vps_world_size(p->world), retains = 0, moved = 0;
	struct staged_check c = {.s = s, .p = p, .rep = rep};
	memset(rep, 0, sizeof(*rep));
	uint64_t hash = s->file_hash ? vps_staged_hash(s) : 0;
	if (s->file_hash && s->file_hash != hash)
		vps_verify_add(rep, "the staged plan states hash 0x%016" PRIx64 " but its content hashes to 0x%016" PRIx64,
			       s->file_hash, hash);
	int64_t steps = 1;
	while (steps < W)
		steps <<= 1;
	steps--;
	if (s->steps != steps)
		vps_verify_add(rep, "steps is %" PRId64 ", the world of %" PRId64 " needs 1 .. %" PRId64, s->steps, W, steps);
	VPS_CHECK_GOTO(views_new(&c.vw, p), rc, done);
	/* the plan itself, over what this file holds: every destination
	 * region received exactly once */
	VPS_CHECK_GOTO(plan_checks(p, s->scope >= 0 ? s->scope : p->scope, &c.vw, rep, &retains, &moved), rc, done);
	c.have = malloc((s->nops + 1) * sizeof(*c.have));
	c.parts = malloc((s->nops + 1) * sizeof(*c.parts));
	if (!c.have || !c.parts) {
		rc = too_large("copies", s->nops + 1, sizeof(*c.have) + sizeof(*c.parts));
		goto done;
	}
	for (size_t i = 0; i < s->nxfers; i++)
		VPS_CHECK_GOTO(check_xfer(&c, i), rc, done);
	VPS_CHECK_GOTO(check_schedule(s, W, rep), rc, done);
	VPS_CHECK_GOTO(check_relay_order(s, W, rep), rc, done);
	VPS_CHECK_GOTO(check_carried(&c), rc, done);
	struct vps_stage_stats st;
	vps_staged_stats(s, &st);
	char bud[VPS_UNITS_LEN], pk[VPS_UNITS_LEN];
	snprintf(rep->summary, sizeof(rep->summary),
		 "%s: %" PRId64 " stages within a %s budget, %" PRId64 " transfers, %" PRId64 " copies for %" PRId64
		 " pieces, peak %s",
		 vps_layout_model(p->a)->name, st.stages, vps_format_bytes(s->budget, bud, sizeof(bud)), st.transfers,
		 st.ops, st.pieces, vps_format_bytes(st.peak_max, pk, sizeof(pk)));
	lost_summary(p, rep);
done:
	views_release(&c.vw);
	free(c.have);
	free(c.parts);
	if (rc)
		vps_verify_report_release(rep);
	return rc;
}
