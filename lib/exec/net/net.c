#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/internal.h"
#include "exec/net/net.h"

#define HELLO_MAGIC 0x3254454e535056ULL /* "VPSNET2" */

struct peer_addr {
	uint32_t ip; /* network order */
	uint16_t port;
	uint16_t pad;
};

struct vps_net {
	int64_t rank, world;
	double timeout;
	int *ctl;          /* rank 0: one per rank; others: ctl[0] */
	int64_t *peers;    /* sorted */
	int *fds;          /* data socket per peer */
	size_t npeers;
	uint64_t sent, received; /* bytes of exchanges, headers included */
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Socket buffers are left to the kernel's autotuning: a fixed size turns
 * it off, and measured slower on loopback (docs/BENCHMARKS.md). */
static void tune(int fd)
{
	int one = 1;
	/* every wait goes through poll with a deadline: nothing blocks */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Wait for fd to be readable or writable; VPS_ETIMEOUT after timeout. */
static vps_result_t wait_fd(int fd, short ev, double deadline, const char *who)
{
	for (;;) {
		double left = deadline - now();
		if (left <= 0)
			return vps_fail(VPS_ETIMEOUT, "%s: no answer", who);
		struct pollfd p = {fd, ev, 0};
		int r = poll(&p, 1, (int)(left * 1000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return vps_fail_errno("%s: poll", who);
		if (r > 0)
			return VPS_OK;
	}
}

static vps_result_t send_all(int fd, const void *buf, size_t len, double timeout, const char *who)
{
	const unsigned char *p = buf;
	double deadline = now() + timeout;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && (errno == EINTR))
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			VPS_CHECK(wait_fd(fd, POLLOUT, deadline, who));
			continue;
		}
		if (n < 0)
			return vps_fail(VPS_EPEER, "%s: %s", who, strerror(errno));
		p += n;
		len -= (size_t)n;
		deadline = now() + timeout;
	}
	return VPS_OK;
}

static vps_result_t recv_all(int fd, void *buf, size_t len, double timeout, const char *who)
{
	unsigned char *p = buf;
	double deadline = now() + timeout;
	while (len) {
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			VPS_CHECK(wait_fd(fd, POLLIN, deadline, who));
			continue;
		}
		if (n == 0)
			return vps_fail(VPS_EPEER, "%s: the connection was closed", who);
		if (n < 0)
			return vps_fail(VPS_EPEER, "%s: %s", who, strerror(errno));
		p += n;
		len -= (size_t)n;
		deadline = now() + timeout;
	}
	return VPS_OK;
}

static vps_result_t resolve(const char *host, int port, struct sockaddr_in *sa)
{
	struct addrinfo hints = {0}, *res = NULL;
	char ps[16];
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	int e = getaddrinfo(host, ps, &hints, &res);
	if (e || !res)
		return vps_fail(VPS_EINPUT, "master address %s:%d: %s", host, port, gai_strerror(e));
	memcpy(sa, res->ai_addr, sizeof(*sa));
	freeaddrinfo(res);
	return VPS_OK;
}

static vps_result_t listen_on(const struct sockaddr_in *sa, int backlog, int *fd_out, int *port_out)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		return vps_fail_errno("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0) {
		vps_result_t rc = vps_fail_errno("bind %s:%d", inet_ntoa(sa->sin_addr), ntohs(sa->sin_port));
		close(fd);
		return rc;
	}
	if (listen(fd, backlog) != 0) {
		close(fd);
		return vps_fail_errno("listen");
	}
	struct sockaddr_in got;
	socklen_t gl = sizeof(got);
	getsockname(fd, (struct sockaddr *)&got, &gl);
	*fd_out = fd;
	*port_out = ntohs(got.sin_port);
	return VPS_OK;
}

/* ---- proving membership: challenge, hello, proof ----
 *
 * The acceptor sends a fresh nonce; the connector answers with a hello
 * (who it is, what it holds, its own nonce) authenticated by a MAC over
 * both; the acceptor answers with a MAC over the connector's nonce. The
 * token never travels, a recorded exchange cannot be replayed, and each
 * side knows the other holds the job's token. Connections that have not
 * proven themselves within AUTH_SECONDS of their accept are dropped; they
 * cannot hold the job, whatever they send. */

#define AUTH_SECONDS 5.0
#define MAX_PENDING 64

enum { HELLO_CTL = 1, HELLO_MESH = 2 };

struct challenge {
	uint64_t magic;
	unsigned char nonce[VPS_AUTH_NONCE];
};

struct hello {
	uint64_t magic, kind, from, to, world, plan_hash, port;
	unsigned char nonce[VPS_AUTH_NONCE];
	uint64_t mac;
};

static uint64_t hello_mac(const unsigned char *key, const unsigned char *server_nonce, const struct hello *h)
{
	unsigned char m[VPS_AUTH_NONCE + offsetof(struct hello, mac)];
	memcpy(m, server_nonce, VPS_AUTH_NONCE);
	memcpy(m + VPS_AUTH_NONCE, h, offsetof(struct hello, mac));
	return vps_siphash(key, m, sizeof(m));
}

static uint64_t proof_mac(const unsigned char *key, const unsigned char *client_nonce, uint64_t acceptor)
{
	unsigned char m[VPS_AUTH_NONCE + 16];
	uint64_t tail[2] = {0x464f4f5250535056ULL /* "VPSPROOF" */, acceptor};
	memcpy(m, client_nonce, VPS_AUTH_NONCE);
	memcpy(m + VPS_AUTH_NONCE, tail, sizeof(tail));
	return vps_siphash(key, m, sizeof(m));
}

struct inbound {
	int fd;
	double deadline;
	struct sockaddr_in from;
	unsigned char nonce[VPS_AUTH_NONCE];
	struct hello h;
	size_t got;
};

enum { OUT_IDLE, OUT_CONNECTING, OUT_CHALLENGE, OUT_PROOF, OUT_DONE };

struct outbound {
	struct sockaddr_in sa;
	int64_t rank;
	int fd, state;
	double retry_at;
	bool turned_away; /* the acceptor closed after our hello */
	struct challenge c;
	struct hello h;
	size_t got;
	uint64_t proof;
};

struct handshake {
	const unsigned char *key;
	int64_t me, world;
	uint64_t plan_hash, port, kind;
	int lfd;          /* -1: nothing to accept */
	size_t want_in;   /* connections still to admit */
	/* an authenticated hello: 1 kept (fd now the callee's), -1 fatal */
	int (*admit)(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from);
	void *ctx;
	struct outbound *out;
	size_t nout;
	double deadline;
	size_t dropped;   /* connections that did not prove the token */
	struct inbound pend[MAX_PENDING];
	size_t npend;
};

