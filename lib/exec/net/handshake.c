/* Proving membership of the job: challenge, hello, proof.
 *
 * The acceptor sends a fresh nonce; the connector answers with a hello
 * (who it is, what it holds, its own nonce) authenticated by a MAC over
 * both; the acceptor answers with a MAC over the connector's nonce. The
 * token never travels, a recorded exchange cannot be replayed, and each
 * side knows the other holds the job's token. Connections that have not
 * proven themselves within AUTH_SECONDS of their accept are dropped; they
 * cannot hold the job, whatever they send. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/internal.h"
#include "exec/net/net_int.h"

#define AUTH_SECONDS 5.0

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
	vps_net_tune(fd);
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
	p->deadline = vps_net_now() + AUTH_SECONDS;
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
	o->retry_at = vps_net_now() + 0.02;
	return VPS_OK;
}

static void out_retry(struct outbound *o)
{
	close(o->fd);
	o->fd = -1;
	o->state = OUT_IDLE;
	o->retry_at = vps_net_now() + 0.02;
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
		vps_net_tune(o->fd);
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
vps_result_t vps_net_handshake(struct handshake *hs)
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
		double t = vps_net_now(), wake = hs->deadline;
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

void vps_net_dropped_note(const struct handshake *hs, char *out, size_t size)
{
	out[0] = '\0';
	if (hs->dropped)
		snprintf(out, size, " (%zu connections that did not prove the job token were dropped: does every rank hold the same VPS_TOKEN?)",
			 hs->dropped);
}
