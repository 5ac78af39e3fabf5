/* Transit: a node's NIC receives spread over its devices, and what its
 * devices take in alike taken in once (transit.h).
 *
 * The model is the plan estimate's (stats.c, device_estimate) restricted to
 * what the node's arrivals say: each device's NIC receives, NVLink
 * receives and NVLink sends to node-mates, each at its own bandwidth (and
 * for shares, its NIC sends). A device's NIC sends and its sends to other
 * nodes do not change, and no sender sends more: a part rerouted leaves
 * its sender as before, to another device of the same node, and what is
 * taken in once or shared leaves it once where it left twice. So the
 * node's busiest device, by this model, can only get faster, and the
 * plan's estimate cannot rise but by the latency of the new pairs of
 * peers, which the gain asked for (1%, or a latency a new node-mate) and
 * the smallest part (TRANSIT_MIN_BYTES) keep far below it. */
#include <math.h>
#include <string.h>

#include "plan/transit.h"

/* The least a part rerouted carries: below, a message's latency would
 * cost more than its bytes save. */
#define TRANSIT_MIN_BYTES ((int64_t)256 << 10)
/* What the node's busiest device must gain (as in relay_weigh and
 * relay_entry). */
#define TRANSIT_GAIN 0.99
/* What the node's busiest device must gain at least, in bytes of its NIC
 * time: new pairs of peers cost a message latency each, which the model
 * leaves out (20 us on a800-testbed, 0.5 MB of a 25 GB/s NIC; up to 32
 * new peers a device). */
#define TRANSIT_MIN_GAIN_BYTES ((int64_t)16 << 20)
/* Areas' ranges start on this many bytes (any element size divides it). */
#define TRANSIT_ALIGN 64
#define BISECTIONS 60

struct tdev {
	int64_t w; /* first: find() orders by it */
	double nic_recv, nvl_recv, nvl_send;
	double eligible; /* NIC arrivals it may have carried by another */
	int64_t area;    /* bytes of its transit area so far */
	int64_t area_max;
	uint64_t mates;  /* node-mates it newly shares with (bit i: device i, mod 64) */
	double nic_send; /* bytes it sends over its NICs (shares only) */
};

struct tnode {
	const struct vps_transit_node *tn;
	struct tdev *d;
	size_t n;
	bool nic_known; /* the devices' nic_send asked for (with_nic_sends) */
};

static struct tdev *find(const struct tnode *t, int64_t w)
{
	return bsearch(&w, t->d, t->n, sizeof(*t->d), vps_int64_cmp); /* w leads struct tdev */
}

static bool on_node(const struct tnode *t, int64_t w)
{
	return vps_world_device(t->tn->w, w).node == t->tn->node;
}

/* A piece that arrives over the receiver's NIC, from a holder or a relay
 * on another node, into a B buffer. */
static bool nic_arrival(const struct tnode *t, const struct vps_piece *x)
{
	return x->src != x->dst && !on_node(t, x->src) && !vps_piece_to_transit(x);
}

static double busiest(const struct tnode *t)
{
	const struct vps_transit_node *tn = t->tn;
	double most = 0;
	for (size_t i = 0; i < t->n; i++)
		most = fmax(most, fmax(t->d[i].nic_recv / tn->inter,
				       fmax(t->d[i].nvl_recv / tn->intra, t->d[i].nvl_send / tn->intra)));
	return most;
}

/* Whether, at time T, what lies above it of the devices' NIC receives can
 * go through devices with room below it, every device's NVLink within T. */
static bool feasible(const struct tnode *t, double T)
{
	const struct vps_transit_node *tn = t->tn;
	double shed = 0, room = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct tdev *d = &t->d[i];
		if (d->nvl_send > T * tn->intra || d->nvl_recv > T * tn->intra)
			return false;
		double over = d->nic_recv - T * tn->inter;
		if (over > 0) {
			if (over > d->eligible || d->nvl_recv + over > T * tn->intra)
				return false;
			shed += over;
		} else {
			room += fmin((double)d->area_max, fmin(-over, T * tn->intra - d->nvl_send));
		}
	}
	return shed <= room;
}

/* The least T feasible, between what no rerouting changes and T0. */
static double level(const struct tnode *t, double T0)
{
	double lo = 0, hi = T0;
	if (!feasible(t, hi))
		return T0;
	for (int k = 0; k < BISECTIONS; k++) {
		double mid = (lo + hi) / 2;
		if (feasible(t, mid))
			hi = mid;
		else
			lo = mid;
	}
	return hi;
}

/* Whether device e passes on any element of arrival x. */
static bool forwarded(const struct vps_pieces *f, const struct vps_piece *x)
{
	for (size_t k = 0; k < f->n; k++) {
		const struct vps_piece *y = &f->v[k];
		struct vps_box o;
		if (y->tensor == x->tensor && y->state == x->state && vps_buffer_index(y->src_buffer) == x->dst_buffer &&
		    vps_box_intersect(&y->box, &x->box, &o))
			return true;
	}
	return false;
}

