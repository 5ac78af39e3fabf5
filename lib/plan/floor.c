/* The time floor of a transition, from its two layouts and a topology
 * alone. It reads no plan on purpose: the statistics compare the planner's
 * estimate with it, and a bug in the planner must not be able to move both.
 * It assumes what vps's plans without relays do, that each element goes
 * straight from a device that holds it under A to each device that needs it
 * under B, each device's links at full rate in each direction at once,
 * latency aside. vps_time_floor_relayed is the floor of plans whose
 * receivers pass on what they received: each device's bytes over both
 * links together; each replica set's elements that no rank outside it
 * holds and a device outside it needs, sent by its members once (not once
 * a receiver), over the links that can carry them; and each node's
 * elements that must enter it (needed there, held by none of its devices)
 * or leave it (held by its devices alone, needed elsewhere), once, over
 * its devices' NICs; and, since an element is only ever on nodes that
 * hold or need it, what a receiver takes over NVLink alone (needed_away)
 * and what a set of nodes must send over their NICs together
 * (node_groups_floor). */
#include <inttypes.h>
#include <math.h>

#include "model/cover.h"
#include "model/world.h"
#include "util/hash.h"
#include "util/internal.h"
#include "util/slots.h"
#include "vps/plan.h"

/* Boxes of the holders of one B region, by the holders' kind. */
struct floor_boxes {
	struct vps_box *own, *loc, *rem, *all;
	size_t nown, nloc, nrem, nall, cap;
};

static void floor_boxes_release(struct floor_boxes *f)
{
	free(f->own);
	free(f->loc);
	free(f->rem);
	free(f->all);
}

static vps_result_t floor_boxes_reserve(struct floor_boxes *f, size_t n)
{
	if (n <= f->cap)
		return VPS_OK;
	size_t cap = f->cap ? f->cap : 16;
	while (cap < n)
		cap *= 2;
	struct vps_box **arrs[] = {&f->own, &f->loc, &f->rem, &f->all};
	for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
		struct vps_box *p = vps_realloc_array(*arrs[i], cap, sizeof(**arrs[i]));
		if (!p)
			return VPS_NOMEM();
		*arrs[i] = p;
	}
	f->cap = cap;
	return VPS_OK;
}

/* Elements of target that the union of boxes a[0..na) and b[0..nb) covers. */
static vps_result_t covered(const struct vps_box *a, size_t na, const struct vps_box *b, size_t nb,
			    struct vps_box *scratch, const struct vps_box *target, int64_t *out)
{
	if (na)
		memcpy(scratch, a, na * sizeof(*a));
	if (nb)
		memcpy(scratch + na, b, nb * sizeof(*b));
	int64_t u = vps_boxes_uncovered(scratch, na + nb, target);
	if (u < 0)
		return VPS_NOMEM();
	*out = vps_box_volume(target) - u;
	return VPS_OK;
}

/* Whether the progression holds rank r. */
static bool prog_has(const struct vps_holder *h, int64_t r)
{
	if (h->count <= 0)
		return false;
	if (h->stride == 0 || h->count == 1)
		return r == h->base;
	int64_t d = r - h->base;
	return d % h->stride == 0 && d / h->stride >= 0 && d / h->stride < h->count;
}

/* Whether a rank of the progression sits on node, and whether one sits
 * elsewhere; stops as soon as both are known, so a progression is walked
 * at most past the ranks of one node. */
static void prog_nodes(const struct vps_layout *a, const struct vps_holder *h, int32_t node, bool *on, bool *off)
{
	*on = *off = false;
	for (int64_t k = 0; k < h->count && !(*on && *off); k++) {
		if (vps_layout_device(a, h->base + k * h->stride).node == node)
			*on = true;
		else
			*off = true;
	}
}

/* A replica set: the A ranks base + k * stride, k < count, that hold one
 * region alike. Its bytes: those of elements no rank outside it holds, for
 * each device that needs them, by the links that can carry them. */
struct rset {
	int64_t base, stride, count;
	int64_t loc, rem, any; /* NVLink only, NIC only, either */
};

/* Relayed plans: a box of one (group, tensor, state) that must cross the
 * group's edge (another: false), or that is on the other side too
 * (another: true). A group is a replica set (what a device outside it
 * needs from it; on and off: the set has a member on that device's node,
 * and one elsewhere), what enters a node (what its devices need from
 * holders none of which has a member there) or what leaves one (what
 * devices elsewhere need from holders all on it). */
enum sent_group { SENT_BY_SET, SENT_INTO_NODE, SENT_OUT_OF_NODE };

struct sent_box {
	uint8_t kind; /* enum sent_group */
	uint32_t id;  /* the set's index, or the node's in floor_acc.nodes */
	uint32_t tensor;
	uint8_t state, dtype;
	bool another, on, off;
	struct vps_box box;
};

/* A node of either layout: the most devices it can have (its highest GPU
 * index, plus one), and the bytes that must enter and leave it. */
struct floor_node {
	int32_t node, gpus;
	int64_t in, out;
};

