#include "model/world.h"
#include "util/internal.h"
#include "vps/plan.h"

/* The union of A's and B's devices. A's ranks keep their numbers; B-only
 * devices follow in B's rank order. When both maps are packed with the same
 * GPUs per node, the devices are intervals of the linear order node*g + gpu,
 * so which B ranks are A's devices is an interval [lo, hi) of B ranks and
 * every lookup is arithmetic. Otherwise the B-only ranks are listed. */
struct vps_world {
	const struct vps_layout *a, *b;
	int64_t wa, wb, w;
	bool packed;
	int64_t lo, hi;        /* packed: B ranks on A's devices */
	int64_t *join_of_b;    /* listed: world rank per B rank */
	int64_t *b_of_join;    /* listed: B rank per joining world rank - wa */
};

vps_result_t vps_world_new(struct vps_world **out, const struct vps_layout *a, const struct vps_layout *b)
{
	struct vps_world *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	w->a = a;
	w->b = b;
	w->wa = vps_layout_world(a);
	w->wb = vps_layout_world(b);
	const struct vps_devices *da = vps_layout_devices(a), *db = vps_layout_devices(b);
	if (da->packed && db->packed && da->gpus_per_node == db->gpus_per_node) {
		int64_t g = da->gpus_per_node;
		int64_t a0 = da->first_node * g, b0 = db->first_node * g;
		int64_t lo = vps_max64(a0, b0), hi = vps_min64(a0 + w->wa, b0 + w->wb);
		w->packed = true;
		w->lo = lo < hi ? lo - b0 : 0;
		w->hi = lo < hi ? hi - b0 : 0;
		w->w = w->wa + w->wb - (w->hi - w->lo);
	} else {
		w->join_of_b = vps_malloc((size_t)w->wb * sizeof(*w->join_of_b));
		w->b_of_join = vps_malloc((size_t)w->wb * sizeof(*w->b_of_join));
		if (!w->join_of_b || !w->b_of_join) {
			vps_world_free(w);
			return VPS_ENOMEM;
		}
		int64_t joins = 0;
		for (int64_t rb = 0; rb < w->wb; rb++) {
			int64_t ra = vps_layout_rank_on(a, vps_layout_device(b, rb));
			if (ra >= 0) {
				w->join_of_b[rb] = ra;
			} else {
				w->b_of_join[joins] = rb;
				w->join_of_b[rb] = w->wa + joins++;
			}
		}
		w->w = w->wa + joins;
	}
	*out = w;
	return VPS_OK;
}

void vps_world_free(struct vps_world *w)
{
	if (!w)
		return;
	free(w->join_of_b);
	free(w->b_of_join);
	free(w);
}

int64_t vps_world_size(const struct vps_world *w) { return w->w; }

int64_t vps_world_a_rank(const struct vps_world *w, int64_t wr) { return wr < w->wa ? wr : -1; }

int64_t vps_world_b_rank(const struct vps_world *w, int64_t wr)
{
	if (wr < 0 || wr >= w->w)
		return -1;
	if (wr < w->wa)
		return vps_layout_rank_on(w->b, vps_layout_device(w->a, wr));
	int64_t j = wr - w->wa;
	if (!w->packed)
		return w->b_of_join[j];
	return j < w->lo ? j : w->hi + (j - w->lo);
}

int64_t vps_world_of_b(const struct vps_world *w, int64_t rb)
{
	if (!w->packed)
		return w->join_of_b[rb];
	if (rb >= w->lo && rb < w->hi)
		return vps_layout_rank_on(w->a, vps_layout_device(w->b, rb));
	return w->wa + (rb < w->lo ? rb : rb - (w->hi - w->lo));
}

struct vps_device vps_world_device(const struct vps_world *w, int64_t wr)
{
	if (wr < w->wa)
		return vps_layout_device(w->a, wr);
	return vps_layout_device(w->b, vps_world_b_rank(w, wr));
}

int64_t vps_world_of_device(const struct vps_world *w, struct vps_device dev)
{
	int64_t ra = vps_layout_rank_on(w->a, dev);
	if (ra >= 0)
		return ra;
	int64_t rb = vps_layout_rank_on(w->b, dev);
	return rb >= 0 ? vps_world_of_b(w, rb) : -1;
}

static bool on_node(const struct vps_layout *l, int32_t node)
{
	int64_t w = vps_layout_world(l);
	for (int64_t r = 0; r < w; r++)
		if (vps_layout_device(l, r).node != node)
			return false;
	return true;
}

bool vps_world_one_node(const struct vps_layout *a, const struct vps_layout *b)
{
	int32_t node = vps_layout_device(a, 0).node;
	return on_node(a, node) && on_node(b, node);
}
