/* Statistics of a global plan: bytes, loads, the lower bound, the balanced
 * bound and an estimate of the transfer time on a topology. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/sysinfo.h>

#include "io/doc.h"
#include "model/cover.h"
#include "model/world.h"
#include "util/hash.h"
#include "util/internal.h"
#include "util/slots.h"
#include "vps/plan.h"

/* ---- the lower bound, computed apart from the planner's choices ---- */

static int region_ts_cmp(const void *p, const void *q)
{
	const struct vps_region *x = *(const struct vps_region *const *)p, *y = *(const struct vps_region *const *)q;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->state < y->state ? -1 : x->state > y->state;
}

/* Bytes of B's regions on world rank d that d's own device does not hold
 * under A: every destination element not already resident, once (a lost
 * range, which no plan can fill, aside). */
static vps_result_t lower_bound_of(const struct vps_plan *p, int64_t d, int64_t *bytes)
{
	int64_t rb = vps_world_b_rank(p->world, d), ra = vps_world_a_rank(p->world, d);
	*bytes = 0;
	if (rb < 0)
		return VPS_OK;
	struct vps_rank_view vb, va = {0};
	VPS_CHECK(vps_layout_rank(p->b, rb, &vb));
	vps_result_t rc = VPS_OK;
	if (ra >= 0)
		rc = vps_layout_rank(p->a, ra, &va);
	const struct vps_region **idx = vps_malloc((va.nregions + 1) * sizeof(*idx));
	struct vps_box *boxes = vps_malloc((va.nregions + p->lost.nranges + 1) * sizeof(*boxes));
	if (!idx || !boxes)
		rc = VPS_ENOMEM;
	for (size_t i = 0; !rc && i < va.nregions; i++)
		idx[i] = &va.regions[i];
	/* a view comes in (tensor, state) order as a rule: sort only if not */
	bool sorted = true;
	for (size_t i = 1; !rc && i < va.nregions && sorted; i++)
		sorted = region_ts_cmp(&idx[i - 1], &idx[i]) <= 0;
	if (!rc && !sorted)
		qsort(idx, va.nregions, sizeof(*idx), region_ts_cmp);
	for (size_t i = 0; !rc && i < vb.nregions; i++) {
		const struct vps_region *R = &vb.regions[i];
		/* the regions of R's (tensor, state): a run of the sorted index */
		size_t lo = 0, hi = va.nregions, n = 0;
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			if (idx[mid]->tensor < R->tensor || (idx[mid]->tensor == R->tensor && idx[mid]->state < R->state))
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t k = lo; k < va.nregions && idx[k]->tensor == R->tensor && idx[k]->state == R->state; k++)
			boxes[n++] = idx[k]->box;
		for (size_t k = 0; k < p->lost.nranges; k++)
			if (p->lost.ranges[k].tensor == R->tensor && p->lost.ranges[k].state == R->state)
				boxes[n++] = p->lost.ranges[k].box;
		int64_t u = vps_boxes_uncovered(boxes, n, &R->box);
		if (u < 0)
			rc = VPS_NOMEM();
		*bytes += u * (int64_t)vps_dtype_size(vps_region_dtype(R));
	}
	free(idx);
	free(boxes);
	vps_rank_view_release(&va);
	vps_rank_view_release(&vb);
	return rc;
}

/* The lower bound of ranks [lo, hi), in a thread of its own: it needs both
 * layouts' views of every rank, independent of the pieces, so it runs
 * beside the rest of the statistics. */
struct lb_job {
	const struct vps_plan *p;
	int64_t lo, hi, bytes;
	vps_result_t rc;
	char err[512];
};

static void *lb_run(void *arg)
{
	struct lb_job *j = arg;
	vps_clear_error();
	for (int64_t w = j->lo; w < j->hi && !j->rc; w++) {
		int64_t lb;
		j->rc = lower_bound_of(j->p, w, &lb);
		j->bytes += lb;
	}
	if (j->rc)
		snprintf(j->err, sizeof(j->err), "%s", vps_last_error());
	return NULL;
}

#define LB_THREADS_MAX 16

struct lb {
	struct lb_job job[LB_THREADS_MAX];
	pthread_t tid[LB_THREADS_MAX];
	bool started[LB_THREADS_MAX];
	int n;
};

/* Start the lower bound on the CPUs but one (the caller's); where no thread
 * can be had, lb_finish computes it. */
static void lb_start(struct lb *l, const struct vps_plan *p)
{
	int64_t W = vps_world_size(p->world);
	int n = get_nprocs() - 1;
	n = n < 1 ? 1 : n > LB_THREADS_MAX ? LB_THREADS_MAX : n;
	memset(l, 0, sizeof(*l));
	l->n = n;
	for (int i = 0; i < n; i++) {
		l->job[i] = (struct lb_job){.p = p, .lo = W * i / n, .hi = W * (i + 1) / n};
		l->started[i] = !pthread_create(&l->tid[i], NULL, lb_run, &l->job[i]);
	}
}

/* The sum, and the error of the lowest failing rank. */
static vps_result_t lb_finish(struct lb *l, int64_t *bytes)
{
	vps_result_t rc = VPS_OK;
	*bytes = 0;
	for (int i = 0; i < l->n; i++) {
		if (l->started[i])
			pthread_join(l->tid[i], NULL);
		else
			lb_run(&l->job[i]);
		if (!rc && l->job[i].rc)
			rc = vps_fail(l->job[i].rc, "%s", l->job[i].err);
		*bytes += l->job[i].bytes;
	}
	return rc;
}

/* ---- the balanced bound ---- */

/* Dinic's max flow on a small graph. */
struct edge {
	int to;
	int64_t cap;
};
struct graph {
	struct edge *e;
	size_t ne, cape;
	int *head_first; /* adjacency as arrays of edge ids */
	int **adj;
	size_t *nadj, *capadj;
	int n;
	int *level, *it;
};

