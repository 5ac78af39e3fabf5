/* Exchanges: every message of a stage in flight at once, each a 16-byte
 * header (tag, payload bytes) then the payload, gathered from and
 * scattered into the callers' iovecs with sendmsg/recvmsg. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

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

/* The flows of msgs: each its peer's socket, its header ready to go. A
 * peer outside the mesh is a bug of the caller's: the mesh holds every
 * rank a plan exchanges with. */
static vps_result_t flows_init(const struct vps_net *n, const struct vps_net_msg *msgs, size_t nmsgs, struct flow *f,
			       const char *what)
{
	for (size_t i = 0; i < nmsgs; i++) {
		int k = vps_net_peer_index(n, msgs[i].peer);
		if (k < 0)
			return vps_fail(VPS_EINTERNAL, "%s: rank %" PRId64 " is not a peer of rank %" PRId64, what, msgs[i].peer,
					n->rank);
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
	return VPS_OK;
}

/* Whether a socket's error says its peer went away (closed, or reset it
 * as it exited): why, the control tree tells. */
static bool ended(int err) { return err == ECONNRESET || err == EPIPE || err == ECONNABORTED; }

/* Send what the socket takes now. */
static vps_result_t flow_send(struct vps_net *n, struct flow *f, double *last, const char *what)
{
	struct iovec v[64];
	while (f->sending) {
		struct msghdr mh = {0};
		mh.msg_iov = v;
		mh.msg_iovlen = (size_t)cursor_iov(&f->out, v, 64);
		ssize_t w = sendmsg(f->fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			break;
		if (w < 0) {
			n->peer_left = ended(errno);
			return vps_fail(VPS_EPEER, "%s: sending to rank %" PRId64 ": %s", what, f->peer, strerror(errno));
		}
		cursor_advance(&f->out, (size_t)w);
		n->sent += (uint64_t)w;
		*last = vps_net_now();
		if (cursor_finished(&f->out))
			f->sending = false;
	}
	return VPS_OK;
}

/* Receive what the socket holds now: the header alone first, so that the
 * payload's size is checked before any byte lands in a destination. */
static vps_result_t flow_recv(struct vps_net *n, struct flow *f, double *last, const char *what)
{
	struct iovec v[64];
	while (f->receiving) {
		bool had_header = f->in.hdr_done == 16;
		struct msghdr mh = {0};
		mh.msg_iov = v;
		mh.msg_iovlen = had_header ? (size_t)cursor_iov(&f->in, v, 64) : 1;
		if (!had_header) {
			v[0].iov_base = (unsigned char *)f->hdr_in + f->in.hdr_done;
			v[0].iov_len = 16 - f->in.hdr_done;
		}
		ssize_t g = mh.msg_iovlen ? recvmsg(f->fd, &mh, 0) : 0;
		if (mh.msg_iovlen && g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			break;
		if (mh.msg_iovlen && g <= 0) {
			n->peer_left = g == 0 || ended(errno);
			return g == 0 ? vps_fail(VPS_EPEER, "%s: rank %" PRId64 " closed the connection", what, f->peer)
				      : vps_fail(VPS_EPEER, "%s: rank %" PRId64 ": %s", what, f->peer, strerror(errno));
		}
		cursor_advance(&f->in, (size_t)(g > 0 ? g : 0));
		n->received += (uint64_t)(g > 0 ? g : 0);
		*last = vps_net_now();
		if (!had_header && f->in.hdr_done == 16 && (f->hdr_in[0] != f->tag || f->hdr_in[1] != f->in.total))
			return vps_fail(VPS_EPEER,
					"%s: rank %" PRId64 " sent message %016" PRIx64 " of %" PRIu64
					" bytes, expected %016" PRIx64 " of %zu (a different plan?)",
					what, f->peer, f->hdr_in[0], f->hdr_in[1], f->tag, f->in.total);
		if (cursor_finished(&f->in))
			f->receiving = false;
	}
	return VPS_OK;
}

/* No progress within the timeout: the ranks still owed or owing bytes. */
static vps_result_t stalled(const struct vps_net *n, const struct flow *f, size_t nmsgs, const char *what)
{
	char list[256] = "";
	size_t len = 0;
	for (size_t i = 0; i < nmsgs && len < sizeof(list) - 24; i++)
		if (f[i].sending || f[i].receiving)
			len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%" PRId64, len ? ", " : "", f[i].peer);
	return vps_fail(VPS_ETIMEOUT, "%s: no progress for %.0f s from rank %s", what, n->timeout, list);
}

/* Move what the sockets take and hold now (revents from poll). */
static vps_result_t flows_move(struct vps_net *n, struct flow *f, size_t nmsgs, const struct pollfd *pfd, double *last,
			       const char *what)
{
	size_t q = 0;
	for (size_t i = 0; i < nmsgs; i++) {
		if (!f[i].sending && !f[i].receiving)
			continue;
		short re = pfd[q++].revents;
		if (f[i].sending && (re & (POLLOUT | POLLERR | POLLHUP)))
			VPS_CHECK(flow_send(n, &f[i], last, what));
		if (f[i].receiving && (re & (POLLIN | POLLERR | POLLHUP)))
			VPS_CHECK(flow_recv(n, &f[i], last, what));
	}
	return VPS_OK;
}

vps_result_t vps_net_exchange(struct vps_net *n, struct vps_net_msg *msgs, size_t nmsgs, const char *what)
{
	struct flow *f = vps_calloc(nmsgs + 1, sizeof(*f));
	struct pollfd *pfd = vps_calloc(nmsgs + 2, sizeof(*pfd));
	if (!f || !pfd) {
		free(f);
		free(pfd);
		return VPS_ENOMEM;
	}
	n->peer_left = false;
	vps_result_t rc = flows_init(n, msgs, nmsgs, f, what);
	double last = vps_net_now();
	while (!rc) {
		size_t np = 0;
		for (size_t i = 0; i < nmsgs; i++) {
			short ev = (short)((f[i].sending ? POLLOUT : 0) | (f[i].receiving ? POLLIN : 0));
			if (ev)
				pfd[np++] = (struct pollfd){f[i].fd, ev, 0};
		}
		if (!np)
			break;
		/* the control tree says when a rank is gone: no one waits out its
		 * timeout for bytes that will not come */
		pfd[np] = (struct pollfd){n->ctl ? vps_ctl_gone_fd(n->ctl) : -1, POLLIN, 0};
		double left = n->timeout - (vps_net_now() - last);
		int r = left > 0 ? poll(pfd, np + 1, (int)(left * 1000) + 1) : 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = vps_fail_errno("%s: poll", what);
			break;
		}
		if (r == 0 && vps_net_now() - last >= n->timeout) {
			rc = stalled(n, f, nmsgs, what);
			break;
		}
		rc = flows_move(n, f, nmsgs, pfd, &last, what);
		if (rc || !(pfd[np].revents & POLLIN))
			continue;
		/* what this rank's own sockets say first: a peer that died closed
		 * them too */
		for (size_t i = 0; i < np; i++)
			pfd[i].revents = 0;
		if (poll(pfd, np, 0) > 0)
			rc = flows_move(n, f, nmsgs, pfd, &last, what);
		bool unfinished = false;
		for (size_t i = 0; i < nmsgs; i++)
			unfinished |= f[i].sending || f[i].receiving;
		if (!rc && unfinished)
			rc = vps_ctl_failure(n->ctl, what);
	}
	free(f);
	free(pfd);
	return rc;
}