static void drop_pending(struct handshake *hs, size_t i)
{
	close(hs->pend[i].fd);
	hs->pend[i] = hs->pend[--hs->npend];
}

static void accept_new(struct handshake *hs)
{
	struct sockaddr_in from;
	socklen_t l = sizeof(from);
	int fd = accept4(hs->lfd, (struct sockaddr *)&from, &l, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	tune(fd);
	if (hs->npend == MAX_PENDING) {
		/* a flood of idle connections: the oldest make room, a real
		 * peer proves itself in a round trip */
		size_t oldest = 0;
		for (size_t i = 1; i < hs->npend; i++)
			if (hs->pend[i].deadline < hs->pend[oldest].deadline)
				oldest = i;
		drop_pending(hs, oldest);
		hs->dropped++;
	}
	struct inbound *p = &hs->pend[hs->npend];
	memset(p, 0, sizeof(*p));
	p->fd = fd;
	p->from = from;
	p->deadline = now() + AUTH_SECONDS;
	struct challenge c = {HELLO_MAGIC, {0}};
	if (vps_auth_random(c.nonce, sizeof(c.nonce)) != VPS_OK ||
	    send(fd, &c, sizeof(c), MSG_NOSIGNAL) != (ssize_t)sizeof(c)) {
		vps_clear_error();
		close(fd);
		return;
	}
	memcpy(p->nonce, c.nonce, sizeof(c.nonce));
	hs->npend++;
}

/* Bytes of a pending connection: -1 drop it, 0 more to come, 1 admitted,
 * -2 fatal. */
static int read_pending(struct handshake *hs, struct inbound *p)
{
	ssize_t g = recv(p->fd, (unsigned char *)&p->h + p->got, sizeof(p->h) - p->got, 0);
	if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (g <= 0)
		return -1;
	p->got += (size_t)g;
	if (p->got < sizeof(p->h))
		return 0;
	uint64_t mac = hello_mac(hs->key, p->nonce, &p->h);
	if (p->h.magic != HELLO_MAGIC || !vps_auth_equal(&mac, &p->h.mac, sizeof(mac)))
		return -1;
	if (p->h.kind != hs->kind || (int64_t)p->h.to != hs->me) {
		vps_fail(VPS_EPEER, "an executor of this job at %s sent a %s hello for rank %" PRIu64 " to rank %" PRId64,
			 inet_ntoa(p->from.sin_addr), p->h.kind == HELLO_CTL ? "bootstrap" : "data", p->h.to, hs->me);
		return -2;
	}
	uint64_t proof = proof_mac(hs->key, p->h.nonce, (uint64_t)hs->me);
	if (send(p->fd, &proof, sizeof(proof), MSG_NOSIGNAL) != (ssize_t)sizeof(proof))
		return -1;
	return hs->admit(hs->ctx, &p->h, p->fd, &p->from) < 0 ? -2 : 1;
}

static vps_result_t out_connect(struct handshake *hs, struct outbound *o)
{
	o->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (o->fd < 0)
		return vps_fail_errno("socket");
	o->got = 0;
	if (connect(o->fd, (const struct sockaddr *)&o->sa, sizeof(o->sa)) == 0) {
		o->state = OUT_CHALLENGE;
		return VPS_OK;
	}
	if (errno == EINPROGRESS) {
		o->state = OUT_CONNECTING;
		return VPS_OK;
	}
	int e = errno;
	close(o->fd);
	o->fd = -1;
	if (e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT && e != ENETUNREACH && e != EAGAIN)
		return vps_fail(VPS_EPEER, "connect to rank %" PRId64 " at %s:%d: %s", o->rank, inet_ntoa(o->sa.sin_addr),
				ntohs(o->sa.sin_port), strerror(e));
	(void)hs;
	o->state = OUT_IDLE;
	o->retry_at = now() + 0.02;
	return VPS_OK;
}

static void out_retry(struct outbound *o)
{
	close(o->fd);
	o->fd = -1;
	o->state = OUT_IDLE;
	o->retry_at = now() + 0.02;
}

static vps_result_t out_progress(struct handshake *hs, struct outbound *o, short revents)
{
	if (o->state == OUT_CONNECTING) {
		int err = 0;
		socklen_t l = sizeof(err);
		getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &l);
		if (err == EINPROGRESS || !(revents & (POLLOUT | POLLERR | POLLHUP)))
			return VPS_OK;
		if (err) {
			out_retry(o);
			return VPS_OK;
		}
		tune(o->fd);
		o->state = OUT_CHALLENGE;
		return VPS_OK;
	}
	unsigned char *buf = o->state == OUT_CHALLENGE ? (unsigned char *)&o->c : (unsigned char *)&o->proof;
	size_t want = o->state == OUT_CHALLENGE ? sizeof(o->c) : sizeof(o->proof);
	ssize_t g = recv(o->fd, buf + o->got, want - o->got, 0);
	if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return VPS_OK;
	if (g <= 0) {
		/* once turned away, say so, whatever later attempts meet (rank 0
		 * done with its bootstrap closes on them) */
		o->turned_away |= o->state == OUT_PROOF;
		out_retry(o);
		return VPS_OK;
	}
	o->got += (size_t)g;
	if (o->got < want)
		return VPS_OK;
	if (o->state == OUT_CHALLENGE) {
		if (o->c.magic != HELLO_MAGIC)
			return vps_fail(VPS_EPEER, "%s:%d is not a vps-exec of this version (rank %" PRId64 " was expected there)",
					inet_ntoa(o->sa.sin_addr), ntohs(o->sa.sin_port), o->rank);
		o->h = (struct hello){HELLO_MAGIC, hs->kind, (uint64_t)hs->me, (uint64_t)o->rank, (uint64_t)hs->world,
				      hs->plan_hash, hs->port, {0}, 0};
		VPS_CHECK(vps_auth_random(o->h.nonce, sizeof(o->h.nonce)));
		o->h.mac = hello_mac(hs->key, o->c.nonce, &o->h);
		if (send(o->fd, &o->h, sizeof(o->h), MSG_NOSIGNAL) != (ssize_t)sizeof(o->h)) {
			out_retry(o);
			return VPS_OK;
		}
		o->state = OUT_PROOF;
		o->got = 0;
		return VPS_OK;
	}
	uint64_t want_mac = proof_mac(hs->key, o->h.nonce, (uint64_t)o->rank);
	if (!vps_auth_equal(&want_mac, &o->proof, sizeof(want_mac)))
		return vps_fail(VPS_EPEER,
				"the process at %s:%d did not prove the job token: it is not rank %" PRId64 " of this job",
				inet_ntoa(o->sa.sin_addr), ntohs(o->sa.sin_port), o->rank);
	o->state = OUT_DONE;
	return VPS_OK;
}