static void rowmajor(const struct vps_box *b, int64_t *strides)
{
	int64_t s = 1;
	for (int a = b->ndim - 1; a >= 0; a--) {
		strides[a] = s;
		s *= b->hi[a] - b->lo[a];
	}
}

/* The first `rows` rows of x (along its first axis longer than one) as
 * *part; x keeps the rest. */
static void carve(struct vps_piece *x, int axis, int64_t rows, struct vps_piece *part)
{
	*part = *x;
	part->box.hi[axis] = x->box.lo[axis] + rows;
	x->box.lo[axis] += rows;
	x->src_offset += rows * x->src_strides[axis];
	x->dst_offset += rows * x->dst_strides[axis];
}

/* The arrival x (or its part) through carrier t: to t's area, and on from
 * there, a hop later. */
static vps_result_t through(struct vps_pieces *out, const struct vps_piece *x, struct tdev *t)
{
	int64_t esize = (int64_t)vps_dtype_size(vps_piece_dtype(x)), bytes = vps_piece_bytes(x);
	int64_t at = t->area / esize;
	VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + 2));
	struct vps_piece *in = &out->v[out->n++], *on = &out->v[out->n++];
	*in = *x;
	in->dst = t->w;
	in->dst_buffer = VPS_BUFFER_TRANSIT;
	in->dst_offset = at;
	rowmajor(&x->box, in->dst_strides);
	*on = *x;
	on->src = t->w;
	on->src_buffer = vps_buffer_at_hop(VPS_BUFFER_TRANSIT, vps_buffer_hop(x->src_buffer) + 1);
	on->src_offset = at;
	memcpy(on->src_strides, in->dst_strides, sizeof(on->src_strides));
	t->area += (bytes + TRANSIT_ALIGN - 1) / TRANSIT_ALIGN * TRANSIT_ALIGN;
	t->nic_recv += (double)bytes;
	t->nvl_send += (double)bytes;
	return VPS_OK;
}

/* The time of the busiest sender into the node over its NIC, by what it
 * sends into the node and by what it must send whatever the plan: a bound
 * below the plan's estimate that no rerouting inside the node changes. */
static double senders_floor(const struct vps_transit_node *tn, const struct vps_pieces *set)
{
	int64_t (*by)[2] = vps_calloc(set->n + 1, sizeof(*by));
	size_t n = 0;
	double most = 0;
	if (!by)
		return 0; /* no bound: the node alone decides */
	for (size_t i = 0; i < set->n; i++) {
		const struct vps_piece *x = &set->v[i];
		if (x->src != x->dst && vps_world_device(tn->w, x->src).node != tn->node) {
			by[n][0] = x->src;
			by[n++][1] = vps_piece_bytes(x);
		}
	}
	qsort(by, n, sizeof(*by), vps_int64_cmp);
	for (size_t i = 0, j; i < n; i = j) {
		int64_t sum = 0;
		for (j = i; j < n && by[j][0] == by[i][0]; j++)
			sum += by[j][1];
		most = fmax(most, fmax((double)sum / tn->inter, tn->least_send ? tn->least_send(tn->arg, by[i][0]) : 0));
	}
	free(by);
	return most;
}

/* Piece y restricted to box r (within y's box), at y's addresses. */
static void sub_piece(const struct vps_piece *y, const struct vps_box *r, struct vps_piece *out)
{
	*out = *y;
	out->box = *r;
	for (int k = 0; k < r->ndim; k++) {
		out->src_offset += (r->lo[k] - y->box.lo[k]) * y->src_strides[k];
		out->dst_offset += (r->lo[k] - y->box.lo[k]) * y->dst_strides[k];
	}
}

/* What the node's forwards need to know of a device: its relays' forwards
 * (the callback's, fetched once) and whether each piece of the set feeds
 * a forward made here. */
struct fwds {
	struct vps_pieces *of; /* by device, as t->d */
	bool *fetched;
	uint8_t *entry; /* by piece of the set: forwards here read it */
	size_t cap;
};

static vps_result_t fwds_of(struct tnode *t, struct fwds *f, size_t i, const struct vps_pieces **out)
{
	if (!f->fetched[i]) {
		VPS_CHECK(t->tn->forwards(t->tn->arg, t->d[i].w, &f->of[i]));
		f->fetched[i] = true;
	}
	*out = &f->of[i];
	return VPS_OK;
}

