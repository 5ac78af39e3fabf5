/* Lost devices: what a switch can still take from the survivors of A, and
 * what no survivor holds.
 *
 * A lost range is computed from the lost ranks' own views alone: for each
 * of their regions, the holders of its box under A less the lost ranks
 * (vps_layout_holders is arithmetic, so this never enumerates the world);
 * what none of those holds is lost. The planner drops the lost ranks from
 * every holder set it reads (vps_lost_drop_holders), so replica choice,
 * rotation and weighing see only survivors, in the global and the
 * per-rank path alike. */
#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "vps/io.h"
#include "vps/plan.h"

static int range_cmp(const void *p, const void *q)
{
	const struct vps_lost_range *x = p, *y = q;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	return vps_box_order(&x->box, &y->box);
}

void vps_lost_release(struct vps_lost *l)
{
	free(l->ranks);
	free(l->ranges);
	memset(l, 0, sizeof(*l));
}

bool vps_lost_has_rank(const struct vps_lost *l, int64_t ra)
{
	return l->nranks && bsearch(&ra, l->ranks, l->nranks, sizeof(*l->ranks), vps_int64_cmp) != NULL;
}

int64_t vps_lost_range_bytes(const struct vps_lost_range *r)
{
	return vps_box_volume(&r->box) * (int64_t)vps_dtype_size(vps_dtype_of(r->dtype, r->state));
}

int64_t vps_lost_bytes(const struct vps_lost *l)
{
	int64_t sum = 0;
	for (size_t i = 0; i < l->nranges; i++)
		sum = vps_sat_add(sum, vps_lost_range_bytes(&l->ranges[i]));
	return sum;
}

vps_result_t vps_lost_drop_holders(const struct vps_lost *l, struct vps_holders *h)
{
	if (!l || !l->nranks)
		return VPS_OK;
	size_t n = h->n;
	for (size_t i = 0; i < n; i++) {
		struct vps_holder x = h->v[i];
		int64_t stride = x.stride ? x.stride : 1, next = 0;
		bool any = false;
		/* the members of the progression that are lost, in order: the
		 * ranks are ascending, and so are their indices */
		for (size_t k = 0; k < l->nranks; k++) {
			int64_t r = l->ranks[k];
			if (r < x.base || (r - x.base) % stride || (r - x.base) / stride >= x.count)
				continue;
			int64_t j = (r - x.base) / stride;
			if (!any) {
				h->v[i].count = 0; /* marked; the survivors are appended */
				any = true;
			}
			if (j > next) {
				struct vps_holder y = x;
				y.base = x.base + next * stride;
				y.count = j - next;
				VPS_CHECK(VPS_GROW(h->v, h->cap, h->n + 1));
				h->v[h->n++] = y;
			}
			next = j + 1;
		}
		if (any && next < x.count) {
			struct vps_holder y = x;
			y.base = x.base + next * stride;
			y.count = x.count - next;
			VPS_CHECK(VPS_GROW(h->v, h->cap, h->n + 1));
			h->v[h->n++] = y;
		}
	}
	/* drop the emptied ones, keeping the order of the rest */
	size_t w = 0;
	for (size_t i = 0; i < h->n; i++)
		if (h->v[i].count > 0)
			h->v[w++] = h->v[i];
	h->n = w;
	return VPS_OK;
}

static vps_result_t push_range(struct vps_lost *l, size_t *cap, const struct vps_region *r, const struct vps_box *b)
{
	VPS_CHECK(VPS_GROW(l->ranges, *cap, l->nranges + 1));
	l->ranges[l->nranges++] = (struct vps_lost_range){r->tensor, r->state, r->dtype, *b};
	return VPS_OK;
}

