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
#include <sys/epoll.h>
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

/* The connections being proven, each in the epoll set by its slot. */
struct pending {
	struct inbound *v;
	size_t n, cap;   /* v[0..n) in use; v[i].fd < 0: a free slot */
	size_t *free_slots;
	size_t nfree;
	size_t live;
};

enum { TAG_LISTEN = 0, TAG_OUT = 1, TAG_IN = 2 };
#define EV_DATA(tag, i) (((uint64_t)(i) << 2) | (tag))

static void drop_slot(struct pending *p, size_t i)
{
	close(p->v[i].fd); /* leaves the epoll set with it */
	p->v[i].fd = -1;
	p->free_slots[p->nfree++] = i;
	p->live--;
}

/* The pending connection that came first, or -1. */
static ssize_t oldest_slot(const struct pending *p)
{
	ssize_t oldest = -1;
	for (size_t i = 0; i < p->n; i++)
		if (p->v[i].fd >= 0 && (oldest < 0 || p->v[i].deadline < p->v[oldest].deadline))
			oldest = (ssize_t)i;
	return oldest;
}

/* When a full set of pending connections makes room: its oldest may go
 * once it had half its time (a real peer proves itself in a round trip,
 * so a flood of idle connections cannot keep one out for long), and until
 * then the new ones wait in the kernel's queue. 0: there is room now. */
static double room_at(const struct pending *p)
{
	if (p->live < p->cap)
		return 0;
	ssize_t o = oldest_slot(p);
	return o < 0 ? 0 : p->v[o].deadline - AUTH_SECONDS / 2;
}

static void accept_new(struct handshake *hs, struct pending *p, int ep)
{
	/* a few a wake, so that the proofs in flight keep moving */
	for (int k = 0; k < 64; k++) {
		if (p->live == p->cap) {
			if (room_at(p) > vps_net_now())
				return;
			drop_slot(p, (size_t)oldest_slot(p));
			hs->dropped++;
		}
		struct sockaddr_in from;
		socklen_t l = sizeof(from);
		int fd = accept4(hs->lfd, (struct sockaddr *)&from, &l, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		vps_net_tune(fd);
		size_t i = p->nfree ? p->free_slots[--p->nfree] : p->n++;
		struct inbound *in = &p->v[i];
		memset(in, 0, sizeof(*in));
		in->fd = fd;
		in->from = from;
		in->deadline = vps_net_now() + AUTH_SECONDS;
		struct challenge c = {HELLO_MAGIC, {0}};
		struct epoll_event ev = {EPOLLIN, {.u64 = EV_DATA(TAG_IN, i)}};
		p->live++;
		if (vps_auth_random(c.nonce, sizeof(c.nonce)) != VPS_OK ||
		    send(fd, &c, sizeof(c), MSG_NOSIGNAL) != (ssize_t)sizeof(c) || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
			vps_clear_error();
			drop_slot(p, i);
			continue;
		}
		memcpy(in->nonce, c.nonce, sizeof(c.nonce));
	}
}

/* Whether a source refused count times is named now: at REFUSALS_NAMED
 * refusals, then, where the notice repeats, every notice_every seconds
 * with its count (*said_at: when it was last named, 0 never). */
static bool named_now(const struct handshake *hs, size_t count, double *said_at)
{
	double t = vps_net_now(), every = hs->n ? hs->n->notice_every : 0;
	if (*said_at ? every <= 0 || t - *said_at < every : count < REFUSALS_NAMED)
		return false;
	*said_at = t;
	return true;
}

/* Where a hello that does not prove the token came from: each source is
 * named once it has been refused REFUSALS_NAMED times (and, where the
 * notice repeats, again with its count), while every one is refused. The
 * rank is the hello's claim: nothing proves it. */
static void refused(struct handshake *hs, const struct inbound *p)
{
	struct refuser *r = NULL;
	for (size_t i = 0; i < hs->nrefused && !r; i++)
		if (hs->refused[i].ip == p->from.sin_addr.s_addr && hs->refused[i].rank == p->h.from)
			r = &hs->refused[i];
	if (!r && hs->nrefused == REFUSERS_MAX)
		return;
	if (!r) {
		r = &hs->refused[hs->nrefused++];
		*r = (struct refuser){p->from.sin_addr.s_addr, p->h.from, 0, 0};
	}
	r->count++;
	if (!named_now(hs, r->count, &r->said_at))
		return;
	char who[96];
	if (r->rank < (uint64_t)hs->world && r->rank != (uint64_t)hs->me)
		snprintf(who, sizeof(who), "rank %" PRIu64 " at %s (as its hello says)", r->rank, inet_ntoa(p->from.sin_addr));
	else
		snprintf(who, sizeof(who), "an executor at %s", inet_ntoa(p->from.sin_addr));
	vps_net_say(hs->n, "%s was refused %zu times: it does not prove the job token (another job's VPS_TOKEN?)", who,
		    r->count);
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
	if (p->h.magic != HELLO_MAGIC)
		return -1;
	if (!vps_auth_equal(&mac, &p->h.mac, sizeof(mac))) {
		refused(hs, p);
		return -1;
	}
	if (p->h.kind >= 32 || !(hs->kinds & (1u << p->h.kind)) || (int64_t)p->h.to != hs->me) {
		vps_fail(VPS_EPEER, "an executor of this job at %s sent a %s hello for rank %" PRIu64 " to rank %" PRId64,
			 inet_ntoa(p->from.sin_addr),
			 p->h.kind == HELLO_CTL ? "bootstrap" : p->h.kind == HELLO_TREE ? "control" : "data", p->h.to, hs->me);
		return -2;
	}
	uint64_t proof = proof_mac(hs->key, p->h.nonce, (uint64_t)hs->me);
	if (send(p->fd, &proof, sizeof(proof), MSG_NOSIGNAL) != (ssize_t)sizeof(proof))
		return -1;
	return hs->admit(hs->ctx, &p->h, p->fd, &p->from) < 0 ? -2 : 1;
}

static vps_result_t out_connect(struct outbound *o, int ep, size_t i)
{
	o->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (o->fd < 0)
		return vps_fail_errno("socket");
	o->got = 0;
	int r = connect(o->fd, (const struct sockaddr *)&o->sa, sizeof(o->sa));
	int e = errno;
	if (r == 0 || e == EINPROGRESS) {
		o->state = r == 0 ? OUT_CHALLENGE : OUT_CONNECTING;
		if (r == 0)
			o->last_errno = 0;
		struct epoll_event ev = {r == 0 ? EPOLLIN : EPOLLOUT, {.u64 = EV_DATA(TAG_OUT, i)}};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, o->fd, &ev))
			return vps_fail_errno("epoll_ctl");
		return VPS_OK;
	}
	close(o->fd);
	o->fd = -1;
	o->last_errno = e;
	if (e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT && e != ENETUNREACH && e != EAGAIN)
		return vps_fail(VPS_EPEER, "connect to rank %" PRId64 " at %s:%d: %s", o->rank, inet_ntoa(o->sa.sin_addr),
				ntohs(o->sa.sin_port), strerror(e));
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