struct floor_acc {
	struct rset *set;
	size_t nset, capset;
	struct sent_box *sent; /* relayed only */
	size_t nsent, capsent;
	struct floor_node *nodes; /* relayed only: by node number */
	size_t nnodes;
	struct vps_slots slots;
	struct vps_time_floor best;
	bool relayed; /* receivers may pass on: each device's bytes at both bandwidths */
	double bi, be;
	double both; /* a device's links together: NVLink alone where every device is on one node */
};

static uint64_t rset_hash(int64_t base, int64_t stride, int64_t count)
{
	int64_t k[3] = {base, stride, count};
	return vps_hash64(k, sizeof(k), 13);
}

static uint64_t rset_hash_at(const void *entries, size_t i)
{
	const struct rset *x = &((const struct rset *)entries)[i];
	return rset_hash(x->base, x->stride, x->count);
}

/* The set of these ranks (one rank: stride 0), made when new. */
static vps_result_t rset_get(struct floor_acc *f, int64_t base, int64_t stride, int64_t count, struct rset **out)
{
	if (count == 1)
		stride = 0;
	VPS_CHECK(vps_slots_room(&f->slots, f->nset, 256, rset_hash_at, f->set, "replica sets"));
	size_t at = vps_slots_start(&f->slots, rset_hash(base, stride, count));
	for (; f->slots.slot[at]; at = vps_slots_next(&f->slots, at)) {
		struct rset *x = &f->set[f->slots.slot[at] - 1];
		if (x->base == base && x->stride == stride && x->count == count) {
			*out = x;
			return VPS_OK;
		}
	}
	VPS_CHECK(VPS_GROW(f->set, f->capset, f->nset + 1));
	f->set[f->nset] = (struct rset){base, stride, count, 0, 0, 0};
	f->slots.slot[at] = (uint32_t)f->nset + 1;
	*out = &f->set[f->nset++];
	return VPS_OK;
}

/* The replica set of holder x's ranks, which must lie in A's world. */
static vps_result_t holder_set(const struct vps_layout *a, struct floor_acc *acc, const struct vps_holder *x,
			      struct rset **out)
{
	int64_t last = x->base + (x->count - 1) * x->stride;
	if (x->base < 0 || x->base >= vps_layout_world(a) || last < 0 || last >= vps_layout_world(a))
		return vps_fail(VPS_EINPUT, "layout A names ranks outside its world");
	return rset_get(acc, x->base, x->stride, x->count, out);
}

/* Bytes a set sends to devices (on: a member shares a device's node; off:
 * a member is on another): over NVLink only where no member is elsewhere,
 * over a NIC only where none shares a node, else over either. */
static void set_add(struct rset *set, bool on, bool off, int64_t bytes)
{
	if (!off)
		set->loc += bytes;
	else if (!on)
		set->rem += bytes;
	else
		set->any += bytes;
}

/* One B rank: what it must receive, and what each sole holder must send it. */
/* One B region of the rank on device dev (A rank ra there, or -1), being
 * weighed against its holders under A. */
struct floor_region {
	const struct vps_region *R;
	int64_t ra;
	struct vps_device dev;
	int64_t esz;
	struct vps_box *scratch; /* room for twice the holders' boxes */
};

/* Bytes of region R the device must receive, over NVLink only (need[0]),
 * over a NIC only (need[1]) or over either (need[2]): by inclusion and
 * exclusion over the region, own elements aside. *call: the elements any
 * holder covers. */
static vps_result_t region_needs(const struct vps_layout *a, const struct floor_region *fr,
				 const struct vps_holders *h, struct floor_boxes *fb, int64_t *need, int64_t *call)
{
	const struct vps_box *box = &fr->R->box;
	fb->nown = fb->nloc = fb->nrem = fb->nall = 0;
	for (size_t k = 0; k < h->n; k++) {
		const struct vps_holder *x = &h->v[k];
		if (x->count <= 0)
			continue;
		fb->all[fb->nall++] = x->region.box;
		if (fr->ra >= 0 && prog_has(x, fr->ra)) {
			fb->own[fb->nown++] = x->region.box;
			continue;
		}
		bool on, off;
		prog_nodes(a, x, fr->dev.node, &on, &off);
		if (on)
			fb->loc[fb->nloc++] = x->region.box;
		if (off)
			fb->rem[fb->nrem++] = x->region.box;
	}
	int64_t own, cl, cr;
	VPS_CHECK(covered(fb->own, fb->nown, NULL, 0, fr->scratch, box, &own));
	VPS_CHECK(covered(fb->own, fb->nown, fb->loc, fb->nloc, fr->scratch, box, &cl));
	VPS_CHECK(covered(fb->own, fb->nown, fb->rem, fb->nrem, fr->scratch, box, &cr));
	VPS_CHECK(covered(fb->all, fb->nall, NULL, 0, fr->scratch, box, call));
	int64_t nl = cl - own, nr = cr - own, nall = *call - own, both = nl + nr - nall;
	need[0] = (nl - both) * fr->esz;
	need[1] = (nr - both) * fr->esz;
	need[2] = both * fr->esz;
	return VPS_OK;
}