/* Accept want_in proven connections and make every outbound one, at once,
 * by the deadline. */
static vps_result_t handshake_run(struct handshake *hs)
{
	size_t cap = 1 + MAX_PENDING + hs->nout;
	struct pollfd *pfd = vps_malloc(cap * sizeof(*pfd));
	if (!pfd)
		return VPS_ENOMEM;
	vps_result_t rc = VPS_OK;
	for (size_t i = 0; i < hs->nout; i++) {
		hs->out[i].fd = -1;
		hs->out[i].state = OUT_IDLE;
		hs->out[i].retry_at = 0;
	}
	for (;;) {
		double t = now(), wake = hs->deadline;
		size_t left_out = 0;
		for (size_t i = 0; i < hs->nout && !rc; i++) {
			struct outbound *o = &hs->out[i];
			if (o->state == OUT_IDLE && o->retry_at <= t)
				rc = out_connect(hs, o);
			if (o->state == OUT_IDLE && o->retry_at < wake)
				wake = o->retry_at;
			left_out += o->state != OUT_DONE;
		}
		if (rc)
			break;
		if (!hs->want_in && !left_out)
			break;
		if (t >= hs->deadline) {
			rc = vps_fail(VPS_ETIMEOUT, "timed out");
			break;
		}
		for (size_t i = 0; i < hs->npend;) {
			if (hs->pend[i].deadline <= t) {
				drop_pending(hs, i);
				hs->dropped++;
				continue;
			}
			if (hs->pend[i].deadline < wake)
				wake = hs->pend[i].deadline;
			i++;
		}
		size_t np = 0;
		if (hs->want_in)
			pfd[np++] = (struct pollfd){hs->lfd, POLLIN, 0};
		for (size_t i = 0; i < hs->npend; i++)
			pfd[np++] = (struct pollfd){hs->pend[i].fd, POLLIN, 0};
		size_t first_out = np;
		for (size_t i = 0; i < hs->nout; i++) {
			const struct outbound *o = &hs->out[i];
			if (o->state == OUT_CONNECTING || o->state == OUT_CHALLENGE || o->state == OUT_PROOF)
				pfd[np++] = (struct pollfd){o->fd, o->state == OUT_CONNECTING ? POLLOUT : POLLIN, 0};
			else
				pfd[np++] = (struct pollfd){-1, 0, 0};
		}
		int pr = poll(pfd, np, (int)((wake - t) * 1000) + 1);
		if (pr < 0 && errno != EINTR) {
			rc = vps_fail_errno("poll");
			break;
		}
		if (pr <= 0)
			continue;
		for (size_t i = 0; i < hs->nout && !rc; i++)
			if (pfd[first_out + i].revents)
				rc = out_progress(hs, &hs->out[i], pfd[first_out + i].revents);
		if (rc)
			break;
		/* pending connections, newest first so that removal keeps indices */
		size_t base = hs->want_in ? 1 : 0;
		for (size_t k = hs->npend; k-- > 0;) {
			if (!pfd[base + k].revents)
				continue;
			int r = read_pending(hs, &hs->pend[k]);
			if (r == -2) {
				rc = VPS_EPEER;
				break;
			}
			if (r == -1) {
				drop_pending(hs, k);
				hs->dropped++;
			} else if (r == 1) {
				hs->pend[k] = hs->pend[--hs->npend];
				hs->want_in--;
			}
		}
		if (rc)
			break;
		if (hs->want_in && (pfd[0].revents & POLLIN))
			accept_new(hs);
	}
	while (hs->npend)
		drop_pending(hs, 0);
	free(pfd);
	return rc;
}

static vps_result_t listen_nb(const struct sockaddr_in *sa, int backlog, int *fd, int *port)
{
	VPS_CHECK(listen_on(sa, backlog, fd, port));
	fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
	return VPS_OK;
}

/* The address of this host that reaches host:port (a UDP socket's route
 * lookup: no packet is sent). */
static vps_result_t route_to(const struct sockaddr_in *to, struct in_addr *local)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return vps_fail_errno("socket");
	struct sockaddr_in got;
	socklen_t l = sizeof(got);
	if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&got, &l) != 0) {
		vps_result_t rc = vps_fail_errno("no route to the master %s", inet_ntoa(to->sin_addr));
		close(fd);
		return rc;
	}
	close(fd);
	*local = got.sin_addr;
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

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static int peer_index(const struct vps_net *n, int64_t peer)
{
	const int64_t *p = bsearch(&peer, n->peers, n->npeers, sizeof(*n->peers), cmp_i64);
	return p ? (int)(p - n->peers) : -1;
}

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

/* the mesh: a lower rank that exchanges data with this one */
static int admit_peer(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from)
{
	struct vps_net *n = ctx;
	int k = peer_index(n, (int64_t)h->from);
	if (k < 0 || (int64_t)h->from >= n->rank || n->fds[k] >= 0) {
		vps_fail(VPS_EPEER, "rank %" PRIu64 " (%s) connected, but this rank expects no connection from it", h->from,
			 inet_ntoa(from->sin_addr));
		return -1;
	}
	n->fds[k] = fd;
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

static void dropped_note(const struct handshake *hs, char *out, size_t size)
{
	out[0] = '\0';
	if (hs->dropped)
		snprintf(out, size, " (%zu connections that did not prove the job token were dropped: does every rank hold the same VPS_TOKEN?)",
			 hs->dropped);
}

/* Rank 0: rank r names the higher peers it connects to (at most W - r - 1,
 * each above r), and gets their addresses. */
static vps_result_t serve_addresses(int fd, int64_t r, int64_t world, const struct peer_addr *table, double timeout)
{
	uint64_t k;
	VPS_CHECK(recv_all(fd, &k, sizeof(k), timeout, "bootstrap: a rank's peers"));
	if (k > (uint64_t)(world - r - 1))
		return vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for %" PRIu64 " peers above it in a world of %" PRId64,
				r, k, world);
	int64_t *want = vps_malloc((size_t)k * sizeof(*want) + 1);
	struct peer_addr *ans = vps_malloc((size_t)k * sizeof(*ans) + 1);
	vps_result_t rc = want && ans ? VPS_OK : VPS_ENOMEM;
	if (!rc)
		rc = recv_all(fd, want, (size_t)k * sizeof(*want), timeout, "bootstrap: a rank's peers");
	for (uint64_t i = 0; !rc && i < k; i++) {
		if (want[i] <= r || want[i] >= world)
			rc = vps_fail(VPS_EPEER, "bootstrap: rank %" PRId64 " asks for the address of rank %" PRId64, r, want[i]);
		else
			ans[i] = table[want[i]];
	}
	if (!rc)
		rc = send_all(fd, ans, (size_t)k * sizeof(*ans), timeout, "bootstrap: answer");
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
	VPS_CHECK(send_all(n->ctl[0], &k, sizeof(k), timeout, "bootstrap: asking for the peers' addresses"));
	VPS_CHECK(send_all(n->ctl[0], n->peers + first, (size_t)k * sizeof(*n->peers), timeout,
			   "bootstrap: asking for the peers' addresses"));
	return recv_all(n->ctl[0], addrs + first, (size_t)k * sizeof(*addrs), timeout,
			"bootstrap: the peers' addresses, through rank 0");
}