/* The acceptor closed after our hello: it did not take our proof. Said
 * after REFUSALS_NAMED times (again with the count where the notice
 * repeats); the connector keeps trying until the deadline. */
static void turned_away(struct handshake *hs, struct outbound *o)
{
	o->turned_away = true;
	if (!named_now(hs, ++o->refusals, &o->said_at))
		return;
	vps_net_say(hs->n, "rank %" PRId64 " at %s:%d turned this rank away %zu times: another job's VPS_TOKEN?", o->rank,
		    inet_ntoa(o->sa.sin_addr), ntohs(o->sa.sin_port), o->refusals);
}

static vps_result_t out_progress(struct handshake *hs, struct outbound *o, uint32_t revents, int ep)
{
	if (o->state == OUT_CONNECTING) {
		int err = 0;
		socklen_t l = sizeof(err);
		getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &l);
		if (err == EINPROGRESS || !(revents & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return VPS_OK;
		if (err) {
			o->last_errno = err;
			out_retry(o);
			return VPS_OK;
		}
		o->last_errno = 0;
		vps_net_tune(o->fd);
		o->state = OUT_CHALLENGE;
		struct epoll_event ev = {EPOLLIN, {.u64 = 0}};
		ev.data.u64 = EV_DATA(TAG_OUT, (size_t)(o - hs->out));
		if (epoll_ctl(ep, EPOLL_CTL_MOD, o->fd, &ev))
			return vps_fail_errno("epoll_ctl");
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
		if (o->state == OUT_PROOF)
			turned_away(hs, o);
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
		o->h = (struct hello){HELLO_MAGIC, o->kind, (uint64_t)hs->me, (uint64_t)o->rank, (uint64_t)hs->world,
				      hs->plan_hash, hs->listen, {0}, 0};
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
	/* the connection is the caller's from here: out of this epoll set */
	epoll_ctl(ep, EPOLL_CTL_DEL, o->fd, NULL);
	return VPS_OK;
}

/* The next thing to do by time: a retry, a pending proof's end, the
 * deadline; drops the pending connections whose time is up. */
static double next_wake(struct handshake *hs, struct pending *p, double t)
{
	double wake = hs->deadline;
	for (size_t i = 0; i < hs->nout; i++)
		if (hs->out[i].state == OUT_IDLE && hs->out[i].retry_at < wake)
			wake = hs->out[i].retry_at;
	for (size_t i = 0; i < p->n; i++) {
		if (p->v[i].fd < 0)
			continue;
		if (p->v[i].deadline <= t) {
			drop_slot(p, i);
			hs->dropped++;
		} else if (p->v[i].deadline < wake) {
			wake = p->v[i].deadline;
		}
	}
	return wake;
}

vps_result_t vps_net_handshake(struct handshake *hs)
{
	struct pending p = {0};
	p.cap = hs->want_in ? MAX_PENDING : 0;
	p.v = vps_calloc(p.cap + 1, sizeof(*p.v));
	p.free_slots = vps_calloc(p.cap + 1, sizeof(*p.free_slots));
	int ep = epoll_create1(EPOLL_CLOEXEC);
	vps_result_t rc = !p.v || !p.free_slots ? VPS_ENOMEM : ep < 0 ? vps_fail_errno("epoll_create1") : VPS_OK;
	struct epoll_event ev[64];
	for (size_t i = 0; i < hs->nout; i++) {
		hs->out[i].fd = -1;
		hs->out[i].state = OUT_IDLE;
		hs->out[i].retry_at = 0;
		hs->out[i].refusals = 0;
		hs->out[i].last_errno = 0;
		hs->out[i].said_at = 0;
	}
	bool listening = false;
	while (!rc) {
		/* the listener is watched while there is room for what it brings */
		double room = room_at(&p);
		bool want = hs->want_in && room <= vps_net_now();
		if (want != listening) {
			struct epoll_event lev = {EPOLLIN, {.u64 = EV_DATA(TAG_LISTEN, 0)}};
			if (epoll_ctl(ep, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, hs->lfd, &lev)) {
				rc = vps_fail_errno("epoll_ctl");
				break;
			}
			listening = want;
		}
		double t = vps_net_now();
		size_t left_out = 0;
		for (size_t i = 0; i < hs->nout && !rc; i++) {
			struct outbound *o = &hs->out[i];
			if (o->state == OUT_IDLE && o->retry_at <= t)
				rc = out_connect(o, ep, i);
			left_out += o->state != OUT_DONE;
		}
		if (rc || (!hs->want_in && !left_out))
			break;
		if (hs->wait && vps_net_wait_due(hs->n, hs->wait, t)) {
			char what[512], waited[64];
			hs->awaited(hs->ctx, hs, what, sizeof(what));
			vps_net_waited(hs->n, hs->wait, t, waited, sizeof(waited));
			vps_net_say(hs->n, "%s %s", what, waited);
		}
		if (t >= hs->deadline) {
			rc = vps_fail(VPS_ETIMEOUT, "timed out");
			break;
		}
		double wake = next_wake(hs, &p, t);
		if (hs->want_in && !listening && room > t && room < wake)
			wake = room;
		if (hs->wait && hs->wait->next && hs->wait->next < wake)
			wake = hs->wait->next;
		int ne = epoll_wait(ep, ev, 64, (int)((wake - t) * 1000) + 1);
		if (ne < 0 && errno != EINTR)
			rc = vps_fail_errno("epoll_wait");
		bool listener = false;
		for (int k = 0; k < ne && !rc; k++) {
			size_t i = (size_t)(ev[k].data.u64 >> 2);
			switch (ev[k].data.u64 & 3) {
			case TAG_LISTEN:
				listener = true;
				break;
			case TAG_OUT:
				if (hs->out[i].fd >= 0 && hs->out[i].state != OUT_DONE)
					rc = out_progress(hs, &hs->out[i], ev[k].events, ep);
				break;
			default: {
				if (p.v[i].fd < 0)
					break;
				int r = read_pending(hs, &p.v[i]);
				if (r == -2) {
					rc = VPS_EPEER;
				} else if (r == -1) {
					drop_slot(&p, i);
					hs->dropped++;
				} else if (r == 1) {
					/* the admitted connection is the caller's now */
					epoll_ctl(ep, EPOLL_CTL_DEL, p.v[i].fd, NULL);
					p.v[i].fd = -1;
					p.free_slots[p.nfree++] = i;
					p.live--;
					hs->want_in--;
				}
			}
			}
		}
		if (!rc && listener && hs->want_in)
			accept_new(hs, &p, ep);
	}
	for (size_t i = 0; i < p.n; i++)
		if (p.v[i].fd >= 0)
			close(p.v[i].fd);
	if (ep >= 0)
		close(ep);
	free(p.v);
	free(p.free_slots);
	return rc;
}

const char *vps_net_out_state(const struct outbound *o)
{
	if (o->turned_away)
		return "it turned this rank away";
	if (o->state == OUT_CHALLENGE || o->state == OUT_PROOF)
		return "connected, no answer yet";
	if (o->last_errno == ECONNREFUSED)
		return "nobody accepts there yet";
	return o->last_errno ? strerror(o->last_errno) : "connecting";
}

void vps_net_dropped_note(const struct handshake *hs, char *out, size_t size)
{
	out[0] = '\0';
	if (!hs->dropped)
		return;
	/* the source refused most, the likely rank of another job's token */
	const struct refuser *most = NULL;
	for (size_t i = 0; i < hs->nrefused; i++)
		if (!most || hs->refused[i].count > most->count)
			most = &hs->refused[i];
	char from[128] = "";
	if (most && most->rank < (uint64_t)hs->world && most->rank != (uint64_t)hs->me)
		snprintf(from, sizeof(from), ", %zu of them from %s as rank %" PRIu64, most->count,
			 inet_ntoa((struct in_addr){most->ip}), most->rank);
	else if (most)
		snprintf(from, sizeof(from), ", %zu of them from %s", most->count, inet_ntoa((struct in_addr){most->ip}));
	snprintf(out, size, " (%zu connections that did not prove the job token were dropped%s: does every rank hold the same VPS_TOKEN?)",
		 hs->dropped, from);
}