/* Elements of region R that only one holder's ranks have: those ranks must
 * send them, over NVLink where they all sit on this node, over their NICs
 * where none does; added to that replica set's bytes in acc. */
static vps_result_t region_only(const struct vps_layout *a, struct floor_acc *acc, const struct floor_region *fr,
				const struct vps_holders *h, int64_t call)
{
	for (size_t k = 0; k < h->n; k++) {
		const struct vps_holder *x = &h->v[k];
		if (x->count <= 0 || (fr->ra >= 0 && prog_has(x, fr->ra)))
			continue;
		size_t n = 0;
		for (size_t j = 0; j < h->n; j++)
			if (j != k && h->v[j].count > 0)
				fr->scratch[n++] = h->v[j].region.box;
		int64_t u = vps_boxes_uncovered(fr->scratch, n, &fr->R->box);
		if (u < 0)
			return VPS_NOMEM();
		int64_t only = (call - (vps_box_volume(&fr->R->box) - u)) * fr->esz;
		if (!only)
			continue;
		struct rset *set;
		VPS_CHECK(holder_set(a, acc, x, &set));
		bool on, off;
		prog_nodes(a, x, fr->dev.node, &on, &off);
		set_add(set, on, off, only);
	}
	return VPS_OK;
}

static vps_result_t push_sent(struct floor_acc *acc, struct sent_box x)
{
	VPS_CHECK(VPS_GROW(acc->sent, acc->capsent, acc->nsent + 1));
	acc->sent[acc->nsent++] = x;
	return VPS_OK;
}

static int node_cmp(const void *p, const void *q)
{
	const struct floor_node *x = p, *y = q;
	return x->node < y->node ? -1 : x->node > y->node;
}

/* Every node of both layouts, with its devices. */
static vps_result_t floor_nodes(struct floor_acc *acc, const struct vps_layout *a, const struct vps_layout *b)
{
	int64_t wa = vps_layout_world(a), wb = vps_layout_world(b);
	struct floor_node *v = vps_calloc((size_t)(wa + wb), sizeof(*v));
	if (!v)
		return VPS_NOMEM();
	for (int64_t r = 0; r < wa + wb; r++) {
		struct vps_device d = r < wa ? vps_layout_device(a, r) : vps_layout_device(b, r - wa);
		v[r] = (struct floor_node){d.node, d.gpu + 1, 0, 0};
	}
	qsort(v, (size_t)(wa + wb), sizeof(*v), node_cmp);
	size_t n = 0;
	for (int64_t r = 0; r < wa + wb; r++) {
		if (n && v[n - 1].node == v[r].node)
			v[n - 1].gpus = v[r].gpus > v[n - 1].gpus ? v[r].gpus : v[n - 1].gpus;
		else
			v[n++] = v[r];
	}
	acc->nodes = v;
	acc->nnodes = n;
	return VPS_OK;
}

/* The nodes are those of every device of the layouts, so any device's or
 * holder's node is among them; one that is not would index past them. */
static vps_result_t node_index(const struct floor_acc *acc, int32_t node, uint32_t *index)
{
	struct floor_node key = {.node = node};
	const struct floor_node *f = bsearch(&key, acc->nodes, acc->nnodes, sizeof(key), node_cmp);
	if (!f)
		return vps_fail(VPS_EINPUT, "node %d holds no device of the layouts", (int)node);
	*index = (uint32_t)(f - acc->nodes);
	return VPS_OK;
}

/* Relayed plans, this device's region R: what each holder's set could be
 * asked for (R within its box), what must enter the device's node, and
 * what must leave the node of a holder that is all on one other node;
 * each with what others on the far side cover there. */
static vps_result_t region_sends(const struct vps_layout *a, struct floor_acc *acc, const struct floor_region *fr,
				 const struct vps_holders *h)
{
	uint32_t here, away;
	VPS_CHECK(node_index(acc, fr->dev.node, &here));
	for (size_t k = 0; k < h->n; k++) {
		const struct vps_holder *x = &h->v[k];
		struct vps_box need;
		if (x->count <= 0 || !vps_box_intersect(&fr->R->box, &x->region.box, &need))
			continue;
		struct rset *set;
		VPS_CHECK(holder_set(a, acc, x, &set));
		struct sent_box sb = {.tensor = fr->R->tensor, .state = fr->R->state, .dtype = fr->R->dtype, .box = need};
		prog_nodes(a, x, fr->dev.node, &sb.on, &sb.off);
		/* into this node: from holders with no member here */
		sb.kind = SENT_INTO_NODE;
		sb.id = here;
		sb.another = sb.on;
		VPS_CHECK(push_sent(acc, sb));
		if (!(fr->ra >= 0 && prog_has(x, fr->ra))) {
			sb.kind = SENT_BY_SET;
			sb.id = (uint32_t)(set - acc->set);
			sb.another = false;
			VPS_CHECK(push_sent(acc, sb));
			for (size_t j = 0; j < h->n; j++) {
				sb.another = true;
				if (j != k && h->v[j].count > 0 && vps_box_intersect(&need, &h->v[j].region.box, &sb.box))
					VPS_CHECK(push_sent(acc, sb));
			}
		}
		/* out of the node the holder is all on, where this device is not */
		int32_t home = vps_layout_device(a, x->base).node;
		bool on, off;
		prog_nodes(a, x, home, &on, &off);
		if (off || home == fr->dev.node)
			continue;
		VPS_CHECK(node_index(acc, home, &away));
		sb = (struct sent_box){SENT_OUT_OF_NODE, away, fr->R->tensor, fr->R->state, fr->R->dtype, false, false, false,
				       need};
		VPS_CHECK(push_sent(acc, sb));
		for (size_t j = 0; j < h->n; j++) {
			if (j == k || h->v[j].count <= 0)
				continue;
			prog_nodes(a, &h->v[j], home, &on, &off);
			sb.another = true;
			if (off && vps_box_intersect(&need, &h->v[j].region.box, &sb.box))
				VPS_CHECK(push_sent(acc, sb));
		}
	}
	return VPS_OK;
}

