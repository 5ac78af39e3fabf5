/* The network between the executors of a job (lib/exec/net/README.md):
 * bootstrap through rank 0, a mesh of connections between the ranks that
 * exchange data, non-blocking exchanges with every message of a stage in
 * flight at once, small collectives through rank 0, and the start of a
 * switch. Every connection proves the job token; every wait is bounded by
 * a timeout that names the peer. The transports (lib/exec/transport) carry
 * their bytes over it; it knows nothing of plans or transfers. */
#ifndef VPS_NET_H
#define VPS_NET_H

#include <sys/uio.h>

#include "vps/vps.h"

struct vps_net;

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

/* Send and receive every message at once; returns when all are done.
 * what names the exchange in messages ("stage 3"). */
vps_result_t vps_net_exchange(struct vps_net *n, struct vps_net_msg *msgs, size_t nmsgs, const char *what);

/* The start of a switch. Each rank's trainer requests it when it reaches
 * its switch point, and the ranks' requests may lie up to `window` seconds
 * apart. While they wait the ranks exchange heartbeats through rank 0, so
 * that a rank that is stopped, cut off or gone is found within the timeout,
 * not the window. ready() polls this rank's trainer: 1 when its request is
 * claimed, 0 not yet, -1 failed (the error set). Returns when every rank
 * has claimed its request; from then on the ordinary timeout applies. */
vps_result_t vps_net_arrive(struct vps_net *n, int (*ready)(void *ctx), void *ctx, double window);

/* Bytes this rank's exchanges sent and received so far, headers included. */
void vps_net_traffic(const struct vps_net *n, uint64_t *sent, uint64_t *received);

/* Set the timeout of later waits; returns the previous one. */
double vps_net_set_timeout(struct vps_net *n, double timeout);

/* Sum n values over all ranks (result on every rank). */
vps_result_t vps_net_allreduce_sum(struct vps_net *n, uint64_t *v, size_t count, const char *what);
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
/* Rank 0's bytes to every rank. */
vps_result_t vps_net_broadcast(struct vps_net *n, void *buf, size_t len, const char *what);
/* Everyone reports ok/failure; returns VPS_EPEER naming a failed rank if
 * any failed. */
vps_result_t vps_net_agree(struct vps_net *n, bool ok, const char *what);
/* The same for a result: a rank whose own result failed (mine) keeps its
 * code and its own words, the others learn the first failure's
 * (VPS_EPEER); VPS_OK when every rank succeeded. */
vps_result_t vps_net_agree_result(struct vps_net *n, vps_result_t mine, const char *what);

#endif
