/* The state routing planner.
 *
 * For each destination region (a B region of a B rank) the planner asks A
 * which ranks hold its (tensor, state) box (vps_layout_holders: analytic,
 * no enumeration) and decides, deterministically from the region alone:
 *   1. retain what the destination's own device holds under A;
 *   2. take the rest group by group, a group being the A regions with one
 *      box (its members are replicas), preferring the A tensor-parallel rank
 *      whose slice the destination's slice overlaps first; members on the
 *      destination's node first, otherwise any member;
 *   3. cut the destination buffer in m equal ranges, range p served by
 *      member (start + p) mod k, where start is the destination's index
 *      among the B replicas that receive the region (among all replicas
 *      past EXACT_REPLICAS), scaled to k and shifted by the replica set's
 *      first rank. Consecutive regions then come from one source (their
 *      copies merge) and replicas share the sending evenly;
 *   4. when 2..SPLIT_MAX candidates span A pipeline stages (a tied
 *      embedding), weigh them by their other duties instead (weights_of),
 *      cutting large pieces by the shares.
 * A source finds its sends by re-running the decision for the destinations
 * that can choose it: all replicas of a small set; for a large one those on
 * its node and those the rotation maps to it (all, for a weighed group).
 * Both sides run the same function, so a rank's plan is exactly the global
 * plan restricted to it.
 * docs/plan.md has the reasons. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/sysinfo.h>

#include "util/hash.h"
#include "util/internal.h"
#include "util/slots.h"
#include "plan/piece.h"
#include "plan/plan_pack.h"
#include "plan/transit.h"
#include "vps/plan.h"

/* A piece with several replicas as sources is cut in up to this many parts,
 * each from another replica: every replica then carries an equal share of
 * every destination, whatever other duty it has. */
#define SPLIT_MIN 4
#define SPLIT_MAX 16
#define SPLIT_MIN_BYTES ((int64_t)256 << 10)
/* Up to this many B replicas of a region, a destination rotates by its index
 * among the replicas that hold none of the region under A (the ones that
 * really receive); above, by its index among all replicas (O(1), no
 * enumeration, for worlds grown by data parallelism). */
#define EXACT_REPLICAS 64
#define NODE_RANKS_MAX 256
/* Nodes' arrivals a planner keeps (node_arrivals): a global plan's
 * destinations come node by node, a rank's sends go to a few nodes. */
#define NODE_SETS 4
/* Destination buffers whose kept elements a context remembers: a sender
 * plans its destinations one after another (plan_sends' visits, by rank). */
#define MOVED_MAPS 4

/* How deep duty_likely follows the chain of devices of A that relay for
 * each other: B's stage s on devices whose own stages go to devices whose
 * own stages go on (llama2-*-tp-down needs two levels). */
#define LIKELY_DEPTH 2

/* What relaying must gain before it is taken for a gain (5%): it keeps
 * relays from where the plan's slowest device lies elsewhere (with 1%,
 * deepseek-v3-s1-s2 and qwen3-235b-s14-s13 relayed for nothing), and
 * keeps duty_likely's receivers light with room to spare (at the bare
 * bound, llama-32b-s7-s8 relayed for nothing). */
#define LIGHT_MARGIN 0.95

/* The members of a group of holders that stand for it where a region is
 * weighed (relay_light, relay_likely, relay_weigh's direct range). */
#define DUTY_MEMBERS 8
/* Holders relay_weigh weighs a region's direct range by, at most. */
#define DIRECT_HOLDERS 64
/* Groups of holders whose entries relay_entry weighs by the members' time
 * to spare (more: in turn), and the unit of a member's share. */
#define ENTRY_GROUPS 4
#define ENTRY_UNIT 4096
/* What entering node by node from the holders must gain over relaying
 * through the receivers (entry_likely) before a holder's other regions
 * count on it (holder_entries): a range straight from the holders lies
 * between the two routes and often beats a narrow gain (llama2-70b-pp-up:
 * stage 1's later layers gain 1.4% by entering and go by a range, 13b's
 * gain 4.6% and enter). */
#define ENTRY_SURE 0.97

/* What an A rank must send whatever the choices (bytes only it holds),
 * and its equal share of what it could send with other replicas. */
struct duty {
	int64_t rank; /* first: slot_of orders by it */
	int64_t forced, shared;
	int64_t forced_link[2]; /* forced, to devices on ra's node [0] and elsewhere [1] */
	/* forced + shared where joining receivers relay, to devices on ra's
	 * node [0] and elsewhere [1] (relay_light) */
	int64_t relayed[2];
	int64_t best[2]; /* the same were every receiver, two or more, to relay */
	int64_t forced_best[2]; /* forced, were every receiver to relay: the least it sends */
	/* the same where the receivers of each of its regions relay as they
	 * likely will, weighed k + 1 levels deep (duty_likely; bit k of
	 * likely_known once likely[k] is known) */
	int64_t likely[LIKELY_DEPTH][2];
	unsigned likely_known;
	/* of its regions, those surely brought into their receivers' nodes
	 * by their holders, by their receivers' nodes (holder_entries),
	 * owned */
	struct entered_kind *kinds;
	size_t nkinds;
	bool entries_known;
};

/* A holder's regions whose free receivers are on the same nodes (nodes:
 * nodes_key) and surely enter them from their holders: what it sends of
 * them more than duty_of's best over its NICs, and what of its shared and
 * best they are. */
struct entered_kind {
	uint64_t nodes;
	int64_t more, shared, once;
};

/* What a device could pass on, at most, were it to relay every B region
 * it is a free receiver of, and what it receives (relay_bound). */
struct fwd {
	int64_t world; /* first: slot_of orders by it */
	int64_t bytes[2]; /* where every receiver is on its node [0], else [1] */
	int64_t recv[2];  /* what it receives: from its node [0], from others [1] */
	int64_t recv_best[2]; /* the same were its node's receivers of each region to relay */
	int64_t recv_far;     /* of recv[0], what devices of other nodes hold too */
	int64_t likely[2];    /* of bytes, what it likely passes on (relay_likely) */
	bool likely_known;
	/* the regions it surely takes node by node from their holders
	 * (relay_likely: region_key's, sorted), owned */
	uint64_t *entered;
	size_t nentered;
};

/* A destination's buffer, less what its device keeps (moved_map). */
struct moved_region {
	int64_t offset, elements, kept, before; /* before: kept in the regions below */
	bool exact; /* kept is one box of a row-major region: counted element by element */
	struct vps_box box, kept_box;
};

struct moved {
	bool used;
	int64_t rb;
	uint32_t buffer;
	size_t n;
	struct moved_region *at; /* the buffer's regions, in offset order */
	int64_t kept;
};

struct ctx {
	const struct vps_layout *a, *b;
	const struct vps_world *w;
	struct vps_holders ha, hb;
	struct vps_boxes rem, next;
	struct vps_holders hda, hdb; /* for duty_of, beside ha and hb in use */
	struct duty *duties;         /* sorted by rank */
	size_t nduties, capduties;
	struct fwd *fwds;            /* relay_bound's, sorted by world rank */
	size_t nfwds, capfwds;
	struct vps_piece last; /* global plans: the piece a block packs against */
	const struct vps_lost *lost; /* A ranks no piece may come from */
	enum vps_relay relay;        /* the options' */
	const struct vps_topology *topo; /* VPS_RELAY_AUTO weighs its bandwidths (NULL: bytes) */
	/* VPS_RELAY_AUTO's choices, by region (at most RELAY_MEMO_MOST) */
	struct relay_memo *memo;
	size_t nmemo, capmemo;
	struct vps_slots memo_slots;
	struct relay_cuts *cuts;
	size_t ncuts, capcuts;
	/* VPS_RELAY_AUTO on a topology: nodes' arrivals, transit routed
	 * (node_arrivals), the last few */
	struct node_set {
		bool used;
		int32_t node;
		struct vps_pieces set;
	} nodes[NODE_SETS];
	unsigned nodes_next;
	/* destinations' buffers less what their devices keep (moved_map),
	 * the last few */
	struct moved moved[MOVED_MAPS];
	unsigned moved_next;
	struct vps_holders hm; /* moved_map's */
};

/* A relayed region: its receivers in replica order (world and B ranks, and
 * their nodes), the destination's index among them, and the node every
 * holder is on (home; NO_HOME when they are on several) with the fewest
 * holders of a group. Range j of the destination buffer (cut in n, equal
 * or weighted) is receiver j's to bring in and pass on; `route` says who
 * takes it from whom, at which hop, from the tables relay_index makes once
 * a region: the receivers' nodes numbered in order of first appearance
 * (nidx; nodes, their node numbers), home's number among them (-1: none of
 * them is at home), below[m][p] the receivers q < p on node m and
 * kth[m][k] the k-th on node m. */
#define NO_HOME INT32_MIN
struct relay {
	int64_t n, i;
	int64_t set_base; /* the B replica set's first rank (-1: none counted) */
	bool mixed;       /* some receivers are devices of A */
	int64_t world[EXACT_REPLICAS], b[EXACT_REPLICAS];
	int32_t node[EXACT_REPLICAS];
	int32_t home;
	int64_t holders;
	int nn, home_idx;
	int32_t nodes[EXACT_REPLICAS];
	uint8_t nidx[EXACT_REPLICAS];
	uint8_t below[EXACT_REPLICAS][EXACT_REPLICAS + 1];
	uint8_t kth[EXACT_REPLICAS][EXACT_REPLICAS];
	/* weighted: range j is cut[j] to cut[j + 1] of the buffer, in
	 * RANGE_SCALE parts (relay_weigh), not the j-th of n equal ones; the
	 * last, range n (cut[n] to cut[n + 1], often empty), is not relayed:
	 * every receiver takes it from a holder */
	bool weighted;
	uint32_t cut[EXACT_REPLICAS + 2];
	/* no receiver at home: each range enters each receivers' node from
	 * a holder, and relays pass on over their node's links alone
	 * (relay_entry), not their own range into every other node */
	bool entry_by_holders;
	/* and which holder brings each in: member j of group g its share
	 * entry_w[g][j] of the entries (of ENTRY_UNIT), all zero: in turn */
	uint16_t entry_w[ENTRY_GROUPS][DUTY_MEMBERS];
};

#define RANGE_SCALE ((int64_t)1 << 30)

/* VPS_RELAY_AUTO's choice for a region (its tensor, state and box, its B
 * replica set's first rank, and its groups of holders): none, its joining
 * receivers, or every free receiver (RELAY_*), kept so that the receivers
 * and holders that plan the region in one plan weigh it once. A choice is
 * the same whenever it is made: past RELAY_MEMO_MOST regions the memo
 * starts again. With a fixed 1,024 slots, qwen3-30b-cp-up's expert
 * regions took each other's and each was weighed again thousands of times
 * (a rank's plan 1.7x slower). */
#define RELAY_MEMO_MOST ((size_t)1 << 14) /* 3 MB of choices */
enum { RELAY_NONE, RELAY_JOINING, RELAY_FREE };
struct relay_memo {
	uint64_t key; /* the hash memo_find looks for */
	uint8_t choice;
	uint32_t tensor;
	uint8_t state;
	struct vps_box box;
	int64_t set_base;
	uint64_t groups;
	bool weighted;         /* RELAY_FREE's ranges, as relay_weigh cut them */
	bool entry_by_holders; /* RELAY_FREE's routes (relay_entry) */
	uint32_t route;        /* either: its relay_cuts (index + 1) */
};

/* Where a memo's region is weighted or enters by its holders: most are
 * neither, and these are most of a choice's bytes. */
struct relay_cuts {
	uint32_t cut[EXACT_REPLICAS + 2];
	uint16_t entry_w[ENTRY_GROUPS][DUTY_MEMBERS];
};

/* Holders under A, less the lost ranks: every choice of a source reads
 * these, so no plan path can pick a lost device. */
static vps_result_t a_holders(const struct ctx *c, uint32_t tensor, int state, const struct vps_box *box,
			      struct vps_holders *h)
{
	VPS_CHECK(vps_layout_holders(c->a, tensor, state, box, h));
	return vps_lost_drop_holders(c->lost, h);
}

static bool member(const struct vps_holder *h, int64_t r)
{
	if (r < h->base)
		return false;
	int64_t d = r - h->base;
	if (h->stride == 0)
		return d == 0;
	return d % h->stride == 0 && d / h->stride < h->count;
}

/* Whether A rank a (-1: a joining device) is among c->hda's holders. */
static bool a_holds(const struct ctx *c, int64_t a)
{
	for (size_t k = 0; k < c->hda.n && a >= 0; k++)
		if (member(&c->hda.v[k], a))
			return true;
	return false;
}

static int box_cmp(const struct vps_box *x, const struct vps_box *y)
{
	for (int k = 0; k < x->ndim; k++) {
		if (x->lo[k] != y->lo[k])
			return x->lo[k] < y->lo[k] ? -1 : 1;
		if (x->hi[k] != y->hi[k])
			return x->hi[k] < y->hi[k] ? -1 : 1;
	}
	return 0;
}

static int holder_cmp(const void *p, const void *q)
{
	const struct vps_holder *x = p, *y = q;
	int c = box_cmp(&x->region.box, &y->region.box);
	if (c)
		return c;
	return x->base < y->base ? -1 : x->base > y->base;
}

static vps_result_t emit(struct vps_pieces *out, int64_t only_src, int64_t src, int64_t dst, const struct vps_box *box,
			 const struct vps_region *sr, const struct vps_region *dr)
{
	if (only_src >= 0 && src != only_src)
		return VPS_OK;
	VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + 1));
	struct vps_piece *p = &out->v[out->n++];
	memset(p, 0, sizeof(*p));
	p->tensor = dr->tensor;
	p->state = dr->state;
	p->dtype = dr->dtype;
	p->box = *box;
	p->src = src;
	p->dst = dst;
	p->src_buffer = sr->buffer;
	p->dst_buffer = dr->buffer;
	p->src_offset = vps_region_offset_at(sr, box->lo);
	p->dst_offset = vps_region_offset_at(dr, box->lo);
	memcpy(p->src_strides, sr->strides, sizeof(p->src_strides));
	memcpy(p->dst_strides, dr->strides, sizeof(p->dst_strides));
	return VPS_OK;
}

/* A group: holders [first, first+n) of the sorted list, all with one box. */
struct group {
	size_t first, n;
	int64_t count;
	int64_t local[NODE_RANKS_MAX]; /* members on the destination's node */
	size_t local_holder[NODE_RANKS_MAX];
	size_t nlocal;
};

/* Member c of a group in holder order. */
static void group_member(const struct vps_holders *h, const struct group *g, int64_t c, int64_t *rank,
			 size_t *holder)
{
	for (size_t i = g->first; i < g->first + g->n; i++) {
		if (c < h->v[i].count) {
			*rank = h->v[i].base + c * h->v[i].stride;
			*holder = i;
			return;
		}
		c -= h->v[i].count;
	}
	*rank = -1;
	*holder = g->first;
}

/* Parts of a piece with k candidate sources and n destinations needing it:
 * at least SPLIT_MIN, and enough that the n destinations together reach
 * all k sources. */
static int64_t split_parts(int64_t k, int64_t n)
{
	int64_t m = vps_max64(SPLIT_MIN, vps_ceil_div(k, n));
	return vps_min64(vps_min64(m, k), SPLIT_MAX);
}

/* Tensor-parallel rank of A whose holders a destination prefers: the first
 * A rank whose slice overlaps the destination's B slice. Tensors every TP
 * rank holds (norms, row-parallel biases) are then taken from the same A
 * rank as their split neighbours, so consecutive copies merge. */
static int64_t preferred_tp(const struct ctx *c, uint32_t tensor, int64_t rb, int64_t *T)
{
	struct vps_tensor t;
	struct vps_coords cb;
	vps_model_tensor(vps_layout_model(c->a), tensor, &t);
	vps_layout_coords(c->b, rb, &cb);
	const struct vps_parallel *pa = vps_layout_parallel(c->a), *pb = vps_layout_parallel(c->b);
	int64_t ta = t.is_expert ? pa->etp : pa->tp, tb = t.is_expert ? pb->etp : pb->tp;
	*T = ta;
	return (t.is_expert ? cb.etp : cb.tp) * ta / tb;
}

/* Stable partition of holders [0, n) putting those of A tensor-parallel rank
 * want first. @return how many there are, or n when none is. */
static size_t prefer(struct vps_holder *v, size_t n, int64_t T, int64_t want)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (v[i].base % T == want) {
			struct vps_holder h = v[i];
			memmove(&v[k + 1], &v[k], (i - k) * sizeof(*v));
			v[k++] = h;
		}
	return k ? k : n;
}

/* Index of B rank rb among the B replicas of region r: (i, n), and the
 * first replica's rank (base), which shifts the rotation so that
 * destinations of different B sets (other TP or EP ranks) needing the same
 * data do not all start at the same source. */
static vps_result_t replica_index(struct ctx *c, int64_t rb, const struct vps_region *r, int64_t *i, int64_t *n,
				  int64_t *base)
{
	c->hb.n = 0;
	VPS_CHECK(vps_layout_holders(c->b, r->tensor, r->state, &r->box, &c->hb));
	for (size_t k = 0; k < c->hb.n; k++) {
		const struct vps_holder *h = &c->hb.v[k];
		if (member(h, rb) && vps_box_equal(&h->region.box, &r->box) && h->region.buffer == r->buffer &&
		    h->region.offset == r->offset) {
			*i = (rb - h->base) / (h->stride ? h->stride : 1);
			*n = h->count;
			*base = h->base;
			if (h->count <= EXACT_REPLICAS) {
				int64_t ii = 0, nn = 0;
				for (int64_t j = 0; j < h->count; j++) {
					int64_t a = vps_world_a_rank(c->w, vps_world_of_b(c->w, h->base + j * h->stride));
					bool holds = false;
					for (size_t q = 0; q < c->ha.n && a >= 0 && !holds; q++)
						holds = member(&c->ha.v[q], a);
					if (!holds || j == *i) {
						if (j < *i)
							ii++;
						nn++;
					}
				}
				*i = ii;
				*n = nn;
			}
			return VPS_OK;
		}
	}
	*i = 0;
	*n = 1;
	*base = rb;
	return VPS_OK;
}

/* Whether A rank a holds any of the region whose A holders are in c->ha. */
static bool holds_any(const struct ctx *c, int64_t a)
{
	for (size_t q = 0; q < c->ha.n && a >= 0; q++)
		if (member(&c->ha.v[q], a))
			return true;
	return false;
}

/* The receivers of region R of B rank rb in replica order: the replicas of
 * R on joining devices (no A rank), and with free_too also on devices of A
 * that hold none of R (c->ha: R's holders), when the replica set is small
 * enough to count exactly (rl->n 0 otherwise); rl->i is rb's index among
 * them, -1 when rb is none of them. A joining device sends nothing
 * without relays, and as a relay less than it receives; a device of A may
 * already be the busiest sender of its own data, so VPS_RELAY_AUTO lets it
 * relay only where relay_light says its whole load stays below the
 * holders' (three paper transitions got slower when any relayed). */
static vps_result_t relay_set(struct ctx *c, int64_t rb, const struct vps_region *R, bool free_too, struct relay *rl)
{
	rl->n = 0;
	rl->i = -1;
	rl->home = NO_HOME;
	rl->holders = 1;
	rl->set_base = -1;
	rl->mixed = false;
	rl->weighted = false;
	rl->entry_by_holders = false;
	memset(rl->entry_w, 0, sizeof(rl->entry_w));
	c->hb.n = 0;
	VPS_CHECK(vps_layout_holders(c->b, R->tensor, R->state, &R->box, &c->hb));
	for (size_t k = 0; k < c->hb.n; k++) {
		const struct vps_holder *h = &c->hb.v[k];
		if (!member(h, rb) || !vps_box_equal(&h->region.box, &R->box) || h->region.buffer != R->buffer ||
		    h->region.offset != R->offset)
			continue;
		if (h->count > EXACT_REPLICAS)
			return VPS_OK;
		rl->set_base = h->base;
		for (int64_t j = 0; j < h->count; j++) {
			int64_t q = h->base + j * h->stride, wq = vps_world_of_b(c->w, q), aq = vps_world_a_rank(c->w, wq);
			if (aq >= 0 && (!free_too || holds_any(c, aq)))
				continue;
			rl->mixed |= aq >= 0;
			if (q == rb)
				rl->i = rl->n;
			rl->node[rl->n] = vps_world_device(c->w, wq).node;
			rl->world[rl->n] = wq;
			rl->b[rl->n++] = q;
		}
		return VPS_OK;
	}
	return VPS_OK;
}

/* ---- weighing replicas whose other duties differ ---- */

/* Replicas in different A pipeline stages (a tied embedding on the first
 * and the last) carry different stages' duties; replicas within a stage
 * (data- and tensor-parallel) carry the same by symmetry, but for the
 * ZeRO-1 shards only each holds. Whether 2..SPLIT_MAX candidates span
 * more than one stage. */
static bool stages_differ(const struct ctx *c, const int64_t *cand, int64_t k)
{
	if (k < 2 || k > SPLIT_MAX)
		return false;
	struct vps_coords c0, ci;
	vps_layout_coords(c->a, cand[0], &c0);
	for (int64_t i = 1; i < k; i++) {
		vps_layout_coords(c->a, cand[i], &ci);
		if (ci.pp != c0.pp)
			return true;
	}
	return false;
}

static vps_result_t duty_of(struct ctx *c, int64_t ra, struct duty *out);
static double link_time(const struct ctx *c, int64_t intra, int64_t inter);

/* Whether a group's candidates share by weights (weights_of) rather than
 * equally: they span stages, or, on a topology, what they alone must send
 * (duty_of's forced: ZeRO-1 shards) takes one of them more than
 * DUTY_SPREAD times as long as another. In llama2-7b-tp-down-back the
 * devices of A's data-parallel ranks 2 and 3 on node 0 sent their shards
 * (3.0 GB) to node 1 over their NICs, and, sharing equally, as many of the
 * parameters as ranks 0 and 1, whose shards stayed: 1.15x the floor; by
 * weights ranks 0 and 1 serve them, 1.06x. */
