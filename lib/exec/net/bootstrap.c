/* The bootstrap (vps_net_start): every rank proves itself to rank 0 and
 * names the ranks it will connect to; once all came, rank 0 answers each
 * with their addresses (or why the job cannot start) and closes: the star
 * carries one message each way per rank and is gone before the first
 * switch. Then the mesh (mesh.c) and the control tree (control.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/internal.h"
#include "exec/net/net_int.h"

/* What rank 0 tells each rank once all came: status 0 and count
 * addresses, or status 1 and len bytes of why. */
struct answer {
	uint64_t status, count;
};

/* A rank's start, while it runs. */
struct boot {
	const struct vps_net_opts *o;
	struct vps_net *n;
	unsigned char key[VPS_AUTH_KEY];
	struct sockaddr_in master;
	double deadline;         /* of the bootstrap */
	struct net_wait wait;    /* what it says while it waits */
	int backlog;
	int dfd, dport;          /* this rank's data listener */
	struct in_addr here;     /* its address */
	int lfd;                 /* rank 0: the bootstrap listener */
	struct mesh_target *t;   /* the ranks this rank connects to, rising */
	size_t nt;
};

/* Rank 0's table while it bootstraps: the one thing it holds per rank. */
struct entry {
	struct peer_addr addr;
	int fd; /* the rank's bootstrap connection, until answered */
};

/* rank 0's bootstrap: every other rank's hello */
struct gather {
	struct vps_net *n;
	struct entry *table;
	uint64_t plan_hash;
	size_t open;
	char bad[512];
	const struct sockaddr_in *at; /* where rank 0 listens */
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
	struct entry *e = &g->table[h->from];
	if (e->fd >= 0) {
		vps_fail(VPS_EPEER, "bootstrap: two executors say they are rank %" PRIu64 " (%s and %s)", h->from,
			 inet_ntoa(from->sin_addr), "an earlier one");
		return -1;
	}
	/* where it listens, as it says: its --bind address need not be the one
	 * its connection to rank 0 comes from */
	e->fd = fd;
	e->addr.ip = (uint32_t)(h->listen >> 16);
	e->addr.port = (uint16_t)h->listen;
	if (!e->addr.ip)
		e->addr.ip = from->sin_addr.s_addr;
	if (++g->open > n->bootstrap_sockets)
		n->bootstrap_sockets = g->open;
	if ((int64_t)h->world != n->world && !g->bad[0])
		snprintf(g->bad, sizeof(g->bad), "rank %" PRIu64 " runs a world of %" PRIu64 ", rank 0 one of %" PRId64,
			 h->from, h->world, n->world);
	else if (h->plan_hash != g->plan_hash && !g->bad[0])
		snprintf(g->bad, sizeof(g->bad),
			 "rank %" PRIu64 " holds another staged plan (hash 0x%016" PRIx64 ", rank 0 has 0x%016" PRIx64 ")",
			 h->from, h->plan_hash, g->plan_hash);
	return 1;
}

static void missing_ranks(const struct vps_net *n, const struct entry *table, char *out, size_t size)
{
	size_t len = 0;
	out[0] = '\0';
	for (int64_t r = 1; r < n->world && len + 24 < size; r++)
		if (table[r].fd < 0)
			len += (size_t)snprintf(out + len, size - len, "%s%" PRId64, len ? ", " : "", r);
}

/* Rank 0 answers rank r: its request (the ranks above it it connects to,
 * rising, at most W - r - 1), read from what it sent after its hello, and
 * their addresses, or why the job cannot start (g->bad). The request is
 * read either way, so that closing the connection loses nothing of the
 * answer. Memory: one rank's request at a time. */