static vps_result_t g_init(struct graph *g, int n)
{
	memset(g, 0, sizeof(*g));
	g->n = n;
	g->adj = vps_calloc((size_t)n, sizeof(*g->adj));
	g->nadj = vps_calloc((size_t)n, sizeof(*g->nadj));
	g->capadj = vps_calloc((size_t)n, sizeof(*g->capadj));
	g->level = vps_calloc((size_t)n, sizeof(*g->level));
	g->it = vps_calloc((size_t)n, sizeof(*g->it));
	return g->adj && g->nadj && g->capadj && g->level && g->it ? VPS_OK : VPS_ENOMEM;
}

static void g_free(struct graph *g)
{
	for (int i = 0; i < g->n && g->adj; i++)
		free(g->adj[i]);
	free(g->adj);
	free(g->nadj);
	free(g->capadj);
	free(g->level);
	free(g->it);
	free(g->e);
}

static vps_result_t g_add(struct graph *g, int u, int v, int64_t cap)
{
	VPS_CHECK(VPS_GROW(g->e, g->cape, g->ne + 2));
	VPS_CHECK(vps_grow((void **)&g->adj[u], &g->capadj[u], g->nadj[u] + 1, sizeof(int)));
	VPS_CHECK(vps_grow((void **)&g->adj[v], &g->capadj[v], g->nadj[v] + 1, sizeof(int)));
	g->adj[u][g->nadj[u]++] = (int)g->ne;
	g->e[g->ne++] = (struct edge){v, cap};
	g->adj[v][g->nadj[v]++] = (int)g->ne;
	g->e[g->ne++] = (struct edge){u, 0};
	return VPS_OK;
}

static bool g_bfs(struct graph *g, int s, int t, int *queue)
{
	for (int i = 0; i < g->n; i++)
		g->level[i] = -1;
	int qh = 0, qt = 0;
	queue[qt++] = s;
	g->level[s] = 0;
	while (qh < qt) {
		int u = queue[qh++];
		for (size_t k = 0; k < g->nadj[u]; k++) {
			struct edge *e = &g->e[g->adj[u][k]];
			if (e->cap > 0 && g->level[e->to] < 0) {
				g->level[e->to] = g->level[u] + 1;
				queue[qt++] = e->to;
			}
		}
	}
	return g->level[t] >= 0;
}

static int64_t g_dfs(struct graph *g, int u, int t, int64_t f)
{
	if (u == t)
		return f;
	for (; g->it[u] < (int)g->nadj[u]; g->it[u]++) {
		int id = g->adj[u][g->it[u]];
		struct edge *e = &g->e[id];
		if (e->cap > 0 && g->level[e->to] == g->level[u] + 1) {
			int64_t got = g_dfs(g, e->to, t, f < e->cap ? f : e->cap);
			if (got > 0) {
				e->cap -= got;
				g->e[id ^ 1].cap += got;
				return got;
			}
		}
	}
	return 0;
}

/* Bytes that one replica set can send (to one node, for the time bound;
 * node -1 for the balanced bound, which has no nodes). */
struct demand {
	uint64_t key;
	/* the destinations' nodes lie in [node, node_hi]; a plan without
	 * relays has one destination node a demand */
	int32_t node, node_hi;
	int64_t bytes;
	int64_t *ranks;
	size_t nranks;
};

static int demand_cmp(const void *p, const void *q)
{
	const struct demand *x = p, *y = q;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->node != y->node)
		return x->node < y->node ? -1 : 1;
	if (x->node_hi != y->node_hi)
		return x->node_hi < y->node_hi ? -1 : 1;
	if (x->nranks != y->nranks)
		return x->nranks < y->nranks ? -1 : 1;
	return memcmp(x->ranks, y->ranks, x->nranks * sizeof(*x->ranks));
}

/* One demand per (replica set, node): returns how many remain (the merged
 * away ranks freed). */
static size_t demands_merge(struct demand *dm, size_t n)
{
	size_t m = 0;
	if (!n) /* a plan that moves nothing has no demand array at all */
		return 0;
	qsort(dm, n, sizeof(*dm), demand_cmp);
	for (size_t i = 0; i < n; i++) {
		if (m && !demand_cmp(&dm[m - 1], &dm[i])) {
			dm[m - 1].bytes += dm[i].bytes;
			free(dm[i].ranks);
		} else {
			dm[m++] = dm[i];
		}
	}
	return m;
}

/* The ranks that send any demand, sorted, each once. */
static vps_result_t demand_senders(const struct demand *dm, size_t n, int64_t **out, size_t *ns)
{
	size_t cap = 0, u = 0;
	*ns = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < dm[i].nranks; k++) {
			VPS_CHECK(vps_grow((void **)out, &cap, *ns + 1, sizeof(**out)));
			(*out)[(*ns)++] = dm[i].ranks[k];
		}
	if (*ns)
		qsort(*out, *ns, sizeof(**out), vps_int64_cmp);
	for (size_t i = 0; i < *ns; i++)
		if (!u || (*out)[u - 1] != (*out)[i])
			(*out)[u++] = (*out)[i];
	*ns = u;
	return VPS_OK;
}

/* The most that can flow from S to T (Dinic). */
static int64_t g_maxflow(struct graph *g, int S, int T, int *queue)
{
	int64_t flow = 0;
	while (g_bfs(g, S, T, queue)) {
		memset(g->it, 0, (size_t)g->n * sizeof(int));
		int64_t f;
		while ((f = g_dfs(g, S, T, INT64_MAX)) > 0)
			flow += f;
	}
	return flow;
}

/* Which of a sender's links (bit l: link l) a demand's bytes may take
 * from replica rank, for flow_feasible. */
typedef unsigned (*links_fn)(const void *arg, const struct demand *d, int64_t rank);

/* Whether every demand's bytes can be sent by its replicas, each sender's
 * link l (of nlinks) carrying at most cap[l]: a max-flow from the demands
 * through the links they may take (links) to the sink. */