#define DUTY_SPREAD 1.5
static vps_result_t weighed(struct ctx *c, const int64_t *cand, int64_t k, bool *yes)
{
	*yes = stages_differ(c, cand, k);
	if (*yes || !c->topo || k < 2 || k > SPLIT_MAX)
		return VPS_OK;
	double least = INFINITY, most = 0;
	for (int64_t i = 0; i < k; i++) {
		struct duty d;
		VPS_CHECK(duty_of(c, cand[i], &d));
		double t = link_time(c, d.forced_link[0], d.forced_link[1]);
		least = fmin(least, t);
		most = fmax(most, t);
	}
	*yes = most > DUTY_SPREAD * least;
	return VPS_OK;
}

/* Receivers among B holder set H of box x: members whose device holds
 * none of x under A (the A holders in hda); of them in r[1] the joining
 * ones, in r[2] those on node, in r[3] the joining ones on node. Counted
 * up to EXACT_REPLICAS members; past that, all members, none joining nor
 * on node. @return r[0]. */
static int64_t receivers(const struct ctx *c, const struct vps_holder *H, const struct vps_box *x, int32_t node,
			 int64_t r[4])
{
	memset(r, 0, 4 * sizeof(*r));
	if (H->count > EXACT_REPLICAS) {
		r[0] = H->count;
		return r[0];
	}
	for (int64_t j = 0; j < H->count; j++) {
		int64_t w = vps_world_of_b(c->w, H->base + j * H->stride), a = vps_world_a_rank(c->w, w);
		bool holds = false;
		for (size_t q = 0; q < c->hda.n && a >= 0 && !holds; q++)
			holds = member(&c->hda.v[q], a) && vps_box_contains(&c->hda.v[q].region.box, x);
		if (holds)
			continue;
		bool here = vps_world_device(c->w, w).node == node;
		r[0]++;
		r[1] += a < 0;
		r[2] += here;
		r[3] += a < 0 && here;
	}
	return r[0];
}

/* The duty of A rank ra: for each of its regions, the bytes B ranks that
 * do not hold them need; forced when ra is the region's only replica,
 * else shared by its replicas equally. Beside it, what it sends where the
 * joining receivers of a replica set relay, as VPS_RELAY_AUTO has them
 * about wherever they are two or more and at least as many as the
 * replicas: one copy for them all (relay_light weighs that). Computed
 * from ra's own regions and holder arithmetic (no enumeration of the
 * world), once per rank. */
/* Where key lies in v, n elements of size bytes sorted by the int64_t each
 * begins with (struct duty's rank, struct fwd's world): its index, or
 * where it goes. */
static size_t slot_of(const void *v, size_t n, size_t size, int64_t key)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int64_t at;
		memcpy(&at, (const char *)v + mid * size, sizeof(at));
		if (at < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Where ra's duty lies in c->duties (sorted by rank). */
static size_t duty_slot(const struct ctx *c, int64_t ra)
{
	return slot_of(c->duties, c->nduties, sizeof(*c->duties), ra);
}

/* Region r's holders under A (c->hda) and under B (c->hdb), and the A
 * replicas of r whole. */
static vps_result_t region_holders(struct ctx *c, const struct vps_region *r, int64_t *replicas)
{
	c->hda.n = 0;
	c->hdb.n = 0;
	*replicas = 0;
	VPS_CHECK(a_holders(c, r->tensor, r->state, &r->box, &c->hda));
	VPS_CHECK(vps_layout_holders(c->b, r->tensor, r->state, &r->box, &c->hdb));
	for (size_t q = 0; q < c->hda.n; q++)
		if (vps_box_equal(&c->hda.v[q].region.box, &r->box))
			*replicas += c->hda.v[q].count;
	return VPS_OK;
}

/* What one of `replicas` holders on `node` sends of box x (elsize bytes
 * an element) to the receivers in B holder set h (c->hda: x's A
 * holders): every receiver's bytes (*all), and its share to devices on
 * its node [0] and elsewhere [1], where joining receivers relay
 * (relayed: they take one copy between them where they are two or more
 * and at least as many as the replicas) and where every receiver, two or
 * more, does (best). */
static void set_sends(const struct ctx *c, const struct vps_holder *h, const struct vps_box *x, int32_t node,
		      int64_t elsize, int64_t replicas, int64_t *all, int64_t relayed[2], int64_t best[2])
{
	int64_t rc4[4], n = receivers(c, h, x, node, rc4), per[2] = {rc4[2], n - rc4[2]}, unit = vps_box_volume(x) * elsize;
	if (rc4[1] >= 2 && rc4[1] >= replicas && c->relay == VPS_RELAY_AUTO) {
		per[0] -= rc4[3];
		per[1] -= rc4[1] - rc4[3];
		per[rc4[1] > rc4[3]]++;
	}
	if (!vps_mul_ok(unit, n, all))
		*all = INT64_MAX;
	for (int pass = 0; pass < 2; pass++) {
		int64_t *out = pass ? best : relayed;
		if (pass && h->count <= EXACT_REPLICAS && n >= 2) {
			per[0] = n == rc4[2];
			per[1] = n != rc4[2];
		}
		for (int link = 0; link < 2; link++) {
			if (!vps_mul_ok(unit, per[link], &out[link]))
				out[link] = INT64_MAX;
			if (replicas > 1)
				out[link] /= replicas;
		}
	}
}

/* One of the B replica sets that take part of a region: its holder
 * (c->hdb.v[q]), the part x it takes, and what one of the region's
 * holders sends it (set_sends: all, relayed, best). */
struct region_set {
	size_t q;
	struct vps_box x;
	int64_t all, relayed[2], best[2];
};

/* Region r's B replica sets, for one of its holders on `node` (*sets,
 * grown as needed, *ns of them), and its A replicas whole. The sets point
 * into c->hdb, and c->hda holds r's A holders, until the caller weighs
 * another region: what reads them goes before what weighs others. */
static vps_result_t region_sets(struct ctx *c, const struct vps_region *r, int32_t node, struct region_set **sets,
				size_t *cap, size_t *ns, int64_t *replicas)
{
	*ns = 0;
	VPS_CHECK(region_holders(c, r, replicas));
	VPS_CHECK(VPS_GROW(*sets, *cap, c->hdb.n));
	int64_t elsize = (int64_t)vps_dtype_size(vps_region_dtype(r));
	for (size_t q = 0; q < c->hdb.n; q++) {
		struct region_set *rs = &(*sets)[*ns];
		if (!vps_box_intersect(&c->hdb.v[q].region.box, &r->box, &rs->x))
			continue;
		rs->q = q;
		set_sends(c, &c->hdb.v[q], &rs->x, node, elsize, *replicas, &rs->all, rs->relayed, rs->best);
		(*ns)++;
	}
	return VPS_OK;
}

static vps_result_t duty_of(struct ctx *c, int64_t ra, struct duty *out)
{
	size_t lo = duty_slot(c, ra);
	if (lo < c->nduties && c->duties[lo].rank == ra) {
		*out = c->duties[lo];
		return VPS_OK;
	}
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(c->a, ra, &v));
	struct duty d = {.rank = ra};
	int32_t node = vps_layout_device(c->a, ra).node;
	struct region_set *sets = NULL;
	size_t cap = 0, ns = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		int64_t replicas;
		rc = region_sets(c, &v.regions[i], node, &sets, &cap, &ns, &replicas);
		for (size_t k = 0; k < ns && !rc; k++) {
			const struct region_set *rs = &sets[k];
			if (replicas <= 1) {
				d.forced = vps_sat_add(d.forced, rs->all);
				for (int link = 0; link < 2; link++) {
					d.forced_link[link] = vps_sat_add(d.forced_link[link], rs->relayed[link]);
					d.forced_best[link] = vps_sat_add(d.forced_best[link], rs->best[link]);
				}
			} else
				d.shared = vps_sat_add(d.shared, rs->all / replicas);
			for (int link = 0; link < 2; link++) {
				d.relayed[link] = vps_sat_add(d.relayed[link], rs->relayed[link]);
				d.best[link] = vps_sat_add(d.best[link], rs->best[link]);
			}
		}
	}
	vps_rank_view_release(&v);
	free(sets);
	VPS_CHECK(rc);
	VPS_CHECK(VPS_GROW(c->duties, c->capduties, c->nduties + 1));
	memmove(&c->duties[lo + 1], &c->duties[lo], (c->nduties - lo) * sizeof(*c->duties));
	c->duties[lo] = d;
	c->nduties++;
	*out = d;
	return VPS_OK;
}

/* The least time t in [lo, hi] at which the n parts' room (room(arg, i, t),
 * growing with t) holds pour: a water level, by bisection (64 halvings, so
 * every rank finds the same level). */
static double water_level(double (*room)(const void *arg, int64_t i, double t), const void *arg, int64_t n,
			  double pour, double lo, double hi)
{
	for (int it = 0; it < 64; it++) {
		double t = (lo + hi) / 2, got = 0;
		for (int64_t i = 0; i < n; i++)
			got += room(arg, i, t);
		if (got >= pour)
			hi = t;
		else
			lo = t;
	}
	return hi;
}

/* Shares of k candidates (k <= SPLIT_MAX), summing to about WEIGHT_UNIT:
 * water-filling, the candidates' shared duties poured over their forced
 * ones, each candidate's share the water above it; the candidates with the
 * least forced duty serve until they reach the others. Integers only (the
 * duties scaled below 2^40), so every rank computes the same shares. */
#define WEIGHT_UNIT ((int64_t)1 << 12) /* times VPS_MAX_ELEMENTS stays below 2^61 */
/* On a topology, shares in time: each candidate's forced sends, NVLink
 * and NICs apart, and the destination's bytes over the link that reaches
 * it (NVLink on its node, else the NIC); the pour raises the slowest
 * candidates' time last. Weighed by bytes alone, a tied embedding's rows
 * for another node went mostly to the last stage's devices, whose NICs
 * carried that stage, while the first stage's devices, busy over NVLink,
 * had idle NICs (gpt3-1.3b-tp-up lay 1.09x its floor). */
struct time_share {
	const double *own, *floor_t, *band;
};

/* What candidate i takes of the pour before its time passes t. */
static double share_room(const void *arg, int64_t i, double t)
{
	const struct time_share *s = arg;
	return fmax(0, fmax(t, s->floor_t[i]) * s->band[i] - s->own[i]);
}

static void weights_in_time(const struct ctx *c, const int64_t *cand, int64_t k, int32_t node, const struct duty *d,
			    int64_t *w)
{
	double bw[2] = {c->topo->intra_node_bandwidth, c->topo->inter_node_bandwidth}, pour = 0, hi = 0;
	double own[SPLIT_MAX], floor_t[SPLIT_MAX], band[SPLIT_MAX];
	for (int64_t i = 0; i < k; i++) {
		int link = vps_layout_device(c->a, cand[i]).node != node;
		own[i] = (double)d[i].forced_link[link];
		band[i] = bw[link];
		/* what its other link takes: bytes on this one below it cost nothing */
		floor_t[i] = (double)d[i].forced_link[!link] / bw[!link];
		pour += fmax(0, (double)d[i].relayed[link] - (double)d[i].forced_link[link]);
		hi = fmax(hi, fmax(floor_t[i], own[i] / band[i]));
	}
	const struct time_share s = {own, floor_t, band};
	double level = water_level(share_room, &s, k, pour, 0, hi + pour / band[0] + pour / band[1]);
	double x[SPLIT_MAX], total = 0;
	for (int64_t i = 0; i < k; i++)
		total += x[i] = share_room(&s, i, level);
	int64_t got = 0;
	for (int64_t i = 0; i < k; i++)
		got += w[i] = total > 0 ? (int64_t)(x[i] / total * (double)WEIGHT_UNIT) : 1;
	if (!got)
		for (int64_t i = 0; i < k; i++)
			w[i] = 1;
}

static vps_result_t weights_of(struct ctx *c, const int64_t *cand, int64_t k, int32_t node, int64_t *w)
{
	int64_t f[SPLIT_MAX], sorted[SPLIT_MAX], pour = 0, top = 0;
	struct duty d[SPLIT_MAX];
	for (int64_t i = 0; i < k; i++) {
		VPS_CHECK(duty_of(c, cand[i], &d[i]));
		top = vps_max64(top, vps_min64(d[i].forced, INT64_MAX / 4));
		pour = vps_min64(vps_sat_add(pour, d[i].shared), INT64_MAX / 4);
	}
	if (c->topo && c->relay == VPS_RELAY_AUTO) {
		weights_in_time(c, cand, k, node, d, w);
		return VPS_OK;
	}
	int shift = 0;
	while (shift < 62 && ((top >> shift) + (pour >> shift)) >= ((int64_t)1 << 40))
		shift++;
	pour >>= shift;
	for (int64_t i = 0; i < k; i++)
		f[i] = sorted[i] = vps_min64(d[i].forced, INT64_MAX / 4) >> shift;
	for (int64_t i = 1; i < k; i++)
		for (int64_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
			int64_t t = sorted[j];
			sorted[j] = sorted[j - 1];
			sorted[j - 1] = t;
		}
	int64_t level = sorted[k - 1], sum = 0, total = 0;
	for (int64_t i = 0; i < k; i++) {
		sum += sorted[i];
		int64_t l = (pour + sum) / (i + 1);
		if (i == k - 1 || l <= sorted[i + 1]) {
			level = l;
			break;
		}
	}
	for (int64_t i = 0; i < k; i++)
		total += vps_max64(0, level - f[i]);
	int64_t got = 0;
	for (int64_t i = 0; i < k; i++) {
		w[i] = total > 0 ? vps_max64(0, level - f[i]) * WEIGHT_UNIT / total : 1;
		got += w[i];
	}
	if (!got)
		for (int64_t i = 0; i < k; i++)
			w[i] = 1;
	return VPS_OK;
}

/* prefer's holders, or all of them where, on a topology, a preferred
 * one's own sends take it DUTY_SPREAD times as long as another's (as
 * weighed() asks): it would serve a replicated tensor alone while the
 * others have time to spare; all of them are then weighed. In gpt3-1.3b-tp-down-back A's
 * tensor-parallel rank 1 sent the position embeddings to B's ranks 2 and
 * 3, whose slices lie in its own, beside 4.6 GB of its own, and rank 0,
 * with 2.7 GB, none: 1.03x the floor. Receivers and senders group alike. */
static vps_result_t prefer_weighed(struct ctx *c, struct vps_holder *v, size_t n, int64_t T, int64_t want, size_t *out)
{
	*out = prefer(v, n, T, want);
	int64_t bytes = vps_box_volume(&v[0].region.box) * (int64_t)vps_dtype_size(vps_region_dtype(&v[0].region));
	/* a norm's few bytes to another holder cost a message more than
	 * they save (llama2-7b-tp-up: 16 peers a device, 22) */
	if (*out == n || !c->topo || c->relay != VPS_RELAY_AUTO || bytes < SPLIT_MIN_BYTES * (int64_t)n)
		return VPS_OK;
	/* the preferred ones (first) the busiest by far */
	double pref = 0, other = INFINITY;
	int64_t k = 0;
	for (size_t i = 0; i < n; i++)
		for (int64_t j = 0; j < v[i].count; j++) {
			struct duty d;
			if (++k > SPLIT_MAX)
				return VPS_OK;
			VPS_CHECK(duty_of(c, v[i].base + j * v[i].stride, &d));
			double t = link_time(c, d.forced_link[0], d.forced_link[1]);
			if (i < *out)
				pref = fmax(pref, t);
			else
				other = fmin(other, t);
		}
	if (pref > DUTY_SPREAD * other)
		*out = n;
	return VPS_OK;
}

/* Build the groups of the (sorted) A holders in c->ha, marking members on
 * `node`, local groups first. */
static vps_result_t make_groups(struct ctx *c, int32_t node, int64_t exclude, int64_t T, int64_t pref_tp,
			       struct group **gs, size_t *ng)
{
	int64_t nr[NODE_RANKS_MAX];
	size_t nn = node >= 0 ? vps_devices_node_ranks(vps_layout_devices(c->a), vps_layout_world(c->a), node, nr,
						       NODE_RANKS_MAX)
			      : 0;
	if (nn > NODE_RANKS_MAX)
		nn = NODE_RANKS_MAX;
	size_t cap = 0;
	*gs = NULL;
	*ng = 0;
	for (size_t i = 0; i < c->ha.n;) {
		size_t j = i + 1;
		while (j < c->ha.n && vps_box_equal(&c->ha.v[j].region.box, &c->ha.v[i].region.box))
			j++;
		VPS_CHECK(vps_grow((void **)gs, &cap, *ng + 1, sizeof(**gs)));
		struct group *g = &(*gs)[(*ng)++];
		g->first = i;
		vps_result_t rc = prefer_weighed(c, &c->ha.v[i], j - i, T, pref_tp, &g->n);
		if (rc) {
			free(*gs);
			*gs = NULL;
			*ng = 0;
			return rc;
		}
		g->count = 0;
		g->nlocal = 0;
		for (size_t k = i; k < i + g->n; k++)
			g->count += c->ha.v[k].count;
		for (size_t q = 0; q < nn; q++) {
			if (nr[q] == exclude)
				continue;
			for (size_t k = i; k < i + g->n; k++)
				if (member(&c->ha.v[k], nr[q])) {
					g->local[g->nlocal] = nr[q];
					g->local_holder[g->nlocal] = k;
					g->nlocal++;
					break;
				}
		}
		i = j;
	}
	/* local groups first, stable */
	size_t w = 0;
	struct group *sorted = vps_malloc((*ng + 1) * sizeof(*sorted));
	if (!sorted) {
		free(*gs);
		return VPS_ENOMEM;
	}
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < *ng; i++)
			if ((pass == 0) == ((*gs)[i].nlocal > 0))
				sorted[w++] = (*gs)[i];
	free(*gs);
	*gs = sorted;
	return VPS_OK;
}

/* 1. What the destination's own device holds under A is retained (copied
 * from the device to itself); c->rem is left with the rest of R. */
static vps_result_t plan_retains(struct ctx *c, int64_t d, int64_t self, const struct vps_region *R, int64_t only_src,
				 struct vps_pieces *out)
{
	VPS_CHECK(vps_boxes_reset(&c->rem, &R->box));
	if (self < 0)
		return VPS_OK;
	for (size_t k = 0; k < c->ha.n && c->rem.n; k++) {
		const struct vps_holder *h = &c->ha.v[k];
		if (!member(h, self))
			continue;
		for (size_t i = 0; i < c->rem.n; i++) {
			struct vps_box y;
			if (vps_box_intersect(&c->rem.v[i], &h->region.box, &y))
				VPS_CHECK(emit(out, only_src, d, d, &y, &h->region, R));
		}
		VPS_CHECK(vps_boxes_subtract(&c->rem, &c->next, &h->region.box));
	}
	return VPS_OK;
}

/* 2. Who of a group serves a destination: its k candidates (the members on
 * the destination's node, if any, else all), rotation slot p served by
 * candidate (start + p) mod k over m slots; when weighed, the candidates
 * in rotated order with their shares. */
struct choice {
	int64_t k, start, m;
	/* weighted relayed ranges with a direct one: each range a receiver
	 * takes from the holders comes in `parts` equal parts, part j from
	 * candidate start_w + j * k / parts (serve_ranges) */
	bool served;
	int64_t start_w, parts;
	bool weigh;
	int64_t cand[SPLIT_MAX], cum[SPLIT_MAX + 1], w[SPLIT_MAX];
	size_t cand_holder[SPLIT_MAX];
};

/* Candidate idx of group g: its rank and its holder in c->ha. */
static void candidate(const struct ctx *c, const struct group *g, int64_t idx, int64_t *rank, size_t *holder)
{
	if (g->nlocal) {
		*rank = g->local[idx];
		*holder = g->local_holder[idx];
	} else {
		group_member(&c->ha, g, idx, rank, holder);
	}
}

static vps_result_t nic_share(struct ctx *c, const struct group *g, int64_t rn, int64_t rbase, int32_t node,
			      int64_t d, struct choice *ch);
static vps_result_t relay_bound(struct ctx *c, int64_t q, struct fwd *out);

/* The choice of group g for destination replica ri of rn, the replica set
 * starting at rank rbase; for destination d (world rank) taking it
 * directly (-1: relayed), members on other nodes too (nic_share). */
static vps_result_t choose(struct ctx *c, const struct group *g, int64_t ri, int64_t rn, int64_t rbase, int32_t node,
			   int64_t d, struct choice *ch)
{
	int64_t k = g->nlocal ? (int64_t)g->nlocal : g->count;
	ch->k = k;
	ch->start = (ri * k / rn + rbase) % k;
	ch->start_w = rbase % k;
	ch->served = false;
	ch->m = split_parts(k, rn);
	ch->weigh = false;
	if (k <= SPLIT_MAX) {
		for (int64_t j = 0; j < k; j++)
			candidate(c, g, (ch->start + j) % k, &ch->cand[j], &ch->cand_holder[j]);
		VPS_CHECK(weighed(c, ch->cand, k, &ch->weigh));
	}
	if (ch->weigh) {
		VPS_CHECK(weights_of(c, ch->cand, k, node, ch->w));
		ch->cum[0] = 0;
		for (int64_t j = 0; j < k; j++)
			ch->cum[j + 1] = ch->cum[j] + ch->w[j];
	}
	if (d >= 0 && g->nlocal && k < SPLIT_MAX && g->count > k && c->topo && c->relay == VPS_RELAY_AUTO)
		VPS_CHECK(nic_share(c, g, rn, rbase, node, d, ch));
	return VPS_OK;
}

/* Of nvlink bytes over NVLink and nic over the NICs, what to move onto the
 * NICs for both links to end together. */
static double to_nics(const struct ctx *c, double nvlink, double nic)
{
	double bv = c->topo->intra_node_bandwidth, bn = c->topo->inter_node_bandwidth;
	return (bn * nvlink - bv * nic) / (bv + bn);
}

