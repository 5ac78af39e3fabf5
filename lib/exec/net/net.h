/* The network between the executors of a job (lib/exec/net/README.md):
 * bootstrap through rank 0, a mesh of connections between the ranks that
 * exchange data, non-blocking exchanges with every message of a stage in
 * flight at once, and a control tree over which the small collectives, the
 * start of a switch, heartbeats and failures travel. Every connection
 * proves the job token; every wait is bounded by a timeout that names the
 * peer, or by the peers' heartbeats. The transports (lib/exec/transport)
 * carry their bytes over it; it knows nothing of plans or transfers. */
#ifndef VPS_NET_H
#define VPS_NET_H

#include <sys/uio.h>

#include "vps/vps.h"

struct vps_net;

/* The thread that serves control trees: their links, heartbeats, and the
 * collectives' messages. A network makes its own unless given one; several
 * networks of one process may share one (a harness that runs many ranks). */
struct vps_net_loop;
vps_result_t vps_net_loop_new(struct vps_net_loop **out);
/* Every network it serves must be freed first. Accepts NULL. */
void vps_net_loop_free(struct vps_net_loop *l);

struct vps_net_opts {
	int64_t rank, world;
	const char *master_host; /* rank 0 listens here */
	int master_port;
	double timeout;          /* seconds without progress before giving up */
	const char *token;       /* the job's secret: peers that cannot prove it are dropped */
	const char *bind;        /* listen here (NULL: the master's address, or the one that reaches it) */
	uint64_t plan_hash;      /* every rank must hold the same plan */
	const int64_t *peers;    /* ranks this rank exchanges data with */
	size_t npeers;
	struct vps_net_loop *loop; /* NULL: the network makes its own */
	/* what a wait for peers says while it lasts (may be NULL): whom it
	 * waits for, first after notice_after seconds, then every
	 * notice_every seconds (0: once); and a peer refused for the job
	 * token, after a few refusals */
	void (*notice)(void *ctx, const char *message);
	void *notice_ctx;
	double notice_after, notice_every;
};

vps_result_t vps_net_start(struct vps_net **out, const struct vps_net_opts *o);
void vps_net_free(struct vps_net *n);

/* One message of an exchange with a peer: bytes gathered from send_iov
 * are sent, bytes received are scattered into recv_iov (zero copies beyond
 * the kernel's own: the iovecs may point straight into the buffers). */
struct vps_net_msg {
	int64_t peer;
	bool send, recv;              /* this side sends / receives (possibly 0 bytes) */
	const struct iovec *send_iov;
	size_t send_iovcnt;
	const struct iovec *recv_iov;
	size_t recv_iovcnt;
	uint64_t tag;                 /* both sides must agree (stage, step, chunk) */
};

/* Send and receive every message at once; returns when all are done, when
 * no byte moved for the timeout, or as soon as the control tree learns
 * that a rank is gone. what names the exchange in messages ("stage 3"). */
vps_result_t vps_net_exchange(struct vps_net *n, struct vps_net_msg *msgs, size_t nmsgs, const char *what);

/* This rank's trainer, as the start of a switch waits for it. ready()
 * looks: 1 when its request is claimed, 0 not yet, -1 failed (the error
 * set). await(), or a plain sleep when NULL, sleeps up to `seconds` and
 * returns early when the trainer may have asked since ready() last looked
 * (its registry's bell rang). */
struct vps_net_trainer {
	int (*ready)(void *ctx);
	void (*await)(void *ctx, double seconds);
	void *ctx;
};

/* The start of a switch. Each rank's trainer requests it when it reaches
 * its switch point, and the ranks' requests may lie up to `window` seconds
 * apart; a rank whose trainer has not asked within the window of the
 * first says so, and every rank learns it. The trainer is looked at when
 * its await() wakes, and otherwise often at first and then at most every
 * few milliseconds, so that a rank waiting for its trainer costs next to
 * no CPU. A rank that is stopped, cut off or gone meanwhile is found by
 * its tree neighbours' heartbeats within the timeout. Returns when every
 * rank has claimed its request. */