static vps_result_t flow_feasible(const struct demand *dm, size_t nd, const int64_t *senders, size_t ns, int nlinks,
				  const int64_t *cap, links_fn links, const void *arg, int64_t total, bool *ok)
{
	struct graph g;
	int S = (int)(nd + (size_t)nlinks * ns), T = S + 1;
	vps_result_t rc = g_init(&g, T + 1);
	int *queue = vps_malloc((size_t)(T + 1) * sizeof(int));
	if (!queue)
		rc = VPS_ENOMEM;
	for (size_t i = 0; !rc && i < nd; i++) {
		rc = g_add(&g, S, (int)i, dm[i].bytes);
		for (size_t k = 0; !rc && k < dm[i].nranks; k++) {
			int64_t *pos = bsearch(&dm[i].ranks[k], senders, ns, sizeof(*senders), vps_int64_cmp);
			size_t j = (size_t)(pos - senders);
			unsigned mask = links(arg, &dm[i], dm[i].ranks[k]);
			for (int l = 0; !rc && l < nlinks; l++)
				if (mask >> l & 1)
					rc = g_add(&g, (int)i, (int)(nd + (size_t)nlinks * j + (size_t)l), INT64_MAX / 4);
		}
	}
	for (size_t j = 0; !rc && j < ns; j++)
		for (int l = 0; !rc && l < nlinks; l++)
			rc = g_add(&g, (int)(nd + (size_t)nlinks * j + (size_t)l), T, cap[l]);
	*ok = !rc && g_maxflow(&g, S, T, queue) >= total;
	free(queue);
	g_free(&g);
	return rc;
}

static unsigned any_link(const void *arg, const struct demand *d, int64_t rank)
{
	(void)arg;
	(void)d;
	(void)rank;
	return 1;
}

/* Whether every class's bytes can be sent with no sender above cap. */
static vps_result_t feasible(const struct demand *dm, size_t nd, const int64_t *senders, size_t ns, int64_t cap,
			     int64_t total, bool *ok)
{
	return flow_feasible(dm, nd, senders, ns, 1, &cap, any_link, NULL, total, ok);
}

/* The replica classes of the moved pieces. A piece's class is the set of A
 * ranks holding the whole of its box (or its source alone, when none does):
 * every piece of one (tensor, state, box) has the same, so the holders are
 * asked once per distinct box, and a class is kept as the holders' rank
 * progressions, expanded once per class (a class at 16,384 ranks has
 * hundreds of ranks and millions of pieces fall in a few thousand classes). */
struct prog {
	int64_t base, stride, count;
};

struct boxent {
	uint64_t h;
	uint32_t tensor;
	uint8_t state, dtype;
	struct vps_box box;
	int64_t cls; /* -1: no A rank holds the whole box */
};

struct cls {
	uint64_t h;
	size_t first, n; /* progressions [first, first + n) */
	int64_t bytes;
};

struct classes {
	struct boxent *be;
	size_t nbe, capbe;
	struct vps_slots beslots;
	struct cls *c;
	size_t nc, capc;
	struct vps_slots cslots;
	struct prog *pg;
	size_t npg, cappg;
};

static void classes_release(struct classes *k)
{
	free(k->be);
	vps_slots_release(&k->beslots);
	free(k->c);
	vps_slots_release(&k->cslots);
	free(k->pg);
}

static uint64_t class_hash(const void *entries, size_t i)
{
	return ((const struct cls *)entries)[i].h;
}

static uint64_t boxent_hash(const void *entries, size_t i)
{
	return ((const struct boxent *)entries)[i].h;
}

static int prog_cmp(const void *p, const void *q)
{
	const struct prog *x = p, *y = q;
	if (x->base != y->base)
		return x->base < y->base ? -1 : 1;
	if (x->stride != y->stride)
		return x->stride < y->stride ? -1 : 1;
	return x->count < y->count ? -1 : x->count > y->count;
}

/* The class of progressions pg[from, npg), which are dropped again if the
 * class exists. */
static vps_result_t class_of(struct classes *k, size_t from, int64_t *id)
{
	size_t n = k->npg - from;
	qsort(&k->pg[from], n, sizeof(*k->pg), prog_cmp);
	uint64_t h = vps_hash64(&k->pg[from], n * sizeof(*k->pg), 11);
	VPS_CHECK(vps_slots_room(&k->cslots, k->nc, 1024, class_hash, k->c, "replica classes"));
	size_t at = vps_slots_start(&k->cslots, h);
	for (; k->cslots.slot[at]; at = vps_slots_next(&k->cslots, at)) {
		const struct cls *c = &k->c[k->cslots.slot[at] - 1];
		if (c->h == h && c->n == n && !memcmp(&k->pg[c->first], &k->pg[from], n * sizeof(*k->pg))) {
			k->npg = from;
			*id = k->cslots.slot[at] - 1;
			return VPS_OK;
		}
	}
	VPS_CHECK(VPS_GROW(k->c, k->capc, k->nc + 1));
	k->c[k->nc] = (struct cls){h, from, n, 0};
	k->cslots.slot[at] = (uint32_t)k->nc + 1;
	*id = (int64_t)k->nc++;
	return VPS_OK;
}

/* The entry of x's (tensor, state, box) in k->be, made on first sight. */
static vps_result_t box_entry(const struct vps_plan *p, struct classes *k, struct vps_holders *h,
			      const struct vps_piece *x, size_t *index)
{
	int64_t f[3 + 2 * VPS_MAX_DIMS] = {x->tensor, x->state, x->box.ndim};
	for (int a = 0; a < x->box.ndim; a++) {
		f[3 + a] = x->box.lo[a];
		f[3 + VPS_MAX_DIMS + a] = x->box.hi[a];
	}
	uint64_t hv = vps_hash64(f, sizeof(f), 5);
	VPS_CHECK(vps_slots_room(&k->beslots, k->nbe, 1024, boxent_hash, k->be, "distinct boxes"));
	size_t at = vps_slots_start(&k->beslots, hv);
	struct boxent *e = NULL;
	for (; k->beslots.slot[at]; at = vps_slots_next(&k->beslots, at)) {
		struct boxent *c = &k->be[k->beslots.slot[at] - 1];
		if (c->h == hv && c->tensor == x->tensor && c->state == x->state && vps_box_equal(&c->box, &x->box)) {
			e = c;
			break;
		}
	}
	if (!e) {
		size_t from = k->npg;
		h->n = 0;
		VPS_CHECK(vps_layout_holders(p->a, x->tensor, x->state, &x->box, h));
		VPS_CHECK(vps_lost_drop_holders(&p->lost, h)); /* lost devices send nothing */
		for (size_t i = 0; i < h->n; i++) {
			if (!vps_box_contains(&h->v[i].region.box, &x->box) || h->v[i].count <= 0)
				continue;
			VPS_CHECK(VPS_GROW(k->pg, k->cappg, k->npg + 1));
			k->pg[k->npg++] = (struct prog){h->v[i].base, h->v[i].stride, h->v[i].count};
		}
		int64_t cls = -1;
		if (k->npg > from)
			VPS_CHECK(class_of(k, from, &cls));
		VPS_CHECK(VPS_GROW(k->be, k->capbe, k->nbe + 1));
		e = &k->be[k->nbe];
		*e = (struct boxent){.h = hv, .tensor = x->tensor, .state = x->state, .dtype = x->dtype, .box = x->box,
				   .cls = cls};
		k->beslots.slot[at] = (uint32_t)k->nbe + 1;
		k->nbe++;
	}
	*index = (size_t)(e - k->be);
	return VPS_OK;
}