/* A destination whose receives over NVLink outlast those over its NICs
 * takes part of what its node's devices hold from their replicas on other
 * nodes, over the NICs: of every such region the same part, what makes
 * its two links end together (to_nics), from the group's members
 * elsewhere by the room their NICs have until then. In qwen3-30b-ep4-ep8
 * every device sent and received its experts' moves within its node, 3.6
 * GB over NVLink, its NIC idle: 1.13x the relayed floor, which has each
 * device take a ninth of it over its NIC; with these parts 1.01x.
 * Where a node-mate it takes from sends more than it receives (its forced
 * sends and its share of the others, duty_of), the part is what that one
 * would shed (to_nics of its sends, over its share) and the time both
 * links end at is its: in qwen3-30b-ep8-ep4 A's expert-parallel ranks 1-6
 * of a node send 4.5 GB, 0 and 7 receive 2.7 from them, and 0 and 7 taking
 * parts of their own alone left the busy ones 1.07x the floor; 1.01x.
 * Taken only where the busier of the destination and its node-mates gets
 * 1% faster with a message latency for each member added (tiny models on
 * a800-testbed gain nothing). The members elsewhere find the destination
 * as a sender does any of a replica set of EXACT_REPLICAS or fewer
 * (candidates_for), so larger sets are left as they are. */
static vps_result_t nic_share(struct ctx *c, const struct group *g, int64_t rn, int64_t rbase, int32_t node,
			      int64_t d, struct choice *ch)
{
	int64_t K = g->count, k = ch->k, nfar = 0, far[SPLIT_MAX];
	size_t far_holder[SPLIT_MAX];
	if (rn > EXACT_REPLICAS || K > EXACT_REPLICAS)
		return VPS_OK;
	struct fwd f;
	VPS_CHECK(relay_bound(c, d, &f));
	double bv = c->topo->intra_node_bandwidth, bn = c->topo->inter_node_bandwidth, nv = (double)f.recv[0];
	double x = to_nics(c, nv, (double)f.recv[1]), level = (nv - x) / bv;
	if (x <= 0 || f.recv_far <= 0)
		return VPS_OK;
	double part = x / (double)f.recv_far, busiest = nv;
	for (int64_t j = 0; j < k; j++) {
		struct duty dl;
		VPS_CHECK(duty_of(c, ch->cand[j], &dl));
		double sends = (double)dl.forced_link[0] + (double)dl.shared;
		if (sends <= nv || dl.shared <= 0)
			continue;
		double y = fmax(0, to_nics(c, sends, (double)dl.forced_link[1]));
		busiest = fmax(busiest, sends);
		level = fmax(level, (sends - y) / bv);
		part = fmin(part, y / (double)dl.shared);
	}
	double room[SPLIT_MAX], rooms = 0;
	for (int64_t j = 0; j < K && nfar < SPLIT_MAX - k; j++) {
		int64_t r;
		size_t h;
		struct duty dr;
		group_member(&c->ha, g, (j + rbase) % K, &r, &h);
		if (vps_layout_device(c->a, r).node == node)
			continue;
		VPS_CHECK(duty_of(c, r, &dr));
		room[nfar] = fmax(0, level * bn - (double)dr.forced_link[1]);
		rooms += room[nfar];
		far_holder[nfar] = h;
		far[nfar++] = r;
	}
	if (!nfar || rooms <= 0 || level + (double)nfar * c->topo->latency >= 0.99 * busiest / bv)
		return VPS_OK;
	part = fmin(1.0, fmin(part, rooms / (double)f.recv_far));
	int64_t w[SPLIT_MAX], near = 0, far_got = 0;
	for (int64_t j = 0; j < k; j++)
		near += w[j] = ch->weigh ? ch->w[j] : 1;
	for (int64_t j = 0; j < k; j++)
		w[j] = (int64_t)((double)w[j] / (double)near * (1 - part) * (double)WEIGHT_UNIT);
	for (int64_t j = 0; j < nfar; j++)
		far_got += w[k + j] = (int64_t)(part * room[j] / rooms * (double)WEIGHT_UNIT);
	if (!far_got)
		return VPS_OK;
	ch->k = k + nfar;
	ch->weigh = true;
	ch->cum[0] = 0;
	for (int64_t j = 0; j < ch->k; j++) {
		if (j >= k) {
			ch->cand[j] = far[j - k];
			ch->cand_holder[j] = far_holder[j - k];
		}
		ch->w[j] = w[j];
		ch->cum[j + 1] = ch->cum[j] + w[j];
	}
	return VPS_OK;
}

/* 3. A box a group serves, cut among its candidates.
 *
 * The destination buffer is cut in m equal ranges, range p served by
 * candidate (start + p) mod k: consecutive regions come from one source
 * (their copies merge) and every source serves an equal share. A piece
 * contiguous in the buffer is cut at the range boundaries; another goes
 * whole to the range of its first element. Weighed candidates (weighed())
 * serve their shares of every large piece, cut in rotated order; a small
 * piece goes whole to the share its position in the buffer falls in. */
struct cut {
	int64_t first;    /* the box's first element in the destination buffer */
	int64_t vol;      /* its elements */
	int64_t bufsize;  /* the destination buffer's elements */
	bool contiguous;  /* one range of the buffer */
	bool large;       /* worth cutting (SPLIT_MIN_BYTES) */
};

/* Destination rb's buffer less what its device keeps: the rotation's
 * ranges (serve) are equal parts of what moves, not of the buffer. Cut by
 * the buffer, a part that its device keeps left the holders unequal: in
 * gpt3-1.3b-dp-up-back B's stage 1 keeps the tied embedding, a seventh of
 * its buffer, from A's first stage, and of the halves that A's two
 * replicas of stage 1 served one sent 52 MB more than the other (its
 * senders, and so the node they send into, 1.03x the floor). Planned on a
 * topology alone, as choose's weights are; NULL (the buffer as it is)
 * where the device is joining and keeps nothing. */
static vps_result_t moved_map(struct ctx *c, int64_t d, int64_t rb, uint32_t buffer, const struct moved **out)
{
	int64_t self = vps_world_a_rank(c->w, d);
	*out = NULL;
	if (self < 0 || !c->topo || c->relay != VPS_RELAY_AUTO)
		return VPS_OK;
	for (int k = 0; k < MOVED_MAPS; k++)
		if (c->moved[k].used && c->moved[k].rb == rb && c->moved[k].buffer == buffer) {
			*out = c->moved[k].kept ? &c->moved[k] : NULL;
			return VPS_OK;
		}
	struct moved *m = &c->moved[c->moved_next++ % MOVED_MAPS];
	struct vps_rank_view v;
	m->used = false;
	m->n = 0;
	m->kept = 0;
	VPS_CHECK(vps_layout_rank(c->b, rb, &v));
	struct moved_region *at = vps_realloc_array(m->at, v.nregions + 1, sizeof(*at));
	vps_result_t rc = at ? VPS_OK : VPS_NOMEM();
	if (at)
		m->at = at;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		const struct vps_region *r = &v.regions[i];
		if (r->buffer != buffer)
			continue;
		struct moved_region *e = &m->at[m->n++];
		int boxes = 0;
		*e = (struct moved_region){.offset = r->offset, .elements = vps_box_volume(&r->box), .box = r->box};
		c->hm.n = 0;
		rc = a_holders(c, r->tensor, r->state, &r->box, &c->hm);
		for (size_t k = 0; k < c->hm.n && !rc; k++) {
			struct vps_box y;
			if (member(&c->hm.v[k], self) && vps_box_intersect(&c->hm.v[k].region.box, &r->box, &y)) {
				e->kept = vps_min64(e->elements, e->kept + vps_box_volume(&y));
				e->kept_box = y;
				boxes++;
			}
		}
		int64_t s2 = 1;
		e->exact = boxes == 1;
		for (int a = r->box.ndim - 1; a >= 0; a--) {
			e->exact &= r->strides[a] == s2 || r->box.hi[a] - r->box.lo[a] == 1;
			s2 *= r->box.hi[a] - r->box.lo[a];
		}
	}
	vps_rank_view_release(&v);
	VPS_CHECK(rc);
	/* regions in offset order (offset leads the struct), each with what
	 * is kept below it */
	qsort(m->at, m->n, sizeof(*m->at), vps_int64_cmp);
	for (size_t i = 0; i < m->n; i++) {
		m->at[i].before = m->kept;
		m->kept = vps_sat_add(m->kept, m->at[i].kept);
	}
	m->rb = rb;
	m->buffer = buffer;
	m->used = true;
	*out = m->kept ? m : NULL;
	return VPS_OK;
}

/* Elements of box y (within box r) before the t-th of r in row-major
 * order: on each axis, those that agree with the t-th on the axes before
 * it and lie below it on this one. */
static int64_t box_before(const struct vps_box *r, const struct vps_box *y, int64_t t)
{
	int64_t at[VPS_MAX_DIMS], count = 0, prefix = 1;
	for (int a = r->ndim - 1; a >= 0; a--) {
		int64_t ext = r->hi[a] - r->lo[a];
		at[a] = r->lo[a] + t % ext;
		t /= ext;
	}
	for (int a = 0; a < r->ndim && prefix; a++) {
		int64_t below = vps_max64(0, vps_min64(at[a], y->hi[a]) - y->lo[a]), rest = 1;
		for (int b = a + 1; b < r->ndim; b++)
			rest *= y->hi[b] - y->lo[b];
		count += below * rest;
		prefix = at[a] >= y->lo[a] && at[a] < y->hi[a];
	}
	return count;
}

/* Buffer position pos among what moves: less what is kept below it,
 * counted exactly where it can be, else at its region's rate. */
static int64_t moved_at(const struct moved *m, int64_t pos)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (m->at[mid].offset <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo)
		return pos;
	const struct moved_region *e = &m->at[lo - 1];
	int64_t into = vps_min64(pos - e->offset, e->elements), kept = e->before;
	if (into == e->elements)
		kept += e->kept;
	else if (e->kept == e->elements)
		kept += into;
	else if (e->kept > 0 && e->exact)
		kept += box_before(&e->box, &e->kept_box, into);
	else if (e->kept > 0)
		kept += (int64_t)((double)e->kept * (double)into / (double)e->elements);
	return pos - kept;
}

/* The candidate (of ch->cand) whose weight covers element pos of a
 * buffer of bufsize elements (the weights laid along the buffer), and
 * where its part ends (*stop). */
static int64_t weighed_member(const struct choice *ch, int64_t pos, int64_t bufsize, int64_t *stop)
{
	const int64_t *cum = ch->cum;
	int64_t k = ch->k, j = 0;
	*stop = bufsize;
	if (bufsize <= 0 || cum[k] <= 0)
		return 0;
	while (j < k - 1 && (ch->w[j] == 0 || cum[j + 1] * bufsize / cum[k] <= pos))
		j++;
	if (j < k - 1)
		*stop = vps_max64(vps_ceil_div(cum[j + 1] * bufsize, cum[k]), pos + 1);
	return j;
}

/* The source of the box's elements from lo on, up to *hi; *seg is the
 * weighed share reached, carried from one call to the next. */
static void serve(const struct ctx *c, const struct group *g, const struct choice *ch, const struct cut *x,
		  int64_t lo, int64_t *seg, int64_t *hi, int64_t *src, size_t *holder)
{
	int64_t k = ch->k;
	*hi = x->vol;
	if (ch->weigh) {
		const int64_t *cum = ch->cum;
		if (x->large) {
			while (*seg < k && cum[*seg + 1] * x->vol / cum[k] <= lo)
				(*seg)++;
			*hi = *seg + 1 < k ? vps_max64(cum[*seg + 1] * x->vol / cum[k], lo + 1) : x->vol;
		} else {
			int64_t stop;
			*seg = weighed_member(ch, x->first, x->bufsize, &stop);
		}
		*src = ch->cand[*seg];
		*holder = ch->cand_holder[*seg];
		return;
	}
	int64_t pos = x->first + lo;
	int64_t part = x->bufsize > 0 ? vps_min64(pos * ch->m / x->bufsize, ch->m - 1) : 0;
	if (x->contiguous && x->bufsize > 0 && x->large && part < ch->m - 1) {
		int64_t boundary = vps_ceil_div((part + 1) * x->bufsize, ch->m);
		*hi = vps_min64(x->vol, vps_max64(boundary - x->first, lo + 1));
	}
	candidate(c, g, (ch->start + part) % k, src, holder);
}

/* Elements [lo, hi) of box y (row-major, extents ext, vol elements) from
 * src. */
static vps_result_t emit_range(struct vps_pieces *out, int64_t only_src, int64_t src, int64_t d, const struct vps_box *y,
			       const int64_t *ext, int64_t vol, int64_t lo, int64_t hi, const struct vps_region *sr,
			       const struct vps_region *R)
{
	if (lo == 0 && hi == vol)
		return emit(out, only_src, src, d, y, sr, R);
	struct vps_box parts[2 * VPS_MAX_DIMS];
	int np = vps_flat_range_boxes(y->ndim, ext, lo, hi, parts, NULL);
	for (int q = 0; q < np; q++) {
		for (int a = 0; a < y->ndim; a++) {
			parts[q].lo[a] += y->lo[a];
			parts[q].hi[a] += y->lo[a];
		}
		VPS_CHECK(emit(out, only_src, src, d, &parts[q], sr, R));
	}
	return VPS_OK;
}

/* ---- relayed routes ----
 *
 * Range p of a relayed region reaches every receiver once, each node's NICs
 * carrying it once in and, from the holders' node, once out:
 * - a receiver on the holders' node (home) takes its own range from a
 *   holder, and the others' from them (hop 1);
 * - each range of a receiver on another node leaves home once, straight
 *   from a holder or through a receiver at home (its exporter: the ranges
 *   go round the holders and the home receivers in turn, each one's NIC
 *   an equal share), to that receiver (its entry); each home receiver's
 *   own range lands on one other node in turn, at a receiver there;
 * - a node's receivers take the ranges that are not their own from
 *   outside in turn (round robin): the range's entry where it lands there,
 *   else the node's gateway for it, which takes it from its entry; every
 *   other receiver of the node takes it from that one over the node's
 *   links.
 * A relay passes on a range the hop after it took it in, so a hop is at
 * most 3. With the holders on several nodes, or none of the receivers at
 * home, every range is its receiver's own to take from a holder. */

/* The tables of rl's routes, in O(receivers x their nodes). */
static void relay_index(struct relay *rl)
{
	uint8_t count[EXACT_REPLICAS];
	rl->nn = 0;
	rl->home_idx = -1;
	for (int64_t q = 0; q < rl->n; q++) {
		int m = 0;
		while (m < rl->nn && rl->nodes[m] != rl->node[q])
			m++;
		if (m == rl->nn) {
			rl->nodes[rl->nn++] = rl->node[q];
			count[m] = 0;
			if (rl->home != NO_HOME && rl->node[q] == rl->home)
				rl->home_idx = m;
		}
		rl->nidx[q] = (uint8_t)m;
		rl->kth[m][count[m]++] = (uint8_t)q;
	}
	for (int m = 0; m < rl->nn; m++) {
		rl->below[m][0] = 0;
		for (int64_t p = 0; p < rl->n; p++)
			rl->below[m][p + 1] = (uint8_t)(rl->below[m][p] + (rl->nidx[p] == m));
	}
}

static bool at_home(const struct relay *rl, int64_t q)
{
	return rl->home_idx >= 0 && rl->nidx[q] == rl->home_idx;
}

/* Who carries range p (of a receiver off home) out of home: a holder (-1)
 * or a home receiver. */
static int64_t exporter(const struct relay *rl, int64_t p)
{
	if (rl->home_idx < 0)
		return -1;
	int64_t home = rl->below[rl->home_idx][rl->n];
	int64_t slot = (p - rl->below[rl->home_idx][p]) % (rl->holders + home);
	return slot < rl->holders ? -1 : rl->kth[rl->home_idx][slot - rl->holders];
}

/* The node (its number in rl) range p lands on first: its receiver's, or
 * for a home receiver's range, the other nodes in turn. */
static int landing(const struct relay *rl, int64_t p)
{
	if (!at_home(rl, p))
		return rl->nidx[p];
	int naway = rl->nn - 1;
	if (!naway)
		return rl->home_idx;
	int k = rl->below[rl->home_idx][p] % naway;
	return k < rl->home_idx ? k : k + 1;
}

/* The receiver on node m (its number in rl; not p's node) that takes range
 * p in from outside. */
static int64_t taker(const struct relay *rl, int64_t p, int m)
{
	return rl->kth[m][(p - rl->below[m][p]) % rl->below[m][rl->n]];
}

/* Where receiver i takes range p from: *from a receiver, or -1 for a
 * holder; *hop the hop of that piece. */
static void route(const struct relay *rl, int64_t p, int64_t i, int64_t *from, int *hop)
{
	*from = -1;
	*hop = 0;
	if (p >= rl->n) { /* the weighted ranges' direct one: into each node once */
		int m = rl->nidx[i];
		int64_t gw = rl->kth[m][0];
		*from = gw == i ? -1 : gw;
		*hop = gw != i;
		return;
	}
	if (at_home(rl, i)) {
		int64_t e = at_home(rl, p) ? p : exporter(rl, p);
		if (e >= 0 && e != i) {
			*from = e;
			*hop = 1;
		}
		return;
	}
	if (rl->entry_by_holders && rl->home_idx < 0) {
		int64_t gw = rl->nidx[i] == rl->nidx[p] ? p : taker(rl, p, rl->nidx[i]);
		*from = gw == i ? -1 : gw;
		*hop = gw != i;
		return;
	}
	int land = landing(rl, p);
	int64_t entry = at_home(rl, p) ? taker(rl, p, land) : p, e = exporter(rl, p);
	/* the hop at which the entry takes p in */
	int in = at_home(rl, p) || e >= 0;
	if (i == entry) {
		*from = at_home(rl, p) ? p : e;
		*hop = *from >= 0;
		return;
	}
	int64_t gateway = land == rl->nidx[i] ? i : taker(rl, p, rl->nidx[i]);
	*from = gateway == i ? entry : gateway;
	*hop = in + (gateway == i ? 1 : 2);
}

/* Where range j (0 to n, or n + 1 weighted) of a relayed buffer of bufsize
 * elements starts. */
static int64_t range_start(const struct relay *rl, int64_t j, int64_t bufsize)
{
	if (!rl->weighted)
		return vps_ceil_div(j * bufsize, rl->n);
	/* bufsize * cut / RANGE_SCALE, exact, without overflow */
	int64_t f = rl->cut[j];
	return bufsize / RANGE_SCALE * f + bufsize % RANGE_SCALE * f / RANGE_SCALE;
}

/* The range element pos of a relayed buffer lies in (weighted ranges may
 * be empty: the last range starting at or before pos). */
static int64_t range_of(const struct relay *rl, int64_t pos, int64_t bufsize)
{
	if (bufsize <= 0)
		return 0;
	if (!rl->weighted)
		return vps_min64(pos * rl->n / bufsize, rl->n - 1);
	int64_t p = rl->n;
	while (p > 0 && range_start(rl, p, bufsize) > pos)
		p--;
	return p;
}

/* Whether group gi's entries go by the members' shares (relay_entry). */
static bool entry_shared(const struct relay *rl, size_t gi, const struct group *g)
{
	if (!rl->entry_by_holders || gi >= ENTRY_GROUPS || g->nlocal || g->count > DUTY_MEMBERS)
		return false;
	for (int j = 0; j < DUTY_MEMBERS; j++)
		if (rl->entry_w[gi][j])
			return true;
	return false;
}

/* The member of group gi that brings range p of the buffer into receiver
 * rl->i's node from element pos on, and where its part ends (*stop). A
 * range's entry into its own receiver's node goes from the members in
 * turn, as every range does unweighed (duty_of's best counts it so); its
 * entries into the other nodes, what the receivers would have passed on,
 * are laid end to end in order (range, then node), each member its share
 * of them (entry_w), cut within an entry where a share ends. */
static int64_t entry_member(const struct relay *rl, size_t gi, int64_t p, int64_t pos, int64_t bufsize, int64_t k,
			    int64_t *stop)
{
	const uint16_t *w = rl->entry_w[gi];
	int64_t m = rl->nidx[rl->i], home = rl->nidx[p];
	int64_t rs = range_start(rl, p, bufsize), len = range_start(rl, p + 1, bufsize) - rs;
	*stop = rs + len;
	if (m == home)
		return (p * rl->nn + m) % k;
	int64_t sum = 0, last = 0;
	for (int j = 0; j < DUTY_MEMBERS; j++) {
		sum += w[j];
		if (w[j])
			last = j;
	}
	int64_t items = rl->n * (rl->nn - 1), t = p * (rl->nn - 1) + (m < home ? m : m - 1);
	/* in units of an entry's sum-th part */
	int64_t u = t * sum + (len > 0 ? (pos - rs) * sum / len : 0), acc = 0, j = 0;
	while (j < last && (!w[j] || u >= acc + w[j] * items)) {
		acc += w[j] * items;
		j++;
	}
	int64_t edge = acc + w[j] * items - t * sum;
	if (j < last && edge < sum && len > 0)
		*stop = rs + vps_ceil_div(edge * len, sum);
	return j;
}

/* Which candidates serve the ranges of rl's weighted buffer that
 * receivers take from the holders: every one of them alike, each range in
 * equal parts by its place in the buffer, part j from the j-th of
 * min(k, n + nn) slots spread over the k candidates. The ranges come in
 * sizes as unequal as the receivers' room: the candidates in turn by
 * receiver gave one of them the large ranges of every receiver on one
 * node (llama2-7b-dp-down-back: a holder 0.46 GB busier than its
 * replica); whole ranges to the least loaded, largest first, turning with
 * the tensor, still left the holders of a stage 0.08 to 0.18 GB of
 * llama2-7b-dp-up's relayed ranges each, as the tensors in a range fell.
 * A range's parts are the same elements whichever rank plans them, so
 * every rank cuts alike. */
static void serve_ranges(const struct relay *rl, struct choice *ch)
{
	ch->parts = vps_min64(ch->k, rl->n + rl->nn);
	ch->served = true;
}

/* The candidate (of group g's, in choice ch) that brings in element pos
 * of range p of rl's served buffer, and where its part ends (*stop). */
static int64_t served_member(const struct relay *rl, const struct choice *ch, int64_t p, int64_t pos, int64_t bufsize,
			     int64_t *stop)
{
	int64_t rs = range_start(rl, p, bufsize), len = range_start(rl, p + 1, bufsize) - rs;
	int64_t j = len > 0 ? vps_min64((pos - rs) * ch->parts / len, ch->parts - 1) : 0;
	*stop = rs + vps_ceil_div((j + 1) * len, ch->parts);
	return (ch->start_w + j * ch->k / ch->parts) % ch->k;
}

