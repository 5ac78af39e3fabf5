/* The bootstrap (vps_net_start): every rank proves itself to rank 0, rank
 * 0 checks that all hold the same world and plan, and each rank learns
 * where the peers it connects to listen; then the mesh (mesh.c). */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/internal.h"
#include "exec/net/net_int.h"

/* A rank's start, while it runs. */
struct boot {
	const struct vps_net_opts *o;
	struct vps_net *n;
	unsigned char key[VPS_AUTH_KEY];
	struct sockaddr_in master;
	double deadline;         /* of the bootstrap */
	int backlog;
	int dfd, dport;          /* this rank's data listener */
	int lfd;                 /* rank 0: the bootstrap listener */
	struct peer_addr *addrs; /* by peer index: where the higher peers listen */
};

/* rank 0's bootstrap: every other rank's hello */
struct gather {
	struct vps_net *n;
	struct peer_addr *table;
	uint64_t plan_hash;
	char bad[512];
};

static int admit_rank(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from)
{
	struct gather *g = ctx;
	struct vps_net *n = g->n;
	if ((int64_t)h->from <= 0 || (int64_t)h->from >= n->world) {
		vps_fail(VPS_EPEER, "bootstrap: an executor of this job at %s says it is rank %" PRIu64 " of a world of %" PRId64,
			 inet_ntoa(from->sin_addr), h->from, n->world);
		return -1;
	}
	if (n->ctl[h->from] >= 0) {
		vps_fail(VPS_EPEER, "bootstrap: two executors say they are rank %" PRIu64 " (%s and %s)", h->from,
			 inet_ntoa(from->sin_addr), "an earlier one");
		return -1;
	}
	n->ctl[h->from] = fd;
	g->table[h->from].ip = from->sin_addr.s_addr;
	g->table[h->from].port = (uint16_t)h->port;
	if ((int64_t)h->world != n->world && !g->bad[0])
		snprintf(g->bad, sizeof(g->bad), "rank %" PRIu64 " runs a world of %" PRIu64 ", rank 0 one of %" PRId64,
			 h->from, h->world, n->world);
	else if (h->plan_hash != g->plan_hash && !g->bad[0])
		snprintf(g->bad, sizeof(g->bad),
			 "rank %" PRIu64 " holds another staged plan (hash 0x%016" PRIx64 ", rank 0 has 0x%016" PRIx64 ")",
			 h->from, h->plan_hash, g->plan_hash);
	return 1;
}

static void missing_ranks(const struct vps_net *n, char *out, size_t size)
{
	size_t len = 0;
	out[0] = '\0';
	for (int64_t r = 1; r < n->world && len + 24 < size; r++)
		if (n->ctl[r] < 0)
			len += (size_t)snprintf(out + len, size - len, "%s%" PRId64, len ? ", " : "", r);
}

/* Rank 0: rank r names the higher peers it connects to (at most W - r - 1,
 * each above r), and gets their addresses. */
static vps_result_t serve_addresses(int fd, int64_t r, int64_t world, const struct peer_addr *table, double timeout)
{
	uint64_t k;
	VPS_CHECK(vps_net_recv_all(fd, &k, sizeof(k), timeout, "bootstrap: a rank's peers"));
	if (k > (uint64_t)(world - r - 1))
		return vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for %" PRIu64 " peers above it in a world of %" PRId64,
				r, k, world);
	int64_t *want = vps_malloc((size_t)k * sizeof(*want) + 1);
	struct peer_addr *ans = vps_malloc((size_t)k * sizeof(*ans) + 1);
	vps_result_t rc = want && ans ? VPS_OK : VPS_ENOMEM;
	if (!rc)
		rc = vps_net_recv_all(fd, want, (size_t)k * sizeof(*want), timeout, "bootstrap: a rank's peers");
	for (uint64_t i = 0; !rc && i < k; i++) {
		if (want[i] <= r || want[i] >= world)
			rc = vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for the address of rank %" PRId64, r, want[i]);
		else
			ans[i] = table[want[i]];
	}
	if (!rc)
		rc = vps_net_send_all(fd, ans, (size_t)k * sizeof(*ans), timeout, "bootstrap: answer");
	free(want);
	free(ans);
	return rc;
}