static vps_result_t piece_class(const struct vps_plan *p, struct classes *k, struct vps_holders *h,
				const struct vps_piece *x, int64_t *id)
{
	size_t index;
	VPS_CHECK(box_entry(p, k, h, x, &index));
	const struct boxent *e = &k->be[index];
	if (e->cls >= 0) {
		*id = e->cls;
		return VPS_OK;
	}
	/* no replica holds it whole: its source alone */
	VPS_CHECK(VPS_GROW(k->pg, k->cappg, k->npg + 1));
	k->pg[k->npg++] = (struct prog){x->src, 0, 1};
	return class_of(k, k->npg - 1, id);
}

/* The least cap in [lo, hi] under which every demand goes through (hi
 * does), by binary search. */
static vps_result_t least_cap(const struct demand *dm, size_t nd, const int64_t *senders, size_t ns, int64_t total,
			      int64_t lo, int64_t hi, int64_t *out)
{
	vps_result_t rc = VPS_OK;
	while (!rc && lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		bool ok = false;
		rc = feasible(dm, nd, senders, ns, mid, total, &ok);
		if (ok)
			hi = mid;
		else
			lo = mid + 1;
	}
	*out = lo;
	return rc;
}

/* Class c's ranks, expanded from its progressions and sorted. */
static vps_result_t class_ranks(const struct classes *k, const struct cls *c, int64_t **out, size_t *n)
{
	size_t nr = 0;
	for (size_t q = c->first; q < c->first + c->n; q++)
		nr += (size_t)k->pg[q].count;
	int64_t *ranks = vps_malloc((nr + 1) * sizeof(*ranks));
	if (!ranks)
		return VPS_ENOMEM;
	nr = 0;
	for (size_t q = c->first; q < c->first + c->n; q++)
		for (int64_t j = 0; j < k->pg[q].count; j++)
			ranks[nr++] = k->pg[q].base + j * k->pg[q].stride;
	qsort(ranks, nr, sizeof(*ranks), vps_int64_cmp);
	*out = ranks;
	*n = nr;
	return VPS_OK;
}

/* ---- when receivers relay ----
 * A plan with forwards lets a device pass on what it received, so a replica
 * set need send each element only it has once, not once a receiver: what it
 * must send is the union of its moved boxes of each tensor and state, toward
 * the nodes of their destinations. (A box no A rank holds whole, whose class
 * would be its sender, is left out: a bound that leaves bytes out is still a
 * bound.) Any device may send the rest, so the moved bytes over every device
 * of the world bound the busiest too. */
struct relayed {
	struct classes cl;
	int32_t *node_lo, *node_hi; /* by box entry: its destinations' nodes */
	struct demand *dm;          /* one a class, tensor and state */
	size_t nd;
	int64_t moved, distinct;
};

static void relayed_release(struct relayed *r)
{
	for (size_t i = 0; i < r->nd; i++)
		free(r->dm[i].ranks);
	free(r->dm);
	free(r->node_lo);
	free(r->node_hi);
	classes_release(&r->cl);
}

struct beref {
	int64_t cls;
	uint32_t tensor;
	uint8_t state;
	size_t index;
};

static int beref_cmp(const void *p, const void *q)
{
	const struct beref *x = p, *y = q;
	if (x->cls != y->cls)
		return x->cls < y->cls ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->state < y->state ? -1 : x->state > y->state;
}

/* The demands of each (class, tensor, state) group of box entries
 * [refs, refs + n): its union's bytes toward its destinations' nodes. */
static vps_result_t relayed_groups(struct relayed *r, struct beref *refs, size_t n)
{
	struct vps_box *boxes = NULL;
	size_t capboxes = 0, capdm = 0;
	vps_result_t rc = VPS_OK;
	qsort(refs, n, sizeof(*refs), beref_cmp);
	for (size_t i = 0, j; !rc && i < n; i = j) {
		int32_t lo = INT32_MAX, hi = INT32_MIN;
		for (j = i; j < n && !beref_cmp(&refs[i], &refs[j]); j++) {
			rc = vps_grow((void **)&boxes, &capboxes, j - i + 1, sizeof(*boxes));
			if (rc)
				break;
			boxes[j - i] = r->cl.be[refs[j].index].box;
			lo = lo < r->node_lo[refs[j].index] ? lo : r->node_lo[refs[j].index];
			hi = hi > r->node_hi[refs[j].index] ? hi : r->node_hi[refs[j].index];
		}
		int64_t elements = rc ? 0 : vps_boxes_union_volume(boxes, j - i);
		if (!rc && elements < 0)
			rc = VPS_NOMEM();
		if (!rc)
			rc = VPS_GROW(r->dm, capdm, r->nd + 1);
		if (rc)
			break;
		const struct cls *c = &r->cl.c[refs[i].cls];
		struct demand *d = &r->dm[r->nd];
		*d = (struct demand){c->h, lo, hi, elements * (int64_t)vps_dtype_size(vps_dtype_of(r->cl.be[refs[i].index].dtype, refs[i].state)), NULL, 0};
		rc = class_ranks(&r->cl, c, &d->ranks, &d->nranks);
		if (!rc) {
			r->distinct += d->bytes;
			r->nd++;
		}
	}
	free(boxes);
	return rc;
}