static vps_result_t plan_cut(struct ctx *c, const struct group *g, size_t gi, const struct choice *ch,
			     const struct relay *rl, int64_t d, const struct vps_region *R, int64_t bufsize,
			     const struct moved *mm, const struct vps_box *y, int64_t only_src, struct vps_pieces *out)
{
	int64_t esize = (int64_t)vps_dtype_size(vps_region_dtype(R)), ext[VPS_MAX_DIMS];
	struct cut x = {.first = vps_region_offset_at(R, y->lo), .vol = vps_box_volume(y), .bufsize = bufsize,
			.contiguous = true};
	for (int a = 0; a < y->ndim; a++)
		ext[a] = y->hi[a] - y->lo[a];
	for (int a = y->ndim - 1, s2 = 1; a >= 0; a--) {
		if (ext[a] != 1 && R->strides[a] != s2)
			x.contiguous = false;
		s2 *= (int)ext[a];
	}
	x.large = x.vol * esize >= SPLIT_MIN_BYTES;
	int64_t lo = 0, seg = 0;
	while (lo < x.vol && rl) {
		/* range p of the buffer, by its route: from a relay, or from the
		 * holder the rotation picks (a piece not one range of the buffer
		 * goes whole with its first element) */
		int64_t pos = x.first + lo, p = range_of(rl, pos, bufsize);
		int64_t end = x.vol;
		if (x.contiguous && bufsize > 0)
			end = vps_min64(x.vol, vps_max64(range_start(rl, p + 1, bufsize) - x.first, lo + 1));
		int64_t from;
		int hop;
		route(rl, p, rl->i, &from, &hop);
		if (from >= 0) {
			struct vps_region fr = *R;
			fr.buffer = vps_buffer_at_hop(R->buffer, hop);
			VPS_CHECK(emit_range(out, only_src, rl->world[from], d, y, ext, x.vol, lo, end, &fr, R));
		} else {
			int64_t src;
			size_t holder;
			/* each range enters each node from a holder: by their shares,
			 * else the holders in turn */
			int64_t idx, stop;
			if (entry_shared(rl, gi, g)) {
				idx = entry_member(rl, gi, p, pos, bufsize, ch->k, &stop);
				if (x.contiguous)
					end = vps_min64(end, vps_max64(stop - x.first, lo + 1));
			} else if (ch->served && !rl->entry_by_holders) {
				idx = served_member(rl, ch, p, pos, bufsize, &stop);
				if (x.contiguous)
					end = vps_min64(end, vps_max64(stop - x.first, lo + 1));
			} else if (!rl->entry_by_holders && ch->weigh) {
				idx = (ch->start + weighed_member(ch, pos, bufsize, &stop)) % ch->k;
				if (x.contiguous && x.large)
					end = vps_min64(end, vps_max64(stop - x.first, lo + 1));
			} else
				idx = rl->entry_by_holders ? (p * rl->nn + rl->nidx[rl->i]) % ch->k : ch->start;
			candidate(c, g, idx, &src, &holder);
			VPS_CHECK(emit_range(out, only_src, src, d, y, ext, x.vol, lo, end, &c->ha.v[holder].region, R));
		}
		lo = end;
	}
	if (mm && lo < x.vol) {
		x.first = moved_at(mm, x.first);
		x.bufsize = vps_max64(bufsize - mm->kept, 1);
	}
	while (lo < x.vol) {
		int64_t hi, src;
		size_t holder;
		serve(c, g, ch, &x, lo, &seg, &hi, &src, &holder);
		VPS_CHECK(emit_range(out, only_src, src, d, y, ext, x.vol, lo, hi, &c->ha.v[holder].region, R));
		lo = hi;
		seg++;
	}
	return VPS_OK;
}

/* Group g's part of what is left of R (c->rem), taken out of c->rem. */
static vps_result_t plan_group(struct ctx *c, const struct group *g, size_t gi, const struct relay *rl, int64_t ri,
			       int64_t rn, int64_t rbase, int64_t d, int64_t rb, const struct vps_region *R, int64_t bufsize,
			       int64_t only_src, struct vps_pieces *out)
{
	const struct vps_box *gbox = &c->ha.v[g->first].region.box;
	struct choice ch;
	const struct moved *mm = NULL;
	VPS_CHECK(choose(c, g, ri, rn, rbase, vps_world_device(c->w, d).node, rl ? -1 : d, &ch));
	/* the rotation's ranges matter where it has candidates to turn over */
	if (!rl && ch.k > 1)
		VPS_CHECK(moved_map(c, d, rb, R->buffer, &mm));
	if (rl && rl->weighted && rl->cut[rl->n] < rl->cut[rl->n + 1])
		serve_ranges(rl, &ch);
	for (size_t i = 0; i < c->rem.n; i++) {
		struct vps_box y;
		if (vps_box_intersect(&c->rem.v[i], gbox, &y))
			VPS_CHECK(plan_cut(c, g, gi, &ch, rl, d, R, bufsize, mm, &y, only_src, out));
	}
	return vps_boxes_subtract(&c->rem, &c->next, gbox);
}

/* ---- VPS_RELAY_AUTO: whether relaying a region lowers its busiest sender ----
 *
 * The region's bytes, direct and relayed, on the devices it involves: its
 * holders and its receivers, in units of one range (its bytes over n).
 * Directly each receiver takes all n from its group's members on its
 * node, or else from any of them; relayed, each range goes as `route`
 * says, a holder's from those same members. A group's members share their
 * units evenly (the rotation's aim), each group weighed by the part of the
 * region it holds. Ranges are equal here: a buffer's regions
 * relay alike and its ranges even out over them. */
struct relay_load {
	double send[2], recv[2]; /* over NVLink [0] and the NICs [1] */
};

/* A device's time on the topology (each link both ways at once), or its
 * bytes without one; only what it sends, or all it does. */
static double load_time(const struct ctx *c, const struct relay_load *l, bool sends_only)
{
	double intra = l->send[0], inter = l->send[1];
	if (!sends_only) {
		intra = fmax(intra, l->recv[0]);
		inter = fmax(inter, l->recv[1]);
	}
	if (!c->topo)
		return sends_only ? l->send[0] + l->send[1] : fmax(l->send[0] + l->send[1], l->recv[0] + l->recv[1]);
	return fmax(intra / c->topo->intra_node_bandwidth, inter / c->topo->inter_node_bandwidth);
}

/* Relayed or direct, rl's region with groups gs: its busiest sender's
 * time, its busiest device's, and its busiest receiver's (rl->n units a
 * copy). */
static void relay_estimate(const struct ctx *c, const struct relay *rl, const struct group *gs, size_t ng,
			   const struct vps_box *R, bool relayed, double *sender, double *device, double *receiver,
			   double *inbound)
{
	struct relay_load recv[EXACT_REPLICAS];
	double whole = (double)vps_box_volume(R);
	memset(recv, 0, sizeof(recv));
	*sender = *device = *receiver = *inbound = 0;
	for (size_t gi = 0; gi < ng; gi++) {
		const struct group *g = &gs[gi];
		struct vps_box x;
		if (!vps_box_intersect(&c->ha.v[g->first].region.box, R, &x) || whole <= 0)
			continue;
		double part = (double)vps_box_volume(&x) / whole;
		/* the group's members on each receiver's node (m), and what they
		 * serve there over NVLink; what the others are served over the
		 * NICs by all */
		int64_t on[EXACT_REPLICAS] = {0};
		double served[EXACT_REPLICAS] = {0}, away = 0;
		for (int64_t j = 0; j < g->count; j++) {
			int64_t ra;
			size_t h;
			group_member(&c->ha, g, j, &ra, &h);
			int32_t node = vps_layout_device(c->a, ra).node;
			for (int m = 0; m < rl->nn; m++)
				on[m] += rl->nodes[m] == node;
		}
		for (int64_t i = 0; i < rl->n; i++)
			for (int64_t p = 0; p < (relayed ? rl->n : 1); p++) {
				int64_t from = -1;
				int hop;
				double units = relayed ? part : part * (double)rl->n;
				if (relayed)
					route(rl, p, i, &from, &hop);
				int m = rl->nidx[i];
				if (from < 0 && on[m]) {
					served[m] += units;
					recv[i].recv[0] += units;
				} else if (from < 0) {
					away += units;
					recv[i].recv[1] += units;
				} else {
					int link = rl->nidx[from] != m;
					recv[from].send[link] += units;
					recv[i].recv[link] += units;
				}
			}
		/* a member on node m: its share there and of what leaves;
		 * members elsewhere share what leaves alone */
		struct relay_load member = {{0, away / (double)g->count}, {0, 0}};
		*sender = fmax(*sender, load_time(c, &member, true));
		*device = fmax(*device, load_time(c, &member, false));
		for (int m = 0; m < rl->nn; m++)
			if (on[m]) {
				member.send[0] = served[m] / (double)on[m];
				*sender = fmax(*sender, load_time(c, &member, true));
				*device = fmax(*device, load_time(c, &member, false));
			}
	}
	for (int64_t i = 0; i < rl->n; i++) {
		*sender = fmax(*sender, load_time(c, &recv[i], true));
		*device = fmax(*device, load_time(c, &recv[i], false));
		*receiver = fmax(*receiver, load_time(c, &recv[i], false));
		struct relay_load in = {{0, 0}, {recv[i].recv[0], recv[i].recv[1]}};
		*inbound = fmax(*inbound, load_time(c, &in, false));
	}
}

/* Whether relaying rl's region makes its busiest sender faster by more
 * than 1%, no receiver ending busier than the busiest device was directly;
 * *inbound whether its busiest receiver's receives get faster by more than
 * 1% too (a range entering a node once where it entered once a receiver:
 * bytes moved from NICs to NVLink). */
static bool relay_gains(const struct ctx *c, const struct vps_region *R, const struct relay *rl,
			const struct group *gs, size_t ng, bool *inbound)
{
	double send_d, dev_d, recv_d, in_d, send_r, dev_r, recv_r, in_r;
	relay_estimate(c, rl, gs, ng, &R->box, false, &send_d, &dev_d, &recv_d, &in_d);
	relay_estimate(c, rl, gs, ng, &R->box, true, &send_r, &dev_r, &recv_r, &in_r);
	*inbound = in_r < 0.99 * in_d;
	return send_r < 0.99 * send_d && recv_r <= dev_d;
}

/* What one relay of a region of `bytes` with n receivers (free ones: they
 * hold none of it under A), `here` of them on the relay's node and all of
 * them on nodes[0..nnodes), could pass on, added to out (NVLink [0], NICs
 * [1]). Where no receiver shares a node with a holder of the region (in
 * c->hda), none is at home and `route` sends a relay's own range (bytes
 * over n) into each other node once, and over NVLink to its node-mates
 * its own range and those it is the gateway for (an equal share of the
 * ranges from outside); else a relay may export its home's ranges too,
 * and one copy of the region bounds it. One copy was the bound everywhere
 * before: in llama2-7b-dp-up it counted four times what stage 0's
 * receivers pass on over their NICs and kept them from relaying.
 * Returns whether a receiver is at home. */
static bool relay_share(const struct ctx *c, int64_t bytes, int64_t n, int64_t here, const int32_t *nodes,
			int nnodes, int64_t out[2])
{
	bool home = false;
	for (size_t k = 0; k < c->hda.n && !home; k++) {
		const struct vps_holder *h = &c->hda.v[k];
		home = h->count > EXACT_REPLICAS;
		for (int64_t j = 0; j < h->count && !home; j++) {
			int32_t hn = vps_layout_device(c->a, h->base + j * h->stride).node;
			for (int m = 0; m < nnodes && !home; m++)
				home = nodes[m] == hn;
		}
	}
	if (home) {
		out[nnodes > 1] = vps_sat_add(out[nnodes > 1], bytes);
		return true;
	}
	int64_t range = vps_ceil_div(bytes, n), mates = here - 1;
	int64_t gateway = here > 0 ? vps_ceil_div(n - here, here) : 0;
	int64_t intra = vps_min64(bytes, range * mates * (1 + gateway));
	out[0] = vps_sat_add(out[0], intra);
	out[1] = vps_sat_add(out[1], vps_min64(bytes, range * (nnodes - 1)));
	return false;
}

static vps_result_t duty_likely(struct ctx *c, int64_t ra, int depth, struct duty *out);

/* A B region's key in fwd->entered: its tensor, state and box. */
static uint64_t region_key(uint32_t tensor, int state, const struct vps_box *box)
{
	uint64_t key = (uint64_t)tensor * 0x9e3779b97f4a7c15u ^ (uint64_t)state;
	for (int k = 0; k < box->ndim; k++)
		key = (key ^ (uint64_t)box->lo[k] ^ (uint64_t)box->hi[k] << 20) * 0x100000001b3u;
	return key;
}

static int key_cmp(const void *p, const void *q)
{
	uint64_t x = *(const uint64_t *)p, y = *(const uint64_t *)q;
	return (x > y) - (x < y);
}

/* A region q would relay, for relay_likely: what q passes on of it, its
 * holders under A (from first_holder in the scan's list of them) and its
 * free receivers (from first in theirs). */
struct relay_cand {
	uint64_t key; /* region_key of the B region */
	int64_t share[2];
	size_t first, nfree, first_holder, nholders;
	bool mixed; /* some receivers are devices of A */
	bool gains; /* relaying it lowers its busiest sender's bytes (relay_cand_add) */
	/* no receiver at home, on two nodes or more, outnumbering them: it
	 * may enter their nodes from its holders (relay_entry, entry_likely) */
	bool entry;
	int64_t members; /* its holders under A, all of them */
};

struct relay_cands {
	struct relay_cand *v;
	size_t n, cap;
	int64_t *free; /* world ranks of the free receivers */
	size_t nfree, capfree;
	int64_t *holders; /* A ranks */
	size_t nholders, capholders;
};

/* Region h (B holders; c->hda its A holders) as one q would relay, into
 * lc: what q passes on of it (relay_share), its A holders (the first
 * DUTY_MEMBERS of each group, as relay_light weighs them), and its free
 * receivers. */
static vps_result_t relay_cand_add(struct ctx *c, const struct vps_holder *h, int64_t bytes, int64_t n, int64_t here,
				   const int32_t *nodes, int nnodes, struct relay_cands *lc)
{
	struct relay_cand x = {.key = region_key(h->region.tensor, h->region.state, &h->region.box),
			       .first = lc->nfree,
			       .first_holder = lc->nholders};
	bool home = relay_share(c, bytes, n, here, nodes, nnodes, x.share);
	x.entry = !home && nnodes >= 2 && n > nnodes;
	/* relay_gains by bytes: its holders share n copies directly, one
	 * relayed, and q passes on its share */
	int64_t holders = 0;
	for (size_t k = 0; k < c->hda.n; k++)
		holders = vps_sat_add(holders, c->hda.v[k].count);
	double direct = (double)bytes * (double)n / (double)vps_max64(holders, 1);
	x.members = holders;
	x.gains = fmax((double)bytes / (double)vps_max64(holders, 1), (double)x.share[0] + (double)x.share[1]) <
		  0.99 * direct;
	for (size_t k = 0; k < c->hda.n; k++)
		for (int64_t j = 0; j < vps_min64(c->hda.v[k].count, DUTY_MEMBERS); j++) {
			VPS_CHECK(VPS_GROW(lc->holders, lc->capholders, lc->nholders + 1));
			lc->holders[lc->nholders++] = c->hda.v[k].base + j * c->hda.v[k].stride;
		}
	x.nholders = lc->nholders - x.first_holder;
	for (int64_t j = 0; j < h->count; j++) {
		int64_t w = vps_world_of_b(c->w, h->base + j * h->stride), a = vps_world_a_rank(c->w, w);
		if (a_holds(c, a))
			continue;
		x.mixed |= a >= 0;
		VPS_CHECK(VPS_GROW(lc->free, lc->capfree, lc->nfree + 1));
		lc->free[lc->nfree++] = w;
	}
	x.nfree = lc->nfree - x.first;
	VPS_CHECK(VPS_GROW(lc->v, lc->cap, lc->n + 1));
	lc->v[lc->n++] = x;
	return VPS_OK;
}

/* relay_bound's count of q's regions into *out (uses c->hda and c->hdb);
 * with lc, each region it would relay into lc as well. */
static vps_result_t relay_scan(struct ctx *c, int64_t q, struct fwd *out, struct relay_cands *lc)
{
	struct fwd f = {.world = q};
	int64_t rb = vps_world_b_rank(c->w, q), aq = vps_world_a_rank(c->w, q), nr[NODE_RANKS_MAX];
	int32_t node = vps_world_device(c->w, q).node;
	size_t nn = vps_devices_node_ranks(vps_layout_devices(c->a), vps_layout_world(c->a), node, nr, NODE_RANKS_MAX);
	if (nn > NODE_RANKS_MAX)
		nn = NODE_RANKS_MAX;
	struct vps_rank_view v = {0};
	vps_result_t rc = rb >= 0 ? vps_layout_rank(c->b, rb, &v) : VPS_OK;
	if (rc)
		return rc;
	for (size_t i = 0; rb >= 0 && i < v.nregions && !rc; i++) {
		const struct vps_region *r = &v.regions[i];
		int64_t bytes = vps_box_volume(&r->box) * (int64_t)vps_dtype_size(vps_region_dtype(r));
		c->hda.n = 0;
		c->hdb.n = 0;
		rc = a_holders(c, r->tensor, r->state, &r->box, &c->hda);
		bool holds = false, near = false;
		int64_t members = 0, nearby = 0;
		for (size_t k = 0; k < c->hda.n && !holds; k++) {
			holds = member(&c->hda.v[k], aq);
			members = vps_sat_add(members, c->hda.v[k].count);
			for (size_t x = 0; x < nn; x++)
				nearby += member(&c->hda.v[k], nr[x]);
		}
		near = nearby > 0;
		if (rc || holds)
			continue;
		f.recv[!near] = vps_sat_add(f.recv[!near], bytes);
		if (near && members > nearby)
			f.recv_far = vps_sat_add(f.recv_far, bytes);
		int64_t from_away = near ? 0 : bytes;
		rc = vps_layout_holders(c->b, r->tensor, r->state, &r->box, &c->hdb);
		for (size_t k = 0; k < c->hdb.n && !rc; k++) {
			const struct vps_holder *h = &c->hdb.v[k];
			if (!member(h, rb) || !vps_box_equal(&h->region.box, &r->box) || h->region.buffer != r->buffer ||
			    h->region.offset != r->offset || h->count > EXACT_REPLICAS)
				continue;
			int64_t n = 0, here = 0;
			int32_t nodes[EXACT_REPLICAS];
			int nnodes = 0;
			for (int64_t j = 0; j < h->count; j++) {
				int64_t w = vps_world_of_b(c->w, h->base + j * h->stride), a = vps_world_a_rank(c->w, w);
				if (a_holds(c, a))
					continue;
				int32_t wn = vps_world_device(c->w, w).node;
				int m = 0;
				while (m < nnodes && nodes[m] != wn)
					m++;
				if (m == nnodes)
					nodes[nnodes++] = wn;
				n++;
				here += wn == node;
			}
			if (n >= 2 && lc)
				rc = relay_cand_add(c, h, bytes, n, here, nodes, nnodes, lc);
			if (n >= 2)
				relay_share(c, bytes, n, here, nodes, nnodes, f.bytes);
			/* relayed, a region from another node enters this one once */
			if (here >= 2)
				from_away /= here;
			break;
		}
		f.recv_best[0] = vps_sat_add(f.recv_best[0], bytes - from_away);
		f.recv_best[1] = vps_sat_add(f.recv_best[1], from_away);
	}
	vps_rank_view_release(&v);
	*out = f;
	return rc;
}

/* Where world rank q's bound lies in c->fwds (sorted by world rank). */
static size_t fwd_slot(const struct ctx *c, int64_t q)
{
	return slot_of(c->fwds, c->nfwds, sizeof(*c->fwds), q);
}

/* Keeps f, a rank's bound, in c->fwds (where it is not yet); *slot its
 * place there. */
static vps_result_t fwd_keep(struct ctx *c, const struct fwd *f, struct fwd **slot)
{
	size_t lo = fwd_slot(c, f->world);
	if (!(lo < c->nfwds && c->fwds[lo].world == f->world)) {
		VPS_CHECK(VPS_GROW(c->fwds, c->capfwds, c->nfwds + 1));
		memmove(&c->fwds[lo + 1], &c->fwds[lo], (c->nfwds - lo) * sizeof(*c->fwds));
		c->fwds[lo] = *f;
		c->nfwds++;
	}
	if (slot)
		*slot = &c->fwds[lo];
	return VPS_OK;
}

/* The most world rank q could pass on: the bytes of each of its B regions
 * it would relay (it holds none of it under A, and the region's free
 * receivers, at most EXACT_REPLICAS, are two or more), in bytes[0] where
 * they are all on q's node, else in bytes[1]. A relay passes on about one
 * copy of a region at most (its own range's copies and, as a gateway or
 * exporter, its share of the others'), so the region's bytes bound it.
 * Beside it what q receives: its B regions that it holds none of, from
 * its node where a holder is there, else from other nodes. From q's own
 * regions and holder arithmetic, once a rank, like duty_of. Uses c->hda
 * and c->hdb. */
static vps_result_t relay_bound(struct ctx *c, int64_t q, struct fwd *out)
{
	size_t lo = fwd_slot(c, q);
	if (lo < c->nfwds && c->fwds[lo].world == q) {
		*out = c->fwds[lo];
		return VPS_OK;
	}
	VPS_CHECK(relay_scan(c, q, out, NULL));
	return fwd_keep(c, out, NULL);
}

/* relay_light's weighing of a region by its holders (A ranks) and its
 * free receivers (world ranks): *yes where they may relay. */