vps_result_t vps_net_start(struct vps_net **out, const struct vps_net_opts *o)
{
	vps_result_t rc = VPS_OK;
	struct vps_net *n = vps_calloc(1, sizeof(*n));
	/* rank 0 gathers every rank's address; the others hold their peers' */
	struct peer_addr *table = vps_calloc(o->rank == 0 ? (size_t)o->world : 1, sizeof(*table));
	struct peer_addr *addrs = vps_calloc(o->npeers + 1, sizeof(*addrs));
	struct outbound *outs = NULL;
	int lfd = -1, dfd = -1, dport = 0, mport = 0;
	unsigned char key[VPS_AUTH_KEY];
	char note[256];
	if (!n || !table || !addrs) {
		free(n);
		free(table);
		free(addrs);
		return VPS_ENOMEM;
	}
	if (o->world > 1 && (!o->token || !*o->token)) {
		free(n);
		free(table);
		free(addrs);
		return vps_fail(VPS_EINPUT, "no job token: set VPS_TOKEN or pass --token-file (vps-exec(1) SECURITY)");
	}
	vps_auth_key(o->token ? o->token : "", key);
	n->rank = o->rank;
	n->world = o->world;
	n->timeout = o->timeout;
	n->ctl = vps_malloc((size_t)(o->rank == 0 ? o->world : 1) * sizeof(int));
	n->peers = vps_malloc((o->npeers + 1) * sizeof(*n->peers));
	n->fds = vps_malloc((o->npeers + 1) * sizeof(int));
	outs = vps_calloc(o->npeers + 1, sizeof(*outs));
	if (!n->ctl || !n->peers || !n->fds || !outs) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (int64_t i = 0; i < (o->rank == 0 ? o->world : 1); i++)
		n->ctl[i] = -1;
	for (size_t i = 0; i <= o->npeers; i++)
		outs[i].fd = -1;
	if (o->npeers)
		memcpy(n->peers, o->peers, o->npeers * sizeof(*n->peers));
	qsort(n->peers, o->npeers, sizeof(*n->peers), cmp_i64);
	for (size_t i = 0; i < o->npeers; i++)
		if (!i || n->peers[i] != n->peers[n->npeers - 1])
			n->peers[n->npeers++] = n->peers[i];
	for (size_t i = 0; i < n->npeers; i++)
		n->fds[i] = -1;
	double deadline = now() + o->timeout;
	struct sockaddr_in master, here = {0};
	VPS_CHECK_GOTO(resolve(o->master_host, o->master_port, &master), rc, fail);
	/* listen only where the job's peers reach us: never on every interface */
	here.sin_family = AF_INET;
	if (o->bind && *o->bind) {
		struct sockaddr_in b;
		VPS_CHECK_GOTO(resolve(o->bind, 0, &b), rc, fail);
		here.sin_addr = b.sin_addr;
	} else if (o->rank == 0) {
		here.sin_addr = master.sin_addr;
	} else {
		VPS_CHECK_GOTO(route_to(&master, &here.sin_addr), rc, fail);
	}
	int backlog = (int)vps_min64(o->world + 16, 4096);
	VPS_CHECK_GOTO(listen_nb(&here, backlog, &dfd, &dport), rc, fail);
	struct handshake hs = {0};
	hs.key = key;
	hs.me = o->rank;
	hs.world = o->world;
	hs.plan_hash = o->plan_hash;
	hs.lfd = -1;
	if (o->rank == 0 && o->world > 1) {
		struct gather g = {n, table, o->plan_hash, ""};
		VPS_CHECK_GOTO(listen_nb(&master, backlog, &lfd, &mport), rc, fail);
		table[0].ip = master.sin_addr.s_addr;
		table[0].port = (uint16_t)dport;
		hs.kind = HELLO_CTL;
		hs.lfd = lfd;
		hs.want_in = (size_t)(o->world - 1);
		hs.admit = admit_rank;
		hs.ctx = &g;
		hs.deadline = deadline;
		rc = handshake_run(&hs);
		if (rc == VPS_ETIMEOUT) {
			char missing[160];
			missing_ranks(n, missing, sizeof(missing));
			dropped_note(&hs, note, sizeof(note));
			rc = vps_fail(VPS_ETIMEOUT, "bootstrap: rank %s did not come within %.0f s%s", missing, o->timeout, note);
		}
		if (rc)
			goto fail;
		for (int64_t r = 1; r < o->world; r++) {
			uint64_t status = g.bad[0] ? 1 : 0;
			VPS_CHECK_GOTO(send_all(n->ctl[r], &status, sizeof(status), o->timeout, "bootstrap: answer"), rc, fail);
			if (g.bad[0])
				VPS_CHECK_GOTO(send_all(n->ctl[r], g.bad, sizeof(g.bad), o->timeout, "bootstrap: answer"), rc, fail);
		}
		if (g.bad[0]) {
			rc = vps_fail(VPS_EPEER, "bootstrap: %s", g.bad);
			goto fail;
		}
		/* each rank learns the addresses of the peers it connects to, not
		 * the world's: rank 0 sends O(peers) per rank, not O(W) */
		for (int64_t r = 1; r < o->world; r++)
			VPS_CHECK_GOTO(serve_addresses(n->ctl[r], r, o->world, table, o->timeout), rc, fail);
		for (size_t i = 0; i < n->npeers; i++)
			addrs[i] = table[n->peers[i]];
	} else if (o->world > 1) {
		uint64_t status;
		outs[0] = (struct outbound){.sa = master, .rank = 0};
		hs.kind = HELLO_CTL;
		hs.port = (uint64_t)dport;
		hs.out = outs;
		hs.nout = 1;
		hs.deadline = deadline;
		rc = handshake_run(&hs);
		if (rc == VPS_ETIMEOUT)
			rc = vps_fail(VPS_ETIMEOUT, "bootstrap: %s %s:%d within %.0f s", 
				      outs[0].turned_away ? "rank 0 turned this rank away (another job token?) at"
							  : "nobody proved to be rank 0 at",
				      o->master_host, o->master_port, o->timeout);
		if (rc)
			goto fail;
		n->ctl[0] = outs[0].fd;
		outs[0].fd = -1;
		VPS_CHECK_GOTO(recv_all(n->ctl[0], &status, sizeof(status), o->timeout + (deadline - now()),
					"bootstrap: waiting for the other ranks through rank 0"),
			       rc, fail);
		if (status) {
			char bad[512];
			VPS_CHECK_GOTO(recv_all(n->ctl[0], bad, sizeof(bad), o->timeout, "bootstrap"), rc, fail);
			bad[sizeof(bad) - 1] = '\0';
			rc = vps_fail(VPS_EPEER, "bootstrap: %s", bad);
			goto fail;
		}
		VPS_CHECK_GOTO(ask_addresses(n, addrs, o->timeout), rc, fail);
	}
	/* the mesh: connect to higher peers and accept lower ones, all at once */
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
	hs = (struct handshake){0};
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
	hs.deadline = now() + o->timeout;
	rc = handshake_run(&hs);
	if (rc == VPS_ETIMEOUT) {
		char missing[160] = "";
		size_t len = 0;
		for (size_t i = 0; i < n->npeers && len + 24 < sizeof(missing); i++)
			if (n->peers[i] < o->rank && n->fds[i] < 0)
				len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "",
							n->peers[i]);
		for (size_t i = 0; i < nout && len + 24 < sizeof(missing); i++)
			if (outs[i].state != OUT_DONE)
				len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64, len ? ", " : "",
							outs[i].rank);
		dropped_note(&hs, note, sizeof(note));
		rc = vps_fail(VPS_ETIMEOUT, "connecting the ranks that exchange data: no connection with rank %s within %.0f s%s",
			      missing, o->timeout, note);
	}
	if (rc)
		goto fail;
	for (size_t i = 0; i < nout; i++) {
		n->fds[peer_index(n, outs[i].rank)] = outs[i].fd;
		outs[i].fd = -1;
	}
	close(dfd);
	if (lfd >= 0)
		close(lfd);
	free(table);
	free(addrs);
	free(outs);
	memset(key, 0, sizeof(key));
	*out = n;
	return VPS_OK;
