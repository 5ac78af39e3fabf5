/* The start of a switch (vps_net_arrive): each rank waits for its
 * trainer's request and, once it is claimed, adds its part to an arrival
 * over the control tree; the go comes back down from rank 0 when every
 * rank's part is in. The tree's loop keeps the heartbeats meanwhile, so a
 * rank that waits watches no more sockets than its tree neighbours. The
 * request wakes the rank's thread (the trainer's await: the registry's
 * bell); the thread also looks now and then for what wakes nothing: a
 * trainer that died, a peer's failure on the tree. */
#include <stdio.h>
#include <time.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

/* Between wakes, the trainer is looked at after an eighth of the time
 * waited so far, from POLL_FIRST to POLL_MOST: a trainer without a bell
 * (await NULL) is seen within a fraction of a millisecond when it asks at
 * once, a late one at most an eighth later, and a rank that waits long
 * costs a hundred looks a second (each of which reads the trainer's
 * registry and checks its pid: a few system calls). A request that rings
 * is seen at once whatever the gap. */
#define POLL_FIRST 0.0002
#define POLL_MOST 0.01

static double gap_after(double waited)
{
	double g = waited / 8;
	return g < POLL_FIRST ? POLL_FIRST : g > POLL_MOST ? POLL_MOST : g;
}

static void nap(double seconds)
{
	struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
	nanosleep(&ts, NULL);
}

/* Sleep up to `seconds`, or until the trainer rings. */
static void idle(const struct vps_net_trainer *tr, double seconds)
{
	if (tr->await)
		tr->await(tr->ctx, seconds);
	else
		nap(seconds);
}

/* One rank alone: its own request is the start. */
static vps_result_t arrive_alone(const struct vps_net_trainer *tr)
{
	for (double t0 = vps_net_now();;) {
		int k = tr->ready(tr->ctx);
		if (k < 0)
			return VPS_EPEER;
		if (k)
			return VPS_OK;
		idle(tr, gap_after(vps_net_now() - t0));
	}
}

vps_result_t vps_net_arrive(struct vps_net *n, const struct vps_net_trainer *tr, double window)
{
	struct ctl *c = n->ctl;
	if (!c)
		return arrive_alone(tr);
	vps_ctl_arrive_begin(c, window);
	bool mine = false;
	struct net_wait w = {0, 0};
	for (double t0 = vps_net_now();;) {
		if (!mine) {
			int k = tr->ready(tr->ctx);
			if (k < 0) {
				/* every rank learns why at once, not after its own timeout */
				char why[2048];
				snprintf(why, sizeof(why), "%s", vps_last_error());
				vps_ctl_fail(c, false, why);
				return vps_ctl_own_failure(c, VPS_EPEER, 0, false, why);
			}
			if (k) {
				mine = true;
				vps_ctl_arrive_mine(c);
				vps_net_wait_begin(n, &w);
			}
		}
		double first, t = vps_net_now();
		if (mine && vps_net_wait_due(n, &w, t)) {
			char so_far[128];
			if (window < 1e9)
				snprintf(so_far, sizeof(so_far), "(%.0f s so far; the ranks' requests may lie %g s apart)",
					 t - w.start, window);
			else
				snprintf(so_far, sizeof(so_far), "(%.0f s so far)", t - w.start);
			vps_ctl_say_awaited(c, "the switch's start", so_far);
		}
		/* with its part in, only the tree moves it on: wait on it; without,
		 * the trainer's bell (the tree is looked at again after the gap) */
		int r = vps_ctl_arrive_wait(c, !mine ? 0 : w.next ? w.next - t : -1, &first);
		if (r > 0)
			return VPS_OK;
		if (r < 0)
			return vps_ctl_failure(c, NULL);
		if (!mine && first >= 0 && vps_net_now() - first > window) {
			char why[256];
			snprintf(why, sizeof(why),
				 "the trainer did not request the switch within %g s of the first rank's request (--request-timeout)",
				 window);
			vps_ctl_fail(c, false, why);
			return vps_fail(VPS_ETIMEOUT, "%s", why);
		}
		if (!mine)
			idle(tr, gap_after(t - t0));
	}
}