vps_result_t vps_lost_compute(struct vps_lost *out, const struct vps_layout *a, const int64_t *ranks, size_t n)
{
	struct vps_lost l = {0};
	struct vps_holders h = {0};
	struct vps_boxes rem = {0}, tmp = {0};
	struct vps_rank_view v = {0};
	size_t cap = 0;
	vps_result_t rc = VPS_OK;
	int64_t world = vps_layout_world(a);
	memset(out, 0, sizeof(*out));
	if (!n)
		return VPS_OK;
	if (n > (size_t)world)
		return vps_fail(VPS_EINPUT, "%zu lost ranks, but the source layout has %" PRId64, n, world);
	l.ranks = vps_malloc(n * sizeof(*l.ranks));
	if (!l.ranks)
		return VPS_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= world) {
			rc = vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the source layout's %" PRId64 " ranks",
				      ranks[i], world);
			goto fail;
		}
		l.ranks[i] = ranks[i];
	}
	qsort(l.ranks, n, sizeof(*l.ranks), vps_int64_cmp);
	for (size_t i = 0; i < n; i++)
		if (!l.nranks || l.ranks[l.nranks - 1] != l.ranks[i])
			l.ranks[l.nranks++] = l.ranks[i];
	if (l.nranks == (size_t)world) {
		rc = vps_fail(VPS_EINPUT, "every rank of the source layout is lost: nothing survives to plan from");
		goto fail;
	}
	for (size_t k = 0; k < l.nranks; k++) {
		VPS_CHECK_GOTO(vps_layout_rank(a, l.ranks[k], &v), rc, fail);
		for (size_t i = 0; i < v.nregions; i++) {
			const struct vps_region *R = &v.regions[i];
			h.n = 0;
			VPS_CHECK_GOTO(vps_layout_holders(a, R->tensor, R->state, &R->box, &h), rc, fail);
			VPS_CHECK_GOTO(vps_lost_drop_holders(&l, &h), rc, fail);
			VPS_CHECK_GOTO(vps_boxes_reset(&rem, &R->box), rc, fail);
			for (size_t q = 0; q < h.n && rem.n; q++)
				VPS_CHECK_GOTO(vps_boxes_subtract(&rem, &tmp, &h.v[q].region.box), rc, fail);
			/* what another lost rank also held is listed once */
			for (size_t q = 0; q < l.nranges && rem.n; q++)
				if (l.ranges[q].tensor == R->tensor && l.ranges[q].state == R->state)
					VPS_CHECK_GOTO(vps_boxes_subtract(&rem, &tmp, &l.ranges[q].box), rc, fail);
			for (size_t q = 0; q < rem.n; q++)
				VPS_CHECK_GOTO(push_range(&l, &cap, R, &rem.v[q]), rc, fail);
		}
		vps_rank_view_release(&v);
	}
	if (l.nranges > 1)
		qsort(l.ranges, l.nranges, sizeof(*l.ranges), range_cmp);
	*out = l;
	goto done;
fail:
	vps_rank_view_release(&v);
	vps_lost_release(&l);
done:
	vps_holders_release(&h);
	vps_boxes_release(&rem);
	vps_boxes_release(&tmp);
	return rc;
}

vps_result_t vps_lost_check_target(const struct vps_lost *l, const struct vps_layout *a, const struct vps_layout *b)
{
	for (size_t i = 0; i < l->nranks; i++) {
		struct vps_device d = vps_layout_device(a, l->ranks[i]);
		int64_t rb = vps_layout_rank_on(b, d);
		if (rb >= 0)
			return vps_fail(VPS_EINPUT,
					"rank %" PRId64 " of the source is lost, but the target places its rank %" PRId64
					" on that device (node %d gpu %d): a lost device cannot receive",
					l->ranks[i], rb, d.node, d.gpu);
	}
	return VPS_OK;
}

vps_result_t vps_lost_devices(const struct vps_layout *a, const char *path, int64_t **ranks, size_t *n)
{
	struct vps_devices d;
	*ranks = NULL;
	*n = 0;
	VPS_CHECK(vps_devices_load(&d, path));
	vps_result_t rc = VPS_OK;
	if (d.packed)
		rc = vps_fail(VPS_EINPUT, "%s: a packed devices document names no device: list the lost ones", path);
	else if (!(*ranks = vps_malloc((size_t)d.n * sizeof(**ranks) + 1)))
		rc = VPS_ENOMEM;
	for (int64_t i = 0; !rc && i < d.n; i++) {
		int64_t r = vps_layout_rank_on(a, d.list[i]);
		if (r < 0)
			rc = vps_fail(VPS_EINPUT, "%s: device (node %d, gpu %d) is not one of the source layout's",
				      path, d.list[i].node, d.list[i].gpu);
		else
			(*ranks)[(*n)++] = r;
	}
	vps_devices_release(&d);
	if (rc) {
		free(*ranks);
		*ranks = NULL;
		*n = 0;
	}
	return rc;
}

static const struct vps_field lost_fields[] = {
	{"tensor", VPS_FIELD_STR}, {"state", VPS_FIELD_STR}, {"box", VPS_FIELD_BOX},
	{"elements", VPS_FIELD_INT}, {"bytes", VPS_FIELD_INT},
};

vps_result_t vps_lost_format(const struct vps_lost *l, const struct vps_layout *a, enum vps_format format,
			struct vps_bytes *out)
{
	struct vps_records rec;
	const struct vps_model *m = vps_layout_model(a);
	VPS_CHECK(vps_records_begin(&rec, out, (enum vps_format)format, lost_fields,
				    sizeof(lost_fields) / sizeof(*lost_fields)));
	for (size_t i = 0; i < l->nranges; i++) {
		const struct vps_lost_range *r = &l->ranges[i];
		struct vps_tensor t;
		char name[256];
		VPS_CHECK(vps_model_tensor(m, r->tensor, &t));
		vps_tensor_name(&t, name, sizeof(name));
		struct vps_value v[] = {
			{.s = name},
			{.s = vps_state_name(r->state)},
			{.box = &r->box},
			{.i = vps_box_volume(&r->box)},
			{.i = vps_lost_range_bytes(r)},
		};
		VPS_CHECK(vps_records_put(&rec, v));
	}
	return vps_records_end(&rec);
}