fail:
	for (size_t i = 0; outs && i <= o->npeers; i++)
		if (outs[i].fd >= 0)
			close(outs[i].fd);
	if (dfd >= 0)
		close(dfd);
	if (lfd >= 0)
		close(lfd);
	free(table);
	free(addrs);
	free(outs);
	memset(key, 0, sizeof(key));
	vps_net_free(n);
	return rc;
}

/* ---- exchanges ---- */

/* A position in an iovec list: the header first, then the payload. */
struct cursor {
	const struct iovec *iov;
	size_t cnt, i, off;  /* next byte: iov[i] + off */
	unsigned char *hdr;
	size_t hdr_done;
	size_t total, done;  /* payload bytes */
};

static size_t iov_total(const struct iovec *iov, size_t cnt)
{
	size_t t = 0;
	for (size_t i = 0; i < cnt; i++)
		t += iov[i].iov_len;
	return t;
}

/* Fill a short iovec array from the cursor (at most max entries). */
static int cursor_iov(const struct cursor *c, struct iovec *out, int max)
{
	int n = 0;
	if (c->hdr_done < 16) {
		out[n].iov_base = c->hdr + c->hdr_done;
		out[n].iov_len = 16 - c->hdr_done;
		n++;
	}
	for (size_t i = c->i; i < c->cnt && n < max; i++) {
		size_t off = i == c->i ? c->off : 0;
		if (c->iov[i].iov_len == off)
			continue;
		out[n].iov_base = (unsigned char *)c->iov[i].iov_base + off;
		out[n].iov_len = c->iov[i].iov_len - off;
		n++;
	}
	return n;
}

static void cursor_advance(struct cursor *c, size_t k)
{
	if (c->hdr_done < 16) {
		size_t h = vps_min64((int64_t)k, (int64_t)(16 - c->hdr_done));
		c->hdr_done += h;
		k -= h;
	}
	c->done += k;
	while (k && c->i < c->cnt) {
		size_t left = c->iov[c->i].iov_len - c->off;
		if (k < left) {
			c->off += k;
			return;
		}
		k -= left;
		c->i++;
		c->off = 0;
	}
	while (c->i < c->cnt && c->iov[c->i].iov_len == c->off) {
		c->i++;
		c->off = 0;
	}
}

static bool cursor_finished(const struct cursor *c) { return c->hdr_done == 16 && c->done == c->total; }

struct flow {
	int fd;
	int64_t peer;
	uint64_t hdr_out[2], hdr_in[2];
	struct cursor out, in;
	bool sending, receiving;
	uint64_t tag;
};