/* The plan's moved pieces as relayed demands; recv and keep (by world
 * rank, either may be NULL) get each device's received and retained bytes. */
static vps_result_t relayed_demands(const struct vps_plan *p, struct relayed *r, double *recv, double *keep)
{
	struct vps_holders h = {0};
	size_t caplo = 0, caphi = 0;
	vps_result_t rc = VPS_OK;
	struct vps_piece_iter it;
	const struct vps_piece *x;
	vps_piece_iter_init(&it, p);
	while (!rc && (x = vps_piece_iter_next(&it))) {
		int64_t bytes = vps_piece_bytes(x);
		if (x->src == x->dst) {
			if (keep)
				keep[x->dst] += (double)bytes;
			continue;
		}
		r->moved += bytes;
		if (recv)
			recv[x->dst] += (double)bytes;
		size_t before = r->cl.nbe, e = 0;
		rc = box_entry(p, &r->cl, &h, x, &e);
		if (!rc && r->cl.nbe > before) {
			rc = vps_grow((void **)&r->node_lo, &caplo, r->cl.nbe, sizeof(*r->node_lo));
			if (!rc)
				rc = vps_grow((void **)&r->node_hi, &caphi, r->cl.nbe, sizeof(*r->node_hi));
			if (!rc) {
				r->node_lo[e] = INT32_MAX;
				r->node_hi[e] = INT32_MIN;
			}
		}
		if (rc)
			break;
		int32_t node = vps_world_device(p->world, x->dst).node;
		if (node < r->node_lo[e])
			r->node_lo[e] = node;
		if (node > r->node_hi[e])
			r->node_hi[e] = node;
	}
	vps_holders_release(&h);
	struct beref *refs = NULL;
	size_t n = 0;
	if (!rc) {
		refs = vps_malloc((r->cl.nbe + 1) * sizeof(*refs));
		if (!refs)
			rc = VPS_ENOMEM;
	}
	for (size_t e = 0; !rc && e < r->cl.nbe; e++)
		if (r->cl.be[e].cls >= 0)
			refs[n++] = (struct beref){r->cl.be[e].cls, r->cl.be[e].tensor, r->cl.be[e].state, e};
	if (!rc)
		rc = relayed_groups(r, refs, n);
	free(refs);
	return rc;
}

/* balanced_send_bound for a plan whose receivers relay. */
static vps_result_t balanced_send_bound_relayed(const struct vps_plan *p, int64_t max_send, int64_t *bound)
{
	struct relayed r = {0};
	int64_t *senders = NULL;
	size_t ns = 0;
	vps_result_t rc = relayed_demands(p, &r, NULL, NULL);
	for (size_t i = 0; !rc && i < r.nd; i++)
		r.dm[i].node = r.dm[i].node_hi = -1;
	if (!rc) {
		r.nd = demands_merge(r.dm, r.nd);
		rc = demand_senders(r.dm, r.nd, &senders, &ns);
	}
	int64_t W = vps_world_size(p->world), least = 0;
	if (!rc && ns)
		rc = least_cap(r.dm, r.nd, senders, ns, r.distinct, (r.distinct + (int64_t)ns - 1) / (int64_t)ns, max_send,
			       &least);
	if (!rc)
		*bound = vps_max64(least, W ? (r.moved + W - 1) / W : 0);
	free(senders);
	relayed_release(&r);
	return rc;
}

static vps_result_t balanced_send_bound(const struct vps_plan *p, int64_t max_send, int64_t *bound)
{
	struct demand *dm = NULL;
	size_t nd = 0;
	int64_t total = 0;
	struct vps_holders h = {0};
	struct classes cl = {0};
	vps_result_t rc = VPS_OK;
	struct vps_piece_iter it;
	const struct vps_piece *x;
	vps_piece_iter_init(&it, p);
	while (!rc && (x = vps_piece_iter_next(&it))) {
		if (x->src == x->dst)
			continue;
		int64_t id = 0;
		rc = piece_class(p, &cl, &h, x, &id);
		if (!rc) {
			cl.c[id].bytes += vps_piece_bytes(x);
			total += vps_piece_bytes(x);
		}
	}
	if (!rc) {
		dm = vps_calloc(cl.nc + 1, sizeof(*dm));
		if (!dm)
			rc = VPS_ENOMEM;
	}
	for (size_t i = 0; !rc && i < cl.nc; i++) {
		const struct cls *c = &cl.c[i];
		int64_t *ranks;
		size_t nr;
		rc = class_ranks(&cl, c, &ranks, &nr);
		if (rc)
			break;
		dm[nd++] = (struct demand){vps_hash64(ranks, nr * sizeof(*ranks), 7), -1, -1, c->bytes, ranks, nr};
	}
	classes_release(&cl);
	/* merge the classes with one replica set */
	if (!rc)
		nd = demands_merge(dm, nd);
	int64_t *senders = NULL;
	size_t ns = 0;
	if (!rc)
		rc = demand_senders(dm, nd, &senders, &ns);
	if (!rc)
		rc = least_cap(dm, nd, senders, ns, total, ns ? (total + (int64_t)ns - 1) / (int64_t)ns : 0, max_send, bound);
	for (size_t i = 0; i < nd; i++)
		free(dm[i].ranks);
	free(dm);
	free(senders);
	vps_holders_release(&h);
	return rc;
}

/* ---- the best time the topology allows ---- */

/* NVLink (bit 0) where a destination of d may sit on the sender's node,
 * the NIC (bit 1) where one may sit elsewhere. */
static unsigned node_links(const void *arg, const struct demand *d, int64_t rank)
{
	int32_t node = vps_world_device(((const struct vps_plan *)arg)->world, rank).node;
	return (unsigned)(node >= d->node && node <= d->node_hi) | (unsigned)!(d->node == d->node_hi && node == d->node) << 1;
}

/* Whether every class can be sent within t seconds: each sender has an
 * NVLink and a NIC capacity of t times its bandwidth, and a class reaches a
 * replica's NVLink when the replica is on a node of the class's
 * destinations, its NIC when a destination is on another node. */