/* The other ranks: the addresses of this rank's higher peers (the lower
 * ones connect to it), into addrs by peer index. */
static vps_result_t ask_addresses(struct vps_net *n, struct peer_addr *addrs, double timeout)
{
	size_t first = 0;
	while (first < n->npeers && n->peers[first] <= n->rank)
		first++;
	uint64_t k = n->npeers - first;
	VPS_CHECK(vps_net_send_all(n->ctl[0], &k, sizeof(k), timeout, "bootstrap: asking for the peers' addresses"));
	VPS_CHECK(vps_net_send_all(n->ctl[0], n->peers + first, (size_t)k * sizeof(*n->peers), timeout,
			   "bootstrap: asking for the peers' addresses"));
	return vps_net_recv_all(n->ctl[0], addrs + first, (size_t)k * sizeof(*addrs), timeout,
			"bootstrap: the peers' addresses, through rank 0");
}

static void boot_handshake(const struct boot *b, struct handshake *hs)
{
	memset(hs, 0, sizeof(*hs));
	hs->key = b->key;
	hs->me = b->o->rank;
	hs->world = b->o->world;
	hs->plan_hash = b->o->plan_hash;
	hs->lfd = -1;
	hs->kind = HELLO_CTL;
	hs->deadline = b->deadline;
}

/* The data listener, only where the job's peers reach this rank: never on
 * every interface. */
static vps_result_t listen_for_peers(struct boot *b)
{
	const struct vps_net_opts *o = b->o;
	struct sockaddr_in here = {0};
	VPS_CHECK(vps_net_resolve(o->master_host, o->master_port, &b->master));
	here.sin_family = AF_INET;
	if (o->bind && *o->bind) {
		struct sockaddr_in at;
		VPS_CHECK(vps_net_resolve(o->bind, 0, &at));
		here.sin_addr = at.sin_addr;
	} else if (o->rank == 0) {
		here.sin_addr = b->master.sin_addr;
	} else {
		VPS_CHECK(vps_net_route_to(&b->master, &here.sin_addr));
	}
	b->backlog = (int)vps_min64(o->world + 16, 4096);
	return vps_net_listen(&here, b->backlog, &b->dfd, &b->dport);
}

/* Rank 0 tells every rank whether all hold its world and plan. */
static vps_result_t answer_ranks(const struct boot *b, const struct gather *g)
{
	const struct vps_net_opts *o = b->o;
	for (int64_t r = 1; r < o->world; r++) {
		uint64_t status = g->bad[0] ? 1 : 0;
		VPS_CHECK(vps_net_send_all(b->n->ctl[r], &status, sizeof(status), o->timeout, "bootstrap: answer"));
		if (g->bad[0])
			VPS_CHECK(vps_net_send_all(b->n->ctl[r], g->bad, sizeof(g->bad), o->timeout, "bootstrap: answer"));
	}
	if (g->bad[0])
		return vps_fail(VPS_EPEER, "bootstrap: %s", g->bad);
	return VPS_OK;
}

/* Rank 0: every other rank's proven hello by the deadline, the answer, and
 * each rank's peers' addresses; rank 0 gathers every rank's address. */
