#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "net.h"

#define HELLO_MAGIC 0x3154454e535056ULL /* "VPSNET1" */

struct hello {
	uint64_t magic, token, rank, world, plan_hash, port;
};

struct peer_addr {
	uint32_t ip; /* network order */
	uint16_t port;
	uint16_t pad;
};

struct vps_net {
	int64_t rank, world;
	double timeout;
	uint64_t token;
	int *ctl;          /* rank 0: one per rank; others: ctl[0] */
	int64_t *peers;    /* sorted */
	int *fds;          /* data socket per peer */
	size_t npeers;
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

static vps_result_t accept_one(int lfd, double deadline, int *fd, struct sockaddr_in *from, const char *who)
{
	VPS_CHECK(wait_fd(lfd, POLLIN, deadline, who));
	socklen_t l = sizeof(*from);
	*fd = accept4(lfd, (struct sockaddr *)from, &l, SOCK_CLOEXEC);
	if (*fd < 0)
		return vps_fail_errno("%s: accept", who);
	tune(*fd);
	return VPS_OK;
}

/* Connect, retrying while the other side is not listening yet. */
static vps_result_t connect_retry(const struct sockaddr_in *sa, double deadline, int *out, const char *who)
{
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return vps_fail_errno("socket");
		if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
			tune(fd);
			*out = fd;
			return VPS_OK;
		}
		int e = errno;
		close(fd);
		if (e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT && e != ENETUNREACH && e != EAGAIN)
			return vps_fail(VPS_EPEER, "%s: connect %s:%d: %s", who, inet_ntoa(sa->sin_addr), ntohs(sa->sin_port),
					strerror(e));
		if (now() > deadline)
			return vps_fail(VPS_ETIMEOUT, "%s: nobody listens on %s:%d", who, inet_ntoa(sa->sin_addr),
					ntohs(sa->sin_port));
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
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

vps_result_t vps_net_start(struct vps_net **out, const struct vps_net_opts *o)
{
	vps_result_t rc = VPS_OK;
	struct vps_net *n = vps_calloc(1, sizeof(*n));
	struct peer_addr *table = vps_calloc((size_t)o->world, sizeof(*table));
	int lfd = -1, dfd = -1, dport = 0, mport = 0;
	char who[128];
	if (!n || !table) {
		free(n);
		free(table);
		return VPS_ENOMEM;
	}
	n->rank = o->rank;
	n->world = o->world;
	n->timeout = o->timeout;
	n->token = o->token;
	n->ctl = vps_malloc((size_t)(o->rank == 0 ? o->world : 1) * sizeof(int));
	n->peers = vps_malloc((o->npeers + 1) * sizeof(*n->peers));
	n->fds = vps_malloc((o->npeers + 1) * sizeof(int));
	if (!n->ctl || !n->peers || !n->fds) {
		rc = VPS_ENOMEM;
		goto fail;
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
	double deadline = now() + o->timeout;
	struct sockaddr_in master, any = {0};
	VPS_CHECK_GOTO(resolve(o->master_host, o->master_port, &master), rc, fail);
	any.sin_family = AF_INET;
	any.sin_addr.s_addr = o->rank == 0 ? master.sin_addr.s_addr : htonl(INADDR_ANY);
	VPS_CHECK_GOTO(listen_on(&any, (int)vps_min64(o->world + 16, 4096), &dfd, &dport), rc, fail);
	if (o->rank == 0) {
		/* collect every rank's hello; answer with the peer table */
		VPS_CHECK_GOTO(listen_on(&master, (int)vps_min64(o->world + 16, 4096), &lfd, &mport), rc, fail);
		table[0].ip = master.sin_addr.s_addr;
		table[0].port = (uint16_t)dport;
		char bad[512] = "";
		for (int64_t k = 1; k < o->world; k++) {
			int fd;
			struct sockaddr_in from;
			struct hello h;
			snprintf(who, sizeof(who), "bootstrap: waiting for %" PRId64 " more ranks", o->world - k);
			rc = accept_one(lfd, deadline, &fd, &from, who);
			if (rc == VPS_ETIMEOUT) {
				char missing[160] = "";
				size_t len = 0;
				for (int64_t r = 1; r < o->world && len < sizeof(missing) - 24; r++)
					if (n->ctl[r] < 0)
						len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%" PRId64,
									len ? ", " : "", r);
				rc = vps_fail(VPS_ETIMEOUT, "bootstrap: rank %s did not come within %.0f s", missing,
					      o->timeout);
			}
			if (rc)
				goto fail;
			rc = recv_all(fd, &h, sizeof(h), o->timeout, "bootstrap: hello");
			if (rc || h.magic != HELLO_MAGIC || h.token != o->token || (int64_t)h.rank <= 0 ||
			    (int64_t)h.rank >= o->world || n->ctl[h.rank] >= 0) {
				/* not one of ours (another job, a port scan): ignore it */
				close(fd);
				k--;
				vps_clear_error();
				rc = VPS_OK;
				continue;
			}
			n->ctl[h.rank] = fd;
			table[h.rank].ip = from.sin_addr.s_addr;
			table[h.rank].port = (uint16_t)h.port;
			if ((int64_t)h.world != o->world && !bad[0])
				snprintf(bad, sizeof(bad), "rank %" PRIu64 " runs a world of %" PRIu64 ", rank 0 one of %" PRId64,
					 h.rank, h.world, o->world);
			else if (h.plan_hash != o->plan_hash && !bad[0])
				snprintf(bad, sizeof(bad),
					 "rank %" PRIu64 " holds another staged plan (hash 0x%016" PRIx64 ", rank 0 has 0x%016" PRIx64 ")",
					 h.rank, h.plan_hash, o->plan_hash);
		}
		for (int64_t r = 1; r < o->world; r++) {
			uint64_t status = bad[0] ? 1 : 0;
			VPS_CHECK_GOTO(send_all(n->ctl[r], &status, sizeof(status), o->timeout, "bootstrap: answer"), rc, fail);
			if (bad[0])
				VPS_CHECK_GOTO(send_all(n->ctl[r], bad, sizeof(bad), o->timeout, "bootstrap: answer"), rc, fail);
			else
				VPS_CHECK_GOTO(send_all(n->ctl[r], table, (size_t)o->world * sizeof(*table), o->timeout,
							"bootstrap: answer"),
					       rc, fail);
		}
		if (bad[0]) {
			rc = vps_fail(VPS_EPEER, "bootstrap: %s", bad);
			goto fail;
		}
	} else {
		struct hello h = {HELLO_MAGIC, o->token, (uint64_t)o->rank, (uint64_t)o->world, o->plan_hash,
				  (uint64_t)dport};
		uint64_t status;
		VPS_CHECK_GOTO(connect_retry(&master, deadline, &n->ctl[0], "bootstrap: rank 0"), rc, fail);
		VPS_CHECK_GOTO(send_all(n->ctl[0], &h, sizeof(h), o->timeout, "bootstrap: rank 0"), rc, fail);
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
		VPS_CHECK_GOTO(recv_all(n->ctl[0], table, (size_t)o->world * sizeof(*table), o->timeout, "bootstrap"), rc,
			       fail);
	}
	/* the mesh: connect to higher peers, accept lower ones */
	size_t lower = 0;
	for (size_t i = 0; i < n->npeers; i++) {
		int64_t p = n->peers[i];
		if (p < o->rank) {
			lower++;
			continue;
		}
		struct sockaddr_in sa = {0};
		sa.sin_family = AF_INET;
		sa.sin_addr.s_addr = table[p].ip;
		sa.sin_port = htons(table[p].port);
		snprintf(who, sizeof(who), "connecting to rank %" PRId64, p);
		VPS_CHECK_GOTO(connect_retry(&sa, now() + o->timeout, &n->fds[i], who), rc, fail);
		uint64_t id[2] = {o->token, (uint64_t)o->rank};
		VPS_CHECK_GOTO(send_all(n->fds[i], id, sizeof(id), o->timeout, who), rc, fail);
	}
	while (lower) {
		int fd;
		struct sockaddr_in from;
		uint64_t id[2];
		snprintf(who, sizeof(who), "waiting for %zu lower ranks to connect", lower);
		VPS_CHECK_GOTO(accept_one(dfd, now() + o->timeout, &fd, &from, who), rc, fail);
		if (recv_all(fd, id, sizeof(id), o->timeout, who) != VPS_OK || id[0] != o->token) {
			close(fd);
			vps_clear_error();
			continue;
		}
		int k = peer_index(n, (int64_t)id[1]);
		if (k < 0 || n->fds[k] >= 0 || (int64_t)id[1] >= o->rank) {
			close(fd);
			continue;
		}
		n->fds[k] = fd;
		lower--;
	}
	close(dfd);
	if (lfd >= 0)
		close(lfd);
	free(table);
	*out = n;
	return VPS_OK;
fail:
	if (dfd >= 0)
		close(dfd);
	if (lfd >= 0)
		close(lfd);
	free(table);
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