static vps_result_t light_of(struct ctx *c, const int64_t *holders, size_t nh, const int64_t *recv, size_t nr,
			     bool *yes, bool *inbound)
{
	double busiest = 0, best = 0, receives = 0, receives_best = 0;
	*yes = false;
	for (size_t j = 0; j < nh; j++) {
		struct duty d;
		VPS_CHECK(duty_of(c, holders[j], &d));
		busiest = fmax(busiest, link_time(c, d.relayed[0], d.relayed[1]));
		best = fmax(best, link_time(c, d.best[0], d.best[1]));
	}
	for (size_t q = 0; q < nr; q++) {
		int64_t a = vps_world_a_rank(c->w, recv[q]);
		struct fwd f;
		struct duty d;
		VPS_CHECK(relay_bound(c, recv[q], &f));
		receives = fmax(receives, link_time(c, f.recv[0], f.recv[1]));
		receives_best = fmax(receives_best, link_time(c, f.recv_best[0], f.recv_best[1]));
		if (a < 0)
			continue;
		VPS_CHECK(duty_likely(c, a, LIKELY_DEPTH, &d));
		if (link_time(c, vps_sat_add(d.likely[LIKELY_DEPTH - 1][0], f.bytes[0]),
			      vps_sat_add(d.likely[LIKELY_DEPTH - 1][1], f.bytes[1])) >= busiest)
			return VPS_OK;
	}
	*inbound = !(busiest > receives);
	*yes = *inbound ? receives_best < LIGHT_MARGIN * receives : best < LIGHT_MARGIN * busiest;
	return VPS_OK;
}

static vps_result_t entry_likely(struct ctx *c, const struct relay_cand *x, const struct relay_cands *lc, bool *yes,
				 bool *sure);

/* What world rank q likely passes on (bytes[0] over NVLink, [1] over its
 * NICs): of what relay_bound counts, the regions whose free receivers that
 * are devices of A are light, as relay_light weighs them (each one's
 * likely sends and all it could relay, below the busiest holder's sends
 * where joining receivers relay): in llama2-7b-dp-up stage 1's holders
 * relay stage 0 too, 0.25 GB each, which a direct range of stage 1 must
 * leave room for. Once a rank, like relay_bound. */
static vps_result_t relay_likely(struct ctx *c, int64_t q, int64_t likely[2])
{
	size_t lo = fwd_slot(c, q);
	if (lo < c->nfwds && c->fwds[lo].world == q && c->fwds[lo].likely_known) {
		memcpy(likely, c->fwds[lo].likely, sizeof(c->fwds[lo].likely));
		return VPS_OK;
	}
	/* one scan: the candidates, and the bound relay_bound keeps */
	struct relay_cands lc = {0};
	int64_t sum[2] = {0, 0};
	struct fwd f;
	vps_result_t rc = relay_scan(c, q, &f, &lc);
	uint64_t *entered = lc.n ? vps_calloc(lc.n, sizeof(*entered)) : NULL;
	size_t nentered = 0;
	if (lc.n && !entered && !rc)
		rc = VPS_ENOMEM;
	for (size_t i = 0; i < lc.n && !rc; i++) {
		const struct relay_cand *x = &lc.v[i];
		bool light = false, inbound = false;
		if (x->nholders > 0 && x->mixed && x->gains)
			rc = light_of(c, lc.holders + x->first_holder, x->nholders, lc.free + x->first, x->nfree, &light,
				      &inbound);
		bool entry = false, sure = false;
		if (light && !rc)
			rc = entry_likely(c, x, &lc, &entry, &sure);
		if (light)
			for (int link = 0; link < 2 - entry; link++)
				sum[link] = vps_sat_add(sum[link], x->share[link]);
		if (sure)
			entered[nentered++] = x->key;
	}
	free(lc.v);
	free(lc.free);
	free(lc.holders);
	struct fwd *slot = NULL;
	if (!rc)
		rc = fwd_keep(c, &f, &slot);
	if (rc) {
		free(entered);
		return rc;
	}
	if (nentered)
		qsort(entered, nentered, sizeof(*entered), key_cmp);
	free(slot->entered);
	slot->entered = entered;
	slot->nentered = nentered;
	memcpy(slot->likely, sum, sizeof(sum));
	slot->likely_known = true;
	memcpy(likely, sum, sizeof(sum));
	return VPS_OK;
}

/* A device's time moving intra bytes over NVLink and inter over its NIC
 * on the plan's topology, or without one its bytes. */
static double link_time(const struct ctx *c, int64_t intra, int64_t inter)
{
	if (!c->topo)
		return (double)intra + (double)inter;
	return fmax((double)intra / c->topo->intra_node_bandwidth, (double)inter / c->topo->inter_node_bandwidth);
}

/* The receivers of one of a region's B replica sets that are devices of
 * A not holding their part of it (world ranks), for duty_likely. */
struct likely_free {
	int64_t n, w[EXACT_REPLICAS];
};

/* What A rank ra likely sends, weighed `depth` levels deep (1 to
 * LIKELY_DEPTH; out->likely[depth - 1]): duty_of's, each of its regions
 * counted as relayed by every receiver (best) where the devices of A among
 * them are light (what each sends, and all it could relay, below ra's own
 * sends by LIGHT_MARGIN, as relay_light asks of a region's receivers),
 * else as relayed by the joining ones alone. What each receiver sends is
 * duty_of's (where joining receivers relay) one level deep, else its own
 * likely sends a level less deep. Once a rank and depth. */
static vps_result_t duty_likely(struct ctx *c, int64_t ra, int depth, struct duty *out)
{
	VPS_CHECK(duty_of(c, ra, out));
	if (out->likely_known & 1u << (depth - 1))
		return VPS_OK;
	int64_t likely[2] = {0, 0};
	double own = link_time(c, out->relayed[0], out->relayed[1]);
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(c->a, ra, &v));
	int32_t node = vps_layout_device(c->a, ra).node;
	struct region_set *sets = NULL;
	struct likely_free *frees = NULL;
	size_t cap = 0, capfrees = 0, ns = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		int64_t replicas;
		rc = region_sets(c, &v.regions[i], node, &sets, &cap, &ns, &replicas);
		if (!rc)
			rc = VPS_GROW(frees, capfrees, ns);
		/* the free receivers first: duty_of and relay_bound below use hda and hdb */
		for (size_t k = 0; k < ns && !rc; k++) {
			const struct vps_holder *h = &c->hdb.v[sets[k].q];
			struct likely_free *lf = &frees[k];
			lf->n = 0;
			for (int64_t j = 0; h->count <= EXACT_REPLICAS && j < h->count; j++) {
				int64_t w = vps_world_of_b(c->w, h->base + j * h->stride), a = vps_world_a_rank(c->w, w);
				bool holds = false;
				for (size_t q = 0; q < c->hda.n && a >= 0 && !holds; q++)
					holds = member(&c->hda.v[q], a) && vps_box_contains(&c->hda.v[q].region.box, &sets[k].x);
				if (a >= 0 && !holds)
					lf->w[lf->n++] = w;
			}
		}
		for (size_t k = 0; k < ns && !rc; k++) {
			/* a set of joining receivers alone is counted as duty_of does */
			bool light = frees[k].n > 0;
			for (int64_t j = 0; light && j < frees[k].n && !rc; j++) {
				struct duty dq;
				struct fwd f;
				int64_t aq = vps_world_a_rank(c->w, frees[k].w[j]);
				rc = depth > 1 ? duty_likely(c, aq, depth - 1, &dq) : duty_of(c, aq, &dq);
				const int64_t *sends = depth > 1 ? dq.likely[depth - 2] : dq.relayed;
				if (!rc)
					rc = relay_bound(c, frees[k].w[j], &f);
				light = !rc && link_time(c, vps_sat_add(sends[0], f.bytes[0]),
							 vps_sat_add(sends[1], f.bytes[1])) < LIGHT_MARGIN * own;
			}
			for (int link = 0; link < 2; link++)
				likely[link] = vps_sat_add(likely[link], light ? sets[k].best[link] : sets[k].relayed[link]);
		}
	}
	vps_rank_view_release(&v);
	free(sets);
	free(frees);
	VPS_CHECK(rc);
	/* the others' duties may have moved ra's, and filled other depths of it */
	struct duty *slot = &c->duties[duty_slot(c, ra)];
	memcpy(slot->likely[depth - 1], likely, sizeof(likely));
	slot->likely_known |= 1u << (depth - 1);
	*out = *slot;
	return VPS_OK;
}

/* One of the B replica sets of a holder's region, for holder_entries:
 * one of its receivers that are not devices of A holding part of it
 * (world rank, or -1), how many nodes other than the holder's those are
 * on, the set of their nodes (at, nodes_key) and the B region's key. */
struct entry_set {
	int64_t free, nodes;
	uint64_t key, at;
};

/* The set of n nodes (n <= EXACT_REPLICAS) as one key, in any order. */
static uint64_t nodes_key(const int32_t *nodes, int n)
{
	int32_t v[EXACT_REPLICAS];
	memcpy(v, nodes, (size_t)n * sizeof(*v));
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			int32_t t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	uint64_t key = 0xcbf29ce484222325u;
	for (int i = 0; i < n; i++)
		key = (key ^ (uint32_t)v[i]) * 0x100000001b3u;
	return key;
}

/* Whether world rank q surely takes the B region `key` node by node from
 * its holders (relay_likely's entered, entry_likely's *sure). */
static vps_result_t takes_entered(struct ctx *c, int64_t q, uint64_t key, bool *yes)
{
	int64_t likely[2];
	VPS_CHECK(relay_likely(c, q, likely));
	const struct fwd *f = &c->fwds[fwd_slot(c, q)];
	*yes = f->nentered && bsearch(&key, f->entered, f->nentered, sizeof(key), key_cmp);
	return VPS_OK;
}

/* What A rank ra sends of its regions that surely enter their receivers'
 * nodes from their holders (their receivers' relay_likely: entry_likely's
 * *sure), by their receivers' nodes (out->kinds): into every receivers'
 * node off its own rather than once, the bytes more than duty_of's best
 * (over its NICs), and what of duty_of's shared and best those regions
 * are. In llama2-13b-pp-up stage 1's holders send its later layers into
 * nodes 6 and 7 each so, 0.2 GB more a NIC than were they relayed; a
 * direct range of its earlier layers into nodes 4 and 5, sized without
 * them, made those holders the plan's busiest (1.034x its relayed floor).
 * Once a rank. */
static vps_result_t holder_entries(struct ctx *c, int64_t ra, struct duty *out)
{
	VPS_CHECK(duty_of(c, ra, out));
	if (out->entries_known)
		return VPS_OK;
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(c->a, ra, &v));
	int32_t node = vps_layout_device(c->a, ra).node;
	struct entered_kind *kinds = NULL;
	size_t nkinds = 0, capkinds = 0;
	struct region_set *sets = NULL;
	struct entry_set *entries = NULL;
	size_t cap = 0, capentries = 0, ns = 0;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		const struct vps_region *r = &v.regions[i];
		int64_t replicas;
		rc = region_sets(c, r, node, &sets, &cap, &ns, &replicas);
		if (!rc)
			rc = VPS_GROW(entries, capentries, ns);
		/* the receivers first: relay_likely below uses hda and hdb */
		for (size_t k = 0; k < ns && !rc; k++) {
			const struct vps_holder *h = &c->hdb.v[sets[k].q];
			struct entry_set *es = &entries[k];
			es->free = -1;
			es->nodes = 0;
			if (h->count > EXACT_REPLICAS)
				continue;
			es->key = region_key(r->tensor, r->state, &h->region.box);
			int32_t seen[EXACT_REPLICAS];
			int nseen = 0;
			for (int64_t j = 0; j < h->count; j++) {
				int64_t w = vps_world_of_b(c->w, h->base + j * h->stride);
				if (a_holds(c, vps_world_a_rank(c->w, w)))
					continue;
				int32_t wn = vps_world_device(c->w, w).node;
				int m = 0;
				while (m < nseen && seen[m] != wn)
					m++;
				if (m == nseen) {
					seen[nseen++] = wn;
					es->nodes += wn != node;
				}
				if (es->free < 0)
					es->free = w;
			}
			es->at = nodes_key(seen, nseen);
		}
		int64_t elsize = (int64_t)vps_dtype_size(vps_region_dtype(r)), each = vps_max64(replicas, 1);
		for (size_t k = 0; k < ns && !rc; k++) {
			const struct entry_set *es = &entries[k];
			bool entered = false;
			if (es->free < 0 || es->nodes < 2)
				continue;
			rc = takes_entered(c, es->free, es->key, &entered);
			if (rc || !entered)
				continue;
			size_t m = 0;
			while (m < nkinds && kinds[m].nodes != es->at)
				m++;
			if (m == nkinds) {
				rc = VPS_GROW(kinds, capkinds, nkinds + 1);
				if (rc)
					break;
				kinds[nkinds++] = (struct entered_kind){.nodes = es->at};
			}
			int64_t into = 0;
			if (!vps_mul_ok(vps_box_volume(&sets[k].x) * elsize, es->nodes - 1, &into))
				into = INT64_MAX;
			kinds[m].more = vps_sat_add(kinds[m].more, into / each);
			if (each > 1) {
				kinds[m].shared = vps_sat_add(kinds[m].shared, sets[k].all / each);
				kinds[m].once = vps_sat_add(kinds[m].once, vps_sat_add(sets[k].best[0], sets[k].best[1]));
			}
		}
	}
	vps_rank_view_release(&v);
	free(sets);
	free(entries);
	if (rc) {
		free(kinds);
		return rc;
	}
	struct duty *slot = &c->duties[duty_slot(c, ra)];
	slot->kinds = kinds;
	slot->nkinds = nkinds;
	slot->entries_known = true;
	*out = *slot;
	return VPS_OK;
}

/* Whether devices of A among rl's receivers may relay its region. Each,
 * relaying all it could (relay_bound) on top of what it likely sends of
 * its own (duty_likely: its regions relayed where their receivers are
 * light, one level deep), must stay below the busiest holder of the
 * region's own sends (duty_of, where joining receivers relay), in time on
 * the topology (or else in bytes). Counting a receiver's own regions as
 * sent directly wherever no joining device relays them kept it from
 * relaying where other devices of A relay its regions and it sends half
 * of that (qwen3-30b-cp-up, docs/relay.md). And relays must be able to
 * gain where the plan is slow: where the busiest holder's sends outlast every receiver's receives,
 * its sends were every receiver, two or more, of each of its regions to
 * relay (d.best) must be faster by more than 5%; where a receiver's
 * receives last longer, so must the busiest receiver's, were its node's
 * receivers of each region to relay (f.recv_best), and *inbound says that
 * the region's receives must get faster too (relay_gains). A region is
 * one of many: what decides is whether relaying all regions alike could
 * gain, which a region alone does not say; the margin keeps relays from
 * where the plan's slowest device lies elsewhere. */
static vps_result_t relay_light(struct ctx *c, const struct relay *rl, const struct group *gs, size_t ng,
				bool *yes, bool *inbound)
{
	/* a group's members share alike (relay_wanted refuses weighed
	 * groups) and differ by where their receivers are: its first
	 * DUTY_MEMBERS stand for it, which keeps the global plan's cost near
	 * what it was at any number of replicas */
	size_t nh = 0;
	for (size_t gi = 0; gi < ng; gi++)
		nh += (size_t)vps_min64(gs[gi].count, DUTY_MEMBERS);
	int64_t *holders = vps_calloc(nh + 1, sizeof(*holders));
	if (!holders)
		return VPS_ENOMEM;
	nh = 0;
	for (size_t gi = 0; gi < ng; gi++)
		for (int64_t j = 0; j < vps_min64(gs[gi].count, DUTY_MEMBERS); j++) {
			size_t h;
			group_member(&c->ha, &gs[gi], j, &holders[nh++], &h);
		}
	vps_result_t rc = light_of(c, holders, nh, rl->world, (size_t)rl->n, yes, inbound);
	free(holders);
	return rc;
}

/* The largest part of a relayed buffer (0 to 1) receiver q may bring in
 * and pass on, sending own bytes of its own and relaying relay bytes at
 * equal ranges (n of them), before its time exceeds t. */
static double range_room(const struct ctx *c, const int64_t own[2], const int64_t relay[2], int64_t n, double t)
{
	double room = 1;
	if (!c->topo) {
		double r = (double)relay[0] + (double)relay[1];
		if (r > 0)
			room = fmin(room, (t - (double)own[0] - (double)own[1]) / (r * (double)n));
		return fmax(room, 0);
	}
	const double bw[2] = {c->topo->intra_node_bandwidth, c->topo->inter_node_bandwidth};
	for (int k = 0; k < 2; k++)
		if (relay[k] > 0)
			room = fmin(room, (t * bw[k] - (double)own[k]) / ((double)relay[k] * (double)n));
		else if ((double)own[k] > t * bw[k])
			room = 0;
	return fmax(room, 0);
}

/* Whether no receiver of rl shares a node with a holder of its groups (the
 * first DUTY_MEMBERS of each). */
static bool apart(const struct ctx *c, const struct relay *rl, const struct group *gs, size_t ng)
{
	for (size_t gi = 0; gi < ng; gi++)
		for (int64_t j = 0; j < vps_min64(gs[gi].count, DUTY_MEMBERS); j++) {
			int64_t ra;
			size_t h;
			group_member(&c->ha, &gs[gi], j, &ra, &h);
			int32_t node = vps_layout_device(c->a, ra).node;
			for (int64_t q = 0; q < rl->n; q++)
				if (rl->node[q] == node)
					return false;
		}
	return true;
}

struct range_rooms {
	const struct ctx *c;
	const int64_t (*own)[2], (*relay)[2];
	int64_t n;
	/* part n, the direct range (direct): the least any holder sends to
	 * every receiver before its time exceeds t */
	bool direct;
	const int64_t (*held)[2], (*extra)[2];
	size_t nheld;
	/* and the receivers' receives over their NICs: a direct range enters
	 * a node once a receiver, a relayed one once */
	const int64_t (*taken)[2], (*more)[2];
};

static double ranges_room(const void *arg, int64_t q, double t)
{
	const struct range_rooms *r = arg;
	if (q < r->n)
		return range_room(r->c, r->own[q], r->relay[q], r->n, t);
	double room = r->direct ? 1 : 0;
	for (size_t h = 0; h < r->nheld && room > 0; h++)
		room = fmin(room, range_room(r->c, r->held[h], r->extra[h], 1, t));
	for (int64_t j = 0; j < r->n && room > 0; j++)
		room = fmin(room, range_room(r->c, r->taken[j], r->more[j], 1, t));
	return room;
}

/* What the holders of rl's region send were every region of theirs
 * relayed, with what they likely relay of others' (duty_of's best,
 * relay_likely: *held), and what they send more for each part of a buffer
 * they send into each of the receivers' nodes rather than once (*extra:
 * their shared sends, every receiver's, less those relayed, scaled from
 * rl's receivers to its nodes, on the links of those relayed). Their
 * regions that surely enter other receivers' nodes node by node from them
 * (holder_entries) count as they go, in *held; the others, like rl's,
 * as though each went as rl's will. Their first DUTY_MEMBERS of each
 * group stand for them. */
static vps_result_t holders_direct(struct ctx *c, const struct relay *rl, const struct group *gs, size_t ng,
				   int64_t (*held)[2], int64_t (*extra)[2], size_t *n)
{
	double nodes = rl->n > 1 ? (double)(rl->nn - 1) / (double)(rl->n - 1) : 0;
	uint64_t at = nodes_key(rl->nodes, rl->nn);
	*n = 0;
	for (size_t gi = 0; gi < ng; gi++)
		for (int64_t j = 0; j < vps_min64(gs[gi].count, DUTY_MEMBERS) && *n < DIRECT_HOLDERS; j++) {
			int64_t ra;
			size_t h;
			struct duty d;
			group_member(&c->ha, &gs[gi], j, &ra, &h);
			int64_t passes[2];
			VPS_CHECK(relay_likely(c, vps_world_of_device(c->w, vps_layout_device(c->a, ra)), passes));
			VPS_CHECK(holder_entries(c, ra, &d));
			int64_t once[2] = {d.best[0] - d.forced_best[0], d.best[1] - d.forced_best[1]};
			int64_t sum = vps_sat_add(once[0], once[1]);
			/* its regions of other receivers' nodes that enter node by
			 * node are in held; those of rl's go alike, by rl's route */
			int64_t entered[3] = {0, 0, 0};
			for (size_t k = 0; k < d.nkinds; k++)
				if (d.kinds[k].nodes != at) {
					entered[0] = vps_sat_add(entered[0], d.kinds[k].more);
					entered[1] = vps_sat_add(entered[1], d.kinds[k].shared);
					entered[2] = vps_sat_add(entered[2], d.kinds[k].once);
				}
			int64_t rest = vps_max64(d.shared - entered[1] - vps_max64(sum - entered[2], 0), 0);
			int64_t more = (int64_t)((double)rest * nodes);
			held[*n][0] = vps_sat_add(d.best[0], passes[0]);
			held[*n][1] = vps_sat_add(vps_sat_add(d.best[1], passes[1]), entered[0]);
			extra[*n][0] = sum > 0 ? (int64_t)((double)more * ((double)once[0] / (double)sum)) : 0;
			extra[*n][1] = more - extra[*n][0];
			++*n;
		}
	return VPS_OK;
}

/* Cuts rl's buffer at level: each part its room there, the direct one last. */
static void cut_at(struct relay *rl, const struct range_rooms *rr, double level)
{
	double room[EXACT_REPLICAS + 1], sum = 0, acc = 0;
	for (int64_t q = 0; q <= rl->n; q++)
		sum += room[q] = ranges_room(rr, q, level);
	rl->cut[0] = 0;
	for (int64_t q = 0; q <= rl->n; q++) {
		acc += room[q] / sum;
		rl->cut[q + 1] = (uint32_t)fmax(rl->cut[q], fmin((double)RANGE_SCALE, floor(acc * (double)RANGE_SCALE)));
	}
	rl->cut[rl->n + 1] = (uint32_t)RANGE_SCALE;
	if (!rr->direct)
		rl->cut[rl->n] = (uint32_t)RANGE_SCALE;
	rl->weighted = true;
}

