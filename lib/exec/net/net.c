/* The network object: a rank's data connections to its peers, its control
 * tree, what its exchanges moved and what it holds. */
#include <sys/socket.h>
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
	n->notice = o->notice;
	n->notice_ctx = o->notice_ctx;
	n->notice_after = o->notice_after;
	n->notice_every = o->notice_every;
	n->peers = vps_malloc((o->npeers + 1) * sizeof(*n->peers));
	n->fds = vps_malloc((o->npeers + 1) * sizeof(int));
	if (!n->peers || !n->fds) {
		vps_net_free(n);
		return VPS_ENOMEM;
	}
	vps_net_account(n, (int64_t)(sizeof(*n) + (o->npeers + 1) * (sizeof(*n->peers) + sizeof(int))));
	if (o->npeers)
		memcpy(n->peers, o->peers, o->npeers * sizeof(*n->peers));
	qsort(n->peers, o->npeers, sizeof(*n->peers), cmp_i64);
	for (size_t i = 0; i < o->npeers; i++)
		if (n->peers[i] != n->rank && (!n->npeers || n->peers[i] != n->peers[n->npeers - 1]))
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
	vps_ctl_free(n);
	vps_net_loop_free(n->own_loop);
	for (size_t i = 0; n->fds && i < n->npeers; i++)
		if (n->fds[i] >= 0)
			close(n->fds[i]);
	free(n->fds);
	free(n->peers);
	free(n);
}

int vps_net_peer_index(const struct vps_net *n, int64_t peer)
{
	const int64_t *p = bsearch(&peer, n->peers, n->npeers, sizeof(*n->peers), cmp_i64);
	return p ? (int)(p - n->peers) : -1;
}

void vps_net_cut(struct vps_net *n)
{
	for (size_t i = 0; n && i < n->npeers; i++)
		if (n->fds[i] >= 0)
			shutdown(n->fds[i], SHUT_RDWR);
}