static vps_result_t time_feasible(const struct vps_plan *p, const struct vps_topology *topo, const struct demand *tc,
				  size_t nc, const int64_t *senders, size_t ns, int64_t total, double t, bool *ok)
{
	const int64_t cap[2] = {(int64_t)fmin(t * topo->intra_node_bandwidth, (double)(INT64_MAX / 4)),
				(int64_t)fmin(t * topo->inter_node_bandwidth, (double)(INT64_MAX / 4))};
	return flow_feasible(tc, nc, senders, ns, 2, cap, node_links, p, total, ok);
}

/* The least time in which every demand goes through, raised into *best:
 * every class from its first replica over the slower link is feasible;
 * below the all-senders-at-full-rate time is not. */
static vps_result_t least_time(const struct vps_plan *p, const struct vps_topology *topo, const struct demand *dm,
			       size_t nd, const int64_t *senders, size_t ns, int64_t total, double *best)
{
	double bi = topo->intra_node_bandwidth, be = topo->inter_node_bandwidth;
	if (total <= 0)
		return VPS_OK;
	double lo = (double)total / ((double)ns * (bi + be)), hi = 2.0 * (double)total / fmin(bi, be);
	vps_result_t rc = VPS_OK;
	while (!rc && hi - lo > 1e-6 * hi) {
		double mid = 0.5 * (lo + hi);
		bool ok = false;
		rc = time_feasible(p, topo, dm, nd, senders, ns, total, mid, &ok);
		if (ok)
			hi = mid;
		else
			lo = mid;
	}
	/* lo is infeasible: the least feasible time lies above it */
	*best = fmax(*best, lo);
	return rc;
}

/* The A ranks holding the whole box of piece x (its replicas), sorted. */
static vps_result_t replicas_of(const struct vps_plan *p, const struct vps_piece *x, struct vps_holders *h,
				int64_t **out, size_t *n, size_t *cap)
{
	h->n = 0;
	*n = 0;
	VPS_CHECK(vps_layout_holders(p->a, x->tensor, x->state, &x->box, h));
	VPS_CHECK(vps_lost_drop_holders(&p->lost, h));
	for (size_t i = 0; i < h->n; i++) {
		if (!vps_box_contains(&h->v[i].region.box, &x->box))
			continue;
		for (int64_t k = 0; k < h->v[i].count; k++) {
			VPS_CHECK(vps_grow((void **)out, cap, *n + 1, sizeof(**out)));
			(*out)[(*n)++] = h->v[i].base + k * h->v[i].stride;
		}
	}
	qsort(*out, *n, sizeof(**out), vps_int64_cmp);
	return VPS_OK;
}

/* A lower bound on the transfer time any plan can reach on topo, latency
 * aside: the largest of
 *  - the senders' side: the least t for which every moved byte can be sent
 *    by one of its replicas with no device's NVLink or NIC busy beyond t
 *    (max-flow with capacities scaled by bandwidth, binary search on t);
 *  - each receiver alone: bytes only a replica on its node has go over
 *    NVLink, those only remote replicas have over the NIC, the rest either
 *    way: max(local / intra, remote / inter, all / (intra + inter));
 *  - each device's retains, read and written at memory bandwidth.
 * Senders and receivers are bounded apart, so the bound may be below what
 * both together allow, never above. */
static vps_result_t time_bound(const struct vps_plan *p, const struct vps_topology *topo, double *out)
{
	int64_t W = vps_world_size(p->world);
	struct demand *tc = NULL;
	size_t nc = 0, capc = 0, nr = 0, capr = 0;
	int64_t *ranks = NULL, total = 0;
	double *loc = vps_calloc((size_t)W, sizeof(*loc)), *rem = vps_calloc((size_t)W, sizeof(*rem));
	double *any = vps_calloc((size_t)W, sizeof(*any)), *keep = vps_calloc((size_t)W, sizeof(*keep));
	struct vps_holders h = {0};
	vps_result_t rc = loc && rem && any && keep ? VPS_OK : VPS_ENOMEM;
	double bi = topo->intra_node_bandwidth, be = topo->inter_node_bandwidth, best = 0;
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, p);
	for (const struct vps_piece *x; !rc && (x = vps_piece_iter_next(&it));) {
		int64_t bytes = vps_piece_bytes(x);
		if (x->src == x->dst) {
			keep[x->dst] += (double)bytes;
			continue;
		}
		rc = replicas_of(p, x, &h, &ranks, &nr, &capr);
		if (!rc && !nr) {
			rc = vps_grow((void **)&ranks, &capr, 1, sizeof(*ranks));
			if (!rc) {
				ranks[0] = x->src;
				nr = 1;
			}
		}
		if (rc)
			break;
		int32_t node = vps_world_device(p->world, x->dst).node;
		bool l = false, r = false;
		for (size_t k = 0; k < nr; k++) {
			if (vps_world_device(p->world, ranks[k]).node == node)
				l = true;
			else
				r = true;
		}
		(l && r ? any : l ? loc : rem)[x->dst] += (double)bytes;
		rc = VPS_GROW(tc, capc, nc + 1);
		if (rc)
			break;
		tc[nc] = (struct demand){vps_hash64(ranks, nr * sizeof(*ranks), 7), node, node, bytes, NULL, nr};
		tc[nc].ranks = vps_malloc(nr * sizeof(*ranks));
		if (!tc[nc].ranks) {
			rc = VPS_ENOMEM;
			break;
		}
		memcpy(tc[nc].ranks, ranks, nr * sizeof(*ranks));
		nc++;
		total += bytes;
	}
	for (int64_t w = 0; !rc && w < W; w++) {
		best = fmax(best, 2.0 * keep[w] / topo->memory_bandwidth);
		best = fmax(best, fmax(loc[w] / bi, rem[w] / be));
		best = fmax(best, (loc[w] + rem[w] + any[w]) / (bi + be));
	}
	if (!rc)
		nc = demands_merge(tc, nc);
	int64_t *senders = NULL;
	size_t ns = 0;
	if (!rc)
		rc = demand_senders(tc, nc, &senders, &ns);
	if (!rc)
		rc = least_time(p, topo, tc, nc, senders, ns, total, &best);
	*out = best;
	for (size_t i = 0; i < nc; i++)
		free(tc[i].ranks);
	free(tc);
	free(senders);
	free(ranks);
	free(loc);
	free(rem);
	free(any);
	free(keep);
	vps_holders_release(&h);
	return rc;
}

