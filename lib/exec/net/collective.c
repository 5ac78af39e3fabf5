/* Collectives: sums, broadcasts and the ranks' agreement through rank 0
 * over the bootstrap connections, and the all-reduce of the stage
 * boundaries between mesh peers, in log2 W rounds. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

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
		VPS_CHECK(vps_net_send_all(n->ctl[0], buf, len, n->timeout, who));
		/* rank 0 may first wait out a silent rank */
		return vps_net_recv_all(n->ctl[0], buf, len, 2 * n->timeout + 1, who);
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
	double last = vps_net_now();
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
		double left = n->timeout - (vps_net_now() - last);
		int pr = left > 0 ? poll(pfd, np, (int)(left * 1000) + 1) : 0;
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0 && vps_net_now() - last >= n->timeout) {
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
			last = vps_net_now();
		}
	}
	for (int64_t r = 1; r < W; r++)
		if (!gone[r] && combine)
			combine(buf, in + (size_t)r * len, len);
	for (int64_t r = 1; r < W; r++) {
		if (gone[r])
			continue;
		snprintf(who, sizeof(who), "%s: rank %" PRId64, what, r);
		vps_result_t e = vps_net_send_all(n->ctl[r], buf, len, n->timeout, who);
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

vps_result_t vps_net_agree_result(struct vps_net *n, vps_result_t mine, const char *what)
{
	/* the agree leaves the first failure's words as the last error */
	char saved[1024] = "";
	if (mine)
		snprintf(saved, sizeof(saved), "%s", vps_last_error());
	vps_result_t agreed = vps_net_agree(n, mine == VPS_OK, what);
	return mine ? vps_fail(mine, "%s", saved) : agreed;
}