/* Pairs of single-rank holders that share elements no other holder has
 * (a tied embedding's two copies, one a stage): the pair must send them,
 * and rset_bound adds each member's own bytes to the pair's, which neither
 * member's bound sees (each took the other for their sender; gpt3's
 * -tp-down-back lay 1.06-1.16x above a floor no plan reaches). Directly
 * the pair's set takes the bytes this device needs; relayed, the boxes go
 * to the set's edge, each element once. At most PAIR_HOLDERS holders a
 * region (more: no pairs, a floor as before). */
#define PAIR_HOLDERS 16
static vps_result_t region_pairs(const struct vps_layout *a, struct floor_acc *acc, const struct floor_region *fr,
				 const struct vps_holders *h)
{
	if (h->n > PAIR_HOLDERS)
		return VPS_OK;
	for (size_t k = 0; k < h->n; k++) {
		const struct vps_holder *x = &h->v[k];
		if (x->count != 1 || (fr->ra >= 0 && x->base == fr->ra))
			continue;
		for (size_t j = k + 1; j < h->n; j++) {
			const struct vps_holder *y = &h->v[j];
			struct vps_box both;
			if (y->count != 1 || y->base == x->base || (fr->ra >= 0 && y->base == fr->ra) ||
			    !vps_box_intersect(&x->region.box, &y->region.box, &both) ||
			    !vps_box_intersect(&both, &fr->R->box, &both))
				continue;
			size_t n = 0;
			for (size_t i = 0; i < h->n; i++)
				if (i != k && i != j && h->v[i].count > 0)
					fr->scratch[n++] = h->v[i].region.box;
			int64_t u = vps_boxes_uncovered(fr->scratch, n, &both);
			if (u < 0)
				return VPS_NOMEM();
			if (!u)
				continue;
			struct rset *set;
			int64_t lo = vps_min64(x->base, y->base), hi = vps_max64(x->base, y->base);
			VPS_CHECK(rset_get(acc, lo, hi - lo, 2, &set));
			bool xon, xoff, yon, yoff;
			prog_nodes(a, x, fr->dev.node, &xon, &xoff);
			prog_nodes(a, y, fr->dev.node, &yon, &yoff);
			if (!acc->relayed) {
				set_add(set, xon || yon, xoff || yoff, u * fr->esz);
				continue;
			}
			struct sent_box sb = {.kind = SENT_BY_SET, .id = (uint32_t)(set - acc->set), .tensor = fr->R->tensor,
					      .state = fr->R->state, .dtype = fr->R->dtype, .on = xon || yon,
					      .off = xoff || yoff, .box = both};
			VPS_CHECK(push_sent(acc, sb));
			sb.another = true;
			for (size_t i = 0; i < n; i++)
				if (vps_box_intersect(&both, &fr->scratch[i], &sb.box))
					VPS_CHECK(push_sent(acc, sb));
		}
	}
	return VPS_OK;
}

static int sent_cmp(const void *p, const void *q)
{
	const struct sent_box *x = p, *y = q;
	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	if (x->another != y->another)
		return x->another ? 1 : -1;
	return vps_box_order(&x->box, &y->box);
}

/* Each (group, tensor, state): the elements that must cross its edge and
 * that nothing on the far side has, vol(needed U others) - vol(others),
 * once: a set's bytes by the links that can carry them (a device on a
 * member's node, or one elsewhere, may have them first and pass them on),
 * a node's bytes in and out. */