/* time_bound for a plan whose receivers relay: each receiver's bytes at
 * both bandwidths together (a relay on its node may have any of them), each
 * replica set's union toward its destinations' nodes, each device's
 * retains, and the moved bytes over every device's links. */
static vps_result_t time_bound_relayed(const struct vps_plan *p, const struct vps_topology *topo, double *out)
{
	int64_t W = vps_world_size(p->world);
	double bi = topo->intra_node_bandwidth, be = topo->inter_node_bandwidth, best = 0;
	double *recv = vps_calloc((size_t)W + 1, sizeof(*recv)), *keep = vps_calloc((size_t)W + 1, sizeof(*keep));
	struct relayed r = {0};
	/* NICs carry only what crosses nodes: none in a world of one node */
	double both = vps_world_one_node(p->a, p->b) ? bi : bi + be;
	int64_t *senders = NULL;
	size_t ns = 0;
	vps_result_t rc = recv && keep ? relayed_demands(p, &r, recv, keep) : VPS_ENOMEM;
	for (int64_t w = 0; !rc && w < W; w++)
		best = fmax(best, fmax(2.0 * keep[w] / topo->memory_bandwidth, recv[w] / both));
	if (!rc && W)
		best = fmax(best, (double)r.moved / ((double)W * both));
	if (!rc) {
		r.nd = demands_merge(r.dm, r.nd);
		rc = demand_senders(r.dm, r.nd, &senders, &ns);
	}
	if (!rc)
		rc = least_time(p, topo, r.dm, r.nd, senders, ns, r.distinct, &best);
	if (!rc)
		*out = best;
	free(senders);
	free(recv);
	free(keep);
	relayed_release(&r);
	return rc;
}

/* ---- everything ---- */

struct pair {
	int64_t a, b;
};

static int pair_cmp(const void *p, const void *q)
{
	const struct pair *x = p, *y = q;
	if (x->a != y->a)
		return x->a < y->a ? -1 : 1;
	return x->b < y->b ? -1 : x->b > y->b;
}

/* Per world rank: bytes sent and received (and of those, across nodes),
 * retained, and peers. */
struct loads {
	int64_t *send, *recv, *isend, *irecv, *keep, *peers;
};

static void loads_release(struct loads *ld)
{
	free(ld->send);
	free(ld->recv);
	free(ld->isend);
	free(ld->irecv);
	free(ld->keep);
	free(ld->peers);
}

static vps_result_t loads_init(struct loads *ld, int64_t W)
{
	ld->send = vps_calloc((size_t)W, sizeof(*ld->send));
	ld->recv = vps_calloc((size_t)W, sizeof(*ld->recv));
	ld->isend = vps_calloc((size_t)W, sizeof(*ld->isend));
	ld->irecv = vps_calloc((size_t)W, sizeof(*ld->irecv));
	ld->keep = vps_calloc((size_t)W, sizeof(*ld->keep));
	ld->peers = vps_calloc((size_t)W, sizeof(*ld->peers));
	if (ld->send && ld->recv && ld->isend && ld->irecv && ld->keep && ld->peers)
		return VPS_OK;
	loads_release(ld);
	return VPS_ENOMEM;
}

/* The plan's pieces counted into s and ld, peers by distinct pairs. */
static vps_result_t count_pieces(const struct vps_plan *p, struct vps_plan_stats *s, struct loads *ld)
{
	struct pair *pairs = NULL;
	size_t np = 0, cappairs = 0;
	vps_result_t rc = VPS_OK;
	struct vps_piece_iter it;
	const struct vps_piece *x;
	vps_piece_iter_init(&it, p);
	while (!rc && (x = vps_piece_iter_next(&it))) {
		int64_t bytes = vps_piece_bytes(x);
		s->pieces++;
		if (x->src == x->dst) {
			s->retains++;
			s->bytes_retained += bytes;
			ld->keep[x->dst] += bytes;
			continue;
		}
		s->bytes_moved += bytes;
		if (x->src_buffer & VPS_BUFFER_TARGET)
			s->bytes_relayed += bytes;
		if (vps_piece_to_transit(x))
			s->bytes_transit += bytes;
		ld->send[x->src] += bytes;
		ld->recv[x->dst] += bytes;
		bool intra = vps_world_device(p->world, x->src).node == vps_world_device(p->world, x->dst).node;
		if (intra) {
			s->bytes_intra_node += bytes;
		} else {
			s->bytes_inter_node += bytes;
			ld->isend[x->src] += bytes;
			ld->irecv[x->dst] += bytes;
		}
		/* pieces come by (dst, src): a pair repeats in a run, kept once */
		if (np && pairs[np - 2].a == x->src && pairs[np - 2].b == x->dst)
			continue;
		rc = VPS_GROW(pairs, cappairs, np + 2);
		if (!rc) {
			pairs[np++] = (struct pair){x->src, x->dst};
			pairs[np++] = (struct pair){x->dst, x->src};
		}
	}
	if (!rc && np)
		qsort(pairs, np, sizeof(*pairs), pair_cmp);
	for (size_t i = 0; !rc && i < np; i++)
		if (!i || pair_cmp(&pairs[i - 1], &pairs[i]))
			ld->peers[pairs[i].a]++;
	free(pairs);
	return rc;
}

/* Device w's time: NVLink and the NICs run at once, each direction at
 * full rate; local copies read and write memory; each peer costs a
 * message latency. The busiest device sets the plan's estimate. */
static struct vps_estimate device_estimate(const struct vps_plan *p, int64_t w, const struct loads *ld,
					   const struct vps_topology *topo)
{
	const int64_t bytes[] = {ld->send[w] - ld->isend[w], ld->recv[w] - ld->irecv[w], ld->isend[w], ld->irecv[w],
				 ld->keep[w]};
	const double per_second[] = {topo->intra_node_bandwidth, topo->intra_node_bandwidth,
				     topo->inter_node_bandwidth, topo->inter_node_bandwidth,
				     topo->memory_bandwidth / 2.0};
	struct vps_estimate e = {.rank = w, .device = vps_world_device(p->world, w), .peers = ld->peers[w]};
	double most = -1;
	for (int k = 0; k < 5; k++)
		if ((double)bytes[k] / per_second[k] > most) {
			most = (double)bytes[k] / per_second[k];
			e.by = (enum vps_estimate_by)k;
			e.bytes = bytes[k];
		}
	e.seconds = most + topo->latency * (double)ld->peers[w];
	return e;
}

