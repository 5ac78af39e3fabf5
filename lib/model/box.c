#include "util/internal.h"
#include "vps/box.h"

int64_t vps_box_volume(const struct vps_box *b)
{
	int64_t v = 1;
	for (int k = 0; k < b->ndim; k++) {
		if (b->hi[k] <= b->lo[k])
			return 0;
	}
	/* readers bound boxes by their tensors; a box built from anything
	 * else saturates rather than wraps, so it fails every size check */
	for (int k = 0; k < b->ndim; k++) {
		int64_t e;
		if (!vps_add_ok(b->hi[k], -b->lo[k], &e) || !vps_mul_ok(v, e, &v))
			return INT64_MAX;
	}
	return v;
}

int64_t vps_ext_volume(int ndim, const int64_t *ext)
{
	int64_t v = 1;
	for (int k = 0; k < ndim; k++)
		if (ext[k] < 1 || !vps_mul_ok(v, ext[k], &v))
			return -1;
	return v;
}

bool vps_view_span(int ndim, const int64_t *ext, int64_t offset, const int64_t *strides, int64_t *first,
		   int64_t *end)
{
	int64_t lo = offset, hi = offset, span;
	for (int k = 0; k < ndim; k++) {
		if (ext[k] < 1 || strides[k] == 0 || !vps_mul_ok(ext[k] - 1, strides[k], &span) ||
		    !vps_add_ok(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi))
			return false;
	}
	if (!vps_add_ok(hi, 1, &hi))
		return false;
	*first = lo;
	*end = hi;
	return true;
}

bool vps_box_intersect(const struct vps_box *a, const struct vps_box *b, struct vps_box *out)
{
	struct vps_box r;
	if (a->ndim != b->ndim)
		return false;
	r.ndim = a->ndim;
	for (int k = 0; k < a->ndim; k++) {
		r.lo[k] = vps_max64(a->lo[k], b->lo[k]);
		r.hi[k] = vps_min64(a->hi[k], b->hi[k]);
		if (r.lo[k] >= r.hi[k])
			return false;
	}
	if (out)
		*out = r;
	return true;
}

bool vps_box_equal(const struct vps_box *a, const struct vps_box *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int k = 0; k < a->ndim; k++)
		if (a->lo[k] != b->lo[k] || a->hi[k] != b->hi[k])
			return false;
	return true;
}

bool vps_box_contains(const struct vps_box *outer, const struct vps_box *inner)
{
	if (outer->ndim != inner->ndim)
		return false;
	for (int k = 0; k < outer->ndim; k++)
		if (inner->lo[k] < outer->lo[k] || inner->hi[k] > outer->hi[k])
			return false;
	return true;
}

void vps_box_full(struct vps_box *b, int ndim, const int64_t *shape)
{
	memset(b, 0, sizeof(*b));
	b->ndim = ndim;
	for (int k = 0; k < ndim; k++)
		b->hi[k] = shape[k];
}

/* Emit the boxes of [lo, hi) inside the sub-tensor whose axes before `axis`
 * are fixed at prefix[]. */
static int flat_rec(int ndim, const int64_t *ext, int axis, int64_t *prefix, int64_t base,
		    int64_t lo, int64_t hi, struct vps_box *out, int64_t *starts, int n)
{
	if (lo >= hi)
		return n;
	int64_t inner = 1;
	for (int k = axis + 1; k < ndim; k++)
		inner *= ext[k];
	int64_t i0 = lo / inner, r0 = lo % inner, i1 = hi / inner, r1 = hi % inner;
	if (i0 == i1) {
		prefix[axis] = i0;
		return flat_rec(ndim, ext, axis + 1, prefix, base + i0 * inner, r0, r1, out, starts, n);
	}
	if (r0 != 0) {
		prefix[axis] = i0;
		n = flat_rec(ndim, ext, axis + 1, prefix, base + i0 * inner, r0, inner, out, starts, n);
		i0++;
	}
	if (i1 > i0) {
		struct vps_box *b = &out[n];
		b->ndim = ndim;
		for (int k = 0; k < axis; k++) {
			b->lo[k] = prefix[k];
			b->hi[k] = prefix[k] + 1;
		}
		b->lo[axis] = i0;
		b->hi[axis] = i1;
		for (int k = axis + 1; k < ndim; k++) {
			b->lo[k] = 0;
			b->hi[k] = ext[k];
		}
		if (starts)
			starts[n] = base + i0 * inner;
		n++;
	}
	if (r1 != 0) {
		prefix[axis] = i1;
		n = flat_rec(ndim, ext, axis + 1, prefix, base + i1 * inner, 0, r1, out, starts, n);
	}
	return n;
}