static vps_result_t edges_cross_once(struct floor_acc *acc)
{
	qsort(acc->sent, acc->nsent, sizeof(*acc->sent), sent_cmp);
	struct vps_box *boxes = NULL;
	size_t capboxes = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0, j; !rc && i < acc->nsent; i = j) {
		const struct sent_box *g = &acc->sent[i];
		size_t n = 0, nothers = 0;
		bool on = false, off = false;
		for (j = i; j < acc->nsent && acc->sent[j].kind == g->kind && acc->sent[j].id == g->id &&
			    acc->sent[j].tensor == g->tensor && acc->sent[j].state == g->state;
		     j++) {
			const struct sent_box *x = &acc->sent[j];
			on |= !x->another && x->on;
			off |= !x->another && x->off;
			if (n && vps_box_equal(&boxes[n - 1], &x->box) && x->another == (nothers > 0))
				continue;
			rc = vps_grow((void **)&boxes, &capboxes, n + 1, sizeof(*boxes));
			if (rc)
				break;
			boxes[n++] = x->box;
			nothers += x->another;
		}
		if (rc)
			break;
		/* the others sort last: boxes[n - nothers..n) */
		int64_t all = vps_boxes_union_volume(boxes, n);
		int64_t others = vps_boxes_union_volume(boxes + (n - nothers), nothers);
		if (all < 0 || others < 0) {
			rc = VPS_NOMEM();
			break;
		}
		int64_t bytes = (all - others) * (int64_t)vps_dtype_size(vps_dtype_of(g->dtype, g->state));
		if (g->kind == SENT_BY_SET)
			set_add(&acc->set[g->id], on, off, bytes);
		else if (g->kind == SENT_INTO_NODE)
			acc->nodes[g->id].in += bytes;
		else
			acc->nodes[g->id].out += bytes;
	}
	free(boxes);
	return rc;
}

/* Whether a device on another node than fr's needs any of fr's region
 * under B: where none does, and none there holds it under A, no device
 * of another node ever has it (only holders and receivers pass elements
 * on), and fr's device takes it over NVLink alone. */
static vps_result_t needed_away(const struct vps_layout *b, const struct floor_region *fr, struct vps_holders *hb,
				bool *away)
{
	*away = false;
	hb->n = 0;
	VPS_CHECK(vps_layout_holders(b, fr->R->tensor, fr->R->state, &fr->R->box, hb));
	for (size_t k = 0; k < hb->n && !*away; k++) {
		bool on, off;
		prog_nodes(b, &hb->v[k], fr->dev.node, &on, &off);
		*away = off;
	}
	return VPS_OK;
}

static vps_result_t floor_rank(const struct vps_layout *a, const struct vps_layout *b, int64_t rb,
			       struct floor_acc *acc, struct vps_holders *h, struct vps_holders *hb, struct floor_boxes *fb)
{
	struct floor_region fr = {.dev = vps_layout_device(b, rb)};
	fr.ra = vps_layout_rank_on(a, fr.dev);
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(b, rb, &v));
	vps_result_t rc = VPS_OK;
	int64_t loc = 0, rem = 0, any = 0, only_here = 0;
	size_t capscratch = 0;
	for (size_t i = 0; !rc && i < v.nregions; i++) {
		int64_t need[3], call;
		fr.R = &v.regions[i];
		fr.esz = (int64_t)vps_dtype_size(vps_region_dtype(fr.R));
		h->n = 0;
		rc = vps_layout_holders(a, fr.R->tensor, fr.R->state, &fr.R->box, h);
		if (!rc)
			rc = floor_boxes_reserve(fb, h->n + 1);
		if (!rc)
			rc = vps_grow((void **)&fr.scratch, &capscratch, 2 * h->n + 1, sizeof(*fr.scratch));
		if (!rc)
			rc = region_needs(a, &fr, h, fb, need, &call);
		if (rc)
			break;
		loc += need[0];
		rem += need[1];
		any += need[2];
		if (acc->relayed && need[0] > 0) {
			bool away;
			rc = needed_away(b, &fr, hb, &away);
			if (!rc && !away)
				only_here += need[0];
		}
		if (!rc)
			rc = acc->relayed ? region_sends(a, acc, &fr, h) : region_only(a, acc, &fr, h, call);
		if (!rc)
			rc = region_pairs(a, acc, &fr, h);
	}
	free(fr.scratch);
	vps_rank_view_release(&v);
	if (rc)
		return rc;
	double t = (double)(loc + rem + any) / acc->both;
	if (!acc->relayed)
		t = fmax(t, fmax((double)loc / acc->bi, (double)rem / acc->be));
	else
		t = fmax(t, (double)only_here / acc->bi);
	if (t > acc->best.seconds)
		acc->best = (struct vps_time_floor){.seconds = t,
						    .device = fr.dev,
						    .senders = 0,
						    .receives = true,
						    .by = VPS_FLOOR_RECEIVER,
						    .local_bytes = loc,
						    .remote_bytes = rem,
						    .either_bytes = any};
	return VPS_OK;
}

/* The members of a set together send its bytes and each member's own:
 * the busiest member sends at least the average. */