static vps_result_t mark(struct fwds *f, const struct vps_pieces *set)
{
	if (set->n <= f->cap)
		return VPS_OK;
	size_t cap = set->cap;
	uint8_t *e = realloc(f->entry, cap);
	if (!e)
		return VPS_ENOMEM;
	memset(e + f->cap, 0, cap - f->cap);
	f->entry = e;
	f->cap = cap;
	return VPS_OK;
}

/* Whether piece k of the set (an arrival into device d's B buffer) may be
 * cut or carried: nothing passes it on. */
static vps_result_t movable(struct tnode *t, struct fwds *f, const struct vps_pieces *set, size_t k, bool *yes)
{
	const struct vps_piece *x = &set->v[k];
	const struct vps_pieces *fw;
	*yes = false;
	if (f->entry[k] || vps_buffer_hop(x->src_buffer) >= VPS_MAX_HOP)
		return VPS_OK;
	VPS_CHECK(fwds_of(t, f, (size_t)(find(t, x->dst) - t->d), &fw));
	*yes = !forwarded(fw, x);
	return VPS_OK;
}

/* An arrival from another node, by what groups it: its (tensor, state),
 * then its device and its place in the set. */
struct cand {
	uint32_t tensor;
	uint8_t state;
	int64_t dst;
	size_t i;
};

static int cand_cmp(const void *p, const void *q)
{
	const struct cand *x = p, *y = q;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	return (x->i > y->i) - (x->i < y->i);
}

static vps_result_t push(struct vps_pieces *set, struct fwds *f, const struct vps_piece *x)
{
	VPS_CHECK(VPS_GROW(set->v, set->cap, set->n + 1));
	set->v[set->n++] = *x;
	return mark(f, set);
}

/* The pieces of one (tensor, state) that devices of the node take in, by
 * their place in the set (the parts enter_once cuts off join it). */
struct group {
	size_t *v, n, cap;
};

static vps_result_t group_add(struct group *g, size_t i)
{
	VPS_CHECK(VPS_GROW(g->v, g->cap, g->n + 1));
	g->v[g->n++] = i;
	return VPS_OK;
}

/* Piece y less box in, slab by slab along each axis, into the set and g. */
static vps_result_t push_rest(struct vps_pieces *set, struct fwds *f, struct group *g, const struct vps_piece *y,
			      const struct vps_box *in)
{
	struct vps_box rest = y->box;
	for (int k = 0; k < y->box.ndim; k++) {
		for (int side = 0; side < 2; side++) {
			struct vps_box r = rest;
			if (side == 0 ? rest.lo[k] >= in->lo[k] : in->hi[k] >= rest.hi[k])
				continue;
			if (side == 0)
				r.hi[k] = in->lo[k];
			else
				r.lo[k] = in->hi[k];
			struct vps_piece part;
			sub_piece(y, &r, &part);
			VPS_CHECK(push(set, f, &part));
			VPS_CHECK(group_add(g, set->n - 1));
		}
		rest.lo[k] = in->lo[k];
		rest.hi[k] = in->hi[k];
	}
	return VPS_OK;
}

/* Devices a and b of the node now exchange a piece. */
static void mates(const struct tnode *t, struct tdev *a, struct tdev *b)
{
	a->mates |= (uint64_t)1 << ((size_t)(b - t->d) % 64);
	b->mates |= (uint64_t)1 << ((size_t)(a - t->d) % 64);
}

/* Box in of piece cut (emptied: dropped at the end) instead from piece
 * ent's device, out of its B buffer where ent landed, a hop after ent;
 * the rest of cut stays, slab by slab, in g. With feeds, the new piece
 * joins g (it may feed another in turn). */
static vps_result_t pass_on(struct vps_pieces *set, struct fwds *f, struct group *g, size_t ent, size_t cut,
			    const struct vps_box *in, bool feeds)
{
	struct vps_piece y = set->v[cut], x = set->v[ent], on, from_x;
	sub_piece(&y, in, &on);
	sub_piece(&x, in, &from_x);
	on.src = x.dst;
	on.src_buffer = vps_buffer_at_hop(x.dst_buffer, vps_buffer_hop(x.src_buffer) + 1);
	on.src_offset = from_x.dst_offset;
	memcpy(on.src_strides, x.dst_strides, sizeof(on.src_strides));
	set->v[cut].box.hi[0] = set->v[cut].box.lo[0];
	f->entry[ent] = 1;
	VPS_CHECK(push(set, f, &on));
	if (feeds)
		VPS_CHECK(group_add(g, set->n - 1));
	return push_rest(set, f, g, &y, in);
}

/* Pieces ent and cut of the set, into two devices of the node, overlap in
 * box in: cut's device takes in from ent's B buffer, a hop later, where
 * neither's NVLink passes T0 and in holds least bytes or more; *done when
 * it did. */