vps_result_t vps_plan_stats(const struct vps_plan *p, const struct vps_topology *topo, bool load,
			    struct vps_plan_stats *s)
{
	int64_t W = vps_world_size(p->world);
	memset(s, 0, sizeof(*s));
	if (p->scope >= 0)
		return vps_fail(VPS_EINPUT, "statistics need a global plan (this one is rank %" PRId64 "'s)", p->scope);
	s->world = W;
	struct loads ld = {0};
	struct lb lb;
	VPS_CHECK(loads_init(&ld, W));
	lb_start(&lb, p);
	for (int64_t w = 0; w < W; w++) {
		s->joining += vps_world_a_rank(p->world, w) < 0;
		s->leaving += vps_world_b_rank(p->world, w) < 0;
	}
	vps_result_t rc = count_pieces(p, s, &ld);
	for (int64_t w = 0; !rc && w < W; w++) {
		s->max_send_bytes = vps_max64(s->max_send_bytes, ld.send[w]);
		s->max_recv_bytes = vps_max64(s->max_recv_bytes, ld.recv[w]);
		s->peers_max = vps_max64(s->peers_max, ld.peers[w]);
	}
	bool counted = !rc;
	/* a plan with forwards is bounded as one whose receivers relay */
	bool relayed = s->bytes_relayed > 0;
	if (counted)
		rc = (relayed ? balanced_send_bound_relayed : balanced_send_bound)(p, s->max_send_bytes,
										    &s->balanced_send_bound);
	/* the lower bound's error first, as when it ran before */
	int64_t lower;
	vps_result_t lrc = lb_finish(&lb, &lower);
	if (counted) {
		s->bytes_lower_bound = lower;
		rc = lrc ? lrc : rc;
	}
	if (rc)
		goto done;
	s->balanced_bound = vps_max64(s->balanced_send_bound, s->max_recv_bytes);
	if (topo) {
		s->have_estimate = true;
		if (load && W && !(s->seconds = vps_calloc((size_t)W, sizeof(*s->seconds)))) {
			rc = VPS_ENOMEM;
			goto done;
		}
		for (int64_t w = 0; w < W; w++) {
			struct vps_estimate e = device_estimate(p, w, &ld, topo);
			if (s->seconds)
				s->seconds[w] = e.seconds;
			if (!w || e.seconds > s->estimate.seconds)
				s->estimate = e;
		}
		s->estimate_seconds = s->estimate.seconds;
		VPS_CHECK_GOTO((relayed ? time_bound_relayed : time_bound)(p, topo, &s->time_bound_seconds), rc, done);
		struct vps_time_floor f;
		VPS_CHECK_GOTO((relayed ? vps_time_floor_relayed : vps_time_floor)(p->a, p->b, topo, &f), rc, done);
		s->time_floor_seconds = f.seconds;
		s->time_floor = f;
		/* the relayed floor also counts what must cross a node's NICs
		 * once, which the bound's view of devices and sets does not see:
		 * no plan beats either */
		if (relayed)
			s->time_bound_seconds = fmax(s->time_bound_seconds, f.seconds);
	}
	if (load) {
		s->send = ld.send;
		s->recv = ld.recv;
		s->nic_send = ld.isend;
		s->nic_recv = ld.irecv;
		s->retain = ld.keep;
		ld.send = ld.recv = ld.isend = ld.irecv = ld.keep = NULL;
	}
done:
	if (rc) {
		free(s->seconds);
		s->seconds = NULL;
	}
	loads_release(&ld);
	return rc;
}

void vps_plan_stats_release(struct vps_plan_stats *s)
{
	free(s->send);
	free(s->recv);
	free(s->nic_send);
	free(s->nic_recv);
	free(s->retain);
	free(s->seconds);
	s->send = s->recv = s->nic_send = s->nic_recv = s->retain = NULL;
	s->seconds = NULL;
}

/* ---- topologies ---- */

vps_result_t vps_topology_load(struct vps_topology *t, const char *arg, const char *search_path)
{
	char path[4096];
	memset(t, 0, sizeof(*t));
	VPS_CHECK(vps_config_find(arg, search_path, "topology", path, sizeof(path)));
	struct vps_bytes b;
	struct vps_reader *r = NULL;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_reader_new(&r, path, b.data, b.len, VPS_DOC_TOPOLOGY);
	const char *name = "";
	if (!rc)
		rc = vps_r_str(r, "name", &name);
	if (!rc)
		snprintf(t->name, sizeof(t->name), "%s", name);
	/* informational: the estimate needs bandwidths only */
	if (!rc)
		rc = vps_r_int_opt(r, "gpus_per_node", &t->gpus_per_node, 1, 1 << 20, 8);
	if (!rc)
		rc = vps_r_int_opt(r, "gpu_memory", &t->gpu_memory, 0, INT64_MAX, 0);
	if (!rc)
		rc = vps_r_double(r, "intra_node_bandwidth", &t->intra_node_bandwidth);
	if (!rc)
		rc = vps_r_double(r, "inter_node_bandwidth", &t->inter_node_bandwidth);
	if (!rc)
		rc = vps_r_double(r, "memory_bandwidth", &t->memory_bandwidth);
	if (!rc)
		rc = vps_r_double(r, "latency", &t->latency);
	if (!rc && (t->intra_node_bandwidth <= 0 || t->inter_node_bandwidth <= 0 || t->memory_bandwidth <= 0 ||
		    t->latency < 0))
		rc = vps_r_error(r, NULL, "bandwidths must be positive and the latency not negative");
	if (!rc)
		rc = vps_reader_finish(r);
	vps_reader_free(r);
	vps_bytes_release(&b);
	return rc;
}