static vps_result_t rset_bound(struct floor_acc *f, const struct vps_layout *a, size_t i)
{
	struct rset x = f->set[i];
	if (x.count > 1) {
		for (int64_t k = 0; k < x.count; k++) {
			struct rset *one;
			VPS_CHECK(rset_get(f, x.base + k * x.stride, 0, 1, &one));
			x.loc += one->loc;
			x.rem += one->rem;
			x.any += one->any;
		}
	}
	double c = (double)x.count;
	double t = fmax(fmax((double)x.loc / (c * f->bi), (double)x.rem / (c * f->be)),
			(double)(x.loc + x.rem + x.any) / (c * f->both));
	if (t > f->best.seconds)
		f->best = (struct vps_time_floor){.seconds = t,
						  .device = vps_layout_device(a, x.base),
						  .receives = false,
						  .by = VPS_FLOOR_SENDERS,
						  .senders = x.count,
						  .local_bytes = x.loc,
						  .remote_bytes = x.rem,
						  .either_bytes = x.any};
	return VPS_OK;
}

/* What must enter or leave a node crosses its devices' NICs, each at most
 * once at a time. */
static void node_bound(struct floor_acc *f, const struct floor_node *n)
{
	double nics = (double)n->gpus * f->be;
	for (int way = 0; way < 2; way++) {
		int64_t bytes = way ? n->out : n->in;
		double t = (double)bytes / nics;
		if (t > f->best.seconds)
			f->best = (struct vps_time_floor){.seconds = t,
							  .device = {n->node, 0},
							  .receives = !way,
							  .by = way ? VPS_FLOOR_NODE_OUT : VPS_FLOOR_NODE_IN,
							  .senders = way ? n->gpus : 0,
							  .remote_bytes = bytes};
	}
}

/* ---- node groups: relays' entries and exits over the NICs of a set of nodes ----
 *
 * An element that devices on the nodes N need and none of them holds
 * (holders on the nodes H) enters each node of N at least once over a NIC,
 * and only a device that holds it or has received it can send it: every
 * sender sits on a node of U = H + N. So for any set of nodes S, the NICs
 * of S send at least, of each element with U within S, one entry for each
 * node of N, and of each element held within S alone and needed outside
 * it, one exit (the first device outside S to have it took it from S).
 * Alone, a node's bound is what must leave it (node_bound); together,
 * nodes that hold a stage and nodes that relay it among themselves carry
 * its entries beside their own exits (llama2-13b-tp-down-back: the
 * devices of A's stage 1 send it into nodes 2 and 3, whose NICs already
 * carry their own stages out; it enters one of them twice, from node 1 or
 * from the other). The sets weighed are the U's themselves. Worlds of at
 * most NODE_GROUP_NODES nodes (a set is a bit a node); a tensor whose
 * holders cut it into more than NODE_GROUP_CELLS cells is left out, as
 * are elements no device of A holds (a bound without them is still one). */
#define NODE_GROUP_NODES 64
#define NODE_GROUP_CELLS 4096
#define NODE_GROUP_RANKS 4096
/* Cells times holders weighed in all, at most: past it the tensors left
 * are left out (about a second of work; the largest of the paper's
 * transitions asks 0.5 million). */
#define NODE_GROUP_WORK ((int64_t)1 << 28)

struct node_group {
	uint64_t held, into; /* H, and N less H */
	int64_t bytes;
};

struct node_groups {
	struct node_group *v;
	size_t n, cap;
	struct vps_slots slots;
	int64_t work; /* cells times holders so far */
};

static uint64_t node_group_hash(uint64_t held, uint64_t into)
{
	uint64_t k[2] = {held, into};
	return vps_hash64(k, sizeof(k), 17);
}

static uint64_t node_group_hash_at(const void *entries, size_t i)
{
	const struct node_group *x = &((const struct node_group *)entries)[i];
	return node_group_hash(x->held, x->into);
}

static vps_result_t node_group_add(struct node_groups *g, uint64_t held, uint64_t into, int64_t bytes)
{
	VPS_CHECK(vps_slots_room(&g->slots, g->n, 64, node_group_hash_at, g->v, "node groups"));
	size_t at = vps_slots_start(&g->slots, node_group_hash(held, into));
	for (; g->slots.slot[at]; at = vps_slots_next(&g->slots, at)) {
		struct node_group *x = &g->v[g->slots.slot[at] - 1];
		if (x->held == held && x->into == into) {
			x->bytes = vps_sat_add(x->bytes, bytes);
			return VPS_OK;
		}
	}
	VPS_CHECK(VPS_GROW(g->v, g->cap, g->n + 1));
	g->v[g->n] = (struct node_group){held, into, bytes};
	g->slots.slot[at] = (uint32_t)g->n + 1;
	g->n++;
	return VPS_OK;
}

/* The nodes of a holder's ranks, as bits of acc->nodes' indices. */
static vps_result_t holder_nodes(const struct floor_acc *acc, const struct vps_layout *l, const struct vps_holder *x,
				 uint64_t *bits)
{
	*bits = 0;
	for (int64_t k = 0; k < x->count; k++) {
		uint32_t i;
		VPS_CHECK(node_index(acc, vps_layout_device(l, x->base + k * x->stride).node, &i));
		*bits |= (uint64_t)1 << i;
	}
	return VPS_OK;
}

