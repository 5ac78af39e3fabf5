/* What the files of lib/exec/net share and nothing outside it sees: the
 * network object, deadline-bounded socket I/O, the handshake that proves a
 * connection belongs to the job, and the control tree. */
#ifndef VPS_NET_INT_H
#define VPS_NET_INT_H

#include <netinet/in.h>

#include "exec/net/net.h"
#include "util/auth.h"
#include "util/internal.h"

/* The wire format's version: a change of any message, or of what one
 * means (the digest's function: VPSNET4), is a new magic, so that
 * executors of two versions refuse each other at the handshake. */
#define HELLO_MAGIC 0x3454454e535056ULL /* "VPSNET4" */

struct ctl;

struct vps_net {
	int64_t rank, world;
	double timeout;
	int64_t *peers;    /* sorted: the ranks this rank exchanges data with */
	int *fds;          /* data socket per peer */
	size_t npeers;
	uint64_t sent, received; /* bytes of exchanges, headers included */
	/* the last exchange failed because a peer's connection ended: a
	 * consequence, whose cause the control tree brings (agree_result) */
	bool peer_left;
	struct ctl *ctl;   /* the control tree; NULL in a world of one */
	struct vps_net_loop *own_loop; /* the loop this net made for itself */
	size_t bootstrap_sockets; /* the most this rank held during the bootstrap */
	size_t mem, mem_peak;     /* bytes this rank's network holds (net_account) */
	void (*notice)(void *ctx, const char *message); /* vps_net_opts' */
	void *notice_ctx;
	double notice_after, notice_every;
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
/* Count bytes this rank's network takes (or gives back: negative) in its
 * memory figure (vps_net_stats). Inline, so that the files net.c frees
 * (the control tree's) need nothing of it: no cycle (make layers). */
static inline void vps_net_account(struct vps_net *n, int64_t bytes)
{
	n->mem = (size_t)((int64_t)n->mem + bytes);
	if (n->mem > n->mem_peak)
		n->mem_peak = n->mem;
}

/* A wait that says whom it waits for, through the network's notice:
 * first notice_after seconds after it began, then every notice_every
 * seconds, or never again. */
struct net_wait {
	double start, next; /* next: when it speaks; 0 never */
};
void vps_net_wait_begin(const struct vps_net *n, struct net_wait *w);
/* Whether it speaks at t; if so, when it speaks next is set. */
bool vps_net_wait_due(const struct vps_net *n, struct net_wait *w, double t);
/* A notice, when the network has one. */
void vps_net_say(const struct vps_net *n, const char *fmt, ...) VPS_PRINTF(2, 3);
/* "(N s so far; timeout T s)": how long a wait has lasted, for its notice. */
void vps_net_waited(const struct vps_net *n, const struct net_wait *w, double t, char *out, size_t size);

/* Whom a wait waits for, as a list that names NAMES_MAX and counts the
 * rest: "rank 1, rank 3 at 10.0.0.2:41234 and 5 more". */
#define NAMES_MAX 4
struct net_names {
	char *out;
	size_t size, len, named;
	int64_t more; /* beyond those named (a caller that knows how many may set it) */
};
void vps_net_names_init(struct net_names *l, char *out, size_t size);
void vps_net_names_add(struct net_names *l, const char *fmt, ...) VPS_PRINTF(2, 3);
/* The list's end: " and N more" when there are. */
void vps_net_names_end(struct net_names *l);

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

/* ---- a peer's words (text.c) ---- */

/* Text a peer sent, as this rank may print it: at most len bytes of in (no
 * terminating NUL needed; a NUL ends it), control characters, backslashes
 * and bytes that are not UTF-8 written as \xNN, cut to fit size with a
 * terminating NUL. Returns the length written. */
size_t vps_net_sanitize(char *out, size_t size, const void *in, size_t len);

/* ---- proving membership: challenge, hello, proof (handshake.c) ---- */

/* Connections being proven at once; more, and the oldest is dropped (a
 * flood of idle connections cannot hold the job, a real rank proves itself
 * in one round trip). */
#define MAX_PENDING 1024

/* kinds of connection, named in the hello */
enum { HELLO_CTL = 1, HELLO_MESH = 2, HELLO_TREE = 3 };

struct challenge {
	uint64_t magic;
	unsigned char nonce[VPS_AUTH_NONCE];
};

struct hello {
	uint64_t magic, kind, from, to, world, plan_hash;
	uint64_t listen; /* where the sender's data listener is: its address (network order) << 16 | its port */
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
	uint64_t kind;    /* HELLO_* */
	int fd, state;
	double retry_at;
	bool turned_away; /* the acceptor closed after our hello */
	int last_errno;   /* of the last attempt that failed to connect, 0 none */
	size_t refusals;  /* times turned away */
	double said_at;   /* when that was last said, 0 never */
	struct challenge c;
	struct hello h;
	size_t got;
	uint64_t proof;
};

/* Where connections refused for the job token came from: their address
 * and the rank their hello claims (unproven), each named after
 * REFUSALS_NAMED refusals. A few sources only: a flood is counted in
 * dropped all the same. */
#define REFUSALS_NAMED 3
#define REFUSERS_MAX 8
struct refuser {
	uint32_t ip; /* network order */
	uint64_t rank;
	size_t count;
	double said_at; /* when it was last named, 0 never */
};

struct handshake {
	const unsigned char *key;
	int64_t me, world;
	uint64_t plan_hash, listen; /* as the hello says it */
	unsigned kinds;   /* inbound kinds accepted: bit HELLO_* */
	int lfd;          /* -1: nothing to accept */
	size_t want_in;   /* connections still to admit */
	/* an authenticated hello: 1 kept (fd now the callee's), -1 fatal */
	int (*admit)(void *ctx, const struct hello *h, int fd, const struct sockaddr_in *from);
	void *ctx;
	struct outbound *out;
	size_t nout;
	double deadline;
	size_t dropped;   /* connections that did not prove the token */
	struct refuser refused[REFUSERS_MAX];
	size_t nrefused;
	/* what the wait says (n's notice; NULL: nothing): whom it waits for */
	const struct vps_net *n;
	struct net_wait *wait;
	void (*awaited)(void *ctx, const struct handshake *hs, char *out, size_t size);
};

/* Accept want_in proven connections and make every outbound one, at once,
 * by the deadline (VPS_ETIMEOUT, "timed out", after it: the caller says
 * who is missing). One epoll set: the cost of a wake is what is ready. */
vps_result_t vps_net_handshake(struct handshake *hs);
/* Where an outbound connection stands, as a wait says it: "nobody
 * accepts there yet", "connected, no answer yet"... */
const char *vps_net_out_state(const struct outbound *o);
/* " (N connections that did not prove the job token were dropped, M of
 * them from ...: ...)", or "" when none was. */
void vps_net_dropped_note(const struct handshake *hs, char *out, size_t size);

/* ---- the mesh (mesh.c) ---- */

/* What a rank connects to: the higher ranks among its data peers and its
 * children in the control tree, each with its address. */
struct mesh_target {
	int64_t rank;
	struct peer_addr addr;
	bool data, tree;
};

/* Connect to the targets and accept the lower data peers and the tree
 * parent on the data listener dfd, all at once; the tree links go to
 * tree_fds[] by vps_net_ctl_neighbours' order. */
vps_result_t vps_net_mesh(struct vps_net *n, const struct vps_net_opts *o, const unsigned char *key, int dfd,
			  const struct mesh_target *t, size_t nt, int *tree_fds);

/* ---- the control tree (control.c) ---- */

/* The tree's fan-out: rank r's children are CTL_FANOUT r + 1 ...
 * CTL_FANOUT r + CTL_FANOUT, its parent (r - 1) / CTL_FANOUT. */
#define CTL_FANOUT 4
/* Bytes of a collective's part on the wire at most. */
#define CTL_PART_MAX 512

/* What a collective combines on its way up. */
enum ctl_kind { CTL_SUM = 1, CTL_BCAST, CTL_BARRIER, CTL_ARRIVE };

/* The tree links of n, from vps_net_ctl_neighbours' fds (each proven),
 * served by loop. Takes the fds, on failure too. */
vps_result_t vps_ctl_new(struct vps_net *n, struct vps_net_loop *loop, const int *fds, size_t nfds);
/* Says what is queued, leaves the loop and closes the links. */
void vps_ctl_free(struct vps_net *n);
/* Readable once a rank is known gone (silent, closed, lying): an exchange
 * waits on it too, so that it stops at once. */
int vps_ctl_gone_fd(const struct ctl *c);
/* The job's failure as this rank words it, as the last error (the code:
 * VPS_ETIMEOUT for a silence this rank saw, otherwise VPS_EPEER); what, if
 * not NULL, opens the message. */
vps_result_t vps_ctl_failure(struct ctl *c, const char *what);
/* Run one collective: buf (len bytes) is this rank's part and receives the
 * result. */
vps_result_t vps_ctl_collective(struct ctl *c, enum ctl_kind kind, void *buf, size_t len, const char *what);
/* Tell every rank that this one failed, and why; consequence: it gave up
 * waiting for a peer, or a peer's connection ended (the others wait a
 * while for what that was about). */
void vps_ctl_fail(struct ctl *c, bool consequence, const char *why);
/* After this rank's own failure (vps_ctl_fail): its words, and the job's
 * failure where another rank's says more and was not yet said (as the
 * last error). A consequence waits up to patience seconds for that; left:
 * it is a peer's connection that ended, and the words say so when nothing
 * came. */
vps_result_t vps_ctl_own_failure(struct ctl *c, vps_result_t mine, double patience, bool left, const char *words);

/* Say (the network's notice) whom this rank waits for in the collective
 * in progress, what opening the message and so_far ending it: its
 * children whose parts have not come, or, once its own part went up, its
 * parent, through which the result comes. */
void vps_ctl_say_awaited(struct ctl *c, const char *what, const char *so_far);

/* The start of a switch on the tree (arrive.c): an CTL_ARRIVE collective
 * whose part is ready when this rank's trainer's request is; "someone
 * arrived" travels only when the ranks' requests lie more than a
 * sixteenth of the window apart. */
void vps_ctl_arrive_begin(struct ctl *c, double window);
/* This rank's request is claimed: its part of the arrival is ready. */
void vps_ctl_arrive_mine(struct ctl *c);
/* Wait at most seconds for the arrival to end or the job to fail: 1 every
 * rank arrived, 0 not yet, -1 failed (vps_ctl_failure says why). *first
 * receives when this rank learnt that the first rank arrived, or -1. */
int vps_ctl_arrive_wait(struct ctl *c, double seconds, double *first);

#endif
