/* Coverage: which elements of a target box a list of boxes leaves
 * uncovered (vps/box.h). vps-verify proves with it that every element is
 * held and received; the planner's statistics and time floor count with it
 * what a device must receive. */
#include "util/internal.h"
#include "model/cover.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* Slab recursion: split target along `axis` at every box boundary; a slab
 * no box spans entirely is uncovered and goes to visit() (which returns
 * false to stop), otherwise recurse on the next axis with the boxes that
 * span it. Every box boundary inside the target is a cut, so a box meets a
 * slab only by spanning it: a sweep over the boxes sorted by their low end
 * keeps exactly the boxes of the current slab, and a level costs
 * O(n log n) plus the boxes it hands down, not slabs times boxes.
 * @return false when stopped or out of memory (*oom set). */
static _Thread_local int slab_axis;

static int lo_cmp(const void *p, const void *q)
{
	const struct vps_box *x = *(const struct vps_box *const *)p, *y = *(const struct vps_box *const *)q;
	return x->lo[slab_axis] < y->lo[slab_axis] ? -1 : x->lo[slab_axis] > y->lo[slab_axis];
}

static bool slabs(const struct vps_box **boxes, size_t n, const struct vps_box *target, int axis,
		  bool (*visit)(void *ctx, const struct vps_box *gap), void *ctx, bool *oom)
{
	if (!n)
		return visit(ctx, target);
	int64_t *cuts = malloc((2 * n + 2) * sizeof(*cuts));
	const struct vps_box **bylo = malloc((n + 1) * sizeof(*bylo)), **sub = malloc((n + 1) * sizeof(*sub));
	if (!cuts || !bylo || !sub) {
		free(cuts);
		free(bylo);
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
	memcpy(bylo, boxes, n * sizeof(*bylo));
	slab_axis = axis;
	qsort(bylo, n, sizeof(*bylo), lo_cmp);
	bool go = true;
	size_t next = 0, ns = 0;
	for (size_t c = 0; c + 1 < nc && go; c++) {
		if (cuts[c] == cuts[c + 1])
			continue;
		struct vps_box slab = *target;
		slab.lo[axis] = cuts[c];
		slab.hi[axis] = cuts[c + 1];
		/* the boxes of the previous slab that reach into this one, and
		 * those that start by its beginning */
		size_t keep = 0;
		for (size_t i = 0; i < ns; i++)
			if (sub[i]->hi[axis] > slab.lo[axis])
				sub[keep++] = sub[i];
		ns = keep;
		while (next < n && bylo[next]->lo[axis] <= slab.lo[axis]) {
			if (bylo[next]->hi[axis] > slab.lo[axis])
				sub[ns++] = bylo[next];
			next++;
		}
		if (!ns)
			go = visit(ctx, &slab);
		else if (axis + 1 < target->ndim)
			go = slabs(sub, ns, &slab, axis + 1, visit, ctx, oom);
	}
	free(cuts);
	free(bylo);
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

int64_t vps_boxes_union_volume(const struct vps_box *boxes, size_t n)
{
	if (!n)
		return 0;
	struct vps_box hull = boxes[0];
	for (size_t i = 1; i < n; i++)
		for (int a = 0; a < hull.ndim; a++) {
			hull.lo[a] = vps_min64(hull.lo[a], boxes[i].lo[a]);
			hull.hi[a] = vps_max64(hull.hi[a], boxes[i].hi[a]);
		}
	int64_t u = n == 1 ? 0 : vps_boxes_uncovered(boxes, n, &hull);
	return u < 0 ? -1 : vps_box_volume(&hull) - u;
}
