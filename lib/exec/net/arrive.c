/* The start of a switch (vps_net_arrive): the ranks wait for their
 * trainers' requests, with heartbeats through rank 0, and start together. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

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
	if (vps_net_recv_all(fd, why, sizeof(why), timeout, "abort") != VPS_OK)
		snprintf(why, sizeof(why), "failed");
	why[sizeof(why) - 1] = '\0';
	return vps_fail(VPS_EPEER, "rank %" PRId64 ": %s", rank, why);
}

/* Rank 0's view of the wait: who arrived, and when each was last heard. */
struct waiting {
	struct vps_net *n;
	double *last;
	bool *arrived;
	struct pollfd *pfd;
	int64_t count;  /* ranks other than 0 that arrived */
	double first;   /* the first request, or -1 */
	double window;
	bool mine;      /* rank 0's own trainer's request is claimed */
};

/* The requests lie more than the window apart: the ranks not there yet. */
static vps_result_t too_late(const struct waiting *wt)
{
	char late[160] = "";
	size_t len = 0;
	if (!wt->mine)
		len += (size_t)snprintf(late, sizeof(late), "0");
	for (int64_t r = 1; r < wt->n->world && len + 24 < sizeof(late); r++)
		if (!wt->arrived[r])
			len += (size_t)snprintf(late + len, sizeof(late) - len, "%s%" PRId64, len ? ", " : "", r);
	return vps_fail(VPS_ETIMEOUT,
			"the trainer of rank %s did not request the switch within %.0f s of the first (--request-timeout)", late,
			wt->window);
}

/* A rank that has not arrived must be heard from within the timeout. */
static vps_result_t check_alive(const struct waiting *wt, double t)
{
	const struct vps_net *n = wt->n;
	for (int64_t r = 1; r < n->world; r++)
		if (!wt->arrived[r] && t - wt->last[r] > n->timeout)
			return vps_fail(VPS_ETIMEOUT,
					"rank %" PRId64 " gave no sign of life for %.0f s while the ranks waited for the switch"
					" (stopped, or cut off?)",
					r, n->timeout);
	return VPS_OK;
}

/* What the ranks sent rank 0 since the last look. */
static vps_result_t read_news(struct waiting *wt, double wait)
{
	struct vps_net *n = wt->n;
	int64_t W = n->world;
	for (int64_t r = 1; r < W; r++)
		wt->pfd[r - 1] = (struct pollfd){n->ctl[r], POLLIN, 0};
	int pr = wait_news(wt->pfd, (size_t)(W - 1), wait);
	for (int64_t r = 1; r < W && pr > 0; r++) {
		if (!wt->pfd[r - 1].revents)
			continue;
		char m;
		ssize_t g = recv(n->ctl[r], &m, 1, 0);
		if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (g <= 0)
			return vps_fail(VPS_EPEER,
					"rank %" PRId64 "'s executor closed its connection while the ranks waited for the switch", r);
		if (m == MSG_HEARTBEAT) {
			wt->last[r] = vps_net_now();
		} else if (m == MSG_ARRIVED && !wt->arrived[r]) {
			wt->arrived[r] = true;
			wt->count++;
			if (wt->first < 0)
				wt->first = vps_net_now();
		} else if (m == MSG_ABORT) {
			return read_abort(n->ctl[r], r, n->timeout);
		} else {
			return vps_fail(VPS_EPEER, "rank %" PRId64 " sent 0x%02x while the ranks waited for the switch", r,
					(unsigned char)m);
		}
	}
	return VPS_OK;
}

/* Rank 0 polls its own trainer, hears every rank, beats for all, and
 * says go when every rank arrived; a failure reaches every rank at once. */
static vps_result_t wait_all(struct waiting *wt, int (*ready)(void *), void *ctx)
{
	struct vps_net *n = wt->n;
	double t = vps_net_now(), next_beat = t, period = heartbeat_period(n);
	for (int64_t r = 0; r < n->world; r++)
		wt->last[r] = t;
	for (;;) {
		if (!wt->mine) {
			int k = ready(ctx);
			if (k < 0)
				return VPS_EPEER;
			if (k) {
				wt->mine = true;
				if (wt->first < 0)
					wt->first = vps_net_now();
			}
		}
		if (wt->mine && wt->count == n->world - 1)
			return VPS_OK;
		t = vps_net_now();
		if (wt->first >= 0 && t - wt->first > wt->window)
			return too_late(wt);
		VPS_CHECK(check_alive(wt, t));
		if (t >= next_beat) {
			/* to the ranks that arrived too: they wait on rank 0 */
			for (int64_t r = 1; r < n->world; r++)
				tell(n->ctl[r], MSG_HEARTBEAT);
			next_beat = t + period;
		}
		VPS_CHECK(read_news(wt, wt->mine ? period / 4 : 0.0002));
	}
}

static vps_result_t arrive_rank0(struct vps_net *n, int (*ready)(void *), void *ctx, double window)
{
	int64_t W = n->world;
	struct waiting wt = {n, vps_malloc((size_t)W * sizeof(double)), vps_calloc((size_t)W, sizeof(bool)),
			     vps_malloc((size_t)W * sizeof(struct pollfd)), 0, -1, window, false};
	vps_result_t rc = VPS_ENOMEM;
	if (wt.last && wt.arrived && wt.pfd) {
		rc = wait_all(&wt, ready, ctx);
		/* every rank learns why at once, not after its own timeout */
		for (int64_t r = 1; r < W && rc; r++)
			tell_abort(n->ctl[r], vps_last_error());
		for (int64_t r = 1; r < W && !rc; r++) {
			char go = MSG_GO;
			rc = vps_net_send_all(n->ctl[r], &go, 1, n->timeout, "start of the switch");
		}
	}
	free(wt.last);
	free(wt.arrived);
	free(wt.pfd);
	return rc;
}

static vps_result_t arrive_other(struct vps_net *n, int (*ready)(void *), void *ctx)
{
	double t = vps_net_now(), last = t, next_beat = t, period = heartbeat_period(n);
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
				VPS_CHECK(vps_net_send_all(fd, &a, 1, n->timeout, "start of the switch: rank 0"));
				mine = true;
			}
		}
		t = vps_net_now();
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
			last = vps_net_now();
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
