/* What the files of lib/exec/net share and nothing outside it sees: the
 * network object, deadline-bounded socket I/O, and the handshake that
 * proves a connection belongs to the job. */
#ifndef VPS_NET_INT_H
#define VPS_NET_INT_H

#include <netinet/in.h>

#include "exec/net/net.h"
#include "util/auth.h"

#define HELLO_MAGIC 0x3254454e535056ULL /* "VPSNET2" */

struct vps_net {
	int64_t rank, world;
	double timeout;
	int *ctl;          /* rank 0: one per rank; others: ctl[0] */
	int64_t *peers;    /* sorted */
	int *fds;          /* data socket per peer */
	size_t npeers;
	uint64_t sent, received; /* bytes of exchanges, headers included */
};

/* Where a rank's data listener is, as rank 0's bootstrap hands it on. */
struct peer_addr {
	uint32_t ip; /* network order */
	uint16_t port;
	uint16_t pad;
};

/* ---- the network object (net.c) ---- */

/* A network of o->rank in o->world with o's peers, sorted, without
 * duplicates, and no socket yet. */
vps_result_t vps_net_new(struct vps_net **out, const struct vps_net_opts *o);
/* The index of peer in n->peers, or -1. */
int vps_net_peer_index(const struct vps_net *n, int64_t peer);

/* ---- sockets (socket.c) ---- */

double vps_net_now(void);
/* Non-blocking, no Nagle: every wait goes through poll with a deadline. */
void vps_net_tune(int fd);
/* All of len bytes, waiting at most timeout seconds without progress; who
 * names the other side in messages. */
vps_result_t vps_net_send_all(int fd, const void *buf, size_t len, double timeout, const char *who);
vps_result_t vps_net_recv_all(int fd, void *buf, size_t len, double timeout, const char *who);
vps_result_t vps_net_resolve(const char *host, int port, struct sockaddr_in *sa);
/* A non-blocking listener on sa; *port receives the port it got. */
vps_result_t vps_net_listen(const struct sockaddr_in *sa, int backlog, int *fd, int *port);
/* The address of this host that reaches `to` (a UDP socket's route
 * lookup: no packet is sent). */
vps_result_t vps_net_route_to(const struct sockaddr_in *to, struct in_addr *local);

/* ---- proving membership: challenge, hello, proof (handshake.c) ---- */

#define MAX_PENDING 64

enum { HELLO_CTL = 1, HELLO_MESH = 2 };

struct challenge {
	uint64_t magic;
	unsigned char nonce[VPS_AUTH_NONCE];
};

struct hello {
	uint64_t magic, kind, from, to, world, plan_hash, port;
	unsigned char nonce[VPS_AUTH_NONCE];
	uint64_t mac;
};

struct inbound {
	int fd;
	double deadline;
	struct sockaddr_in from;
	unsigned char nonce[VPS_AUTH_NONCE];
	struct hello h;
	size_t got;
};

enum { OUT_IDLE, OUT_CONNECTING, OUT_CHALLENGE, OUT_PROOF, OUT_DONE };

struct outbound {
	struct sockaddr_in sa;
	int64_t rank;
	int fd, state;
	double retry_at;
	bool turned_away; /* the acceptor closed after our hello */
	struct challenge c;
	struct hello h;
	size_t got;
	uint64_t proof;
};

struct handshake {
	const unsigned char *key;
	int64_t me, world;
	uint64_t plan_hash, port, kind;
	int lfd;          /* -1: nothing to accept */
	size_t want_in;   /* connections still to admit */
	/* an authenticated hello: 1 kept (fd now the callee's), -1 fatal */
	int (*admit)(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from);
	void *ctx;
	struct outbound *out;
	size_t nout;
	double deadline;
	size_t dropped;   /* connections that did not prove the token */
	struct inbound pend[MAX_PENDING];
	size_t npend;
};

/* Accept want_in proven connections and make every outbound one, at once,
 * by the deadline (VPS_ETIMEOUT, "timed out", after it: the caller says
 * who is missing). */
vps_result_t vps_net_handshake(struct handshake *hs);
/* " (N connections that did not prove the job token were dropped: ...)",
 * or "" when none was. */
void vps_net_dropped_note(const struct handshake *hs, char *out, size_t size);

/* ---- the mesh (mesh.c) ---- */

/* Connect to the higher peers, at addrs (by peer index), and accept the
 * lower ones on the data listener dfd, all at once. */
vps_result_t vps_net_mesh(struct vps_net *n, const struct vps_net_opts *o, const unsigned char *key, int dfd,
			  const struct peer_addr *addrs);

#endif