/* Sorted, distinct edges of the boxes along axis. */
static size_t cuts_along(const struct vps_holders *ha, const struct vps_holders *hb, int axis, int64_t *cut, size_t cap)
{
	size_t n = 0;
	for (int side = 0; side < 2; side++) {
		const struct vps_holders *h = side ? hb : ha;
		for (size_t k = 0; k < h->n && n + 2 <= cap; k++) { /* cap holds them all (tensor_groups) */
			cut[n++] = h->v[k].region.box.lo[axis];
			cut[n++] = h->v[k].region.box.hi[axis];
		}
	}
	qsort(cut, n, sizeof(*cut), vps_int64_cmp);
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (!m || cut[m - 1] != cut[i])
			cut[m++] = cut[i];
	return m;
}

static bool box_within(const struct vps_box *x, const struct vps_box *in)
{
	for (int d = 0; d < x->ndim; d++)
		if (x->lo[d] < in->lo[d] || x->hi[d] > in->hi[d])
			return false;
	return true;
}

/* One (tensor, state): the cells its holders under A and B cut it into,
 * each added to the group of its nodes. */
static vps_result_t tensor_groups(const struct floor_acc *acc, const struct vps_layout *a, const struct vps_layout *b,
				  const struct vps_holders *ha, const struct vps_holders *hb, struct node_groups *g)
{
	/* every edge of every box is a cut: a cell lies within a box or
	 * outside it, never across */
	enum { HOLDERS = 64, CUTS = 2 * (HOLDERS + HOLDERS) };
	int64_t cut[VPS_MAX_DIMS][CUTS], at[VPS_MAX_DIMS] = {0};
	size_t ncut[VPS_MAX_DIMS], cells = 1;
	uint64_t abits[HOLDERS], bbits[HOLDERS];
	if (!ha->n || !hb->n || ha->n > HOLDERS || hb->n > HOLDERS)
		return VPS_OK;
	int ndim = ha->v[0].region.box.ndim;
	for (int d = 0; d < ndim; d++) {
		ncut[d] = cuts_along(ha, hb, d, cut[d], CUTS);
		if (ncut[d] < 2)
			return VPS_OK;
		cells *= ncut[d] - 1;
		if (cells > NODE_GROUP_CELLS)
			return VPS_OK;
	}
	g->work += (int64_t)cells * (int64_t)(ha->n + hb->n);
	if (g->work > NODE_GROUP_WORK)
		return VPS_OK;
	for (size_t k = 0; k < ha->n; k++) {
		if (ha->v[k].count > NODE_GROUP_RANKS)
			return VPS_OK;
		VPS_CHECK(holder_nodes(acc, a, &ha->v[k], &abits[k]));
	}
	for (size_t k = 0; k < hb->n; k++) {
		if (hb->v[k].count > NODE_GROUP_RANKS)
			return VPS_OK;
		VPS_CHECK(holder_nodes(acc, b, &hb->v[k], &bbits[k]));
	}
	for (size_t c = 0; c < cells; c++) {
		struct vps_box cell = {.ndim = ndim};
		for (int d = 0; d < ndim; d++) {
			cell.lo[d] = cut[d][at[d]];
			cell.hi[d] = cut[d][at[d] + 1];
		}
		/* the next cell: the last axis fastest */
		for (int d = ndim - 1; d >= 0; d--) {
			if (++at[d] < (int64_t)ncut[d] - 1)
				break;
			at[d] = 0;
		}
		uint64_t held = 0, need = 0;
		size_t dtype_of = SIZE_MAX;
		for (size_t k = 0; k < ha->n; k++)
			if (box_within(&cell, &ha->v[k].region.box))
				held |= abits[k];
		for (size_t k = 0; k < hb->n; k++)
			if (box_within(&cell, &hb->v[k].region.box)) {
				need |= bbits[k];
				dtype_of = k;
			}
		uint64_t into = need & ~held;
		if (!held || !into)
			continue;
		int64_t bytes;
		if (!vps_mul_ok(vps_box_volume(&cell), (int64_t)vps_dtype_size(vps_region_dtype(&hb->v[dtype_of].region)),
				&bytes))
			bytes = INT64_MAX;
		VPS_CHECK(node_group_add(g, held, into, bytes));
	}
	return VPS_OK;
}

/* The NICs of each set U of nodes send at least what its groups ask. */
static void node_groups_bound(struct floor_acc *f, const struct node_groups *g)
{
	for (size_t i = 0; i < g->n; i++) {
		uint64_t S = g->v[i].held | g->v[i].into;
		int64_t bytes = 0, nics = 0;
		bool again = false;
		for (size_t j = 0; j < i && !again; j++)
			again = (g->v[j].held | g->v[j].into) == S;
		if (again)
			continue;
		for (size_t j = 0; j < g->n; j++) {
			const struct node_group *x = &g->v[j];
			int64_t entries;
			if (!vps_mul_ok(x->bytes, __builtin_popcountll(x->into), &entries))
				entries = INT64_MAX;
			if (((x->held | x->into) & ~S) == 0)
				bytes = vps_sat_add(bytes, entries);
			else if ((x->held & ~S) == 0)
				bytes = vps_sat_add(bytes, x->bytes);
		}
		int32_t first = -1;
		for (size_t n = 0; n < f->nnodes; n++)
			if (S >> n & 1) {
				nics += f->nodes[n].gpus;
				if (first < 0)
					first = f->nodes[n].node;
			}
		double t = nics ? (double)bytes / ((double)nics * f->be) : 0;
		if (t > f->best.seconds)
			f->best = (struct vps_time_floor){.seconds = t,
							  .device = {first, 0},
							  .receives = false,
							  .by = VPS_FLOOR_NODES_OUT,
							  .senders = nics,
							  .remote_bytes = bytes};
	}
}

