/* Statistics of a global plan: bytes, loads, the lower bound, the balanced
 * bound and an estimate of the transfer time on a topology. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "doc.h"
#include "internal.h"
#include "vps/plan.h"
#include "vps/verify.h"

/* ---- the lower bound, computed apart from the planner's choices ---- */

static int region_ts_cmp(const void *p, const void *q)
{
	const struct vps_region *x = *(const struct vps_region *const *)p, *y = *(const struct vps_region *const *)q;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->state < y->state ? -1 : x->state > y->state;
}

/* Bytes of B's regions on world rank d that d's own device does not hold
 * under A: every destination element not already resident, once. */
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
	struct vps_box *boxes = vps_malloc((va.nregions + 1) * sizeof(*boxes));
	if (!idx || !boxes)
		rc = VPS_ENOMEM;
	for (size_t i = 0; !rc && i < va.nregions; i++)
		idx[i] = &va.regions[i];
	if (!rc)
		qsort(idx, va.nregions, sizeof(*idx), region_ts_cmp);
	for (size_t i = 0; !rc && i < vb.nregions; i++) {
		const struct vps_region *R = &vb.regions[i];
		size_t n = 0;
		for (size_t k = 0; k < va.nregions; k++)
			if (idx[k]->tensor == R->tensor && idx[k]->state == R->state)
				boxes[n++] = idx[k]->box;
		int64_t u = vps_boxes_uncovered(boxes, n, &R->box);
		if (u < 0)
			rc = VPS_NOMEM();
		*bytes += u * (int64_t)vps_dtype_size(vps_state_dtype(R->state));
	}
	free(idx);
	free(boxes);
	vps_rank_view_release(&va);
	vps_rank_view_release(&vb);
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

struct demand {
	uint64_t key;
	int64_t bytes;
	int64_t *ranks;
	size_t nranks;
};

static int demand_cmp(const void *p, const void *q)
{
	const struct demand *x = p, *y = q;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->nranks != y->nranks)
		return x->nranks < y->nranks ? -1 : 1;
	return memcmp(x->ranks, y->ranks, x->nranks * sizeof(*x->ranks));
}

static int i64_cmp(const void *p, const void *q)
{
	int64_t x = *(const int64_t *)p, y = *(const int64_t *)q;
	return x < y ? -1 : x > y;
}

/* Whether every class's bytes can be sent with no sender above cap. */
static vps_result_t feasible(const struct demand *dm, size_t nd, const int64_t *senders, size_t ns, int64_t cap,
			     int64_t total, bool *ok)
{
	struct graph g;
	int S = (int)(nd + ns), T = S + 1;
	vps_result_t rc = g_init(&g, T + 1);
	int *queue = vps_malloc((size_t)(T + 1) * sizeof(int));
	if (!queue)
		rc = VPS_ENOMEM;
	for (size_t i = 0; !rc && i < nd; i++) {
		rc = g_add(&g, S, (int)i, dm[i].bytes);
		for (size_t k = 0; !rc && k < dm[i].nranks; k++) {
			int64_t *pos = bsearch(&dm[i].ranks[k], senders, ns, sizeof(*senders), i64_cmp);
			rc = g_add(&g, (int)i, (int)(nd + (size_t)(pos - senders)), INT64_MAX / 4);
		}
	}
	for (size_t j = 0; !rc && j < ns; j++)
		rc = g_add(&g, (int)(nd + j), T, cap);
	int64_t flow = 0;
	while (!rc && g_bfs(&g, S, T, queue)) {
		memset(g.it, 0, (size_t)g.n * sizeof(int));
		int64_t f;
		while ((f = g_dfs(&g, S, T, INT64_MAX)) > 0)
			flow += f;
	}
	*ok = flow >= total;
	free(queue);
	g_free(&g);
	return rc;
}

/* The A ranks holding the whole of a piece (its replicas). */
static vps_result_t replicas_of(const struct vps_plan *p, const struct vps_piece *x, struct vps_holders *h,
				int64_t **out, size_t *n, size_t *cap)
{
	h->n = 0;
	*n = 0;
	VPS_CHECK(vps_layout_holders(p->a, x->tensor, x->state, &x->box, h));
	for (size_t i = 0; i < h->n; i++) {
		if (!vps_box_contains(&h->v[i].region.box, &x->box))
			continue;
		for (int64_t k = 0; k < h->v[i].count; k++) {
			VPS_CHECK(vps_grow((void **)out, cap, *n + 1, sizeof(**out)));
			(*out)[(*n)++] = h->v[i].base + k * h->v[i].stride;
		}
	}
	qsort(*out, *n, sizeof(**out), i64_cmp);
	return VPS_OK;
}