static vps_result_t answer_rank(struct gather *g, int64_t r, double timeout)
{
	int fd = g->table[r].fd;
	int64_t world = g->n->world;
	uint64_t k;
	VPS_CHECK(vps_net_recv_all(fd, &k, sizeof(k), timeout, "bootstrap: a rank's peers"));
	if (k > (uint64_t)(world - r - 1))
		return vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for %" PRIu64 " peers above it in a world of %" PRId64,
				r, k, world);
	size_t bytes = (size_t)k * (sizeof(int64_t) + sizeof(struct peer_addr));
	int64_t *want = vps_malloc((size_t)k * sizeof(*want) + 1);
	struct peer_addr *ans = vps_malloc((size_t)k * sizeof(*ans) + 1);
	vps_result_t rc = want && ans ? VPS_OK : VPS_ENOMEM;
	vps_net_account(g->n, (int64_t)bytes);
	if (!rc)
		rc = vps_net_recv_all(fd, want, (size_t)k * sizeof(*want), timeout, "bootstrap: a rank's peers");
	for (uint64_t i = 0; !rc && !g->bad[0] && i < k; i++) {
		if (want[i] <= r || want[i] >= world || (i && want[i] <= want[i - 1]))
			rc = vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for the address of rank %" PRId64, r, want[i]);
		else
			ans[i] = g->table[want[i]].addr;
	}
	struct answer a = {g->bad[0] ? 1 : 0, g->bad[0] ? strlen(g->bad) : k};
	if (!rc)
		rc = vps_net_send_all(fd, &a, sizeof(a), timeout, "bootstrap: answer");
	if (!rc)
		rc = a.status ? vps_net_send_all(fd, g->bad, a.count, timeout, "bootstrap: answer")
			      : vps_net_send_all(fd, ans, (size_t)k * sizeof(*ans), timeout, "bootstrap: answer");
	vps_net_account(g->n, -(int64_t)bytes);
	free(want);
	free(ans);
	return rc;
}

/* Whom rank 0's bootstrap waits for: the first ranks by number that have
 * not come (the table's one scan stops there), and how many. */
static void rank0_awaited(void *ctx, const struct handshake *hs, char *out, size_t size)
{
	const struct gather *g = ctx;
	char list[256];
	struct net_names l;
	(void)hs;
	vps_net_names_init(&l, list, sizeof(list));
	for (int64_t r = 1; r < g->n->world && l.named < NAMES_MAX; r++)
		if (g->table[r].fd < 0)
			vps_net_names_add(&l, "rank %" PRId64, r);
	l.more = g->n->world - 1 - (int64_t)g->open - (int64_t)l.named;
	vps_net_names_end(&l);
	snprintf(out, size, "bootstrap: waiting for %s to join at %s:%d", list, inet_ntoa(g->at->sin_addr),
		 ntohs(g->at->sin_port));
}

/* Any other rank's: rank 0, where it should be. */
static void joiner_awaited(void *ctx, const struct handshake *hs, char *out, size_t size)
{
	const struct outbound *o = &hs->out[0];
	(void)ctx;
	snprintf(out, size, "bootstrap: waiting for rank 0 at %s:%d: %s", inet_ntoa(o->sa.sin_addr), ntohs(o->sa.sin_port),
		 vps_net_out_state(o));
}

static void boot_handshake(struct boot *b, struct handshake *hs)
{
	memset(hs, 0, sizeof(*hs));
	hs->n = b->n;
	hs->wait = &b->wait;
	hs->key = b->key;
	hs->me = b->o->rank;
	hs->world = b->o->world;
	hs->plan_hash = b->o->plan_hash;
	hs->lfd = -1;
	hs->kinds = 1u << HELLO_CTL;
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
	b->here = here.sin_addr;
	return vps_net_listen(&here, b->backlog, &b->dfd, &b->dport);
}

/* Rank 0: every other rank's proven hello by the deadline, then each
 * rank's answer, and each connection closed as soon as it is answered. */
static vps_result_t bootstrap_rank0(struct boot *b)
{
	const struct vps_net_opts *o = b->o;
	struct vps_net *n = b->n;
	int mport = 0;
	size_t bytes = (size_t)o->world * sizeof(struct entry);
	struct entry *table = vps_malloc(bytes);
	if (!table)
		return VPS_ENOMEM;
	vps_net_account(n, (int64_t)bytes);
	for (int64_t r = 0; r < o->world; r++)
		table[r] = (struct entry){{0, 0, 0}, -1};
	struct gather g = {n, table, o->plan_hash, 0, "", &b->master};
	vps_result_t rc = vps_net_listen(&b->master, b->backlog, &b->lfd, &mport);
	if (rc)
		goto done;
	table[0].addr.ip = b->here.s_addr;
	table[0].addr.port = (uint16_t)b->dport;
	struct handshake hs;
	boot_handshake(b, &hs);
	hs.lfd = b->lfd;
	hs.want_in = (size_t)(o->world - 1);
	hs.admit = admit_rank;
	hs.ctx = &g;
	hs.awaited = rank0_awaited;
	rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT) {
		char missing[160], note[256];
		missing_ranks(n, table, missing, sizeof(missing));
		vps_net_dropped_note(&hs, note, sizeof(note));
		rc = vps_fail(VPS_ETIMEOUT, "bootstrap: rank %s did not come within %g s%s", missing, o->timeout, note);
	}
	/* no one connects to rank 0 any more: a late connection is refused, not
	 * left waiting */
	close(b->lfd);
	b->lfd = -1;
	/* refused or not, every rank hears it: a refusal is sent to all before
	 * rank 0 says it */
	for (int64_t r = 1; r < o->world && !rc; r++) {
		vps_result_t e = answer_rank(&g, r, o->timeout);
		close(table[r].fd);
		table[r].fd = -1;
		if (!g.bad[0])
			rc = e;
	}
	if (!rc && g.bad[0])
		rc = vps_fail(VPS_EPEER, "bootstrap: %s", g.bad);
	for (size_t i = 0; i < b->nt && !rc; i++)
		b->t[i].addr = table[b->t[i].rank].addr;