/* Ranges for rl's receivers (every free one: RELAY_FREE) sized to what
 * each has to spare: a receiver's own sends (what it likely sends, a
 * device of A; nothing, a joining one) and all it relays at equal ranges
 * (relay_bound) grow with its range, and the ranges are cut so that the
 * busiest of them is as little busy as can be (water-filling its time
 * over the receivers). In llama2-7b-dp-up stage 1's receivers are the
 * devices of stages 2 and 3, relaying it on top of their own stages;
 * stage 3's, with 0.12 GB more of their own, were the busiest, and pass
 * on smaller ranges now (1.04x faster). On a topology, where no receiver
 * shares a node with a holder and the holders have time to spare beside
 * what they send were all their regions relayed, a last range goes from
 * them into each of the receivers' nodes once (route), relayed no further
 * (holders_direct weighs them as though all their regions went alike):
 * in llama2-*-tp-up stage 1's receivers are the devices of stages 2 and
 * 3, each busy with its own stage, while stage 1's holders sent 0.8x as
 * much. Only where no receiver is at home
 * (relay_share's count is then what `route` does), and only where the
 * busiest gains more than 1% (the direct range: more than 1% over the
 * ranges without it); else equal ranges, the plan as before. *when: the
 * busiest one's time so cut, or in equal ranges (infinite with a receiver
 * at home: not weighed). Every rank reads the same receivers and loads,
 * so they cut alike. */
static vps_result_t relay_weigh(struct ctx *c, struct relay *rl, const struct group *gs, size_t ng, double *when)
{
	*when = INFINITY;
	int64_t own[EXACT_REPLICAS][2], relay[EXACT_REPLICAS][2], held[DIRECT_HOLDERS][2], extra[DIRECT_HOLDERS][2];
	int64_t taken[EXACT_REPLICAS][2], more[EXACT_REPLICAS][2];
	rl->weighted = false;
	if (rl->home_idx >= 0)
		return VPS_OK;
	double equal = 0, least = 0;
	for (int64_t q = 0; q < rl->n; q++) {
		int64_t a = vps_world_a_rank(c->w, rl->world[q]);
		struct fwd f;
		VPS_CHECK(relay_bound(c, rl->world[q], &f));
		own[q][0] = own[q][1] = 0;
		if (a >= 0) {
			struct duty d;
			VPS_CHECK(duty_likely(c, a, LIKELY_DEPTH, &d));
			own[q][0] = d.likely[LIKELY_DEPTH - 1][0];
			own[q][1] = d.likely[LIKELY_DEPTH - 1][1];
		}
		relay[q][0] = f.bytes[0];
		relay[q][1] = f.bytes[1];
		/* the direct range's taker on a node passes it on to its
		 * node-mates (route); its receives over its NIC grow as
		 * though every region it takes came straight to it */
		int m = rl->nidx[q];
		int64_t mates = rl->kth[m][0] == q ? rl->below[m][rl->n] - 1 : 0;
		taken[q][0] = vps_sat_add(own[q][0], relay[q][0]);
		more[q][0] = 0;
		if (mates > 0 && !vps_mul_ok(vps_sat_add(f.recv[0], f.recv[1]), mates, &more[q][0]))
			more[q][0] = INT64_MAX;
		taken[q][1] = f.recv_best[1];
		more[q][1] = vps_max64(f.recv[1] - f.recv_best[1], 0);
		equal = fmax(equal, link_time(c, vps_sat_add(own[q][0], relay[q][0]), vps_sat_add(own[q][1], relay[q][1])));
		least = fmax(least, link_time(c, own[q][0], own[q][1]));
	}
	size_t nheld = 0;
	/* by bytes a node's links are its NICs: passed on over NVLink, the
	 * range would cost its taker as much as the holder it spares */
	if (c->topo && apart(c, rl, gs, ng))
		VPS_CHECK(holders_direct(c, rl, gs, ng, held, extra, &nheld));
	/* no range makes a receiver less busy than its own sends do */
	struct range_rooms rr = {c, own, relay, rl->n, false, held, extra, nheld, taken, more};
	double level = water_level(ranges_room, &rr, rl->n, 1, least, equal);
	rr.direct = nheld > 0;
	double direct = rr.direct ? water_level(ranges_room, &rr, rl->n + 1, 1, least, equal) : INFINITY;
	*when = equal;
	if (direct < 0.99 * level && direct < 0.99 * equal) {
		cut_at(rl, &rr, direct);
		*when = direct;
		return VPS_OK;
	}
	rr.direct = false;
	if (level < 0.99 * equal) {
		cut_at(rl, &rr, level);
		*when = level;
	}
	return VPS_OK;
}

/* A group's members' room for their part of the entries, at time t
 * (range_room's, of one range: the entries). */
struct entry_rooms {
	const struct ctx *c;
	int64_t own[DUTY_MEMBERS][2], entries[2];
};

static double entry_room(const void *arg, int64_t j, double t)
{
	const struct entry_rooms *er = arg;
	return range_room(er->c, er->own[j], er->entries, 1, t);
}

/* The n receivers (world ranks) of a relayed region, for relay_entry
 * and entry_likely: the busiest one's time were each to pass on over its
 * NICs all it could relay (*routed), or over NVLink alone (*entered), and
 * what they would pass on over NICs in all (*exported). A receiver's own
 * sends are what it likely sends (a device of A), or none. */
static vps_result_t receivers_routed(struct ctx *c, const int64_t *world, int64_t n, double *routed, double *entered,
				     int64_t *exported)
{
	*routed = *entered = 0;
	*exported = 0;
	for (int64_t q = 0; q < n; q++) {
		int64_t a = vps_world_a_rank(c->w, world[q]), own[2] = {0, 0};
		struct fwd f;
		VPS_CHECK(relay_bound(c, world[q], &f));
		if (a >= 0) {
			struct duty d;
			VPS_CHECK(duty_likely(c, a, LIKELY_DEPTH, &d));
			own[0] = d.likely[LIKELY_DEPTH - 1][0];
			own[1] = d.likely[LIKELY_DEPTH - 1][1];
		}
		int64_t nvlink = vps_sat_add(own[0], f.bytes[0]);
		*routed = fmax(*routed, link_time(c, nvlink, vps_sat_add(own[1], f.bytes[1])));
		*entered = fmax(*entered, link_time(c, nvlink, own[1]));
		*exported = vps_sat_add(*exported, f.bytes[1]);
	}
	return VPS_OK;
}

/* A holder (A rank ra) of a relayed region, for relay_entry and
 * entry_likely: its sends were every region of its relayed (duty_of's
 * best) with all it could relay over NVLink (own[0]) and the NICs
 * (own[1], before any entries), and *held raised to its time with all it
 * could relay. */
static vps_result_t holder_routed(struct ctx *c, int64_t ra, int64_t own[2], double *held)
{
	struct duty d;
	struct fwd f;
	VPS_CHECK(duty_of(c, ra, &d));
	VPS_CHECK(relay_bound(c, vps_world_of_device(c->w, vps_layout_device(c->a, ra)), &f));
	own[0] = vps_sat_add(d.best[0], f.bytes[0]);
	own[1] = d.best[1];
	*held = fmax(*held, link_time(c, own[0], vps_sat_add(d.best[1], f.bytes[1])));
	return VPS_OK;
}

/* Whether candidate x's region (relay_likely's) likely enters its
 * receivers' nodes from its holders, as relay_entry weighs it (its
 * holders as one group, each bringing in what lies below the water level
 * of their time): its receivers then pass it on over NVLink alone. In
 * llama2-7b-dp-up stage 0 enters nodes 2 and 3 so, and their devices,
 * holders of stage 1, were counted as passing it on over their NICs as
 * well, 0.22 GB each: stage 1's range straight from them was sized for
 * less room than they had (the plan 1.048x its relayed floor). *sure:
 * and by more than ENTRY_SURE. */
static vps_result_t entry_likely(struct ctx *c, const struct relay_cand *x, const struct relay_cands *lc, bool *yes,
				 bool *sure)
{
	double routed, entered, held = 0, most = 0, equal = 0;
	int64_t exported;
	*yes = *sure = false;
	if (!x->entry)
		return VPS_OK;
	VPS_CHECK(receivers_routed(c, lc->free + x->first, (int64_t)x->nfree, &routed, &entered, &exported));
	int64_t part = exported / vps_max64(x->members, 1);
	struct entry_rooms er = {.c = c, .entries = {0, exported}};
	int64_t nh = vps_min64((int64_t)x->nholders, DUTY_MEMBERS);
	for (int64_t j = 0; j < nh; j++) {
		VPS_CHECK(holder_routed(c, lc->holders[x->first_holder + (size_t)j], er.own[j], &held));
		equal = fmax(equal, link_time(c, er.own[j][0], vps_sat_add(er.own[j][1], part)));
		most = fmax(most, link_time(c, er.own[j][0], vps_sat_add(er.own[j][1], exported)));
	}
	/* in turn where the holders are too many to share (relay_entry) */
	if (x->members <= DUTY_MEMBERS && exported > 0)
		equal = fmin(equal, water_level(entry_room, &er, nh, 1, 0, most));
	*yes = fmax(entered, equal) < 0.99 * fmax(routed, held);
	*sure = fmax(entered, equal) < ENTRY_SURE * fmax(routed, held);
	return VPS_OK;
}

/* Whether rl's region, relayed by every free receiver and none of them at
 * home, should enter each of the receivers' nodes from the holders (each
 * range once a node, the holders by their shares or in turn) rather than
 * through its receiver's NIC into every other node: where the receivers
 * are devices of A busy with their own sends and the holders have time to
 * spare. In llama2-7b-pp-down-back stage 1's receivers held stages 2 and 3
 * and sent them to the joining devices; passing stage 1's ranges on into
 * the other node made them the plan's busiest, 1.07x the floor. A region
 * is one of many (its ranges alone never gain 1%), so the region's devices
 * are weighed as though every region they relay went the same way: a
 * receiver's likely sends and all it could relay (relay_bound), less, by
 * the holders' entries, all it would pass on over its NIC; a holder's
 * sends where every receiver relays (duty_of's best) and all it could
 * relay, plus, by the holders' entries, its share of what the region's
 * receivers would have passed on over their NICs. Taken where the busiest
 * of them gets faster by more than 1%. The shares (rl->entry_w): where
 * every group's members are its candidates for every receiver (apart, at
 * most DUTY_MEMBERS, ENTRY_GROUPS groups), each member what lies below the
 * water level above its own sends, if that makes the group's busiest
 * member 1% faster than equal shares; else in turn. when[0]: the busiest
 * device's time by the holders' entries, when[1] the busiest holder's
 * where the receivers relay. Every rank reads the same loads, so they
 * route and share alike. */
static vps_result_t relay_entry(struct ctx *c, const struct vps_region *R, struct relay *rl, const struct group *gs,
				size_t ng, bool *yes, double when[2])
{
	*yes = false;
	when[0] = when[1] = INFINITY;
	memset(rl->entry_w, 0, sizeof(rl->entry_w));
	if (rl->home_idx >= 0 || rl->nn < 2 || rl->n <= rl->nn)
		return VPS_OK;
	double routed, entered; /* the busiest device's time, by either route */
	double held = 0;        /* the busiest holder's, routed */
	int64_t exported;       /* what the receivers pass on over NICs */
	VPS_CHECK(receivers_routed(c, rl->world, rl->n, &routed, &entered, &exported));
	/* shares by time to spare where every receiver takes every group's
	 * members as the same candidates (none on its node) */
	bool shares = ng <= ENTRY_GROUPS && apart(c, rl, gs, ng);
	for (size_t gi = 0; gi < ng && shares; gi++)
		shares = gs[gi].count <= DUTY_MEMBERS;
	double whole = (double)vps_box_volume(&R->box);
	for (size_t gi = 0; gi < ng && whole > 0; gi++) {
		struct vps_box x;
		if (!vps_box_intersect(&c->ha.v[gs[gi].first].region.box, &R->box, &x))
			continue;
		/* by the group's whole box, not its part of R: members holding
		 * more than R (a tensor-parallel slice B splits) bring in the
		 * entries of each region like R they hold (llama2-7b-tp-down-back:
		 * counted by their part, the holders seemed to have room for
		 * half their entries, and brought all of them in) */
		double group = (double)exported * ((double)vps_box_volume(&c->ha.v[gs[gi].first].region.box) / whole);
		int64_t members = vps_min64(gs[gi].count, DUTY_MEMBERS);
		struct entry_rooms er = {.c = c, .entries = {0, (int64_t)group}};
		double most = 0; /* a member's time, were it to bring in all */
		for (int64_t j = 0; j < members; j++) {
			int64_t ra;
			size_t h;
			group_member(&c->ha, &gs[gi], j, &ra, &h);
			VPS_CHECK(holder_routed(c, ra, er.own[j], &held));
			most = fmax(most, link_time(c, er.own[j][0], vps_sat_add(er.own[j][1], er.entries[1])));
		}
		/* in turn: each member an equal part */
		int64_t part = (int64_t)(group / (double)gs[gi].count);
		double equal = 0, weighed = 0;
		for (int64_t j = 0; j < members; j++)
			equal = fmax(equal, link_time(c, er.own[j][0], vps_sat_add(er.own[j][1], part)));
		if (!shares || er.entries[1] <= 0) {
			entered = fmax(entered, equal);
			continue;
		}
		/* else each member its part up to the least time all of it fits
		 * in: a member with time to spare beside what it sends anyway
		 * brings in most (llama2-7b-pp-up: stage 0's dp3 members keep
		 * their ZeRO-1 shards and send a tenth of what the others do) */
		double level = water_level(entry_room, &er, members, 1, 0, most), room[DUTY_MEMBERS], sum = 0;
		for (int64_t j = 0; j < members; j++)
			sum += room[j] = entry_room(&er, j, level);
		int total = 0;
		for (int64_t j = 0; j < members && sum > 0; j++) {
			weighed = fmax(weighed, link_time(c, er.own[j][0],
							  vps_sat_add(er.own[j][1], (int64_t)(room[j] / sum * group))));
			rl->entry_w[gi][j] = (uint16_t)lround(room[j] / sum * ENTRY_UNIT);
			total += rl->entry_w[gi][j];
		}
		/* shares only where they gain: else in turn, with no new peers */
		if (!total || !(weighed < 0.99 * equal)) {
			memset(rl->entry_w[gi], 0, sizeof(rl->entry_w[gi]));
			weighed = equal;
		}
		entered = fmax(entered, weighed);
	}
	routed = fmax(routed, held);
	*yes = entered < 0.99 * routed;
	when[0] = entered;
	when[1] = held;
	if (!*yes)
		memset(rl->entry_w, 0, sizeof(rl->entry_w));
	return VPS_OK;
}

/* How rl's region goes, relayed by every free receiver: node by node
 * from its holders (relay_entry: *by_holders), else through its receivers
 * in ranges sized to what each has to spare (relay_weigh); where both
 * apply, the one whose busiest device is the less busy (node by node on a
 * tie): ranged, the busiest receiver's time, with the busiest holder's
 * where the receivers relay (relay_weigh weighs the holders only for a
 * direct range; without it, llama2-*-pp-down went ranged for nothing,
 * their NICs' time the same and 3% more bytes moved). In
 * llama2-70b-tp-down-back stage 1's receivers on one node have time to
 * spare and those on the other none: ranges sized to that, with a range
 * from the holders into each node, beat the holders bringing all of it
 * in (1.13x the relayed floor -> 1.05x; -13b 1.09x -> 1.06x). */
static vps_result_t relay_route(struct ctx *c, const struct vps_region *R, struct relay *rl, const struct group *gs,
				size_t ng, bool *by_holders)
{
	double entered[2], weighed;
	VPS_CHECK(relay_entry(c, R, rl, gs, ng, by_holders, entered));
	if (!*by_holders)
		return relay_weigh(c, rl, gs, ng, &weighed);
	struct relay *ranged = vps_malloc(sizeof(*ranged));
	if (!ranged)
		return VPS_ENOMEM;
	*ranged = *rl;
	vps_result_t rc = relay_weigh(c, ranged, gs, ng, &weighed);
	/* ranged, the holders send as routed, but for a direct range (weighed
	 * with their time) */
	bool direct = ranged->weighted && ranged->cut[ranged->n] < ranged->cut[ranged->n + 1];
	if (!rc && (direct ? weighed : fmax(weighed, entered[1])) < entered[0]) {
		*by_holders = false;
		rl->weighted = ranged->weighted;
		memcpy(rl->cut, ranged->cut, sizeof(rl->cut));
		memset(rl->entry_w, 0, sizeof(rl->entry_w));
	}
	free(ranged);
	return rc;
}

static uint64_t memo_hash(const void *entries, size_t i)
{
	return ((const struct relay_memo *)entries)[i].key;
}

/* The choice kept for region R (key: its memo key) of the B replica set
 * from set_base with these groups, or NULL. */
static const struct relay_memo *memo_find(const struct ctx *c, uint64_t key, const struct vps_region *R,
					  int64_t set_base, uint64_t groups)
{
	if (!c->memo_slots.mask)
		return NULL;
	for (size_t at = vps_slots_start(&c->memo_slots, key); c->memo_slots.slot[at];
	     at = vps_slots_next(&c->memo_slots, at)) {
		const struct relay_memo *m = &c->memo[c->memo_slots.slot[at] - 1];
		if (m->key == key && m->tensor == R->tensor && m->state == R->state && m->set_base == set_base &&
		    m->groups == groups && vps_box_equal(&m->box, &R->box))
			return m;
	}
	return NULL;
}

/* Keeps choice x (not kept yet), with rl's cuts and shares where x is
 * weighted or enters by its holders; *kept: where. */
static vps_result_t memo_keep(struct ctx *c, const struct relay_memo *x, const struct relay *rl,
			      const struct relay_memo **kept)
{
	if (c->nmemo >= RELAY_MEMO_MOST) {
		c->nmemo = c->ncuts = 0;
		memset(c->memo_slots.slot, 0, (c->memo_slots.mask + 1) * sizeof(*c->memo_slots.slot));
	}
	VPS_CHECK(vps_slots_room(&c->memo_slots, c->nmemo, 1024, memo_hash, c->memo, "relayed regions"));
	VPS_CHECK(VPS_GROW(c->memo, c->capmemo, c->nmemo + 1));
	struct relay_memo *m = &c->memo[c->nmemo];
	*m = *x;
	if (x->weighted || x->entry_by_holders) {
		VPS_CHECK(VPS_GROW(c->cuts, c->capcuts, c->ncuts + 1));
		struct relay_cuts *cuts = &c->cuts[c->ncuts++];
		memcpy(cuts->cut, rl->cut, sizeof(cuts->cut));
		memcpy(cuts->entry_w, rl->entry_w, sizeof(cuts->entry_w));
		m->route = (uint32_t)c->ncuts;
	}
	size_t at = vps_slots_start(&c->memo_slots, x->key);
	while (c->memo_slots.slot[at])
		at = vps_slots_next(&c->memo_slots, at);
	c->memo_slots.slot[at] = (uint32_t)c->nmemo + 1;
	*kept = m;
	c->nmemo++;
	return VPS_OK;
}

/* Whether region R of B rank rb on world rank d is relayed, and through
 * whom (rl). Every group of holders must share alike (not weighed). By
 * the mode: ALWAYS relays among the joining receivers where they are two
 * or more and outnumber every group's members (a holder that sends R to
 * two receivers directly sends it once when they relay); AUTO (groups of
 * at most EXACT_REPLICAS) among every free receiver where that gains
 * (relay_gains) and the devices of A among them stay light (relay_light),
 * else among the joining ones where that gains. The receivers and the
 * groups are the same whichever rank asks, so they all decide alike; the
 * choice is remembered per region. */
static vps_result_t relay_wanted(struct ctx *c, int64_t d, int64_t rb, const struct vps_region *R,
				 const struct group *gs, size_t ng, struct relay *rl, bool *yes)
{
	*yes = false;
	rl->n = 0;
	bool entry_by_holders = false;
	int64_t self = vps_world_a_rank(c->w, d);
	if (c->relay == VPS_RELAY_NEVER || (self >= 0 && (c->relay != VPS_RELAY_AUTO || holds_any(c, self))))
		return VPS_OK;
	/* the receivers first: most regions have none to relay among, or d
	 * is none of them (not of the free ones, so not of the joining ones) */
	VPS_CHECK(relay_set(c, rb, R, c->relay == VPS_RELAY_AUTO, rl));
	if (rl->set_base < 0 || rl->n < 2 || rl->i < 0) {
		rl->n = 0;
		return VPS_OK;
	}
	int32_t home = NO_HOME;
	bool one_home = true;
	int64_t holders = 1;
	uint64_t groups = ng;
	for (size_t gi = 0; gi < ng; gi++) {
		const struct group *g = &gs[gi];
		if (c->relay == VPS_RELAY_AUTO && g->count > EXACT_REPLICAS)
			return VPS_OK;
		if (g->count <= SPLIT_MAX) {
			int64_t cand[SPLIT_MAX];
			size_t h;
			for (int64_t j = 0; j < g->count; j++)
				group_member(&c->ha, g, j, &cand[j], &h);
			if (stages_differ(c, cand, g->count))
				return VPS_OK;
		}
		/* each member's node (at most EXACT_REPLICAS of them, or stops
		 * at the second node) */
		for (int64_t j = 0; j < g->count && one_home; j++) {
			int64_t ra;
			size_t h;
			group_member(&c->ha, g, j, &ra, &h);
			int32_t node = vps_layout_device(c->a, ra).node;
			one_home = home == NO_HOME || home == node;
			home = node;
		}
		holders = gi ? vps_min64(holders, g->count) : g->count;
		/* the groups by their first members and sizes: a choice is never
		 * taken for other holders' */
		int64_t first;
		size_t h;
		group_member(&c->ha, g, 0, &first, &h);
		groups = (groups ^ (uint64_t)first ^ (uint64_t)g->count << 32) * 0x100000001b3u;
	}
	if (c->relay == VPS_RELAY_ALWAYS) {
		for (size_t gi = 0; gi < ng; gi++)
			if (rl->n <= gs[gi].count)
				return VPS_OK;
	} else {
		uint64_t key = vps_mix64(region_key(R->tensor, R->state, &R->box) ^ (uint64_t)rl->set_base ^ groups);
		const struct relay_memo *m = memo_find(c, key, R, rl->set_base, groups);
		if (!m) {
			uint8_t choice = RELAY_NONE;
			if (rl->mixed) {
				bool light, need_inbound, inbound;
				rl->home = one_home ? home : NO_HOME;
				rl->holders = holders;
				relay_index(rl);
				/* the devices' own loads first: cached a device, where
				 * relay_gains weighs the region anew */
				VPS_CHECK(relay_light(c, rl, gs, ng, &light, &need_inbound));
				light = light && relay_gains(c, R, rl, gs, ng, &inbound) && (inbound || !need_inbound);
				if (light) {
					choice = RELAY_FREE;
					VPS_CHECK(relay_route(c, R, rl, gs, ng, &entry_by_holders));
				} else
					VPS_CHECK(relay_set(c, rb, R, false, rl));
			}
			if (choice == RELAY_NONE && rl->n >= 2) {
				rl->home = one_home ? home : NO_HOME;
				rl->holders = holders;
				relay_index(rl);
				bool inbound;
				if (relay_gains(c, R, rl, gs, ng, &inbound))
					choice = RELAY_JOINING;
			}
			struct relay_memo made = {.key = key, .choice = choice, .tensor = R->tensor,
						  .state = (uint8_t)R->state, .box = R->box, .set_base = rl->set_base,
						  .groups = groups, .weighted = choice == RELAY_FREE && rl->weighted,
						  .entry_by_holders = choice == RELAY_FREE && entry_by_holders};
			VPS_CHECK(memo_keep(c, &made, rl, &m));
		}
		if (m->choice == RELAY_NONE)
			return VPS_OK;
		const struct relay_cuts *cuts = m->route ? &c->cuts[m->route - 1] : NULL;
		if (m->weighted) {
			rl->weighted = true;
			memcpy(rl->cut, cuts->cut, sizeof(rl->cut));
		}
		entry_by_holders = m->entry_by_holders;
		if (entry_by_holders)
			memcpy(rl->entry_w, cuts->entry_w, sizeof(rl->entry_w));
		if (m->choice == RELAY_JOINING && rl->mixed)
			VPS_CHECK(relay_set(c, rb, R, false, rl));
	}
	if (rl->n < 2 || rl->i < 0)
		return VPS_OK;
	rl->home = one_home ? home : NO_HOME;
	rl->holders = holders;
	relay_index(rl);
	rl->entry_by_holders = entry_by_holders;
	*yes = true;
	return VPS_OK;
}