vps_result_t vps_net_exchange(struct vps_net *n, struct vps_net_msg *msgs, size_t nmsgs, const char *what)
{
	vps_result_t rc = VPS_OK;
	struct flow *f = vps_calloc(nmsgs + 1, sizeof(*f));
	struct pollfd *pfd = vps_calloc(nmsgs + 1, sizeof(*pfd));
	if (!f || !pfd) {
		free(f);
		free(pfd);
		return VPS_ENOMEM;
	}
	for (size_t i = 0; i < nmsgs; i++) {
		int k = peer_index(n, msgs[i].peer);
		if (k < 0) {
			rc = vps_fail(VPS_EINPUT, "%s: rank %" PRId64 " is not a peer of rank %" PRId64, what, msgs[i].peer,
				      n->rank);
			goto done;
		}
		f[i].fd = n->fds[k];
		f[i].peer = msgs[i].peer;
		f[i].tag = msgs[i].tag;
		f[i].sending = msgs[i].send;
		f[i].receiving = msgs[i].recv;
		f[i].out = (struct cursor){msgs[i].send_iov, msgs[i].send_iovcnt, 0, 0, (unsigned char *)f[i].hdr_out, 0,
					   iov_total(msgs[i].send_iov, msgs[i].send_iovcnt), 0};
		f[i].in = (struct cursor){msgs[i].recv_iov, msgs[i].recv_iovcnt, 0, 0, (unsigned char *)f[i].hdr_in, 0,
					  iov_total(msgs[i].recv_iov, msgs[i].recv_iovcnt), 0};
		f[i].hdr_out[0] = msgs[i].tag;
		f[i].hdr_out[1] = f[i].out.total;
	}
	double last = now();
	for (;;) {
		size_t np = 0;
		for (size_t i = 0; i < nmsgs; i++) {
			short ev = (short)((f[i].sending ? POLLOUT : 0) | (f[i].receiving ? POLLIN : 0));
			if (ev) {
				pfd[np].fd = f[i].fd;
				pfd[np].events = ev;
				pfd[np].revents = 0;
				np++;
			}
		}
		if (!np)
			break;
		double left = n->timeout - (now() - last);
		int r = left > 0 ? poll(pfd, np, (int)(left * 1000) + 1) : 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = vps_fail_errno("%s: poll", what);
			goto done;
		}
		if (r == 0 && now() - last >= n->timeout) {
			char list[256] = "";
			size_t len = 0;
			for (size_t i = 0; i < nmsgs && len < sizeof(list) - 24; i++)
				if (f[i].sending || f[i].receiving)
					len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%" PRId64, len ? ", " : "",
								f[i].peer);
			rc = vps_fail(VPS_ETIMEOUT, "%s: no progress for %.0f s from rank %s", what, n->timeout, list);
			goto done;
		}
		size_t q = 0;
		for (size_t i = 0; i < nmsgs; i++) {
			if (!f[i].sending && !f[i].receiving)
				continue;
			short re = pfd[q++].revents;
			struct iovec v[64];
			if (f[i].sending && (re & (POLLOUT | POLLERR | POLLHUP))) {
				while (f[i].sending) {
					struct msghdr mh = {0};
					mh.msg_iov = v;
					mh.msg_iovlen = (size_t)cursor_iov(&f[i].out, v, 64);
					ssize_t w = sendmsg(f[i].fd, &mh, MSG_NOSIGNAL);
					if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
						break;
					if (w < 0) {
						rc = vps_fail(VPS_EPEER, "%s: sending to rank %" PRId64 ": %s", what, f[i].peer,
							      strerror(errno));
						goto done;
					}
					cursor_advance(&f[i].out, (size_t)w);
					n->sent += (uint64_t)w;
					last = now();
					if (cursor_finished(&f[i].out))
						f[i].sending = false;
				}
			}
			if (f[i].receiving && (re & (POLLIN | POLLERR | POLLHUP))) {
				while (f[i].receiving) {
					bool had_header = f[i].in.hdr_done == 16;
					struct msghdr mh = {0};
					mh.msg_iov = v;
					/* the header alone first: the payload's size is checked
					 * before any byte lands in a destination */
					mh.msg_iovlen = had_header ? (size_t)cursor_iov(&f[i].in, v, 64) : 1;
					if (!had_header) {
						v[0].iov_base = (unsigned char *)f[i].hdr_in + f[i].in.hdr_done;
						v[0].iov_len = 16 - f[i].in.hdr_done;
					}
					ssize_t g = mh.msg_iovlen ? recvmsg(f[i].fd, &mh, 0) : 0;
					if (mh.msg_iovlen && g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
						break;
					if (mh.msg_iovlen && g <= 0) {
						rc = g == 0 ? vps_fail(VPS_EPEER, "%s: rank %" PRId64 " closed the connection", what,
								       f[i].peer)
							    : vps_fail(VPS_EPEER, "%s: rank %" PRId64 ": %s", what, f[i].peer,
								       strerror(errno));
						goto done;
					}
					cursor_advance(&f[i].in, (size_t)(g > 0 ? g : 0));
					n->received += (uint64_t)(g > 0 ? g : 0);
					last = now();
					if (!had_header && f[i].in.hdr_done == 16 &&
					    (f[i].hdr_in[0] != f[i].tag || f[i].hdr_in[1] != f[i].in.total)) {
						rc = vps_fail(VPS_EPEER,
							      "%s: rank %" PRId64 " sent message %016" PRIx64 " of %" PRIu64
							      " bytes, expected %016" PRIx64 " of %zu (a different plan?)",
							      what, f[i].peer, f[i].hdr_in[0], f[i].hdr_in[1], f[i].tag, f[i].in.total);
						goto done;
					}
					if (cursor_finished(&f[i].in))
						f[i].receiving = false;
				}
			}
		}
	}
done:
	free(f);
	free(pfd);
	return rc;
}

/* ---- collectives through rank 0 ---- */

/* Rank 0 gathers len bytes from every rank at once (one deadline, reset by
 * progress), combines them, and sends the result back. A rank that does not
 * answer fails the collective, unless missing() turns it into part of the
 * result (agree: the others learn which rank is gone). */
static vps_result_t star(struct vps_net *n, void *buf, size_t len, const char *what,
			 void (*combine)(void *acc, const void *in, size_t len),
			 void (*missing)(void *acc, int64_t rank, const char *why))
{
	char who[160];
	if (n->rank != 0) {
		snprintf(who, sizeof(who), "%s: rank 0", what);
		VPS_CHECK(send_all(n->ctl[0], buf, len, n->timeout, who));
		/* rank 0 may first wait out a silent rank */
		return recv_all(n->ctl[0], buf, len, 2 * n->timeout + 1, who);
	}
	int64_t W = n->world;
	unsigned char *in = vps_malloc((size_t)W * len + 1);
	size_t *got = vps_calloc((size_t)W, sizeof(*got));
	bool *gone = vps_calloc((size_t)W, sizeof(*gone));
	struct pollfd *pfd = vps_malloc((size_t)W * sizeof(*pfd));
	int64_t *who_of = vps_malloc((size_t)W * sizeof(*who_of));
	vps_result_t rc = VPS_OK;
	if (!in || !got || !gone || !pfd || !who_of) {
		rc = VPS_ENOMEM;
		goto done;
	}
	double last = now();
	for (;;) {
		size_t np = 0;
		for (int64_t r = 1; r < W; r++)
			if (!gone[r] && got[r] < len) {
				pfd[np].fd = n->ctl[r];
				pfd[np].events = POLLIN;
				pfd[np].revents = 0;
				who_of[np++] = r;
			}
		if (!np)
			break;
		double left = n->timeout - (now() - last);
		int pr = left > 0 ? poll(pfd, np, (int)(left * 1000) + 1) : 0;
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0 && now() - last >= n->timeout) {
			for (size_t i = 0; i < np; i++) {
				gone[who_of[i]] = true;
				if (!missing) {
					rc = vps_fail(VPS_ETIMEOUT, "%s: rank %" PRId64 " did not answer within %.0f s", what,
						      who_of[i], n->timeout);
					goto done;
				}
				missing(buf, who_of[i], "did not answer in time");
			}
			continue;
		}
		for (size_t i = 0; i < np; i++) {
			if (!pfd[i].revents)
				continue;
			int64_t r = who_of[i];
			ssize_t g = recv(n->ctl[r], in + (size_t)r * len + got[r], len - got[r], 0);
			if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
				continue;
			if (g <= 0) {
				gone[r] = true;
				if (!missing) {
					rc = vps_fail(VPS_EPEER, "%s: rank %" PRId64 " %s", what, r,
						      g == 0 ? "closed the connection" : strerror(errno));
					goto done;
				}
				missing(buf, r, g == 0 ? "closed the connection" : strerror(errno));
				continue;
			}
			got[r] += (size_t)g;
			last = now();
		}
	}
	for (int64_t r = 1; r < W; r++)
		if (!gone[r] && combine)
			combine(buf, in + (size_t)r * len, len);
	for (int64_t r = 1; r < W; r++) {
		if (gone[r])
			continue;
		snprintf(who, sizeof(who), "%s: rank %" PRId64, what, r);
		vps_result_t e = send_all(n->ctl[r], buf, len, n->timeout, who);
		if (e && !missing) {
			rc = e;
			goto done;
		}
	}