static vps_result_t enter_pair(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct group *g, size_t ent,
			       size_t cut, const struct vps_box *in, double T0, double least, bool *done)
{
	const struct vps_transit_node *tn = t->tn;
	struct tdev *de = find(t, set->v[ent].dst), *dc = find(t, set->v[cut].dst);
	double bytes = (double)vps_box_volume(in) * (double)vps_dtype_size(vps_piece_dtype(&set->v[cut]));
	bool ok;
	*done = false;
	if (bytes < least || vps_buffer_hop(set->v[ent].src_buffer) >= VPS_MAX_HOP || de->nvl_send + bytes > T0 * tn->intra ||
	    dc->nvl_recv + bytes > T0 * tn->intra)
		return VPS_OK;
	VPS_CHECK(movable(t, f, set, cut, &ok));
	if (!ok)
		return VPS_OK;
	VPS_CHECK(pass_on(set, f, g, ent, cut, in, false));
	dc->nic_recv -= bytes;
	dc->nvl_recv += bytes;
	de->nvl_send += bytes;
	mates(t, de, dc);
	*done = true;
	return VPS_OK;
}

/* Elements that two devices of the node both take in from other nodes
 * (replicas of B) enter it once: one of them, the less busy over its NIC,
 * takes them and passes them on to the other over the node's links, a hop
 * later, as long as neither's NVLink gets busier than the node's busiest
 * device was. The other's sender sends them no more. */
static vps_result_t enter_group(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct group *g,
				const double *args)
{
	double T0 = args[0], least = args[1];
	for (size_t a = 0; a < g->n; a++) {
		for (size_t b = a + 1; b < g->n; b++) {
			size_t i = g->v[a], j = g->v[b];
			struct vps_box in;
			if (vps_box_volume(&set->v[i].box) == 0)
				break;
			if (set->v[i].dst == set->v[j].dst || vps_box_volume(&set->v[j].box) == 0 ||
			    !vps_box_intersect(&set->v[i].box, &set->v[j].box, &in))
				continue;
			/* the less busy NIC takes them in; else the other */
			bool done = false;
			bool i_first = find(t, set->v[i].dst)->nic_recv <= find(t, set->v[j].dst)->nic_recv;
			VPS_CHECK(enter_pair(t, f, set, g, i_first ? i : j, i_first ? j : i, &in, T0, least, &done));
			if (!done)
				VPS_CHECK(enter_pair(t, f, set, g, i_first ? j : i, i_first ? i : j, &in, T0, least, &done));
		}
	}
	return VPS_OK;
}

/* Pieces of the set as pick selects them, grouped by (tensor, state):
 * visit sees each group that lands on two devices or more, in order. */
struct group_visit {
	bool (*pick)(const struct tnode *t, const struct vps_piece *x);
	vps_result_t (*visit)(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct group *g, const double *args);
	const double *args;
};

static vps_result_t each_group(struct tnode *t, struct fwds *f, struct vps_pieces *set, const struct group_visit *gv)
{
	struct cand *idx = NULL;
	struct group g = {0};
	size_t n = 0, cap = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < set->n && !rc; i++) {
		const struct vps_piece *x = &set->v[i];
		if (!gv->pick(t, x))
			continue;
		rc = VPS_GROW(idx, cap, n + 1);
		if (!rc)
			idx[n++] = (struct cand){x->tensor, x->state, x->dst, i};
	}
	if (!rc && n > 1)
		qsort(idx, n, sizeof(*idx), cand_cmp);
	for (size_t g0 = 0, g1; g0 < n && !rc; g0 = g1) {
		for (g1 = g0 + 1; g1 < n && idx[g1].tensor == idx[g0].tensor && idx[g1].state == idx[g0].state; g1++)
			;
		if (idx[g0].dst == idx[g1 - 1].dst)
			continue; /* one device's alone */
		g.n = 0;
		for (size_t k = g0; k < g1 && !rc; k++)
			rc = group_add(&g, idx[k].i);
		if (!rc)
			rc = gv->visit(t, f, set, &g, gv->args);
	}
	free(idx);
	free(g.v);
	return rc;
}

static bool entering(const struct tnode *t, const struct vps_piece *x)
{
	return nic_arrival(t, x) && find(t, x->dst);
}

static vps_result_t enter_once(struct tnode *t, struct fwds *f, struct vps_pieces *set, double T0, double least)
{
	const double args[2] = {T0, least};
	const struct group_visit gv = {entering, enter_group, args};
	return each_group(t, f, set, &gv);
}

/* Device e's movable arrivals, by what it sheds: each to the carriers in
 * turn (*next, the first with room), whole or its first rows. */
