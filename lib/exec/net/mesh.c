/* The mesh: a data connection between every two ranks that exchange data,
 * and a control connection between each rank and its parent in the control
 * tree, each proven to belong to the job. The lower rank connects, the
 * higher accepts, all at once, within one timeout. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

struct mesh {
	struct vps_net *n;
	int64_t parent;  /* in the control tree; -1: none */
	int *tree_fds;   /* [0]: the parent's, when there is one */
};

/* a lower rank that exchanges data with this one, or this rank's parent */
static int admit_peer(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from)
{
	struct mesh *m = ctx;
	struct vps_net *n = m->n;
	if (h->kind == HELLO_TREE && (int64_t)h->from == m->parent && m->tree_fds[0] < 0) {
		m->tree_fds[0] = fd;
		return 1;
	}
	int k = vps_net_peer_index(n, (int64_t)h->from);
	if (h->kind != HELLO_MESH || k < 0 || (int64_t)h->from >= n->rank || n->fds[k] >= 0) {
		vps_fail(VPS_EPEER, "rank %" PRIu64 " (%s) connected, but this rank expects no %s connection from it", h->from,
			 inet_ntoa(from->sin_addr), h->kind == HELLO_TREE ? "control" : "data");
		return -1;
	}
	n->fds[k] = fd;
	return 1;
}

/* Whom the mesh waits for: the ranks that connect to this one and have
 * not (its parent in the tree, lower data peers), and those it connects
 * to, at their addresses. One look at this rank's own peers. */
static void mesh_awaited(void *ctx, const struct handshake *hs, char *out, size_t size)
{
	const struct mesh *m = ctx;
	const struct vps_net *n = m->n;
	char list[384];
	struct net_names l;
	vps_net_names_init(&l, list, sizeof(list));
	bool parent = m->parent >= 0 && m->tree_fds[0] < 0;
	if (parent)
		vps_net_names_add(&l, "rank %" PRId64 " (to connect here)", m->parent);
	for (size_t i = 0; i < n->npeers && n->peers[i] < n->rank; i++)
		if (n->fds[i] < 0 && !(parent && n->peers[i] == m->parent))
			vps_net_names_add(&l, "rank %" PRId64 " (to connect here)", n->peers[i]);
	/* a rank this one connects to for data and in the tree is named once */
	for (size_t i = 0; i < hs->nout; i++) {
		const struct outbound *x = &hs->out[i];
		if (x->state != OUT_DONE && !(i && hs->out[i - 1].rank == x->rank && hs->out[i - 1].state != OUT_DONE))
			vps_net_names_add(&l, "rank %" PRId64 " at %s:%d (%s)", x->rank, inet_ntoa(x->sa.sin_addr),
					  ntohs(x->sa.sin_port), vps_net_out_state(x));
	}
	vps_net_names_end(&l);
	snprintf(out, size, "connecting the ranks: waiting for %s", list);
}

/* The ranks not connected by the deadline. */
static vps_result_t mesh_timeout(const struct mesh *m, const struct vps_net_opts *o, const struct handshake *hs)
{
	const struct vps_net *n = m->n;
	char missing[160] = "", note[256];
	size_t len = 0;
	if (m->parent >= 0 && m->tree_fds[0] < 0)
		len += (size_t)snprintf(missing, sizeof(missing), "%" PRId64, m->parent);
	for (size_t i = 0; i < n->npeers && len + 24 < sizeof(missing); i++)
		if (n->peers[i] < o->rank && n->fds[i] < 0)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "", n->peers[i]);
	for (size_t i = 0; i < hs->nout && len + 24 < sizeof(missing); i++)
		if (hs->out[i].state != OUT_DONE)
			len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "",
						hs->out[i].rank);
	vps_net_dropped_note(hs, note, sizeof(note));
	return vps_fail(VPS_ETIMEOUT, "connecting the ranks: no connection with rank %s within %g s%s", missing,
			o->timeout, note);
}

vps_result_t vps_net_mesh(struct vps_net *n, const struct vps_net_opts *o, const unsigned char *key, int dfd,
			  const struct mesh_target *t, size_t nt, int *tree_fds)
{
	struct outbound *outs = vps_calloc(2 * nt + 1, sizeof(*outs));
	if (!outs)
		return VPS_ENOMEM;
	size_t nout = 0, lower = 0;
	vps_net_account(n, (int64_t)((2 * nt + 1) * sizeof(*outs)));
	for (size_t i = 0; i < n->npeers; i++)
		lower += n->peers[i] < o->rank;
	for (size_t i = 0; i < nt; i++)
		for (int kind = HELLO_MESH; kind <= HELLO_TREE; kind++) {
			if ((kind == HELLO_MESH && !t[i].data) || (kind == HELLO_TREE && !t[i].tree))
				continue;
			struct outbound *x = &outs[nout++];
			x->sa.sin_family = AF_INET;
			x->sa.sin_addr.s_addr = t[i].addr.ip;
			x->sa.sin_port = htons(t[i].addr.port);
			x->rank = t[i].rank;
			x->kind = (uint64_t)kind;
			x->fd = -1;
		}
	int64_t tree[1 + CTL_FANOUT];
	size_t ntree = vps_net_ctl_neighbours(o->rank, o->world, tree);
	struct mesh m = {n, o->rank > 0 ? tree[0] : -1, tree_fds};
	struct handshake hs = {0};
	struct net_wait wait;
	vps_net_wait_begin(n, &wait);
	hs.n = n;
	hs.wait = &wait;
	hs.awaited = mesh_awaited;
	hs.key = key;
	hs.me = o->rank;
	hs.world = o->world;
	hs.plan_hash = o->plan_hash;
	hs.kinds = 1u << HELLO_MESH | 1u << HELLO_TREE;
	hs.lfd = dfd;
	hs.want_in = lower + (m.parent >= 0);
	hs.admit = admit_peer;
	hs.ctx = &m;
	hs.out = outs;
	hs.nout = nout;
	hs.deadline = vps_net_now() + o->timeout;
	vps_result_t rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT)
		rc = mesh_timeout(&m, o, &hs);
	for (size_t i = 0; i < nout; i++) {
		const struct outbound *x = &outs[i];
		if (rc) {
			if (x->fd >= 0)
				close(x->fd);
			continue;
		}
		if (x->kind == HELLO_MESH) {
			n->fds[vps_net_peer_index(n, x->rank)] = x->fd;
			continue;
		}
		for (size_t j = o->rank > 0; j < ntree; j++)
			if (tree[j] == x->rank)
				tree_fds[j] = x->fd;
	}
	vps_net_account(n, -(int64_t)((2 * nt + 1) * sizeof(*outs)));
	free(outs);
	return rc;
}