static vps_result_t balanced_send_bound(const struct vps_plan *p, int64_t max_send, int64_t *bound)
{
	struct demand *dm = NULL;
	size_t nd = 0, capd = 0, nr = 0, capr = 0;
	int64_t *ranks = NULL, total = 0;
	struct vps_holders h = {0};
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < p->npieces && !rc; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if (x->src == x->dst)
			continue;
		rc = replicas_of(p, x, &h, &ranks, &nr, &capr);
		if (rc)
			break;
		if (!nr) {
			/* grown, never shrunk: capr stays true for replicas_of */
			rc = vps_grow((void **)&ranks, &capr, 1, sizeof(*ranks));
			if (rc)
				break;
			ranks[0] = x->src;
			nr = 1;
		}
		uint64_t key = vps_hash64(ranks, nr * sizeof(*ranks), 7);
		rc = VPS_GROW(dm, capd, nd + 1);
		if (rc)
			break;
		dm[nd].key = key;
		dm[nd].bytes = vps_piece_bytes(x);
		dm[nd].ranks = vps_malloc(nr * sizeof(*ranks));
		if (!dm[nd].ranks) {
			rc = VPS_ENOMEM;
			break;
		}
		memcpy(dm[nd].ranks, ranks, nr * sizeof(*ranks));
		dm[nd].nranks = nr;
		total += dm[nd].bytes;
		nd++;
	}
	/* merge the classes with one replica set */
	size_t m = 0;
	if (!rc) {
		qsort(dm, nd, sizeof(*dm), demand_cmp);
		for (size_t i = 0; i < nd; i++) {
			if (m && !demand_cmp(&dm[m - 1], &dm[i])) {
				dm[m - 1].bytes += dm[i].bytes;
				free(dm[i].ranks);
			} else {
				dm[m++] = dm[i];
			}
		}
	}
	int64_t *senders = NULL;
	size_t ns = 0, caps = 0;
	for (size_t i = 0; !rc && i < m; i++)
		for (size_t k = 0; !rc && k < dm[i].nranks; k++) {
			rc = VPS_GROW(senders, caps, ns + 1);
			if (!rc)
				senders[ns++] = dm[i].ranks[k];
		}
	if (!rc) {
		qsort(senders, ns, sizeof(*senders), i64_cmp);
		size_t u = 0;
		for (size_t i = 0; i < ns; i++)
			if (!u || senders[u - 1] != senders[i])
				senders[u++] = senders[i];
		ns = u;
		int64_t lo = ns ? (total + (int64_t)ns - 1) / (int64_t)ns : 0, hi = max_send;
		/* least cap that lets every class through */
		while (!rc && lo < hi) {
			int64_t mid = lo + (hi - lo) / 2;
			bool ok = false;
			rc = feasible(dm, m, senders, ns, mid, total, &ok);
			if (ok)
				hi = mid;
			else
				lo = mid + 1;
		}
		*bound = lo;
	}
	for (size_t i = 0; i < (rc ? nd : m); i++)
		if (i < m || rc)
			free(dm[i].ranks);
	free(dm);
	free(senders);
	free(ranks);
	vps_holders_release(&h);
	return rc;
}

/* ---- the best time the topology allows ---- */

/* Bytes that can be sent by one replica set to one node. */
struct tclass {
	uint64_t key;
	int32_t node;
	int64_t bytes;
	int64_t *ranks;
	size_t nranks;
};

static int tclass_cmp(const void *p, const void *q)
{
	const struct tclass *x = p, *y = q;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->node != y->node)
		return x->node < y->node ? -1 : 1;
	if (x->nranks != y->nranks)
		return x->nranks < y->nranks ? -1 : 1;
	return memcmp(x->ranks, y->ranks, x->nranks * sizeof(*x->ranks));
}

/* Whether every class can be sent within t seconds: each sender has an
 * NVLink and a NIC capacity of t times its bandwidth, and a class reaches a
 * replica's NVLink when the replica is on the class's node, its NIC when
 * not. */