static vps_result_t shed(struct tnode *t, struct fwds *f, struct tdev *e, double T, struct vps_pieces *set,
			 size_t *next, struct vps_pieces *out)
{
	const struct vps_transit_node *tn = t->tn;
	double need = e->nic_recv - T * tn->inter;
	for (size_t i = 0; i < set->n && need > 0 && *next < t->n; i++) {
		struct vps_piece *x = &set->v[i];
		bool ok = false;
		if (x->dst != e->w || !nic_arrival(t, x) || vps_box_volume(&x->box) == 0)
			continue;
		VPS_CHECK(movable(t, f, set, i, &ok));
		if (!ok)
			continue;
		while (need > 0 && *next < t->n && vps_box_volume(&x->box) > 0) {
			struct tdev *c = &t->d[*next];
			double room = c == e ? 0
					     : fmin((double)(c->area_max - c->area - TRANSIT_ALIGN),
						    fmin(T * tn->inter - c->nic_recv, T * tn->intra - c->nvl_send));
			if (room < (double)TRANSIT_MIN_BYTES) {
				++*next;
				continue;
			}
			int axis = 0;
			while (axis < x->box.ndim - 1 && x->box.hi[axis] - x->box.lo[axis] == 1)
				axis++;
			int64_t len = x->box.hi[axis] - x->box.lo[axis], bytes = vps_piece_bytes(x);
			int64_t row = bytes / len, take = vps_min64((int64_t)fmin(need, room) / row, len);
			if (take < len && take * row < TRANSIT_MIN_BYTES)
				break; /* too little of this one to cut it for */
			struct vps_piece part;
			if (take >= len) {
				part = *x;
				x->box.hi[axis] = x->box.lo[axis]; /* emptied: dropped below */
			} else {
				carve(x, axis, take, &part);
			}
			int64_t moved = vps_piece_bytes(&part);
			VPS_CHECK(through(out, &part, c));
			e->nic_recv -= (double)moved;
			e->nvl_recv += (double)moved;
			need -= (double)moved;
		}
	}
	return VPS_OK;
}

static void drop_emptied(struct vps_pieces *set)
{
	size_t kept = 0;
	for (size_t i = 0; i < set->n; i++)
		if (vps_box_volume(&set->v[i].box) > 0)
			set->v[kept++] = set->v[i];
	set->n = kept;
}

/* Each device's loads by the set as it stands. */
static void tally(struct tnode *t, const struct vps_pieces *set)
{
	for (size_t i = 0; i < t->n; i++)
		t->d[i].nic_recv = t->d[i].nvl_recv = t->d[i].nvl_send = 0;
	for (size_t i = 0; i < set->n; i++) {
		const struct vps_piece *x = &set->v[i];
		struct tdev *dst = find(t, x->dst), *src = x->src == x->dst ? NULL : find(t, x->src);
		double bytes = (double)vps_piece_bytes(x);
		if (!dst || x->src == x->dst)
			continue;
		if (on_node(t, x->src)) {
			dst->nvl_recv += bytes;
			if (src)
				src->nvl_send += bytes;
		} else {
			dst->nic_recv += bytes;
		}
	}
}

/* The set copied whole: kept before a try, put back where the try gains
 * too little. */
static vps_result_t copy_set(struct vps_pieces *to, const struct vps_pieces *from)
{
	to->n = 0;
	VPS_CHECK(VPS_GROW(to->v, to->cap, from->n));
	memcpy(to->v, from->v, from->n * sizeof(*from->v));
	to->n = from->n;
	return VPS_OK;
}

/* ---- sharing once over NVLink ----
 *
 * A device of the node that sends one box to two node-mates sends it to
 * one of them only where it is the node's busiest sender over NVLink: the
 * other takes the box from that one's B buffer, a hop later, as entering
 * once does for what comes over the NICs. No sender's NIC and no other
 * node changes; the sender's NVLink time falls by what it no longer sends
 * and the relay's rises as much, as long as it stays at or below the
 * node's level (the node's NVLink sends on average, or its busiest
 * receives or NIC sends, whichever is more). In llama2-13b-ablation-s1-s2 (data
 * parallelism 1 -> 4 on the node that holds the stage) each holder sent
 * every box to three node-mates, the holders with the most to send 1.08x
 * as busy as the node on average. */

/* What rounding may leave a relay above the level, relative. */
#define SHARE_SLACK (1 + 1e-9)

/* The level no sharing goes above: the node's NVLink sends on average, or
 * any device's receives or NIC sends (which sharing does not change). */
static double share_level(const struct tnode *t)
{
	const struct vps_transit_node *tn = t->tn;
	double sends = 0, most = 0;
	for (size_t i = 0; i < t->n; i++) {
		sends += t->d[i].nvl_send;
		most = fmax(most, fmax(fmax(t->d[i].nic_recv, t->d[i].nic_send) / tn->inter, t->d[i].nvl_recv / tn->intra));
	}
	return fmax(most, sends / (double)t->n / tn->intra);
}

/* The node's busiest device with its NIC sends: what a share can gain
 * (it changes no NIC). */