done:
	free(in);
	free(got);
	free(gone);
	free(pfd);
	free(who_of);
	return rc;
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

static void add_u64(void *acc, const void *in, size_t len)
{
	uint64_t *a = acc;
	const uint64_t *b = in;
	for (size_t i = 0; i < len / 8; i++)
		a[i] += b[i];
}

vps_result_t vps_net_allreduce_sum(struct vps_net *n, uint64_t *v, size_t count, const char *what)
{
	return star(n, v, count * sizeof(*v), what, add_u64, NULL);
}

size_t vps_net_tree_peers(int64_t rank, int64_t world, int64_t *out)
{
	int64_t P = 1;
	size_t n = 0;
	while (P * 2 <= world)
		P *= 2;
	if (rank >= P) {
		out[n++] = rank - P;
		return n;
	}
	for (int64_t m = 1; m < P; m <<= 1)
		out[n++] = rank ^ m;
	if (rank + P < world)
		out[n++] = rank + P;
	return n;
}

struct tree_op {
	int64_t *v, *in;
	size_t count;
	void (*combine)(int64_t *acc, const int64_t *in, size_t count);
	const char *what;
};

static vps_result_t tree_step(struct vps_net *n, const struct tree_op *t, int64_t peer, bool send, bool recv,
			      uint64_t round)
{
	struct iovec out_iov = {t->v, t->count * sizeof(*t->v)}, in_iov = {t->in, t->count * sizeof(*t->in)};
	struct vps_net_msg m = {peer, send, recv, &out_iov, 1, &in_iov, 1, 0x5650535452454500ull | round};
	VPS_CHECK(vps_net_exchange(n, &m, 1, t->what));
	if (recv && round == 63) /* the result, from the partner below P */
		memcpy(t->v, t->in, t->count * sizeof(*t->v));
	else if (recv)
		t->combine(t->v, t->in, t->count);
	return VPS_OK;
}

void vps_net_max(int64_t *acc, const int64_t *in, size_t count)
{
	for (size_t i = 0; i < count; i++)
		acc[i] = acc[i] > in[i] ? acc[i] : in[i];
}

/* Recursive doubling over the largest power of two P <= W: ranks past P
 * hand their numbers to rank - P first and take the result back last, so
 * every rank sends and receives at most log2(W) + 1 vectors, and rank 0
 * no more than any other. */
vps_result_t vps_net_allreduce(struct vps_net *n, int64_t *v, size_t count,
			       void (*combine)(int64_t *acc, const int64_t *in, size_t count), const char *what)
{
	int64_t P = 1, r = n->rank, W = n->world;
	while (P * 2 <= W)
		P *= 2;
	if (W < 2 || !count)
		return VPS_OK;
	struct tree_op t = {v, vps_malloc(count * sizeof(int64_t)), count, combine, what};
	if (!t.in)
		return VPS_ENOMEM;
	vps_result_t rc = VPS_OK;
	uint64_t round = 0;
	if (r >= P) {
		rc = tree_step(n, &t, r - P, true, false, round);
		if (!rc)
			rc = tree_step(n, &t, r - P, false, true, 63);
		goto done;
	}
	if (r + P < W)
		VPS_CHECK_GOTO(tree_step(n, &t, r + P, false, true, round), rc, done);
	for (int64_t m = 1; m < P; m <<= 1)
		VPS_CHECK_GOTO(tree_step(n, &t, r ^ m, true, true, ++round), rc, done);
	if (r + P < W)
		rc = tree_step(n, &t, r + P, true, false, 63);
done:
	free(t.in);
	return rc;
}

vps_result_t vps_net_broadcast(struct vps_net *n, void *buf, size_t len, const char *what)
{
	return star(n, buf, len, what, NULL, NULL);
}

struct verdict {
	uint64_t failed_rank; /* world if none */
	char message[248];
};

static void first_failure(void *acc, const void *in, size_t len)
{
	(void)len;
	struct verdict *a = acc;
	const struct verdict *b = in;
	if (b->failed_rank < a->failed_rank)
		*a = *b;
}

static void verdict_missing(void *acc, int64_t rank, const char *why)
{
	struct verdict *a = acc;
	if ((uint64_t)rank < a->failed_rank) {
		a->failed_rank = (uint64_t)rank;
		snprintf(a->message, sizeof(a->message), "%s", why);
	}
}

vps_result_t vps_net_agree(struct vps_net *n, bool ok, const char *what)
{
	struct verdict v = {0};
	v.failed_rank = ok ? (uint64_t)n->world : (uint64_t)n->rank;
	if (!ok)
		snprintf(v.message, sizeof(v.message), "%s", vps_last_error());
	VPS_CHECK(star(n, &v, sizeof(v), what, first_failure, verdict_missing));
	if (v.failed_rank < (uint64_t)n->world)
		return vps_fail(VPS_EPEER, "rank %" PRIu64 " failed: %s", v.failed_rank, v.message);
	return VPS_OK;
}

/* ---- the start of a switch ---- */

enum { MSG_HEARTBEAT = 'h', MSG_ARRIVED = 'a', MSG_GO = 'g', MSG_ABORT = 'x' };
#define ABORT_TEXT 248

static double heartbeat_period(const struct vps_net *n) { return n->timeout / 4 < 1.0 ? n->timeout / 4 : 1.0; }

/* A byte of news, without waiting: a peer that does not read (stopped)
 * only fills its socket buffer. */
static void tell(int fd, char what) { (void)!send(fd, &what, 1, MSG_NOSIGNAL | MSG_DONTWAIT); }