/* Every (tensor, state) grouped by its nodes, then each group's bound. */
static vps_result_t node_groups_floor(struct floor_acc *acc, const struct vps_layout *a, const struct vps_layout *b)
{
	if (acc->nnodes > NODE_GROUP_NODES || acc->nnodes < 2)
		return VPS_OK;
	const struct vps_model *m = vps_layout_model(b);
	struct vps_holders ha = {0}, hb = {0};
	struct node_groups g = {0};
	vps_result_t rc = VPS_OK;
	for (uint32_t t = 0; t < vps_model_num_tensors(m) && !rc; t++) {
		struct vps_tensor T;
		rc = vps_model_tensor(m, t, &T);
		for (int s = 0; s < VPS_NSTATES && !rc; s++) {
			if (!vps_layout_tensor_has_state(a, &T, (enum vps_state)s) ||
			    !vps_layout_tensor_has_state(b, &T, (enum vps_state)s))
				continue;
			struct vps_box whole = {.ndim = T.ndim};
			for (int d = 0; d < T.ndim; d++)
				whole.hi[d] = T.shape[d];
			ha.n = hb.n = 0;
			rc = vps_layout_holders(a, t, (enum vps_state)s, &whole, &ha);
			if (!rc)
				rc = vps_layout_holders(b, t, (enum vps_state)s, &whole, &hb);
			if (!rc)
				rc = tensor_groups(acc, a, b, &ha, &hb, &g);
		}
	}
	if (!rc)
		node_groups_bound(acc, &g);
	vps_holders_release(&ha);
	vps_holders_release(&hb);
	free(g.v);
	vps_slots_release(&g.slots);
	return rc;
}

static vps_result_t time_floor(const struct vps_layout *a, const struct vps_layout *b, const struct vps_topology *topo,
			       bool relayed, struct vps_time_floor *out)
{
	memset(out, 0, sizeof(*out));
	if (vps_model_hash(vps_layout_model(a)) != vps_model_hash(vps_layout_model(b)))
		return vps_fail(VPS_EINPUT, "the layouts are of different models (%s, %s)", vps_layout_model(a)->name,
				vps_layout_model(b)->name);
	if (!(topo->intra_node_bandwidth > 0) || !(topo->inter_node_bandwidth > 0))
		return vps_fail(VPS_EINPUT, "topology %s: bandwidths must be positive", topo->name);
	int64_t wb = vps_layout_world(b);
	struct floor_acc acc = {.bi = topo->intra_node_bandwidth, .be = topo->inter_node_bandwidth, .relayed = relayed};
	/* a node's NICs carry only what crosses nodes: in a world of one
	 * node no byte can take them, relayed or not */
	acc.both = vps_world_one_node(a, b) ? acc.bi : acc.bi + acc.be;
	struct vps_holders h = {0}, hb = {0};
	struct floor_boxes fb = {0};
	vps_result_t rc = VPS_OK;
	if (relayed)
		rc = floor_nodes(&acc, a, b);
	for (int64_t rb = 0; !rc && rb < wb; rb++)
		rc = floor_rank(a, b, rb, &acc, &h, &hb, &fb);
	if (!rc && relayed)
		rc = edges_cross_once(&acc);
	for (size_t i = 0; !rc && i < acc.nnodes; i++)
		node_bound(&acc, &acc.nodes[i]);
	if (!rc && relayed)
		rc = node_groups_floor(&acc, a, b);
	/* sets of one rank are added while the larger ones are bounded */
	size_t n = acc.nset;
	for (size_t i = 0; !rc && i < n; i++)
		rc = rset_bound(&acc, a, i);
	if (!rc)
		*out = acc.best;
	free(acc.set);
	free(acc.sent);
	free(acc.nodes);
	vps_slots_release(&acc.slots);
	vps_holders_release(&h);
	vps_holders_release(&hb);
	floor_boxes_release(&fb);
	return rc;
}

vps_result_t vps_time_floor(const struct vps_layout *a, const struct vps_layout *b, const struct vps_topology *topo,
			    struct vps_time_floor *out)
{
	return time_floor(a, b, topo, false, out);
}

vps_result_t vps_time_floor_relayed(const struct vps_layout *a, const struct vps_layout *b,
				    const struct vps_topology *topo, struct vps_time_floor *out)
{
	return time_floor(a, b, topo, true, out);
}
