/* Collectives: the small ones over the control tree (control.c), each
 * rank's part up to rank 0 and the result back down, and the all-reduce of
 * the stage boundaries between mesh peers, in log2 W rounds. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

vps_result_t vps_net_allreduce_sum(struct vps_net *n, uint64_t *v, size_t count, const char *what)
{
	if (!n->ctl)
		return VPS_OK;
	if (count > CTL_PART_MAX / sizeof(*v))
		return vps_fail(VPS_EINTERNAL, "%s: %zu numbers, more than a sum carries", what, count);
	return vps_ctl_collective(n->ctl, CTL_SUM, v, count * sizeof(*v), what);
}

vps_result_t vps_net_broadcast(struct vps_net *n, void *buf, size_t len, const char *what)
{
	return n->ctl ? vps_ctl_collective(n->ctl, CTL_BCAST, buf, len, what) : VPS_OK;
}

/* How long a rank whose peer's connection ended waits for what that was
 * about. A rank that leaves says why before it closes its connections, and
 * one that dies closes its control links too, which its tree neighbours
 * report: either reaches every rank within milliseconds (5 s leaves room
 * for a loaded machine). When nothing comes, the link itself broke while
 * both ranks ran, and nothing will come: both ends waited out --timeout
 * for it (30 s in exec.bats's test of it). */
#define LEFT_PATIENCE 5.0

vps_result_t vps_net_agree_result(struct vps_net *n, vps_result_t mine, const char *what)
{
	if (!n->ctl)
		return mine;
	if (!mine)
		return vps_ctl_collective(n->ctl, CTL_BARRIER, NULL, 0, what);
	/* every rank learns it now, not when the others are done: the failed
	 * rank waits for no one */
	char words[2048];
	snprintf(words, sizeof(words), "%s", vps_last_error());
	bool timeout = mine == VPS_ETIMEOUT, left = !timeout && n->peer_left;
	n->peer_left = false;
	vps_ctl_fail(n->ctl, timeout || left, words);
	double patience = timeout ? n->timeout : left ? fmin(n->timeout, LEFT_PATIENCE) : 0;
	return vps_ctl_own_failure(n->ctl, mine, patience, left, words);
}

void vps_net_abort(struct vps_net *n, const char *why)
{
	if (n && n->ctl)
		vps_ctl_fail(n->ctl, false, why);
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