static vps_result_t bootstrap_rank0(struct boot *b)
{
	const struct vps_net_opts *o = b->o;
	struct vps_net *n = b->n;
	int mport = 0;
	struct peer_addr *table = vps_calloc((size_t)o->world, sizeof(*table));
	if (!table)
		return VPS_ENOMEM;
	struct gather g = {n, table, o->plan_hash, ""};
	vps_result_t rc = vps_net_listen(&b->master, b->backlog, &b->lfd, &mport);
	if (rc)
		goto done;
	table[0].ip = b->master.sin_addr.s_addr;
	table[0].port = (uint16_t)b->dport;
	struct handshake hs;
	boot_handshake(b, &hs);
	hs.lfd = b->lfd;
	hs.want_in = (size_t)(o->world - 1);
	hs.admit = admit_rank;
	hs.ctx = &g;
	rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT) {
		char missing[160], note[256];
		missing_ranks(n, missing, sizeof(missing));
		vps_net_dropped_note(&hs, note, sizeof(note));
		rc = vps_fail(VPS_ETIMEOUT, "bootstrap: rank %s did not come within %.0f s%s", missing, o->timeout, note);
	}
	if (!rc)
		rc = answer_ranks(b, &g);
	/* each rank learns the addresses of the peers it connects to, not
	 * the world's: rank 0 sends O(peers) per rank, not O(W) */
	for (int64_t r = 1; r < o->world && !rc; r++)
		rc = serve_addresses(n->ctl[r], r, o->world, table, o->timeout);
	for (size_t i = 0; i < n->npeers && !rc; i++)
		b->addrs[i] = table[n->peers[i]];
done:
	free(table);
	return rc;
}

/* Any other rank: proven to rank 0, the answer once every rank came, and
 * its higher peers' addresses. */
static vps_result_t bootstrap_joiner(struct boot *b)
{
	const struct vps_net_opts *o = b->o;
	struct vps_net *n = b->n;
	struct outbound out = {.sa = b->master, .rank = 0};
	struct handshake hs;
	boot_handshake(b, &hs);
	hs.port = (uint64_t)b->dport;
	hs.out = &out;
	hs.nout = 1;
	vps_result_t rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT)
		rc = vps_fail(VPS_ETIMEOUT, "bootstrap: %s %s:%d within %.0f s",
			      out.turned_away ? "rank 0 turned this rank away (another job token?) at"
					      : "nobody proved to be rank 0 at",
			      o->master_host, o->master_port, o->timeout);
	if (rc) {
		if (out.fd >= 0)
			close(out.fd);
		return rc;
	}
	n->ctl[0] = out.fd;
	uint64_t status;
	VPS_CHECK(vps_net_recv_all(n->ctl[0], &status, sizeof(status), o->timeout + (b->deadline - vps_net_now()),
				   "bootstrap: waiting for the other ranks through rank 0"));
	if (status) {
		char bad[512];
		VPS_CHECK(vps_net_recv_all(n->ctl[0], bad, sizeof(bad), o->timeout, "bootstrap"));
		bad[sizeof(bad) - 1] = '\0';
		return vps_fail(VPS_EPEER, "bootstrap: %s", bad);
	}
	return ask_addresses(n, b->addrs, o->timeout);
}

vps_result_t vps_net_start(struct vps_net **out, const struct vps_net_opts *o)
{
	if (o->world > 1 && (!o->token || !*o->token))
		return vps_fail(VPS_EINPUT, "no job token: set VPS_TOKEN or pass --token-file (vps-exec(1) SECURITY)");
	struct boot b = {.o = o, .dfd = -1, .lfd = -1};
	VPS_CHECK(vps_net_new(&b.n, o));
	vps_auth_key(o->token ? o->token : "", b.key);
	b.deadline = vps_net_now() + o->timeout;
	b.addrs = vps_calloc(b.n->npeers + 1, sizeof(*b.addrs));
	vps_result_t rc = b.addrs ? VPS_OK : VPS_ENOMEM;
	if (!rc)
		rc = listen_for_peers(&b);
	if (!rc && o->world > 1)
		rc = o->rank == 0 ? bootstrap_rank0(&b) : bootstrap_joiner(&b);
	if (!rc)
		rc = vps_net_mesh(b.n, o, b.key, b.dfd, b.addrs);
	if (b.dfd >= 0)
		close(b.dfd);
	if (b.lfd >= 0)
		close(b.lfd);
	free(b.addrs);
	memset(b.key, 0, sizeof(b.key));
	if (rc) {
		vps_net_free(b.n);
		return rc;
	}
	*out = b.n;
	return VPS_OK;
}