static double busiest_all(const struct tnode *t)
{
	double most = busiest(t);
	for (size_t i = 0; i < t->n; i++)
		most = fmax(most, t->d[i].nic_send / t->tn->inter);
	return most;
}

/* Each device's NIC sends (the callback's), and the node's busiest device
 * with them. */
static double with_nic_sends(struct tnode *t)
{
	for (size_t i = 0; i < t->n && !t->nic_known; i++)
		t->d[i].nic_send = t->tn->nic_sends ? t->tn->nic_sends(t->tn->arg, t->d[i].w) : 0;
	t->nic_known = true;
	return busiest_all(t);
}

/* Whether no device of the node, its new node-mates' message latencies
 * added, is busier than T0 (the node's busiest before, NIC sends counted). */
static bool within_with_latency(const struct tnode *t, double T0)
{
	const struct vps_transit_node *tn = t->tn;
	for (size_t i = 0; i < t->n; i++) {
		const struct tdev *d = &t->d[i];
		int k = 0;
		for (uint64_t m = d->mates; m; m &= m - 1)
			k++;
		double time = fmax(fmax(d->nic_recv, d->nic_send) / tn->inter, fmax(d->nvl_recv, d->nvl_send) / tn->intra);
		if (k && time + tn->latency * (double)k > T0 * SHARE_SLACK)
			return false;
	}
	return true;
}

/* Piece cut (from a node-mate busier than level L over NVLink) and piece
 * ent (into another device of the node) overlap in box in: ent's device
 * passes it on to cut's, a hop later, where its NVLink stays within L;
 * *done when it did. */
static vps_result_t share_pair(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct group *g, size_t ent,
			       size_t cut, const struct vps_box *in, double L, bool *done)
{
	const struct vps_transit_node *tn = t->tn;
	const struct vps_piece *x = &set->v[ent], *y = &set->v[cut];
	struct tdev *de = find(t, x->dst), *ds = find(t, y->src);
	double bytes = (double)vps_box_volume(in) * (double)vps_dtype_size(vps_piece_dtype(y));
	bool ok;
	*done = false;
	if (!ds || ds == de || bytes < (double)TRANSIT_MIN_BYTES || vps_buffer_hop(x->src_buffer) >= VPS_MAX_HOP ||
	    ds->nvl_send <= L * tn->intra || de->nvl_send + bytes > L * tn->intra * SHARE_SLACK)
		return VPS_OK;
	VPS_CHECK(movable(t, f, set, cut, &ok));
	if (!ok)
		return VPS_OK;
	struct tdev *dc = find(t, y->dst);
	VPS_CHECK(pass_on(set, f, g, ent, cut, in, true)); /* it may feed a share in turn */
	ds->nvl_send -= bytes;
	de->nvl_send += bytes;
	mates(t, de, dc);
	*done = true;
	return VPS_OK;
}

/* Whether piece x of the set may feed or be replaced by a share: it lands
 * in a B buffer of a device of the node, from another device. */
static bool shareable(const struct tnode *t, const struct vps_piece *x)
{
	return x->src != x->dst && !vps_piece_to_transit(x) && vps_box_volume(&x->box) > 0 && find(t, x->dst);
}

static vps_result_t share_group(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct group *g,
				const double *args)
{
	double L = args[0];
	const struct vps_transit_node *tn = t->tn;
	/* g grows as cuts leave their rest behind; those join the scan */
	for (size_t b = 0; b < g->n; b++) {
		size_t j = g->v[b];
		struct tdev *ds = find(t, set->v[j].src);
		if (!ds || !on_node(t, set->v[j].src) || ds->nvl_send <= L * tn->intra)
			continue;
		/* the least busy device that takes some of it in passes it on;
		 * what it does not take stays in g, scanned in its turn */
		size_t best = SIZE_MAX;
		struct vps_box in;
		for (size_t a = 0; a < g->n; a++) {
			size_t i = g->v[a];
			const struct vps_piece *x = &set->v[i];
			if (i == j || x->dst == set->v[j].dst || x->dst == set->v[j].src || !shareable(t, x) ||
			    vps_buffer_hop(x->src_buffer) >= VPS_MAX_HOP || !vps_box_intersect(&x->box, &set->v[j].box, &in))
				continue;
			if (best == SIZE_MAX || find(t, x->dst)->nvl_send < find(t, set->v[best].dst)->nvl_send)
				best = i;
		}
		bool done;
		if (best != SIZE_MAX && vps_box_intersect(&set->v[best].box, &set->v[j].box, &in))
			VPS_CHECK(share_pair(t, f, set, g, best, j, &in, L, &done));
	}
	return VPS_OK;
}

