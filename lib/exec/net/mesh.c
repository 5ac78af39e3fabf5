/* The mesh: a data connection between every two ranks that exchange data,
 * each proven to belong to the job. The lower rank accepts, the higher
 * connects, all at once, within one timeout. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

/* a lower rank that exchanges data with this one */
static int admit_peer(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from)
{
	struct vps_net *n = ctx;
	int k = vps_net_peer_index(n, (int64_t)h->from);
	if (k < 0 || (int64_t)h->from >= n->rank || n->fds[k] >= 0) {
		vps_fail(VPS_EPEER, "rank %" PRIu64 " (%s) connected, but this rank expects no connection from it", h->from,
			 inet_ntoa(from->sin_addr));
		return -1;
	}
	n->fds[k] = fd;
	return 1;
}

/* The ranks of the mesh not connected by the deadline. */
static vps_result_t mesh_timeout(const struct vps_net *n, const struct vps_net_opts *o, const struct handshake *hs)
{
	char missing[160] = "", note[256];
	size_t len = 0;
	for (size_t i = 0; i < n->npeers && len + 24 < sizeof(missing); i++)
		if (n->peers[i] < o->rank && n->fds[i] < 0)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "", n->peers[i]);
	for (size_t i = 0; i < hs->nout && len + 24 < sizeof(missing); i++)
		if (hs->out[i].state != OUT_DONE)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "",
						hs->out[i].rank);
	vps_net_dropped_note(hs, note, sizeof(note));
	return vps_fail(VPS_ETIMEOUT, "connecting the ranks that exchange data: no connection with rank %s within %.0f s%s",
			missing, o->timeout, note);
}

vps_result_t vps_net_mesh(struct vps_net *n, const struct vps_net_opts *o, const unsigned char *key, int dfd,
			  const struct peer_addr *addrs)
{
	struct outbound *outs = vps_calloc(n->npeers + 1, sizeof(*outs));
	if (!outs)
		return VPS_ENOMEM;
	size_t lower = 0, nout = 0;
	for (size_t i = 0; i < n->npeers; i++) {
		int64_t p = n->peers[i];
		if (p < o->rank) {
			lower++;
			continue;
		}
		outs[nout].sa.sin_family = AF_INET;
		outs[nout].sa.sin_addr.s_addr = addrs[i].ip;
		outs[nout].sa.sin_port = htons(addrs[i].port);
		outs[nout].rank = p;
		outs[nout].fd = -1;
		nout++;
	}
	struct handshake hs = {0};
	hs.key = key;
	hs.me = o->rank;
	hs.world = o->world;
	hs.plan_hash = o->plan_hash;
	hs.kind = HELLO_MESH;
	hs.lfd = dfd;
	hs.want_in = lower;
	hs.admit = admit_peer;
	hs.ctx = n;
	hs.out = outs;
	hs.nout = nout;
	hs.deadline = vps_net_now() + o->timeout;
	vps_result_t rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT)
		rc = mesh_timeout(n, o, &hs);
	for (size_t i = 0; i < nout; i++) {
		if (!rc)
			n->fds[vps_net_peer_index(n, outs[i].rank)] = outs[i].fd;
		else if (outs[i].fd >= 0)
			close(outs[i].fd);
	}
	free(outs);
	return rc;
}