done:
	for (int64_t r = 1; r < o->world; r++)
		if (table[r].fd >= 0)
			close(table[r].fd);
	vps_net_account(n, -(int64_t)bytes);
	free(table);
	return rc;
}

/* Rank 0 answers once every rank came, by its deadline: until then this
 * rank says, when its notice is due, that it waits for rank 0. Returns
 * the time left to wait for the answer. */
static double await_answer(struct boot *b, int fd)
{
	double end = b->deadline + b->o->timeout;
	for (;;) {
		double t = vps_net_now();
		if (t >= end)
			return 0.001;
		if (vps_net_wait_due(b->n, &b->wait, t)) {
			char waited[64];
			vps_net_waited(b->n, &b->wait, t, waited, sizeof(waited));
			vps_net_say(b->n, "bootstrap: waiting for rank 0 at %s:%d to hear from every rank %s",
				    b->o->master_host, b->o->master_port, waited);
		}
		double wake = b->wait.next && b->wait.next < end ? b->wait.next : end;
		struct pollfd p = {fd, POLLIN, 0};
		int r = poll(&p, 1, (int)((wake - t) * 1000) + 1);
		/* bytes, a close or an error: the read says which */
		if (r > 0 || (r < 0 && errno != EINTR))
			return end - vps_net_now() > 0.001 ? end - vps_net_now() : 0.001;
	}
}

/* Any other rank: proven to rank 0, the ranks it connects to named, and
 * their addresses (or why not) once every rank came. */
static vps_result_t bootstrap_joiner(struct boot *b)
{
	const struct vps_net_opts *o = b->o;
	struct outbound out = {.sa = b->master, .rank = 0, .kind = HELLO_CTL};
	struct handshake hs;
	boot_handshake(b, &hs);
	hs.listen = (uint64_t)b->here.s_addr << 16 | (uint64_t)b->dport;
	hs.out = &out;
	hs.nout = 1;
	hs.awaited = joiner_awaited;
	vps_result_t rc = vps_net_handshake(&hs);
	if (rc == VPS_ETIMEOUT)
		rc = vps_fail(VPS_ETIMEOUT, "bootstrap: %s %s:%d within %g s",
			      out.turned_away ? "rank 0 turned this rank away (another job token?) at"
					      : "nobody proved to be rank 0 at",
			      o->master_host, o->master_port, o->timeout);
	if (rc) {
		if (out.fd >= 0)
			close(out.fd);
		return rc;
	}
	b->n->bootstrap_sockets = 1;
	int fd = out.fd;
	uint64_t k = b->nt;
	int64_t *want = vps_malloc(b->nt * sizeof(*want) + 1);
	struct peer_addr *addrs = vps_malloc(b->nt * sizeof(*addrs) + 1);
	struct answer a;
	rc = want && addrs ? VPS_OK : VPS_ENOMEM;
	for (size_t i = 0; !rc && i < b->nt; i++)
		want[i] = b->t[i].rank;
	if (!rc)
		rc = vps_net_send_all(fd, &k, sizeof(k), o->timeout, "bootstrap: naming the peers to rank 0");
	if (!rc)
		rc = vps_net_send_all(fd, want, b->nt * sizeof(*want), o->timeout, "bootstrap: naming the peers to rank 0");
	/* rank 0 answers when every rank came: until its deadline */
	if (!rc)
		rc = vps_net_recv_all(fd, &a, sizeof(a), await_answer(b, fd),
				      "bootstrap: waiting for the other ranks through rank 0");
	if (!rc && a.status) {
		char bad[512], text[600];
		size_t len = a.count < sizeof(bad) ? (size_t)a.count : sizeof(bad);
		rc = vps_net_recv_all(fd, bad, len, o->timeout, "bootstrap");
		if (!rc) {
			vps_net_sanitize(text, sizeof(text), bad, len);
			rc = vps_fail(VPS_EPEER, "bootstrap: %s", text);
		}
	} else if (!rc && a.count != k) {
		rc = vps_fail(VPS_EPEER, "bootstrap: rank 0 answered with %" PRIu64 " addresses for %" PRIu64 " peers", a.count,
			      k);
	} else if (!rc) {
		rc = vps_net_recv_all(fd, addrs, b->nt * sizeof(*addrs), o->timeout, "bootstrap: the peers' addresses");
	}
	for (size_t i = 0; !rc && i < b->nt; i++)
		b->t[i].addr = addrs[i];
	close(fd);
	free(want);
	free(addrs);
	return rc;
}