/* The decision for one destination region R of B rank rb on world rank d.
 * Pieces with a source other than only_src (when >= 0) are dropped. */
static vps_result_t plan_region(struct ctx *c, int64_t d, int64_t rb, const struct vps_region *R, int64_t only_src,
				struct vps_pieces *out)
{
	c->ha.n = 0;
	VPS_CHECK(a_holders(c, R->tensor, R->state, &R->box, &c->ha));
	qsort(c->ha.v, c->ha.n, sizeof(*c->ha.v), holder_cmp);
	int64_t self = vps_world_a_rank(c->w, d);
	VPS_CHECK(plan_retains(c, d, self, R, only_src, out));
	if (!c->rem.n)
		return VPS_OK;
	struct group *gs;
	size_t ng;
	int64_t T, pref_tp = preferred_tp(c, R->tensor, rb, &T), ri, rn, rbase;
	VPS_CHECK(make_groups(c, vps_world_device(c->w, d).node, self, T, pref_tp, &gs, &ng));
	vps_result_t rc = replica_index(c, rb, R, &ri, &rn, &rbase);
	int64_t bufsize = vps_layout_buffer_elements(c->b, rb, R->buffer);
	struct relay rl;
	bool relayed = false;
	if (!rc)
		rc = relay_wanted(c, d, rb, R, gs, ng, &rl, &relayed);
	for (size_t gi = 0; !rc && gi < ng && c->rem.n; gi++)
		rc = plan_group(c, &gs[gi], gi, relayed ? &rl : NULL, ri, rn, rbase, d, rb, R, bufsize, only_src, out);
	free(gs);
	/* what no survivor holds is a lost range (vps_plan_compute refused it
	 * unless allowed): a hole the trainer reloads */
	if (!rc && c->rem.n && !(c->lost && c->lost->nranges)) {
		struct vps_tensor t;
		char name[256];
		vps_model_tensor(vps_layout_model(c->b), R->tensor, &t);
		vps_tensor_name(&t, name, sizeof(name));
		rc = vps_fail(VPS_ECHECK, "no rank holds %s %s [%" PRId64 ":%" PRId64 ", ...] under the source layout",
			      name, vps_state_name(R->state), c->rem.v[0].lo[0], c->rem.v[0].hi[0]);
	}
	return rc;
}

/* Everything world rank d receives or retains. */
static vps_result_t plan_receives(struct ctx *c, int64_t d, struct vps_pieces *out)
{
	int64_t rb = vps_world_b_rank(c->w, d);
	if (rb < 0)
		return VPS_OK;
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(c->b, rb, &v));
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++)
		rc = plan_region(c, d, rb, &v.regions[i], -1, out);
	vps_rank_view_release(&v);
	return rc;
}

/* ---- sends of one source ---- */

struct visit {
	int64_t rb;
	struct vps_region r;
};

static int visit_cmp(const void *p, const void *q)
{
	const struct visit *x = p, *y = q;
	if (x->rb != y->rb)
		return x->rb < y->rb ? -1 : 1;
	if (x->r.tensor != y->r.tensor)
		return x->r.tensor < y->r.tensor ? -1 : 1;
	if (x->r.state != y->r.state)
		return x->r.state < y->r.state ? -1 : 1;
	if (x->r.buffer != y->r.buffer)
		return x->r.buffer < y->r.buffer ? -1 : 1;
	return x->r.offset < y->r.offset ? -1 : x->r.offset > y->r.offset;
}

struct visits {
	struct visit *v;
	size_t n, cap;
};

static vps_result_t want(struct visits *vs, int64_t rb, const struct vps_region *r)
{
	VPS_CHECK(VPS_GROW(vs->v, vs->cap, vs->n + 1));
	vs->v[vs->n].rb = rb;
	vs->v[vs->n].r = *r;
	vs->n++;
	return VPS_OK;
}

/* Destinations (B ranks in holder set H, region R_b) that can choose source
 * s, whose A region is sa. */
static vps_result_t candidates_for(struct ctx *c, int64_t s, const struct vps_region *sa, const struct vps_holder *H,
				   struct visits *vs)
{
	int64_t rb_self = vps_world_b_rank(c->w, s);
	if (H->count <= EXACT_REPLICAS) {
		/* few replicas: every one is a candidate, the decision is re-run */
		for (int64_t j = 0; j < H->count; j++)
			if (H->base + j * H->stride != rb_self)
				VPS_CHECK(want(vs, H->base + j * H->stride, &H->region));
		return VPS_OK;
	}
	/* on s's node: any of them may take s as a local replica */
	int64_t nr[NODE_RANKS_MAX];
	size_t nn = vps_devices_node_ranks(vps_layout_devices(c->b), vps_layout_world(c->b),
					   vps_world_device(c->w, s).node, nr, NODE_RANKS_MAX);
	for (size_t q = 0; q < nn && q < NODE_RANKS_MAX; q++)
		if (nr[q] != rb_self && member(H, nr[q]))
			VPS_CHECK(want(vs, nr[q], &H->region));
	/* the rotation over all members of s's group */
	c->ha.n = 0;
	VPS_CHECK(a_holders(c, H->region.tensor, H->region.state, &H->region.box, &c->ha));
	qsort(c->ha.v, c->ha.n, sizeof(*c->ha.v), holder_cmp);
	/* s's group, with the destinations' preference (they share a B
	 * tensor-parallel rank) */
	size_t gfirst = 0, gn = 0;
	for (size_t i = 0; i < c->ha.n; i++)
		if (vps_box_equal(&c->ha.v[i].region.box, &sa->box)) {
			if (!gn)
				gfirst = i;
			gn++;
		}
	int64_t T, pref_tp = preferred_tp(c, H->region.tensor, H->base, &T);
	if (gn)
		VPS_CHECK(prefer_weighed(c, &c->ha.v[gfirst], gn, T, pref_tp, &gn));
	int64_t k = 0, cidx = -1;
	for (size_t i = gfirst; i < gfirst + gn; i++) {
		const struct vps_holder *h = &c->ha.v[i];
		if (cidx < 0 && member(h, s) && h->region.buffer == sa->buffer && h->region.offset == sa->offset)
			cidx = k + (s - h->base) / (h->stride ? h->stride : 1);
		k += h->count;
	}
	if (cidx < 0)
		return VPS_OK;
	int64_t n = H->count, m = split_parts(k, n);
	if (k <= SPLIT_MAX) {
		/* weighed candidates serve every destination's large pieces */
		int64_t cand[SPLIT_MAX];
		struct group g = {.first = gfirst, .n = gn};
		for (int64_t j = 0; j < k; j++) {
			size_t hidx;
			group_member(&c->ha, &g, j, &cand[j], &hidx);
		}
		bool weigh;
		VPS_CHECK(weighed(c, cand, k, &weigh));
		if (weigh) {
			for (int64_t i = 0; i < n; i++)
				if (H->base + i * H->stride != rb_self)
					VPS_CHECK(want(vs, H->base + i * H->stride, &H->region));
			return VPS_OK;
		}
	}
	for (int64_t o = 0; o < m; o++) {
		/* start(i) = (floor(i k / n) + base) mod k must be cidx - o */
		int64_t x = ((cidx - o - H->base) % k + k) % k;
		/* i with floor(i * k / n) == x */
		int64_t lo = vps_ceil_div(x * n, k), hi = vps_min64(vps_ceil_div((x + 1) * n, k), n);
		for (int64_t i = lo; i < hi; i++) {
			int64_t rb = H->base + i * H->stride;
			if (rb != rb_self)
				VPS_CHECK(want(vs, rb, &H->region));
		}
	}
	return VPS_OK;
}

/* What world rank s passes on: for each of its B regions that it receives
 * relayed, the decision re-run for the other receivers, keeping the pieces
 * from s's B buffers (a holder's own sends come from plan_sends). A
 * joining device relays, and by default (VPS_RELAY_AUTO) a device of A
 * too, where relay_wanted lets it. */
static vps_result_t plan_forwards(struct ctx *c, int64_t s, struct vps_pieces *out)
{
	int64_t rb = vps_world_b_rank(c->w, s);
	if (rb < 0 || c->relay == VPS_RELAY_NEVER ||
	    (vps_world_a_rank(c->w, s) >= 0 && c->relay != VPS_RELAY_AUTO))
		return VPS_OK;
	struct vps_rank_view v;
	struct vps_pieces tmp = {0};
	struct relay rl;
	rl.n = 0;
	VPS_CHECK(vps_layout_rank(c->b, rb, &v));
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		const struct vps_region *R = &v.regions[i];
		struct group *gs = NULL;
		size_t ng = 0;
		int64_t T, pref_tp = preferred_tp(c, R->tensor, rb, &T);
		bool relayed = false;
		c->ha.n = 0;
		rc = a_holders(c, R->tensor, R->state, &R->box, &c->ha);
		if (!rc && vps_world_a_rank(c->w, s) >= 0) {
			/* what it holds it sends as a holder, not as a relay; and
			 * most regions have no receivers to relay among */
			if (holds_any(c, vps_world_a_rank(c->w, s)))
				continue;
			rc = relay_set(c, rb, R, true, &rl);
			if (!rc && (rl.set_base < 0 || rl.n < 2 || rl.i < 0))
				continue;
		}
		if (!rc) {
			qsort(c->ha.v, c->ha.n, sizeof(*c->ha.v), holder_cmp);
			rc = make_groups(c, vps_world_device(c->w, s).node, -1, T, pref_tp, &gs, &ng);
		}
		if (!rc)
			rc = relay_wanted(c, s, rb, R, gs, ng, &rl, &relayed);
		free(gs);
		for (int64_t j = 0; j < rl.n && relayed && !rc; j++) {
			if (j == rl.i)
				continue;
			tmp.n = 0;
			rc = plan_region(c, rl.world[j], rl.b[j], R, s, &tmp);
			for (size_t k = 0; k < tmp.n && !rc; k++) {
				if (!(tmp.v[k].src_buffer & VPS_BUFFER_TARGET))
					continue;
				rc = VPS_GROW(out->v, out->cap, out->n + 1);
				if (!rc)
					out->v[out->n++] = tmp.v[k];
			}
		}
	}
	free(tmp.v);
	vps_rank_view_release(&v);
	return rc;
}

static vps_result_t plan_sends(struct ctx *c, int64_t s, struct vps_pieces *out)
{
	int64_t ra = vps_world_a_rank(c->w, s);
	VPS_CHECK(plan_forwards(c, s, out));
	if (ra < 0)
		return VPS_OK;
	struct vps_rank_view v;
	struct visits vs = {0};
	struct vps_holders hb = {0};
	VPS_CHECK(vps_layout_rank(c->a, ra, &v));
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < v.nregions && !rc; i++) {
		const struct vps_region *sa = &v.regions[i];
		hb.n = 0;
		rc = vps_layout_holders(c->b, sa->tensor, sa->state, &sa->box, &hb);
		for (size_t k = 0; k < hb.n && !rc; k++)
			rc = candidates_for(c, s, sa, &hb.v[k], &vs);
	}
	if (!rc && vs.n) {
		qsort(vs.v, vs.n, sizeof(*vs.v), visit_cmp);
		for (size_t i = 0; i < vs.n && !rc; i++) {
			if (i && !visit_cmp(&vs.v[i - 1], &vs.v[i]))
				continue;
			rc = plan_region(c, vps_world_of_b(c->w, vs.v[i].rb), vs.v[i].rb, &vs.v[i].r, s, out);
		}
	}
	free(vs.v);
	vps_holders_release(&hb);
	vps_rank_view_release(&v);
	return rc;
}

/* ---- transit (transit.h) ---- */

static bool transit_on(const struct ctx *c)
{
	return c->relay == VPS_RELAY_AUTO && c->topo;
}

static vps_result_t forwards_of(void *arg, int64_t w, struct vps_pieces *out)
{
	return plan_forwards(arg, w, out);
}

/* What device w must send over its NICs whatever the plan, in time: the
 * bytes only it holds, each into each node that needs it once (0 for a
 * device with no A rank). */
static double least_nic_time(void *arg, int64_t w)
{
	struct ctx *c = arg;
	int64_t ra = vps_world_a_rank(c->w, w);
	struct duty d;
	if (ra < 0 || duty_of(c, ra, &d) != VPS_OK)
		return 0;
	return (double)vps_min64(d.forced_best[1], d.forced_link[1]) / c->topo->inter_node_bandwidth;
}

/* What device w sends over its NICs in the plan (before transit, which
 * changes no sender's NICs), in bytes; 0 where it cannot be planned. */
static double nic_send_bytes(void *arg, int64_t w)
{
	struct ctx *c = arg;
	struct vps_pieces p = {0};
	int32_t node = vps_world_device(c->w, w).node;
	double bytes = 0;
	if (plan_sends(c, w, &p) == VPS_OK)
		for (size_t i = 0; i < p.n; i++)
			if (p.v[i].dst != w && vps_world_device(c->w, p.v[i].dst).node != node)
				bytes += (double)vps_piece_bytes(&p.v[i]);
	free(p.v);
	return bytes;
}

/* A device's transit area at most: half of what it holds under B, so that
 * a switch holds at most 1.5x the target state there beside the source's
 * (docs/relay.md, "Transit": a quarter gave up most of the gains). */
#define TRANSIT_AREA_SHARE 2
static vps_result_t transit_area_max(struct ctx *c, int64_t w, int64_t *out)
{
	struct vps_rank_view v;
	int64_t bytes = 0, b;
	*out = 0;
	VPS_CHECK(vps_layout_rank(c->b, vps_world_b_rank(c->w, w), &v));
	for (size_t i = 0; i < v.nbuffers; i++)
		if (vps_mul_ok(v.buffers[i].elements, (int64_t)vps_dtype_size(v.buffers[i].dtype), &b))
			bytes = vps_sat_add(bytes, b);
	vps_rank_view_release(&v);
	*out = bytes / TRANSIT_AREA_SHARE;
	return VPS_OK;
}

/* Every piece into a device of node, transit routed, in *out (kept until
 * NODE_SETS other nodes are asked for); NULL for a node of more than
 * NODE_RANKS_MAX devices, which transit leaves alone. */
static vps_result_t node_arrivals(struct ctx *c, int32_t node, const struct vps_pieces **out)
{
	*out = NULL;
	for (int k = 0; k < NODE_SETS; k++)
		if (c->nodes[k].used && c->nodes[k].node == node) {
			*out = &c->nodes[k].set;
			return VPS_OK;
		}
	int64_t dev[NODE_RANKS_MAX], area_max[NODE_RANKS_MAX];
	size_t n = vps_devices_node_ranks(vps_layout_devices(c->b), vps_layout_world(c->b), node, dev, NODE_RANKS_MAX);
	if (n > NODE_RANKS_MAX)
		return VPS_OK;
	struct node_set *ns = &c->nodes[c->nodes_next++ % NODE_SETS];
	ns->used = false;
	ns->set.n = 0;
	for (size_t i = 0; i < n; i++)
		dev[i] = vps_world_of_b(c->w, dev[i]);
	qsort(dev, n, sizeof(*dev), vps_int64_cmp);
	for (size_t i = 0; i < n; i++) {
		VPS_CHECK(plan_receives(c, dev[i], &ns->set));
		VPS_CHECK(transit_area_max(c, dev[i], &area_max[i]));
	}
	struct vps_transit_node tn = {.w = c->w, .node = node, .devices = dev, .ndevices = n,
				      .intra = c->topo->intra_node_bandwidth, .inter = c->topo->inter_node_bandwidth,
				      .latency = c->topo->latency,
				      .area_max = area_max, .forwards = forwards_of, .least_send = least_nic_time,
				      .nic_sends = nic_send_bytes,
				      .arg = c};
	VPS_CHECK(vps_transit_route(&tn, &ns->set));
	ns->used = true;
	ns->node = node;
	*out = &ns->set;
	return VPS_OK;
}

static vps_result_t take(struct vps_pieces *out, const struct vps_piece *x)
{
	VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + 1));
	out->v[out->n++] = *x;
	return VPS_OK;
}

/* What world rank d receives, transit routed where transit is on. */
static vps_result_t plan_arrivals(struct ctx *c, int64_t d, struct vps_pieces *out)
{
	const struct vps_pieces *set = NULL;
	if (transit_on(c))
		VPS_CHECK(node_arrivals(c, vps_world_device(c->w, d).node, &set));
	if (!set)
		return plan_receives(c, d, out);
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].dst == d)
			VPS_CHECK(take(out, &set->v[i]));
	return VPS_OK;
}

/* Rank r's pieces (its receives and sends in pcs), transit routed: each
 * node r sends into decides its own arrivals, r's among them. */
static vps_result_t plan_rank_transit(struct ctx *c, int64_t r, struct vps_pieces *pcs)
{
	int32_t home = vps_world_device(c->w, r).node, *nodes = NULL;
	size_t nn = 0, cap = 0;
	struct vps_pieces out = {0};
	const struct vps_pieces *set;
	vps_result_t rc = node_arrivals(c, home, &set);
	if (rc || !set)
		return rc;
	for (size_t i = 0; i < set->n && !rc; i++)
		if (set->v[i].dst == r || set->v[i].src == r)
			rc = take(&out, &set->v[i]);
	for (size_t i = 0; i < pcs->n && !rc; i++) {
		int32_t node = vps_world_device(c->w, pcs->v[i].dst).node;
		bool seen = node == home;
		for (size_t k = 0; k < nn && !seen; k++)
			seen = nodes[k] == node;
		if (seen || pcs->v[i].src != r)
			continue;
		rc = VPS_GROW(nodes, cap, nn + 1);
		if (!rc)
			nodes[nn++] = node;
	}
	for (size_t k = 0; k < nn && !rc; k++) {
		rc = node_arrivals(c, nodes[k], &set);
		if (!rc && !set) {
			/* a node transit leaves alone: r's sends to it as planned */
			for (size_t i = 0; i < pcs->n && !rc; i++)
				if (pcs->v[i].src == r && vps_world_device(c->w, pcs->v[i].dst).node == nodes[k])
					rc = take(&out, &pcs->v[i]);
			continue;
		}
		for (size_t i = 0; set && i < set->n && !rc; i++)
			if (set->v[i].src == r)
				rc = take(&out, &set->v[i]);
	}
	free(nodes);
	if (rc) {
		free(out.v);
		return rc;
	}
	free(pcs->v);
	*pcs = out;
	return VPS_OK;
}

/* ---- the plan ---- */

static int piece_cmp(const void *p, const void *q)
{
	const struct vps_piece *x = p, *y = q;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	/* a pair's direct pieces, then each hop of forwards: staging
	 * cuts them apart */
	int hx = vps_buffer_hop(x->src_buffer), hy = vps_buffer_hop(y->src_buffer);
	if (hx != hy)
		return hx < hy ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	if (x->dst_buffer != y->dst_buffer)
		return x->dst_buffer < y->dst_buffer ? -1 : 1;
	return x->dst_offset < y->dst_offset ? -1 : x->dst_offset > y->dst_offset;
}

/* Pieces of one (tensor, state) compared for disjointness: each with the
 * ones this far before it. */
#define DISJOINT_WINDOW 64

/* What promotion needs of one (tensor, state)'s moved pieces, taken in plan
 * order: the plan is read, never sorted by tensor or held whole. */
struct coll_acc {
	int64_t n, bytes, ndst, nsrc;
	int64_t src0, dst0, last_src, last_dst;
	struct vps_box box0;
	bool one_src, one_dst, identical, one_per_dst, disjoint;
	/* second reading, for the ones whose kind rests on disjointness: the
	 * last boxes, held from the first piece to the last */
	bool pending;
	int64_t seen;
	struct vps_box *win;
	int nwin, at;
};