static vps_result_t share_once(struct tnode *t, struct fwds *f, struct vps_pieces *set)
{
	const double L = share_level(t);
	const struct group_visit gv = {shareable, share_group, &L};
	return each_group(t, f, set, &gv);
}

/* The node's shares: kept where its busiest device gets more than 1%
 * faster with a message latency for each node-mate a device newly shares
 * with (the most any has); else the set as it was. */
static vps_result_t share_route(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct vps_pieces *was)
{
	const struct vps_transit_node *tn = t->tn;
	tally(t, set);
	/* none above the node's level over NVLink: nothing to share (and
	 * no device's NIC sends to ask for) */
	double L = share_level(t), most = 0;
	for (size_t i = 0; i < t->n; i++)
		most = fmax(most, t->d[i].nvl_send);
	if (!(most > L * tn->intra))
		return VPS_OK;
	double T0 = with_nic_sends(t);
	L = share_level(t);
	if (!(T0 > 0))
		return VPS_OK;
	VPS_CHECK(copy_set(was, set));
	for (size_t i = 0; i < t->n; i++)
		t->d[i].mates = 0;
	VPS_CHECK(share_once(t, f, set));
	/* every share makes two devices node-mates anew: none, none made */
	int peers = 0;
	for (size_t i = 0; i < t->n; i++) {
		int k = 0;
		for (uint64_t m = t->d[i].mates; m; m &= m - 1)
			k++;
		peers = k > peers ? k : peers;
	}
	if (!peers)
		return VPS_OK;
	double T1 = busiest_all(t);
	if (T1 + tn->latency * (double)peers > TRANSIT_GAIN * T0)
		return copy_set(set, was);
	drop_emptied(set);
	return VPS_OK;
}

/* Entering once for the senders' sake: where the node itself cannot gain
 * (a sender into it is as busy as its busiest device, or the gain is too
 * little), what two devices take in alike from other nodes still enters it
 * once: the senders into it send less, no NIC of the node takes in more,
 * and no device of the node, its NVLink and its new node-mates' message
 * latencies counted, gets busier than the node's busiest was (which also
 * keeps a tiny model's few bytes where they were on a800-testbed). In llama2-7b-tp-down-back each
 * tensor-parallel slice of stage 1's parameters entered node 2 (and 3)
 * twice, for its two data-parallel replicas there, from node 1, whose
 * NICs set the plan's time. */
static vps_result_t senders_entry(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct vps_pieces *was)
{
	tally(t, set);
	double in0 = 0, in1 = 0, T0 = busiest(t);
	for (size_t i = 0; i < t->n; i++) {
		in0 += t->d[i].nic_recv;
		t->d[i].mates = 0;
	}
	if (!(T0 > 0) || !(in0 > 0))
		return VPS_OK;
	VPS_CHECK(copy_set(was, set));
	VPS_CHECK(enter_once(t, f, set, T0, (double)TRANSIT_MIN_BYTES));
	for (size_t i = 0; i < t->n; i++)
		in1 += t->d[i].nic_recv;
	if (in0 - in1 < (double)TRANSIT_MIN_BYTES)
		return copy_set(set, was);
	/* entering changes no device's NIC sends: the busiest before, with
	 * them, is the larger of T0 and theirs */
	double T0all = fmax(T0, with_nic_sends(t));
	if (!within_with_latency(t, T0all))
		return copy_set(set, was);
	drop_emptied(set);
	return VPS_OK;
}

/* Whatever arrives into the node that a forward made here passes on
 * (entering once's and the shares' relays read their arrival), marked
 * afresh in f once the set has changed places. */
static int cand_key_cmp(const struct cand *x, uint32_t tensor, uint8_t state, int64_t dst)
{
	if (x->tensor != tensor)
		return x->tensor < tensor ? -1 : 1;
	if (x->state != state)
		return x->state < state ? -1 : 1;
	return (x->dst > dst) - (x->dst < dst);
}

static vps_result_t mark_feeds(struct tnode *t, struct fwds *f, const struct vps_pieces *set)
{
	VPS_CHECK(mark(f, set));
	memset(f->entry, 0, f->cap);
	struct cand *idx = vps_calloc(set->n + 1, sizeof(*idx));
	size_t n = 0;
	if (!idx)
		return VPS_ENOMEM;
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].src != set->v[i].dst && !vps_piece_to_transit(&set->v[i]))
			idx[n++] = (struct cand){set->v[i].tensor, set->v[i].state, set->v[i].dst, i};
	qsort(idx, n, sizeof(*idx), cand_cmp);
	for (size_t k = 0; k < set->n; k++) {
		const struct vps_piece *z = &set->v[k];
		if (!(z->src_buffer & VPS_BUFFER_TARGET) || vps_piece_from_transit(z) || !find(t, z->src))
			continue;
		size_t lo = 0, hi = n;
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			if (cand_key_cmp(&idx[mid], z->tensor, z->state, z->src) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (; lo < n && cand_key_cmp(&idx[lo], z->tensor, z->state, z->src) == 0; lo++) {
			const struct vps_piece *x = &set->v[idx[lo].i];
			struct vps_box o;
			if (x->dst_buffer == vps_buffer_index(z->src_buffer) && vps_box_intersect(&x->box, &z->box, &o))
				f->entry[idx[lo].i] = 1;
		}
	}
	free(idx);
	return VPS_OK;
}