/* The ranks above this one that it connects to: its data peers and its
 * children in the control tree, rising, each once. */
static vps_result_t targets(struct boot *b)
{
	struct vps_net *n = b->n;
	int64_t tree[1 + CTL_FANOUT];
	size_t nt = vps_net_ctl_neighbours(n->rank, n->world, tree), first = n->rank > 0;
	b->t = vps_calloc(n->npeers + nt + 1, sizeof(*b->t));
	if (!b->t)
		return VPS_ENOMEM;
	size_t i = 0, j = first;
	while (i < n->npeers && n->peers[i] <= n->rank)
		i++;
	while (i < n->npeers || j < nt) {
		int64_t p = i < n->npeers ? n->peers[i] : INT64_MAX, c = j < nt ? tree[j] : INT64_MAX;
		struct mesh_target *t = &b->t[b->nt++];
		t->rank = p < c ? p : c;
		t->data = p == t->rank;
		t->tree = c == t->rank;
		i += t->data;
		j += t->tree;
	}
	vps_net_account(n, (int64_t)((b->nt + 1) * sizeof(*b->t)));
	return VPS_OK;
}

vps_result_t vps_net_start(struct vps_net **out, const struct vps_net_opts *o)
{
	if (o->world > 1 && (!o->token || !*o->token))
		return vps_fail(VPS_EINPUT, "no job token: set VPS_TOKEN or pass --token-file (vps-exec(1) SECURITY)");
	struct boot b = {.o = o, .dfd = -1, .lfd = -1};
	VPS_CHECK(vps_net_new(&b.n, o));
	vps_auth_key(o->token ? o->token : "", b.key);
	b.deadline = vps_net_now() + o->timeout;
	vps_net_wait_begin(b.n, &b.wait);
	int tree_fds[1 + CTL_FANOUT];
	int64_t tree[1 + CTL_FANOUT];
	size_t ntree = vps_net_ctl_neighbours(o->rank, o->world, tree);
	for (size_t i = 0; i < ntree; i++)
		tree_fds[i] = -1;
	vps_result_t rc = targets(&b);
	if (!rc && o->world > 1)
		rc = listen_for_peers(&b);
	if (!rc && o->world > 1)
		rc = o->rank == 0 ? bootstrap_rank0(&b) : bootstrap_joiner(&b);
	if (!rc && o->world > 1)
		rc = vps_net_mesh(b.n, o, b.key, b.dfd, b.t, b.nt, tree_fds);
	if (b.dfd >= 0)
		close(b.dfd);
	if (b.lfd >= 0)
		close(b.lfd);
	vps_net_account(b.n, -(int64_t)((b.nt + 1) * sizeof(*b.t)));
	free(b.t);
	memset(b.key, 0, sizeof(b.key));
	if (!rc && o->world > 1) {
		if (!o->loop && !(rc = vps_net_loop_new(&b.n->own_loop)))
			rc = vps_ctl_new(b.n, b.n->own_loop, tree_fds, ntree);
		else if (o->loop)
			rc = vps_ctl_new(b.n, o->loop, tree_fds, ntree);
		else
			for (size_t i = 0; i < ntree; i++)
				close(tree_fds[i]);
	} else {
		for (size_t i = 0; i < ntree; i++)
			if (tree_fds[i] >= 0)
				close(tree_fds[i]);
	}
	if (rc) {
		vps_net_free(b.n);
		return rc;
	}
	*out = b.n;
	return VPS_OK;
}