static void tell_abort(int fd, const char *why)
{
	char msg[1 + ABORT_TEXT] = {MSG_ABORT};
	snprintf(msg + 1, ABORT_TEXT, "%s", why);
	(void)!send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A short wait: the trainer's request is polled between waits. */
static int wait_news(struct pollfd *p, size_t np, double seconds)
{
	if (seconds < 0)
		seconds = 0;
	struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
	int r = ppoll(p, np, &ts, NULL);
	return r < 0 && errno == EINTR ? 0 : r;
}

/* the other side's reason after MSG_ABORT */
static vps_result_t read_abort(int fd, int64_t rank, double timeout)
{
	char why[ABORT_TEXT];
	if (recv_all(fd, why, sizeof(why), timeout, "abort") != VPS_OK)
		snprintf(why, sizeof(why), "failed");
	why[sizeof(why) - 1] = '\0';
	return vps_fail(VPS_EPEER, "rank %" PRId64 ": %s", rank, why);
}

static vps_result_t arrive_rank0(struct vps_net *n, int (*ready)(void *), void *ctx, double window)
{
	int64_t W = n->world;
	double *last = vps_malloc((size_t)W * sizeof(*last));
	bool *arrived = vps_calloc((size_t)W, sizeof(*arrived));
	struct pollfd *pfd = vps_malloc((size_t)W * sizeof(*pfd));
	vps_result_t rc = VPS_OK;
	if (!last || !arrived || !pfd) {
		rc = VPS_ENOMEM;
		goto done;
	}
	double t = now(), first = -1, next_beat = t, period = heartbeat_period(n);
	for (int64_t r = 0; r < W; r++)
		last[r] = t;
	int64_t count = 0;
	bool mine = false;
	for (;;) {
		if (!mine) {
			int k = ready(ctx);
			if (k < 0) {
				rc = VPS_EPEER;
				break;
			}
			if (k) {
				mine = true;
				if (first < 0)
					first = now();
			}
		}
		if (mine && count == W - 1) {
			for (int64_t r = 1; r < W && !rc; r++) {
				char go = MSG_GO;
				rc = send_all(n->ctl[r], &go, 1, n->timeout, "start of the switch");
			}
			goto done;
		}
		t = now();
		if (first >= 0 && t - first > window) {
			char late[160] = "";
			size_t len = 0;
			if (!mine)
				len += (size_t)snprintf(late, sizeof(late), "0");
			for (int64_t r = 1; r < W && len + 24 < sizeof(late); r++)
				if (!arrived[r])
					len += (size_t)snprintf(late + len, sizeof(late) - len, "%s%" PRId64, len ? ", " : "", r);
			rc = vps_fail(VPS_ETIMEOUT,
				      "the trainer of rank %s did not request the switch within %.0f s of the first (--request-timeout)",
				      late, window);
			break;
		}
		for (int64_t r = 1; r < W && !rc; r++)
			if (!arrived[r] && t - last[r] > n->timeout)
				rc = vps_fail(VPS_ETIMEOUT,
					      "rank %" PRId64 " gave no sign of life for %.0f s while the ranks waited for the switch"
					      " (stopped, or cut off?)",
					      r, n->timeout);
		if (rc)
			break;
		if (t >= next_beat) {
			/* to the ranks that arrived too: they wait on rank 0 */
			for (int64_t r = 1; r < W; r++)
				tell(n->ctl[r], MSG_HEARTBEAT);
			next_beat = t + period;
		}
		for (int64_t r = 1; r < W; r++)
			pfd[r - 1] = (struct pollfd){n->ctl[r], POLLIN, 0};
		int pr = wait_news(pfd, (size_t)(W - 1), mine ? period / 4 : 0.0002);
		for (int64_t r = 1; r < W && pr > 0 && !rc; r++) {
			if (!pfd[r - 1].revents)
				continue;
			char m;
			ssize_t g = recv(n->ctl[r], &m, 1, 0);
			if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
				continue;
			if (g <= 0)
				rc = vps_fail(VPS_EPEER, "rank %" PRId64 "'s executor closed its connection while the ranks waited for the switch", r);
			else if (m == MSG_HEARTBEAT)
				last[r] = now();
			else if (m == MSG_ARRIVED && !arrived[r]) {
				arrived[r] = true;
				count++;
				if (first < 0)
					first = now();
			} else if (m == MSG_ABORT)
				rc = read_abort(n->ctl[r], r, n->timeout);
			else
				rc = vps_fail(VPS_EPEER, "rank %" PRId64 " sent 0x%02x while the ranks waited for the switch", r,
					      (unsigned char)m);
		}
		if (rc)
			break;
	}
	/* every rank learns why at once, not after its own timeout */
	for (int64_t r = 1; r < W; r++)
		tell_abort(n->ctl[r], vps_last_error());
done:
	free(last);
	free(arrived);
	free(pfd);
	return rc;
}

static vps_result_t arrive_other(struct vps_net *n, int (*ready)(void *), void *ctx)
{
	double t = now(), last = t, next_beat = t, period = heartbeat_period(n);
	bool mine = false;
	int fd = n->ctl[0];
	for (;;) {
		if (!mine) {
			int k = ready(ctx);
			if (k < 0) {
				tell_abort(fd, vps_last_error());
				return VPS_EPEER;
			}
			if (k) {
				char a = MSG_ARRIVED;
				VPS_CHECK(send_all(fd, &a, 1, n->timeout, "start of the switch: rank 0"));
				mine = true;
			}
		}
		t = now();
		if (t - last > n->timeout)
			return vps_fail(VPS_ETIMEOUT,
					"rank 0 gave no sign of life for %.0f s while the ranks waited for the switch (stopped, or cut off?)",
					n->timeout);
		if (!mine && t >= next_beat) {
			tell(fd, MSG_HEARTBEAT);
			next_beat = t + period;
		}
		struct pollfd p = {fd, POLLIN, 0};
		if (wait_news(&p, 1, mine ? period / 4 : 0.0002) <= 0)
			continue;
		char m;
		ssize_t g = recv(fd, &m, 1, 0);
		if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (g <= 0)
			return vps_fail(VPS_EPEER, "rank 0's executor closed its connection while the ranks waited for the switch");
		if (m == MSG_HEARTBEAT)
			last = now();
		else if (m == MSG_GO && mine)
			return VPS_OK;
		else if (m == MSG_ABORT)
			return read_abort(fd, 0, n->timeout);
		else
			return vps_fail(VPS_EPEER, "rank 0 sent 0x%02x while the ranks waited for the switch", (unsigned char)m);
	}
}

vps_result_t vps_net_arrive(struct vps_net *n, int (*ready)(void *ctx), void *ctx, double window)
{
	return n->rank == 0 ? arrive_rank0(n, ready, ctx, window) : arrive_other(n, ready, ctx);
}