/* What the node takes in over its NICs, spread (entering once, then
 * shedding to carriers), where that gains enough; else the set as it was. */
static vps_result_t ingress(struct tnode *t, struct fwds *f, struct vps_pieces *set, struct vps_pieces *was,
			   bool *kept)
{
	const struct vps_transit_node *tn = t->tn;
	struct vps_pieces out = {0};
	*kept = false;
	tally(t, set);
	double T0 = busiest(t), floor = senders_floor(tn, set);
	/* a sender into the node as busy as the node's busiest device: the
	 * plan's estimate cannot gain by the node, whose parts would move for
	 * nothing; nor is it worth shedding below it */
	if (!(T0 > 0) || floor > TRANSIT_GAIN * T0 || (T0 - floor) * tn->inter < (double)TRANSIT_MIN_GAIN_BYTES)
		return VPS_OK;
	/* kept whole, to go back to where the node gains too little */
	vps_result_t rc = copy_set(was, set);
	if (!rc)
		rc = enter_once(t, f, set, T0, 0);
	/* what arrives to be passed on stays where it arrives: its forwards'
	 * hops follow its arrival's */
	for (size_t i = 0; i < t->n && !rc; i++)
		t->d[i].eligible = 0;
	for (size_t k = 0; k < set->n && !rc; k++) {
		bool ok = false;
		if (!nic_arrival(t, &set->v[k]) || !find(t, set->v[k].dst) || vps_box_volume(&set->v[k].box) == 0)
			continue;
		rc = movable(t, f, set, k, &ok);
		if (ok)
			find(t, set->v[k].dst)->eligible += (double)vps_piece_bytes(&set->v[k]);
	}
	double T = rc ? T0 : fmax(level(t, T0), floor);
	size_t next = 0;
	for (size_t i = 0; i < t->n && !rc && T <= TRANSIT_GAIN * T0; i++) {
		struct tdev *e = &t->d[i];
		if (e->nic_recv > T * tn->inter)
			rc = shed(t, f, e, T, set, &next, &out);
	}
	if (!rc) {
		double T1 = busiest(t);
		if (T1 > TRANSIT_GAIN * T0 || (T0 - T1) * tn->inter < (double)TRANSIT_MIN_GAIN_BYTES) {
			/* too little for the bytes: the node as it was */
			rc = copy_set(set, was);
		} else {
			/* the emptied arrivals out, the rerouted parts in */
			*kept = true;
			drop_emptied(set);
			rc = VPS_GROW(set->v, set->cap, set->n + out.n);
			if (!rc && out.n) {
				memcpy(set->v + set->n, out.v, out.n * sizeof(*out.v));
				set->n += out.n;
			}
		}
	}
	free(out.v);
	return rc;
}

vps_result_t vps_transit_route(const struct vps_transit_node *tn, struct vps_pieces *set)
{
	if (tn->ndevices < 2 || !(tn->intra > 0) || !(tn->inter > 0))
		return VPS_OK;
	struct tnode t = {.tn = tn, .n = tn->ndevices};
	struct vps_pieces was = {0};
	struct fwds f = {0};
	t.d = vps_calloc(t.n, sizeof(*t.d));
	f.of = vps_calloc(t.n, sizeof(*f.of));
	f.fetched = vps_calloc(t.n, sizeof(*f.fetched));
	vps_result_t rc = t.d && f.of && f.fetched ? mark(&f, set) : VPS_ENOMEM;
	for (size_t i = 0; i < t.n && !rc; i++) {
		t.d[i].w = tn->devices[i];
		t.d[i].area_max = tn->area_max[i];
	}
	bool kept = false;
	if (!rc)
		rc = ingress(&t, &f, set, &was, &kept);
	if (!rc && !kept) {
		rc = mark_feeds(&t, &f, set);
		if (!rc)
			rc = senders_entry(&t, &f, set, &was);
	}
	if (!rc && tn->ndevices > 2)
		rc = mark_feeds(&t, &f, set);
	if (!rc && tn->ndevices > 2)
		rc = share_route(&t, &f, set, &was);
	for (size_t i = 0; f.of && i < t.n; i++)
		free(f.of[i].v);
	free(f.of);
	free(f.fetched);
	free(f.entry);
	free(was.v);
	free(t.d);
	return rc;
}