vps_result_t vps_net_arrive(struct vps_net *n, const struct vps_net_trainer *tr, double window);

/* What this rank's network holds and moved (the report's connections, the
 * control-plane benchmark's figures). */
struct vps_net_stats {
	size_t data_connections;     /* to the ranks this rank exchanges data with */
	size_t control_connections;  /* to its parent and children in the control tree */
	size_t bootstrap_connections; /* the most it held while bootstrapping (rank 0: one a rank), all closed */
	uint64_t data_bytes_sent, data_bytes_received; /* of exchanges, headers included */
	uint64_t control_messages_sent, control_messages_received; /* the collectives' and failures' */
	/* "someone arrived" while the ranks wait for a switch: none when every
	 * rank arrives within the window, else one a link, sent whenever the
	 * window ends (so apart from the collective it belongs to) */
	uint64_t arrival_notices_sent, arrival_notices_received;
	uint64_t control_messages_per_collective; /* sent and received in one collective, at most (its parts and results) */
	/* those of the collective called last: a neighbour's part of the next
	 * one may come in before this rank's call returns, so a count of
	 * messages between two moments is not one collective's */
	uint64_t control_messages_last_collective;
	uint64_t control_bytes_sent, control_bytes_received;       /* those, with the heartbeats */
	uint64_t heartbeats_sent, heartbeats_received;
	double control_cpu_seconds;  /* the loop thread's time on this rank's tree */
	uint64_t control_wakes;      /* the events it handled for it */
	size_t memory, memory_peak;  /* bytes the network holds (now, and at most) */
};
void vps_net_stats(const struct vps_net *n, struct vps_net_stats *out);

/* The collectives over the control tree: every rank calls the same ones in
 * the same order; each rank sends and receives at most CTL_FANOUT + 1
 * messages each way, rank 0 no more than another. They wait for a rank as
 * long as it is alive (its heartbeats); one that is silent for the
 * timeout, or closes its connection, is named to every rank. */

/* Sum count (at most 64) numbers over all ranks (result on every rank). */
vps_result_t vps_net_allreduce_sum(struct vps_net *n, uint64_t *v, size_t count, const char *what);
/* Rank 0's len bytes (at most 512) to every rank. */
vps_result_t vps_net_broadcast(struct vps_net *n, void *buf, size_t len, const char *what);
/* Every rank says whether it succeeded: VPS_OK when all did. A rank whose
 * own result failed (mine) keeps its code and its own words (and every
 * rank learns them at once); the others learn the first failure to reach
 * them, naming the rank (VPS_EPEER). */
vps_result_t vps_net_agree_result(struct vps_net *n, vps_result_t mine, const char *what);
/* Tell every rank that this one failed, and why (an executor that stops
 * outside a collective). */
void vps_net_abort(struct vps_net *n, const char *why);
/* The tests' fault VPS_FAULT_CUT (exec/fault.h): every data connection
 * shut down both ways, the sockets kept, the process going on, as a link
 * that breaks while both ends live. */
void vps_net_cut(struct vps_net *n);

/* Combine count numbers over all ranks (result on every rank) with an
 * associative, commutative combine(acc, in, count), between mesh peers: the
 * ranks vps_net_tree_peers names must be among each rank's peers.
 * O(count log W) bytes per rank, rank 0 no more than another. */
vps_result_t vps_net_allreduce(struct vps_net *n, int64_t *v, size_t count,
			       void (*combine)(int64_t *acc, const int64_t *in, size_t count), const char *what);
/* Element-wise maximum: a combine for vps_net_allreduce. */
void vps_net_max(int64_t *acc, const int64_t *in, size_t count);
/* The peers rank exchanges with in vps_net_allreduce (at most 64, written
 * to out); returns their number. */
size_t vps_net_tree_peers(int64_t rank, int64_t world, int64_t *out);
/* Rank's neighbours in the control tree: its parent first (none for rank
 * 0), then its children (at most 1 + CTL_FANOUT, written to out); returns
 * their number. */
size_t vps_net_ctl_neighbours(int64_t rank, int64_t world, int64_t *out);

#endif