static vps_result_t time_feasible(const struct vps_plan *p, const struct vps_topology *topo, const struct tclass *tc,
				  size_t nc, const int64_t *senders, size_t ns, int64_t total, double t, bool *ok)
{
	struct graph g;
	int S = (int)(nc + 2 * ns), T = S + 1;
	vps_result_t rc = g_init(&g, T + 1);
	int *queue = vps_malloc((size_t)(T + 1) * sizeof(int));
	if (!queue)
		rc = VPS_ENOMEM;
	for (size_t i = 0; !rc && i < nc; i++) {
		rc = g_add(&g, S, (int)i, tc[i].bytes);
		for (size_t k = 0; !rc && k < tc[i].nranks; k++) {
			int64_t *pos = bsearch(&tc[i].ranks[k], senders, ns, sizeof(*senders), i64_cmp);
			size_t j = (size_t)(pos - senders);
			bool intra = vps_world_device(p->world, tc[i].ranks[k]).node == tc[i].node;
			rc = g_add(&g, (int)i, (int)(nc + 2 * j + !intra), INT64_MAX / 4);
		}
	}
	double cap_intra = fmin(t * topo->intra_node_bandwidth, (double)(INT64_MAX / 4));
	double cap_inter = fmin(t * topo->inter_node_bandwidth, (double)(INT64_MAX / 4));
	for (size_t j = 0; !rc && j < ns; j++) {
		rc = g_add(&g, (int)(nc + 2 * j), T, (int64_t)cap_intra);
		if (!rc)
			rc = g_add(&g, (int)(nc + 2 * j + 1), T, (int64_t)cap_inter);
	}
	int64_t flow = 0;
	while (!rc && g_bfs(&g, S, T, queue)) {
		memset(g.it, 0, (size_t)g.n * sizeof(int));
		int64_t f;
		while ((f = g_dfs(&g, S, T, INT64_MAX)) > 0)
			flow += f;
	}
	*ok = flow >= total;
	free(queue);
	g_free(&g);
	return rc;
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
	struct tclass *tc = NULL;
	size_t nc = 0, capc = 0, nr = 0, capr = 0;
	int64_t *ranks = NULL, total = 0;
	double *loc = vps_calloc((size_t)W, sizeof(*loc)), *rem = vps_calloc((size_t)W, sizeof(*rem));
	double *any = vps_calloc((size_t)W, sizeof(*any)), *keep = vps_calloc((size_t)W, sizeof(*keep));
	struct vps_holders h = {0};
	vps_result_t rc = loc && rem && any && keep ? VPS_OK : VPS_ENOMEM;
	double bi = topo->intra_node_bandwidth, be = topo->inter_node_bandwidth, best = 0;
	for (size_t i = 0; i < p->npieces && !rc; i++) {
		const struct vps_piece *x = &p->pieces[i];
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
		tc[nc] = (struct tclass){vps_hash64(ranks, nr * sizeof(*ranks), 7), node, bytes, NULL, nr};
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
	size_t m = 0;
	if (!rc) {
		qsort(tc, nc, sizeof(*tc), tclass_cmp);
		for (size_t i = 0; i < nc; i++) {
			if (m && !tclass_cmp(&tc[m - 1], &tc[i])) {
				tc[m - 1].bytes += tc[i].bytes;
				free(tc[i].ranks);
			} else {
				tc[m++] = tc[i];
			}
		}
		nc = m;
	}
	int64_t *senders = NULL;
	size_t ns = 0, caps = 0;
	for (size_t i = 0; !rc && i < nc; i++)
		for (size_t k = 0; !rc && k < tc[i].nranks; k++) {
			rc = VPS_GROW(senders, caps, ns + 1);
			if (!rc)
				senders[ns++] = tc[i].ranks[k];
		}
	if (!rc && total > 0) {
		qsort(senders, ns, sizeof(*senders), i64_cmp);
		size_t u = 0;
		for (size_t i = 0; i < ns; i++)
			if (!u || senders[u - 1] != senders[i])
				senders[u++] = senders[i];
		ns = u;
		/* every class from its first replica over the slower link is
		 * feasible; below the all-senders-at-full-rate time is not */
		double lo = (double)total / ((double)ns * (bi + be)), hi = 2.0 * (double)total / fmin(bi, be);
		while (!rc && hi - lo > 1e-6 * hi) {
			double mid = 0.5 * (lo + hi);
			bool ok = false;
			rc = time_feasible(p, topo, tc, nc, senders, ns, total, mid, &ok);
			if (ok)
				hi = mid;
			else
				lo = mid;
		}
		/* lo is infeasible: the least feasible time lies above it */
		best = fmax(best, lo);
	}
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

vps_result_t vps_plan_stats(const struct vps_plan *p, const struct vps_topology *topo, bool load,
			    struct vps_plan_stats *s)
{
	vps_result_t rc = VPS_OK;
	int64_t W = vps_world_size(p->world);
	memset(s, 0, sizeof(*s));
	if (p->scope >= 0)
		return vps_fail(VPS_EINPUT, "statistics need a global plan (this one is rank %" PRId64 "'s)", p->scope);
	s->world = W;
	int64_t *send = vps_calloc((size_t)W, sizeof(*send)), *recv = vps_calloc((size_t)W, sizeof(*recv));
	int64_t *isend = vps_calloc((size_t)W, sizeof(*isend)), *irecv = vps_calloc((size_t)W, sizeof(*irecv));
	int64_t *keep = vps_calloc((size_t)W, sizeof(*keep)), *peers = vps_calloc((size_t)W, sizeof(*peers));
	struct pair *pairs = vps_malloc((2 * p->npieces + 1) * sizeof(*pairs));
	if (!send || !recv || !isend || !irecv || !keep || !peers || !pairs) {
		rc = VPS_ENOMEM;
		goto done;
	}
	size_t np = 0;
	for (int64_t w = 0; w < W; w++) {
		s->joining += vps_world_a_rank(p->world, w) < 0;
		s->leaving += vps_world_b_rank(p->world, w) < 0;
	}
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		int64_t bytes = vps_piece_bytes(x);
		s->pieces++;
		if (x->src == x->dst) {
			s->retains++;
			s->bytes_retained += bytes;
			keep[x->dst] += bytes;
			continue;
		}
		s->bytes_moved += bytes;
		send[x->src] += bytes;
		recv[x->dst] += bytes;
		bool intra = vps_world_device(p->world, x->src).node == vps_world_device(p->world, x->dst).node;
		if (intra) {
			s->bytes_intra_node += bytes;
		} else {
			s->bytes_inter_node += bytes;
			isend[x->src] += bytes;
			irecv[x->dst] += bytes;
		}
		pairs[np++] = (struct pair){x->src, x->dst};
		pairs[np++] = (struct pair){x->dst, x->src};
	}
	qsort(pairs, np, sizeof(*pairs), pair_cmp);
	for (size_t i = 0; i < np; i++)
		if (!i || pair_cmp(&pairs[i - 1], &pairs[i]))
			peers[pairs[i].a]++;
	for (int64_t w = 0; w < W; w++) {
		s->max_send_bytes = vps_max64(s->max_send_bytes, send[w]);
		s->max_recv_bytes = vps_max64(s->max_recv_bytes, recv[w]);
		s->peers_max = vps_max64(s->peers_max, peers[w]);
		int64_t lb;
		VPS_CHECK_GOTO(lower_bound_of(p, w, &lb), rc, done);
		s->bytes_lower_bound += lb;
	}
	VPS_CHECK_GOTO(balanced_send_bound(p, s->max_send_bytes, &s->balanced_send_bound), rc, done);
	s->balanced_bound = vps_max64(s->balanced_send_bound, s->max_recv_bytes);
	if (topo) {
		/* Per device: NVLink and the NICs run at once, each direction at
		 * full rate; local copies read and write memory. The busiest device
		 * sets the time; each peer costs a message latency. */
		double t = 0;
		for (int64_t w = 0; w < W; w++) {
			double intra = (double)vps_max64(send[w] - isend[w], recv[w] - irecv[w]) / topo->intra_node_bandwidth;
			double inter = (double)vps_max64(isend[w], irecv[w]) / topo->inter_node_bandwidth;
			double copy = 2.0 * (double)keep[w] / topo->memory_bandwidth;
			double dev = fmax(fmax(intra, inter), copy) + topo->latency * (double)peers[w];
			t = fmax(t, dev);
		}
		s->have_estimate = true;
		s->estimate_seconds = t;
		VPS_CHECK_GOTO(time_bound(p, topo, &s->time_bound_seconds), rc, done);
	}
	if (load) {
		s->send = send;
		s->recv = recv;
		send = recv = NULL;
	}
done:
	free(send);
	free(recv);
	free(isend);
	free(irecv);
	free(keep);
	free(peers);
	free(pairs);
	return rc;
}

void vps_plan_stats_release(struct vps_plan_stats *s)
{
	free(s->send);
	free(s->recv);
	s->send = s->recv = NULL;
}

/* ---- topologies ---- */

vps_result_t vps_topology_load(struct vps_topology *t, const char *arg, const char *search_path)
{
	char path[4096];
	memset(t, 0, sizeof(*t));
	VPS_CHECK(vps_config_find(arg, search_path, "--topology", "topology", path, sizeof(path)));
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