int vps_flat_range_boxes(int ndim, const int64_t *ext, int64_t lo, int64_t hi,
			 struct vps_box *out, int64_t *starts)
{
	int64_t prefix[VPS_MAX_DIMS] = {0};
	return flat_rec(ndim, ext, 0, prefix, 0, lo, hi, out, starts, 0);
}

int vps_box_subtract(const struct vps_box *a, const struct vps_box *b, struct vps_box *out)
{
	struct vps_box inter;
	if (!vps_box_intersect(a, b, &inter)) {
		out[0] = *a;
		return 1;
	}
	struct vps_box rest = *a;
	int n = 0;
	for (int k = 0; k < a->ndim; k++) {
		if (rest.lo[k] < inter.lo[k]) {
			out[n] = rest;
			out[n].hi[k] = inter.lo[k];
			n++;
		}
		if (inter.hi[k] < rest.hi[k]) {
			out[n] = rest;
			out[n].lo[k] = inter.hi[k];
			n++;
		}
		rest.lo[k] = inter.lo[k];
		rest.hi[k] = inter.hi[k];
	}
	return n;
}

void vps_box_rowmajor_strides(const struct vps_box *b, int64_t *strides)
{
	int64_t s = 1;
	for (int k = b->ndim - 1; k >= 0; k--) {
		strides[k] = s;
		s *= b->hi[k] - b->lo[k];
	}
}

int64_t vps_region_offset_at(const struct vps_region *r, const int64_t *idx)
{
	int64_t off = r->offset;
	for (int k = 0; k < r->box.ndim; k++)
		off += (idx[k] - r->box.lo[k]) * r->strides[k];
	return off;
}

void vps_region_restrict(const struct vps_region *r, const struct vps_box *sub, struct vps_region *out)
{
	struct vps_region t = *r;
	t.offset = vps_region_offset_at(r, sub->lo);
	t.box = *sub;
	*out = t;
}

bool vps_strides_rowmajor(int ndim, const int64_t *ext, const int64_t *strides)
{
	int64_t s = 1;
	for (int k = ndim - 1; k >= 0; k--) {
		if (ext[k] != 1 && strides[k] != s)
			return false;
		if (__builtin_mul_overflow(s, ext[k], &s))
			return false;
	}
	return true;
}

bool vps_region_is_contiguous(const struct vps_region *r)
{
	int64_t ext[VPS_MAX_DIMS];
	for (int k = 0; k < r->box.ndim; k++)
		ext[k] = r->box.hi[k] - r->box.lo[k];
	return vps_strides_rowmajor(r->box.ndim, ext, r->strides);
}

void vps_region_extent(const struct vps_region *r, int64_t *first, int64_t *end)
{
	int64_t ext[VPS_MAX_DIMS];
	for (int k = 0; k < r->box.ndim; k++)
		ext[k] = r->box.hi[k] - r->box.lo[k];
	/* a view that cannot be real (a zero stride, an overflow) reaches
	 * everywhere, so that every bounds check refuses it */
	if (!vps_view_span(r->box.ndim, ext, r->offset, r->strides, first, end)) {
		*first = INT64_MIN;
		*end = INT64_MAX;
	}
}

int vps_box_order(const struct vps_box *a, const struct vps_box *b)
{
	for (int k = 0; k < a->ndim; k++) {
		if (a->lo[k] != b->lo[k])
			return a->lo[k] < b->lo[k] ? -1 : 1;
		if (a->hi[k] != b->hi[k])
			return a->hi[k] < b->hi[k] ? -1 : 1;
	}
	return 0;
}

void vps_boxes_release(struct vps_boxes *b)
{
	free(b->v);
	memset(b, 0, sizeof(*b));
}

vps_result_t vps_boxes_push(struct vps_boxes *b, const struct vps_box *x)
{
	VPS_CHECK(VPS_GROW(b->v, b->cap, b->n + 1));
	b->v[b->n++] = *x;
	return VPS_OK;
}

vps_result_t vps_boxes_reset(struct vps_boxes *b, const struct vps_box *x)
{
	b->n = 0;
	return vps_boxes_push(b, x);
}

vps_result_t vps_boxes_subtract(struct vps_boxes *b, struct vps_boxes *scratch, const struct vps_box *cut)
{
	scratch->n = 0;
	for (size_t i = 0; i < b->n; i++) {
		struct vps_box out[2 * VPS_MAX_DIMS];
		int m = vps_box_subtract(&b->v[i], cut, out);
		if (!m)
			continue;
		VPS_CHECK(VPS_GROW(scratch->v, scratch->cap, scratch->n + (size_t)m));
		memcpy(scratch->v + scratch->n, out, (size_t)m * sizeof(*out));
		scratch->n += (size_t)m;
	}
	struct vps_boxes t = *b;
	*b = *scratch;
	*scratch = t;
	return VPS_OK;
}
