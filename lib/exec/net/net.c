/* The network object: a rank's bootstrap connections (rank 0 holds one to
 * every rank, the others one to rank 0), its data connections to its
 * peers, and what its exchanges moved. */
#include <unistd.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

vps_result_t vps_net_new(struct vps_net **out, const struct vps_net_opts *o)
{
	struct vps_net *n = vps_calloc(1, sizeof(*n));
	if (!n)
		return VPS_ENOMEM;
	n->rank = o->rank;
	n->world = o->world;
	n->timeout = o->timeout;
	n->ctl = vps_malloc((size_t)(o->rank == 0 ? o->world : 1) * sizeof(int));
	n->peers = vps_malloc((o->npeers + 1) * sizeof(*n->peers));
	n->fds = vps_malloc((o->npeers + 1) * sizeof(int));
	if (!n->ctl || !n->peers || !n->fds) {
		vps_net_free(n);
		return VPS_ENOMEM;
	}
	for (int64_t i = 0; i < (o->rank == 0 ? o->world : 1); i++)
		n->ctl[i] = -1;
	if (o->npeers)
		memcpy(n->peers, o->peers, o->npeers * sizeof(*n->peers));
	qsort(n->peers, o->npeers, sizeof(*n->peers), cmp_i64);
	for (size_t i = 0; i < o->npeers; i++)
		if (!i || n->peers[i] != n->peers[n->npeers - 1])
			n->peers[n->npeers++] = n->peers[i];
	for (size_t i = 0; i < n->npeers; i++)
		n->fds[i] = -1;
	*out = n;
	return VPS_OK;
}

void vps_net_free(struct vps_net *n)
{
	if (!n)
		return;
	if (n->ctl)
		for (int64_t i = 0; i < (n->rank == 0 ? n->world : 1); i++)
			if (n->ctl[i] >= 0)
				close(n->ctl[i]);
	for (size_t i = 0; n->fds && i < n->npeers; i++)
		if (n->fds[i] >= 0)
			close(n->fds[i]);
	free(n->ctl);
	free(n->fds);
	free(n->peers);
	free(n);
}

int vps_net_peer_index(const struct vps_net *n, int64_t peer)
{
	const int64_t *p = bsearch(&peer, n->peers, n->npeers, sizeof(*n->peers), cmp_i64);
	return p ? (int)(p - n->peers) : -1;
}

void vps_net_traffic(const struct vps_net *n, uint64_t *sent, uint64_t *received)
{
	*sent = n->sent;
	*received = n->received;
}

double vps_net_set_timeout(struct vps_net *n, double timeout)
{
	double old = n->timeout;
	n->timeout = timeout;
	return old;
}