static void coll_add(struct coll_acc *c, const struct vps_piece *x)
{
	int64_t b = vps_piece_bytes(x);
	if (!c->n++) {
		c->src0 = c->last_src = x->src;
		c->dst0 = c->last_dst = x->dst;
		c->box0 = x->box;
		c->one_src = c->one_dst = c->identical = c->one_per_dst = c->disjoint = true;
		c->ndst = c->nsrc = 1;
		c->bytes = b;
		return;
	}
	c->bytes += b;
	c->one_src &= x->src == c->src0;
	c->one_dst &= x->dst == c->dst0;
	c->identical &= vps_box_equal(&x->box, &c->box0);
	if (x->dst != c->last_dst)
		c->ndst++;
	else
		c->one_per_dst = false;
	c->nsrc += x->src != c->last_src;
	c->last_src = x->src;
	c->last_dst = x->dst;
}

/* Whether the kind depends on the pieces' boxes being disjoint. */
static bool coll_needs_disjoint(const struct coll_acc *c)
{
	if (c->n < 2)
		return false;
	if (c->one_src)
		return c->ndst > 1 && !(c->identical && c->one_per_dst);
	return c->one_dst;
}

static vps_result_t coll_disjoint(struct coll_acc *c, const struct vps_piece *x)
{
	if (!c->win) {
		c->win = vps_malloc((size_t)vps_min64(c->n, DISJOINT_WINDOW - 1) * sizeof(*c->win));
		if (!c->win)
			return VPS_ENOMEM;
	}
	for (int k = 0; k < c->nwin && c->disjoint; k++)
		c->disjoint = !vps_box_intersect(&c->win[k], &x->box, NULL);
	int cap = (int)vps_min64(c->n, DISJOINT_WINDOW - 1);
	c->win[c->at] = x->box;
	c->at = (c->at + 1) % cap;
	if (c->nwin < cap)
		c->nwin++;
	if (++c->seen == c->n || !c->disjoint) {
		free(c->win);
		c->win = NULL;
		c->pending = false;
	}
	return VPS_OK;
}

/* Collective promotion, fed the moved pieces in plan order (as the planner
 * collects them), finished with a second reading for the few whose kind
 * rests on disjointness. */
struct promotion {
	struct coll_acc *acc;
	size_t nkeys;
};

static vps_result_t promote_begin(struct promotion *pr, const struct vps_plan *p)
{
	pr->nkeys = (size_t)vps_model_num_tensors(vps_layout_model(p->a)) * VPS_NSTATES;
	pr->acc = vps_calloc(pr->nkeys + 1, sizeof(*pr->acc));
	return pr->acc ? VPS_OK : VPS_ENOMEM;
}

static void promote_add(struct promotion *pr, const struct vps_piece *x)
{
	if (x->src != x->dst)
		coll_add(&pr->acc[(size_t)x->tensor * VPS_NSTATES + x->state], x);
}

static void promote_release(struct promotion *pr)
{
	for (size_t k = 0; pr->acc && k < pr->nkeys; k++)
		free(pr->acc[k].win);
	free(pr->acc);
	pr->acc = NULL;
}

/* Broadcast, scatter and gather, per (tensor, state), from the moved pieces. */
static vps_result_t promote_end(struct promotion *pr, struct vps_plan *p)
{
	struct coll_acc *acc = pr->acc;
	size_t nkeys = pr->nkeys, cap = 0;
	vps_result_t rc = VPS_OK;
	struct vps_piece_iter it;
	const struct vps_piece *x;
	bool second = false;
	for (size_t k = 0; k < nkeys; k++) {
		acc[k].pending = coll_needs_disjoint(&acc[k]);
		second |= acc[k].pending;
	}
	vps_piece_iter_init(&it, p);
	while (second && !rc && (x = vps_piece_iter_next(&it))) {
		struct coll_acc *c = &acc[(size_t)x->tensor * VPS_NSTATES + x->state];
		if (x->src != x->dst && c->pending)
			rc = coll_disjoint(c, x);
	}
	for (size_t k = 0; k < nkeys && !rc; k++) {
		const struct coll_acc *c = &acc[k];
		if (!c->n)
			continue;
		int kind = -1;
		if (c->one_src && c->ndst > 1 && c->identical && c->one_per_dst)
			kind = VPS_COLL_BROADCAST;
		else if (c->one_src && c->ndst > 1 && c->disjoint)
			kind = VPS_COLL_SCATTER;
		else if (!c->one_src && c->one_dst && c->disjoint)
			kind = VPS_COLL_GATHER;
		if (kind < 0)
			continue;
		rc = VPS_GROW(p->colls, cap, p->ncolls + 1);
		if (!rc) {
			struct vps_collective *cl = &p->colls[p->ncolls++];
			cl->tensor = (uint32_t)(k / VPS_NSTATES);
			cl->state = (uint8_t)(k % VPS_NSTATES);
			cl->kind = (uint8_t)kind;
			cl->root = kind == VPS_COLL_GATHER ? c->dst0 : c->src0;
			cl->peers = kind == VPS_COLL_GATHER ? c->nsrc : c->ndst;
			cl->bytes = c->bytes;
		}
	}
	promote_release(pr);
	return rc;
}

/* ---- the global plan, by blocks of destinations ---- */

/* A block is this many destination ranks: small enough that threads share
 * the world evenly, large enough that claiming one costs nothing. */
#define BLOCK_RANKS 32
/* Blocks computed ahead of the one being collected, per thread: bounds what
 * waits outside the plan. */
#define BLOCKS_AHEAD 4

static void ctx_release(struct ctx *c)
{
	vps_holders_release(&c->ha);
	vps_holders_release(&c->hb);
	vps_holders_release(&c->hda);
	vps_holders_release(&c->hdb);
	for (size_t k = 0; k < c->nduties; k++)
		free(c->duties[k].kinds);
	free(c->duties);
	for (size_t k = 0; k < c->nfwds; k++)
		free(c->fwds[k].entered);
	free(c->fwds);
	free(c->memo);
	vps_slots_release(&c->memo_slots);
	free(c->cuts);
	for (int k = 0; k < NODE_SETS; k++)
		free(c->nodes[k].set.v);
	for (int k = 0; k < MOVED_MAPS; k++)
		free(c->moved[k].at);
	vps_holders_release(&c->hm);
	vps_boxes_release(&c->rem);
	vps_boxes_release(&c->next);
}

/* The pieces of destinations [lo, hi), in plan order, packed. dst leads the
 * order, so sorting each destination's pieces alone sorts the block (a
 * whole-plan sort of millions of pieces took most of the global planning
 * time); scratch holds one destination's at a time. */
static vps_result_t plan_block(struct ctx *c, int64_t lo, int64_t hi, struct vps_pieces *scratch,
			       struct vps_packed_block *out)
{
	static const struct vps_piece zero;
	const struct vps_piece *prev = &zero;
	for (int64_t d = lo; d < hi; d++) {
		scratch->n = 0;
		VPS_CHECK(plan_arrivals(c, d, scratch));
		if (scratch->n > 1)
			qsort(scratch->v, scratch->n, sizeof(*scratch->v), piece_cmp);
		for (size_t i = 0; i < scratch->n; i++) {
			VPS_CHECK(vps_pack_piece(out, prev, &scratch->v[i]));
			prev = &scratch->v[i];
		}
		if (scratch->n) {
			/* the next destination packs against this one's last piece */
			c->last = scratch->v[scratch->n - 1];
			prev = &c->last;
		}
	}
	return VPS_OK;
}

struct block {
	struct vps_packed_block p;
	vps_result_t rc;
	bool ready;
	char err[512]; /* the worker's message: errors are per thread */
};

struct job {
	const struct vps_layout *a, *b;
	const struct vps_world *w;
	const struct vps_lost *lost;
	enum vps_relay relay;
	const struct vps_topology *topo;
	int64_t W, nblocks, next, collected, ahead;
	bool stop;
	struct block *blocks;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void *plan_worker(void *arg)
{
	struct job *j = arg;
	struct ctx c = {.a = j->a, .b = j->b, .w = j->w, .lost = j->lost, .relay = j->relay, .topo = j->topo};
	struct vps_pieces scratch = {0};
	struct vps_packed_block work = {0};
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (!j->stop && j->next < j->nblocks && j->next >= j->collected + j->ahead)
			pthread_cond_wait(&j->cv, &j->mu);
		if (j->stop || j->next >= j->nblocks)
			break;
		struct block *bl = &j->blocks[j->next];
		int64_t lo = j->next * BLOCK_RANKS, hi = vps_min64(j->W, lo + BLOCK_RANKS);
		j->next++;
		pthread_mutex_unlock(&j->mu);
		vps_clear_error();
		/* packed into a buffer kept from block to block, then copied out
		 * at its size: growing each block's own would copy it over and over */
		work.len = work.npieces = 0;
		vps_result_t rc = plan_block(&c, lo, hi, &scratch, &work);
		if (!rc && work.len) {
			bl->p.data = vps_malloc(work.len);
			if (!bl->p.data)
				rc = VPS_ENOMEM;
			else
				memcpy(bl->p.data, work.data, work.len);
			bl->p.len = bl->p.cap = work.len;
			bl->p.npieces = work.npieces;
		}
		if (rc)
			snprintf(bl->err, sizeof(bl->err), "%s", vps_last_error());
		pthread_mutex_lock(&j->mu);
		bl->rc = rc;
		bl->ready = true;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	free(scratch.v);
	free(work.data);
	ctx_release(&c);
	return NULL;
}

static int plan_threads(int asked)
{
	if (asked > 0)
		return asked > VPS_PLAN_MAX_THREADS ? VPS_PLAN_MAX_THREADS : asked;
	int n = get_nprocs();
	return n < 1 ? 1 : n > VPS_PLAN_MAX_THREADS ? VPS_PLAN_MAX_THREADS : n;
}

/* Take block bl into the packed plan, or unpack it into the pieces; the
 * collecting thread meanwhile feeds promotion and, packed, the hash. */
static vps_result_t collect(const struct vps_layout *a, struct vps_packed_block *bl, struct vps_packed *pk,
			    struct vps_pieces *out, struct promotion *pr, bool hash)
{
	struct vps_packed one = {.v = bl, .n = 1, .cap = 1};
	/* the iterator reads the states' dtypes off the source layout */
	struct vps_plan view = {.a = (struct vps_layout *)a, .packed = &one};
	struct vps_piece_iter it;
	const struct vps_piece *x;
	if (!pk)
		VPS_CHECK(VPS_GROW(out->v, out->cap, out->n + bl->npieces));
	vps_piece_iter_init(&it, &view);
	while ((x = vps_piece_iter_next(&it))) {
		promote_add(pr, x);
		if (hash)
			pk->hash = vps_piece_hash(x, pk->hash);
		if (!pk)
			out->v[out->n++] = *x;
	}
	if (pk) {
		VPS_CHECK(VPS_GROW(pk->v, pk->cap, pk->n + 1));
		pk->v[pk->n++] = *bl;
		memset(bl, 0, sizeof(*bl));
	}
	return VPS_OK;
}

/* Every destination's pieces, in plan order: packed into pk, or else as
 * structs into out. Threads take blocks as they come; the blocks are
 * collected in rank order, so the plan (and the first error, the one of the
 * lowest failing rank) is the same for any number of threads. */
static vps_result_t plan_all(struct ctx *c, int64_t W, int asked, struct vps_packed *pk, struct vps_pieces *out,
			     struct promotion *pr, bool hash)
{
	int64_t nblocks = vps_ceil_div(W, BLOCK_RANKS);
	int threads = (int)vps_min64(plan_threads(asked), nblocks);
	struct job j = {.a = c->a, .b = c->b, .w = c->w, .lost = c->lost, .relay = c->relay, .topo = c->topo, .W = W, .nblocks = nblocks, .ahead = BLOCKS_AHEAD * threads};
	pthread_t tid[VPS_PLAN_MAX_THREADS];
	int started = 0;
	struct vps_pieces scratch = {0};
	j.blocks = vps_calloc((size_t)nblocks, sizeof(*j.blocks));
	if (!j.blocks)
		return VPS_ENOMEM;
	pthread_mutex_init(&j.mu, NULL);
	pthread_cond_init(&j.cv, NULL);
	for (int t = 0; threads > 1 && t < threads; t++)
		if (!pthread_create(&tid[started], NULL, plan_worker, &j))
			started++;
	vps_result_t rc = VPS_OK;
	for (int64_t k = 0; k < nblocks && !rc; k++) {
		struct block *bl = &j.blocks[k];
		if (started) {
			pthread_mutex_lock(&j.mu);
			while (!bl->ready)
				pthread_cond_wait(&j.cv, &j.mu);
			pthread_mutex_unlock(&j.mu);
		} else {
			/* one thread, or none to be had: plan here */
			bl->rc = plan_block(c, k * BLOCK_RANKS, vps_min64(W, (k + 1) * BLOCK_RANKS), &scratch, &bl->p);
			if (bl->rc)
				snprintf(bl->err, sizeof(bl->err), "%s", vps_last_error());
		}
		rc = bl->rc ? vps_fail(bl->rc, "%s", bl->err) : collect(c->a, &bl->p, pk, out, pr, hash);
		free(bl->p.data);
		bl->p.data = NULL;
		pthread_mutex_lock(&j.mu);
		j.collected = k + 1;
		j.stop = rc != VPS_OK;
		pthread_cond_broadcast(&j.cv);
		pthread_mutex_unlock(&j.mu);
	}
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
	for (int64_t k = 0; k < nblocks; k++)
		free(j.blocks[k].p.data);
	free(j.blocks);
	free(scratch.v);
	pthread_mutex_destroy(&j.mu);
	pthread_cond_destroy(&j.cv);
	return rc;
}

static vps_result_t plan_training(struct vps_plan *p, const struct vps_plan_opts *o)
{
	p->train = o->train;
	p->train.dp = vps_layout_parallel(p->b)->dp;
	if (!o->train.global_batch)
		return VPS_OK;
	int64_t gb = o->train.global_batch, dp = p->train.dp;
	/* the split below walks down from the micro batch: bound both */
	if (gb > VPS_MAX_BATCH || o->train.micro_batch > VPS_MAX_BATCH || o->micro_batch_a > VPS_MAX_BATCH)
		return vps_fail(VPS_EINPUT, "%s: more than %" PRId64 " samples is not a batch",
				gb > VPS_MAX_BATCH ? "global batch" : o->train.micro_batch > VPS_MAX_BATCH ? "micro batch"
											 : "micro batch before the switch",
				VPS_MAX_BATCH);
	if (gb % dp)
		return vps_fail(VPS_EINPUT, "global batch: %" PRId64 " samples do not split over dp=%" PRId64 " of the target",
				gb, dp);
	int64_t mbs = o->train.micro_batch ? o->train.micro_batch : o->micro_batch_a;
	if (mbs <= 0)
		mbs = 1;
	mbs = vps_min64(mbs, gb / dp);
	/* Megatron needs global = micro x dp x accumulation: keep the micro
	 * batch if it fits, else the largest one below it that does */
	while (mbs > 1 && (gb / dp) % mbs)
		mbs--;
	p->train.micro_batch = mbs;
	p->train.grad_accum = gb / dp / mbs;
	return VPS_OK;
}

const char *vps_collective_name(enum vps_collective_kind kind)
{
	static const char *names[] = {"broadcast", "scatter", "gather"};
	return kind >= 0 && kind < 3 ? names[kind] : "?";
}

/* The lost ranks of opts, checked against the target, and what no
 * survivor holds, refused unless allowed. */
static vps_result_t plan_lost(struct vps_plan *p, const struct vps_plan_opts *o)
{
	if (!o->nlost)
		return VPS_OK;
	VPS_CHECK(vps_lost_compute(&p->lost, p->a, o->lost, o->nlost));
	VPS_CHECK(vps_lost_check_target(&p->lost, p->a, p->b));
	if (o->rank >= 0 && vps_lost_has_rank(&p->lost, vps_world_a_rank(p->world, o->rank)))
		return vps_fail(VPS_EINPUT, "world rank %" PRId64 " is a lost device: it has no part to plan",
				o->rank);
	if (p->lost.nranges && !o->allow_loss) {
		char bytes[VPS_UNITS_LEN];
		return vps_fail(VPS_ECHECK,
				"%zu ranges (%s) are held by no surviving rank of the source: refused (--allow-loss plans "
				"around them, for the trainer to reload)",
				p->lost.nranges, vps_format_bytes(vps_lost_bytes(&p->lost), bytes, sizeof(bytes)));
	}
	return VPS_OK;
}

/* The relay mode of the options (vps/plan.h: relay, then relay_mode from
 * version 2), recorded in the plan with the bandwidths that AUTO weighs. */
static vps_result_t plan_relay(struct vps_plan *p, struct ctx *c, const struct vps_plan_opts *o)
{
	enum vps_relay mode = o->relay ? VPS_RELAY_ALWAYS : o->version >= 2 ? o->relay_mode : VPS_RELAY_NEVER;
	const struct vps_topology *t = o->version >= 2 && mode == VPS_RELAY_AUTO ? o->topology : NULL;
	if (mode != VPS_RELAY_NEVER && mode != VPS_RELAY_ALWAYS && mode != VPS_RELAY_AUTO)
		return vps_fail(VPS_EINPUT, "relay mode %d is none of never, always and auto", (int)mode);
	if (t && !(t->intra_node_bandwidth > 0 && t->inter_node_bandwidth > 0 && isfinite(t->intra_node_bandwidth) &&
		   isfinite(t->inter_node_bandwidth)))
		return vps_fail(VPS_EINPUT, "topology %s: relays weigh its bandwidths, which must be positive", t->name);
	c->relay = mode;
	c->topo = t;
	p->relay = (uint8_t)mode;
	p->relay_intra_bandwidth = t ? t->intra_node_bandwidth : 0;
	p->relay_inter_bandwidth = t ? t->inter_node_bandwidth : 0;
	return VPS_OK;
}

vps_result_t vps_plan_compute(struct vps_plan **out, struct vps_layout *a, struct vps_layout *b,
			      const struct vps_plan_opts *opts)
{
	vps_result_t rc;
	VPS_CHECK(VPS_OPTS_CHECK(opts, VPS_PLAN_OPTS_VERSION, "struct vps_plan_opts", "VPS_PLAN_OPTS_INIT"));
	const struct vps_model *ma = vps_layout_model(a), *mb = vps_layout_model(b);
	if (vps_model_hash(ma) != vps_model_hash(mb))
		return vps_fail(VPS_EINPUT, "the layouts are of different models (%s, %s)", ma->name, mb->name);
	const struct vps_parallel *pa = vps_layout_parallel(a), *pb = vps_layout_parallel(b);
	if (pa->family != pb->family)
		return vps_fail(VPS_EINPUT, "the layouts are of different families (%s, %s): their jobs hold different "
				"states", vps_parallel_family_name(pa->family), vps_parallel_family_name(pb->family));
	VPS_CHECK(vps_layout_states_match(a, b));
	struct vps_plan *p = vps_calloc(1, sizeof(*p));
	if (!p)
		return VPS_ENOMEM;
	struct ctx c = {0};
	struct vps_pieces pcs = {0};
	struct promotion pr = {0};
	VPS_CHECK_GOTO(vps_world_new(&p->world, a, b), rc, fail);
	p->scope = opts->rank;
	p->a = a;
	p->b = b;
	c.a = a;
	c.b = b;
	c.w = p->world;
	VPS_CHECK_GOTO(plan_relay(p, &c, opts), rc, fail);
	int64_t W = vps_world_size(p->world);
	if (opts->rank >= W) {
		rc = vps_fail(VPS_EINPUT, "world rank %" PRId64 " is outside the transition world of %" PRId64 " ranks",
			      opts->rank, W);
		goto fail;
	}
	VPS_CHECK_GOTO(plan_lost(p, opts), rc, fail);
	c.lost = &p->lost;
	if (opts->rank >= 0) {
		VPS_CHECK_GOTO(plan_receives(&c, opts->rank, &pcs), rc, fail);
		VPS_CHECK_GOTO(plan_sends(&c, opts->rank, &pcs), rc, fail);
		if (transit_on(&c))
			VPS_CHECK_GOTO(plan_rank_transit(&c, opts->rank, &pcs), rc, fail);
	} else {
		/* the plan's layouts hash lazily: not in threads */
		(void)vps_layout_hash(a);
		(void)vps_layout_hash(b);
		if (opts->compact) {
			p->packed = vps_calloc(1, sizeof(*p->packed));
			if (!p->packed) {
				rc = VPS_ENOMEM;
				goto fail;
			}
		}
		VPS_CHECK_GOTO(promote_begin(&pr, p), rc, fail);
		bool hash = p->packed && !opts->unhashed;
		if (hash)
			p->packed->hash = vps_plan_hash_start(p);
		VPS_CHECK_GOTO(plan_all(&c, W, opts->threads, p->packed, &pcs, &pr, hash), rc, fail);
		if (hash)
			p->packed->hashed = true;
	}
	if (opts->rank >= 0 && pcs.n) /* a rank with no piece has no array to sort */
		qsort(pcs.v, pcs.n, sizeof(*pcs.v), piece_cmp);
	if (pcs.n && pcs.n < pcs.cap) {
		/* give back the growth's slack: the global plan is the largest thing
		 * a tool holds */
		struct vps_piece *v = realloc(pcs.v, pcs.n * sizeof(*pcs.v));
		if (v)
			pcs.v = v;
	}
	p->pieces = pcs.v;
	p->npieces = pcs.n;
	pcs.v = NULL;
	for (size_t k = 0; p->packed && k < p->packed->n; k++)
		p->npieces += p->packed->v[k].npieces;
	VPS_CHECK_GOTO(plan_training(p, opts), rc, fail);
	if (opts->rank < 0)
		VPS_CHECK_GOTO(promote_end(&pr, p), rc, fail);
	ctx_release(&c);
	*out = p;
	return VPS_OK;
fail:
	ctx_release(&c);
	promote_release(&pr);
	free(pcs.v);
	vps_world_free(p->world);
	vps_packed_free(p->packed);
	free(p->pieces);
	free(p->colls);
	vps_lost_release(&p->lost);
	free(p);
	return rc;
}

void vps_plan_free(struct vps_plan *p)
{
	if (!p)
		return;
	vps_world_free(p->world);
	vps_layout_free(p->a);
	vps_layout_free(p->b);
	vps_packed_free(p->packed);
	free(p->pieces);
	free(p->colls);
	vps_lost_release(&p->lost);
	free(p);
}
