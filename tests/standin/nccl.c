/* libnccl-standin.so: NCCL's ABI (nccl.h) for the calls vps makes (unique
 * id, init rank, group start and end, send, receive, abort, destroy,
 * asynchronous error, error string, last error), between processes over
 * host shared memory. A test instrument: libvps-cuda (the real one or its
 * stand-in) loads it only when VPS_NCCL_LIBRARY names it.
 *
 * It keeps the rules whose breach makes real NCCL hang or fail, and breaks
 * loudly where NCCL would hang: with NCCL's result code and a message that
 * names the call (ncclGetLastError), on both sides of the exchange.
 * - A send and its receive agree on size, type and peer, and pair within
 *   one group on each side: every message carries its group's number for
 *   the pair, its place among the group's sends to that peer and their
 *   count, and the receiver checks them all.
 * - A group completes only when every peer has posted its side: a send is
 *   done when its receiver has taken the last byte, not when it is written.
 * - ncclCommAbort stops this rank's running group; a peer that aborted,
 *   destroyed its communicator while a peer still waits for it, or exited,
 *   fails the groups that wait for it (ncclRemoteError, as a network
 *   transport reports a closed connection). A rank that merely stops
 *   (SIGSTOP) leaves its peers waiting, as in NCCL.
 * - A group never ended (ncclGroupStart without ncclGroupEnd) is named by
 *   ncclCommDestroy, ncclCommGetAsyncError and vps_standin_nccl_pending;
 *   a communicator used after ncclCommAbort or ncclCommDestroy freed it
 *   stops the process with a message (a use after free in NCCL).
 * - Two ranks on one device are allowed (real NCCL refuses them).
 *
 * The transport: one shared-memory object per communicator
 * (/dev/shm/vps-snccl-PID-START-NONCE, removed once every rank has
 * joined), holding each rank's slot (state, pid, start time) and a ring of
 * RING bytes per ordered pair of ranks. Groups queued on the CUDA
 * stand-in's stream (standin.h) run on its thread, in stream order; on the
 * NULL stream (the unit tests, with host buffers) ncclGroupEnd runs the
 * group and returns its result. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

#include <nccl.h>

#include "standin.h"

/* nccl.h declares these two without a prototype */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#define EXPORT __attribute__((visibility("default")))
#define ID_MAGIC "VPSNID01"
#define SEG_MAGIC "VPSNSEG1"
#define OBJ_PREFIX "vps-snccl-"
#define NAME_MAX_ 64
#define MAX_RANKS 64
#define RING ((uint64_t)256 << 10)
#define MSG_MAGIC 0x4d53474eu /* "NGSM" */
#define COMM_LIVE 0x434f4d4d4c495645ULL
#define COMM_DEAD 0x434f4d4d44454144ULL

enum { SLOT_EMPTY, SLOT_CLAIMING, SLOT_JOINED, SLOT_ABORTED, SLOT_DESTROYED, SLOT_ABANDONED };

struct id {
	char magic[8];
	uint64_t nonce;
	char name[NAME_MAX_];
};
_Static_assert(sizeof(struct id) <= NCCL_UNIQUE_ID_BYTES, "id size");

struct slot {
	_Atomic int32_t state;
	int32_t pid;
	uint64_t start;
	char why[240];
};

struct chan {
	_Atomic uint64_t head; /* bytes the sender has written */
	char pad0[56];
	_Atomic uint64_t tail; /* bytes the receiver has taken */
	char pad1[56];
	_Atomic int32_t error; /* the receiver refused a message: the sender fails too */
	char msg[444];
	unsigned char ring[RING];
};

struct seg {
	char magic[8];
	_Atomic uint32_t ready;
	int32_t nranks;
	uint64_t nonce;
	_Atomic int32_t joined;
	int32_t pad;
	struct slot slots[MAX_RANKS];
};

/* What travels ahead of each send's bytes. */
struct msg {
	uint32_t magic;
	int32_t from;
	uint64_t group; /* the sender's groups with sends to this peer, before this one */
	uint64_t count;
	uint64_t bytes;
	int32_t type;
	uint32_t index; /* among this group's sends to the peer */
	uint32_t nops;  /* this group's sends to the peer */
	char pad[20];
};
_Static_assert(sizeof(struct msg) == 64, "message header");

struct ncclComm {
	_Atomic uint64_t magic;
	int rank, nranks;
	struct seg *seg;
	size_t seglen;
	_Atomic int aborted;  /* ncclCommAbort: running groups stop */
	_Atomic int closing;  /* abort or destroy: a failed group may end */
	_Atomic int inflight; /* operations of queued or running groups */
	_Atomic int async;    /* ncclResult_t */
	uint64_t *sent_groups, *recv_groups;
	char last[512];
	struct ncclComm *next_dead;
};

/* Freed communicators stay, so that a later use is found and named (and
 * stay reachable, so that a leak checker does not count them). */
static pthread_mutex_t g_deadlock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *g_dead;

static pthread_mutex_t g_errlock = PTHREAD_MUTEX_INITIALIZER;
static char g_last[512];

static size_t seg_size(int nranks)
{
	return sizeof(struct seg) + (size_t)nranks * (size_t)nranks * sizeof(struct chan);
}

static struct chan *chan_of(struct seg *s, int from, int to)
{
	struct chan *c = (struct chan *)(void *)(s + 1);
	return &c[(size_t)from * (size_t)s->nranks + (size_t)to];
}

/* Record an error (ncclGetLastError) and return its code; NCCL_DEBUG=WARN
 * or INFO also prints it, as NCCL does. */
static ncclResult_t nfail(ncclComm_t comm, ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ncclResult_t nfail(ncclComm_t comm, ncclResult_t code, const char *fmt, ...)
{
	char m[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&g_errlock);
	snprintf(g_last, sizeof(g_last), "%s", m);
	if (comm)
		snprintf(comm->last, sizeof(comm->last), "%s", m);
	pthread_mutex_unlock(&g_errlock);
	const char *dbg = getenv("NCCL_DEBUG");
	if (dbg && (!strcasecmp(dbg, "WARN") || !strcasecmp(dbg, "INFO")))
		fprintf(stderr, "%d [%d] NCCL WARN (stand-in) %s\n", (int)getpid(), comm ? comm->rank : -1, m);
	return code;
}

/* A use after free in NCCL crashes or corrupts; here it stops the process
 * with a message, since callers tend to ignore what destroy returns. */
static void check_comm(ncclComm_t comm, const char *call)
{
	if (comm && atomic_load(&comm->magic) == COMM_DEAD) {
		fprintf(stderr, "nccl stand-in: %s: communicator %p (rank %d) was freed by ncclCommAbort or ncclCommDestroy "
			"before: a use after free in NCCL\n", call, (void *)comm, comm->rank);
		abort();
	}
}

static ncclResult_t live(ncclComm_t comm, const char *call)
{
	if (!comm)
		return nfail(NULL, ncclInvalidArgument, "%s: comm is NULL", call);
	check_comm(comm, call);
	if (atomic_load(&comm->magic) != COMM_LIVE)
		return nfail(NULL, ncclInvalidArgument, "%s: %p is not a communicator", call, (void *)comm);
	return ncclSuccess;
}

static size_t type_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	default: return 0;
	}
}

static const char *type_name(int t)
{
	static const char *const n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
					"ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
					"ncclFloat8e5m2"};
	return t >= 0 && t < (int)(sizeof(n) / sizeof(*n)) ? n[t] : "an unknown type";
}

static void nap(unsigned *idle)
{
	if (++*idle < 64) {
		sched_yield();
		return;
	}
	struct timespec ts = {0, *idle < 1024 ? 20000 : 200000};
	nanosleep(&ts, NULL);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- versions, ids, errors ---- */

EXPORT ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return nfail(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
	if (comm && atomic_load(&comm->magic) == COMM_LIVE && comm->last[0])
		return comm->last;
	return g_last;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *out)
{
	if (!out)
		return nfail(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
	standin_sweep(OBJ_PREFIX);
	struct id id;
	memset(&id, 0, sizeof(id));
	memcpy(id.magic, ID_MAGIC, sizeof(id.magic));
	if (getrandom(&id.nonce, sizeof(id.nonce), 0) != (ssize_t)sizeof(id.nonce))
		return nfail(NULL, ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
	pid_t pid = getpid();
	snprintf(id.name, sizeof(id.name), OBJ_PREFIX "%x-%" PRIx64 "-%016" PRIx64, (unsigned)pid,
		 standin_start_time(pid), id.nonce);
	memset(out, 0, sizeof(*out));
	memcpy(out, &id, sizeof(id));
	return ncclSuccess;
}

/* An id is input from the rendezvous: the one form ncclGetUniqueId writes. */
static ncclResult_t parse_id(const ncclUniqueId *u, struct id *id)
{
	memcpy(id, u, sizeof(*id));
	unsigned pid;
	uint64_t start, nonce;
	int used = -1;
	if (memcmp(id->magic, ID_MAGIC, sizeof(id->magic)) || !memchr(id->name, '\0', sizeof(id->name)) ||
	    sscanf(id->name, OBJ_PREFIX "%x-%" SCNx64 "-%" SCNx64 "%n", &pid, &start, &nonce, &used) != 3 || used < 0 ||
	    id->name[used] || nonce != id->nonce)
		return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: the unique id is not one of ncclGetUniqueId's");
	char canon[NAME_MAX_];
	snprintf(canon, sizeof(canon), OBJ_PREFIX "%x-%" PRIx64 "-%016" PRIx64, pid, start, nonce);
	if (strcmp(canon, id->name))
		return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: the unique id is not one of ncclGetUniqueId's");
	return ncclSuccess;
}

/* ---- communicators ---- */

static double init_timeout(void)
{
	const char *e = getenv("VPS_STANDIN_NCCL_INIT_TIMEOUT");
	double t = e && *e ? strtod(e, NULL) : 120.0;
	return t > 0 ? t : 120.0;
}

/* Seconds a rank waits between seeing the world not yet whole and looking
 * at its peers (VPS_STANDIN_NCCL_INIT_LAG, at most 5): widens, for a test,
 * the window in which a peer that returned from init leaves at once. */
static double init_lag(void)
{
	const char *e = getenv("VPS_STANDIN_NCCL_INIT_LAG");
	double t = e && *e ? strtod(e, NULL) : 0.0;
	return t > 0 && t <= 5 ? t : 0.0;
}

/* Open (or make, the first rank to come) the communicator's object. */
static ncclResult_t open_seg(const struct id *id, int nranks, int rank, struct seg **out, size_t *len)
{
	char path[NAME_MAX_ + 1];
	snprintf(path, sizeof(path), "/%s", id->name);
	size_t size = seg_size(nranks);
	double deadline = now() + init_timeout();
	unsigned idle = 0;
	for (;;) {
		int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0) {
			void *p = MAP_FAILED;
			int e = standin_reserve(fd, size);
			if (!e && (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
				e = errno;
			close(fd);
			if (p == MAP_FAILED) {
				shm_unlink(path);
				return nfail(NULL, ncclSystemError, "ncclCommInitRank: /dev/shm%s: %s", path, strerror(e));
			}
			struct seg *s = p;
			s->nranks = nranks;
			s->nonce = id->nonce;
			memcpy(s->magic, SEG_MAGIC, sizeof(s->magic));
			atomic_store(&s->ready, 1);
			*out = s;
			*len = size;
			return ncclSuccess;
		}
		if (errno != EEXIST)
			return nfail(NULL, ncclSystemError, "ncclCommInitRank: /dev/shm%s: %s", path, strerror(errno));
		fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
		struct stat st;
		if (fd >= 0 && fstat(fd, &st) == 0) {
			if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
				close(fd);
				return nfail(NULL, ncclSystemError, "ncclCommInitRank: /dev/shm%s is not this user's, of mode "
					     "0600", path);
			}
			if ((size_t)st.st_size >= sizeof(struct seg)) {
				struct seg *h = mmap(NULL, sizeof(struct seg), PROT_READ, MAP_SHARED, fd, 0);
				if (h != MAP_FAILED) {
					bool ready = atomic_load(&h->ready) == 1;
					int theirs = h->nranks;
					bool same = !memcmp(h->magic, SEG_MAGIC, sizeof(h->magic)) && h->nonce == id->nonce;
					munmap(h, sizeof(struct seg));
					if (ready && !same) {
						close(fd);
						return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: /dev/shm%s is not this "
							     "communicator's", path);
					}
					if (ready && theirs != nranks) {
						close(fd);
						return nfail(NULL, ncclInvalidUsage, "ncclCommInitRank: rank %d says nranks=%d, the "
							     "communicator was made with nranks=%d", rank, nranks, theirs);
					}
					if (ready && (size_t)st.st_size == size) {
						void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
						close(fd);
						if (p == MAP_FAILED)
							return nfail(NULL, ncclSystemError, "ncclCommInitRank: map /dev/shm%s: %s",
								     path, strerror(errno));
						*out = p;
						*len = size;
						return ncclSuccess;
					}
				}
			}
		}
		if (fd >= 0)
			close(fd);
		if (now() > deadline)
			return nfail(NULL, ncclSystemError, "ncclCommInitRank: rank %d found no ready communicator at "
				     "/dev/shm%s within %.0f s", rank, path, init_timeout());
		nap(&idle);
	}
}

static void teardown(ncclComm_t comm)
{
	munmap(comm->seg, comm->seglen);
	comm->seg = NULL;
	free(comm->sent_groups);
	free(comm->recv_groups);
	comm->sent_groups = comm->recv_groups = NULL;
	/* the struct stays: a later call on it is found and named */
	atomic_store(&comm->magic, COMM_DEAD);
	pthread_mutex_lock(&g_deadlock);
	comm->next_dead = g_dead;
	g_dead = comm;
	pthread_mutex_unlock(&g_deadlock);
}

static const char *slot_word(int state)
{
	switch (state) {
	case SLOT_ABORTED: return "aborted its communicator (ncclCommAbort)";
	case SLOT_DESTROYED: return "destroyed its communicator (ncclCommDestroy)";
	case SLOT_ABANDONED: return "left its communicator";
	default: return "left";
	}
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId uid, int rank)
{
	if (!out)
		return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
	*out = NULL;
	if (nranks < 1 || nranks > MAX_RANKS)
		return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: nranks=%d (the stand-in takes 1 to %d)", nranks,
			     MAX_RANKS);
	if (rank < 0 || rank >= nranks)
		return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d is out of range [0, %d)", rank, nranks);
	struct id id;
	ncclResult_t r = parse_id(&uid, &id);
	if (r)
		return r;
	struct seg *s = NULL;
	size_t len = 0;
	if ((r = open_seg(&id, nranks, rank, &s, &len)))
		return r;
	char path[NAME_MAX_ + 1];
	snprintf(path, sizeof(path), "/%s", id.name);
	struct slot *me = &s->slots[rank];
	int32_t empty = SLOT_EMPTY;
	if (!atomic_compare_exchange_strong(&me->state, &empty, SLOT_CLAIMING)) {
		int pid = me->pid;
		munmap(s, len);
		return nfail(NULL, ncclInvalidUsage, "ncclCommInitRank: rank %d is in the communicator already (pid %d)",
			     rank, pid);
	}
	me->pid = (int32_t)getpid();
	me->start = standin_start_time(getpid());
	atomic_store(&me->state, SLOT_JOINED);
	atomic_fetch_add(&s->joined, 1);
	/* collective: every rank joins before any returns */
	double deadline = now() + init_timeout(), lag = init_lag();
	unsigned idle = 0;
	r = ncclSuccess;
	while (atomic_load(&s->joined) < nranks && !r) {
		if (lag > 0)
			usleep((useconds_t)(lag * 1e6));
		for (int k = 0; k < nranks && !r; k++) {
			struct slot *o = &s->slots[k];
			int st = atomic_load(&o->state);
			/* A peer that returned from init (the count was full) may have
			 * destroyed, aborted or exited already: that is not a failed
			 * init. The count is read after the state, so it sees the join
			 * of any peer whose leaving was seen. */
			if (atomic_load(&s->joined) >= nranks)
				break;
			if (st == SLOT_JOINED && !standin_alive(o->pid, o->start))
				r = nfail(NULL, ncclRemoteError, "ncclCommInitRank: rank %d (pid %d) exited before every rank "
					  "joined", k, (int)o->pid);
			else if (st >= SLOT_ABORTED)
				r = nfail(NULL, ncclRemoteError, "ncclCommInitRank: rank %d %s before every rank joined", k,
					  slot_word(st));
		}
		if (!r && now() > deadline) {
			char missing[256] = "";
			size_t at = 0;
			for (int k = 0; k < nranks && at + 16 < sizeof(missing); k++)
				if (atomic_load(&s->slots[k].state) != SLOT_JOINED)
					at += (size_t)snprintf(missing + at, sizeof(missing) - at, "%s%d", at ? ", " : "", k);
			r = nfail(NULL, ncclSystemError, "ncclCommInitRank: ranks %s did not join within %.0f s", missing,
				  init_timeout());
		}
		if (!r)
			nap(&idle);
	}
	/* every rank has it mapped, or the communicator failed: the name goes */
	shm_unlink(path);
	if (r) {
		atomic_store(&me->state, SLOT_ABORTED);
		munmap(s, len);
		return r;
	}
	ncclComm_t c = calloc(1, sizeof(*c));
	if (c) {
		c->sent_groups = calloc((size_t)nranks, sizeof(uint64_t));
		c->recv_groups = calloc((size_t)nranks, sizeof(uint64_t));
	}
	if (!c || !c->sent_groups || !c->recv_groups) {
		if (c) {
			free(c->sent_groups);
			free(c->recv_groups);
		}
		free(c);
		atomic_store(&me->state, SLOT_ABORTED);
		munmap(s, len);
		return nfail(NULL, ncclSystemError, "ncclCommInitRank: out of memory");
	}
	c->rank = rank;
	c->nranks = nranks;
	c->seg = s;
	c->seglen = len;
	atomic_store(&c->magic, COMM_LIVE);
	*out = c;
	return ncclSuccess;
}

/* ---- groups ---- */

struct op {
	ncclComm_t comm;
	bool send;
	int peer;
	unsigned char *buf;
	size_t count;
	ncclDataType_t type;
	uint64_t bytes;
	cudaStream_t stream;
	/* set when the group ends */
	uint64_t group;
	uint32_t index, nops;
	long prev; /* the op before it on the same channel, or -1 */
	/* progress */
	struct msg hdr;
	uint64_t pos, end;
	bool written, done;
};

struct group {
	size_t n;
	struct op ops[];
};

/* A thread's group, as NCCL keeps it: per thread. In a pthread key, not
 * _Thread_local: LeakSanitizer cannot scan the dynamic TLS of a library
 * loaded with dlopen on this glibc, and make asan loads this one so. */
struct thread_group {
	int depth;
	struct op *ops;
	size_t nops, cap;
	ncclResult_t error;
};

static pthread_key_t g_group_key;
static pthread_once_t g_group_once = PTHREAD_ONCE_INIT;

static void group_free(void *p)
{
	struct thread_group *t = p;
	free(t->ops);
	free(t);
}

static void group_key(void)
{
	pthread_key_create(&g_group_key, group_free);
}

static struct thread_group *thread_group(void)
{
	pthread_once(&g_group_once, group_key);
	struct thread_group *t = pthread_getspecific(g_group_key);
	if (!t) {
		if (!(t = calloc(1, sizeof(*t)))) {
			fprintf(stderr, "nccl stand-in: out of memory\n");
			abort();
		}
		pthread_setspecific(g_group_key, t);
	}
	return t;
}

/* Operations posted in this thread's group and not launched: a group never
 * ended. The CUDA stand-in asks before it waits for its stream. */
EXPORT int vps_standin_nccl_pending(void);
EXPORT int vps_standin_nccl_pending(void)
{
	return (int)thread_group()->nops;
}

static size_t pending_on(ncclComm_t comm)
{
	struct thread_group *t = thread_group();
	size_t k = 0;
	for (size_t i = 0; i < t->nops; i++)
		k += t->ops[i].comm == comm;
	return k;
}

EXPORT ncclResult_t ncclGroupStart(void)
{
	thread_group()->depth++;
	return ncclSuccess;
}

static ncclResult_t launch(struct op *ops, size_t n);

static ncclResult_t post(const char *call, bool send, void *buf, size_t count, ncclDataType_t type, int peer,
			 ncclComm_t comm, cudaStream_t stream)
{
	struct thread_group *t = thread_group();
	ncclResult_t r = live(comm, call);
	size_t es = type_size(type);
	uint64_t bytes = 0;
	if (!r && (peer < 0 || peer >= comm->nranks))
		r = nfail(comm, ncclInvalidArgument, "%s: peer %d is out of range [0, %d) (rank %d)", call, peer, comm->nranks,
			  comm->rank);
	if (!r && !es)
		r = nfail(comm, ncclInvalidArgument, "%s: datatype %d is not an NCCL type", call, (int)type);
	if (!r && __builtin_mul_overflow((uint64_t)count, (uint64_t)es, &bytes))
		r = nfail(comm, ncclInvalidArgument, "%s: %zu elements of %s overflow", call, count, type_name(type));
	if (!r && !buf && count)
		r = nfail(comm, ncclInvalidArgument, "%s: %s buffer is NULL", call, send ? "send" : "receive");
	if (!r && atomic_load(&comm->async) != ncclSuccess)
		r = nfail(comm, (ncclResult_t)atomic_load(&comm->async), "%s: the communicator failed before: %s", call,
			  comm->last);
	if (!r && t->nops == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 64;
		struct op *v = realloc(t->ops, cap * sizeof(*v));
		if (!v)
			r = nfail(comm, ncclSystemError, "%s: out of memory", call);
		else {
			t->ops = v;
			t->cap = cap;
		}
	}
	if (r) {
		/* the group fails at its end, as NCCL's does */
		if (t->depth)
			t->error = r;
		return r;
	}
	struct op *o = &t->ops[t->nops++];
	memset(o, 0, sizeof(*o));
	*o = (struct op){.comm = comm, .send = send, .peer = peer, .buf = buf, .count = count, .type = type,
			 .bytes = bytes, .stream = stream, .prev = -1};
	if (t->depth)
		return ncclSuccess;
	/* outside a group: a group of one */
	struct op one = *o;
	t->nops = 0;
	return launch(&one, 1);
}

EXPORT ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
			     cudaStream_t stream)
{
	return post("ncclSend", true, (void *)(uintptr_t)buf, count, type, peer, comm, stream);
}

EXPORT ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
			     cudaStream_t stream)
{
	return post("ncclRecv", false, buf, count, type, peer, comm, stream);
}

/* Why an operation with this peer cannot complete, or ncclSuccess. */
static ncclResult_t peer_gone(const struct op *o)
{
	struct slot *p = &o->comm->seg->slots[o->peer];
	int st = atomic_load(&p->state);
	bool exited = st < SLOT_ABORTED && !standin_alive(p->pid, p->start);
	/* A peer may leave once it has taken the last byte of a send. Whether
	 * it left is read first: a peer seen gone has its last take seen too. */
	if (o->send && o->written &&
	    atomic_load(&chan_of(o->comm->seg, o->comm->rank, o->peer)->tail) >= o->end)
		return ncclSuccess;
	if (st >= SLOT_ABORTED)
		return nfail(o->comm, ncclRemoteError, "%s %" PRIu64 " bytes %s rank %d: rank %d %s%s%s", o->send ? "ncclSend" :
			     "ncclRecv", o->bytes, o->send ? "to" : "from", o->peer, o->peer, slot_word(st),
			     p->why[0] ? ": " : "", p->why);
	if (exited)
		return nfail(o->comm, ncclRemoteError, "%s %" PRIu64 " bytes %s rank %d: rank %d (pid %d) exited",
			     o->send ? "ncclSend" : "ncclRecv", o->bytes, o->send ? "to" : "from", o->peer, o->peer,
			     (int)p->pid);
	return ncclSuccess;
}

/* The receiver's check of a message against its own receive. */
static ncclResult_t match(struct op *o, struct chan *c)
{
	const struct msg *m = &o->hdr;
	ncclComm_t comm = o->comm;
	char why[400] = "";
	if (m->magic != MSG_MAGIC || m->from != o->peer)
		snprintf(why, sizeof(why), "ncclRecv from rank %d: the stream from it is corrupt", o->peer);
	else if (m->group != o->group || m->nops != o->nops)
		snprintf(why, sizeof(why), "ncclSend/ncclRecv do not pair within a group: rank %d's group %" PRIu64 " with "
			 "sends to rank %d sends it %u messages; rank %d's group %" PRIu64 " with receives from rank %d "
			 "receives %u", o->peer, m->group, comm->rank, m->nops, comm->rank, o->group, o->peer, o->nops);
	else if (m->bytes != o->bytes || m->type != (int32_t)o->type)
		snprintf(why, sizeof(why), "ncclSend/ncclRecv mismatch: rank %d sends %" PRIu64 " bytes (%" PRIu64 " x %s) "
			 "to rank %d, which receives %" PRIu64 " bytes (%zu x %s) from rank %d (message %u of %u of the "
			 "group)", o->peer, m->bytes, m->count, type_name(m->type), comm->rank, o->bytes, o->count,
			 type_name((int)o->type), o->peer, m->index + 1, m->nops);
	if (!why[0])
		return ncclSuccess;
	snprintf(c->msg, sizeof(c->msg), "%s", why);
	atomic_store(&c->error, (int32_t)ncclInvalidUsage);
	return nfail(comm, ncclInvalidUsage, "%s", why);
}

static uint64_t ring_put(struct chan *c, const unsigned char *src, uint64_t n)
{
	uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
	uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
	uint64_t room = head - tail <= RING ? RING - (head - tail) : 0; /* a peer's counters are not trusted */
	if (n > room)
		n = room;
	uint64_t at = head % RING, first = RING - at < n ? RING - at : n;
	memcpy(c->ring + at, src, first);
	memcpy(c->ring, src + first, n - first);
	atomic_store_explicit(&c->head, head + n, memory_order_release);
	return n;
}

static uint64_t ring_take(struct chan *c, unsigned char *dst, uint64_t n)
{
	uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
	if (n > head - tail)
		n = head - tail;
	if (n > RING)
		n = RING;
	uint64_t at = tail % RING, first = RING - at < n ? RING - at : n;
	memcpy(dst, c->ring + at, first);
	memcpy(dst + first, c->ring, n - first);
	atomic_store_explicit(&c->tail, tail + n, memory_order_release);
	return n;
}

/* One pass over an operation; true when it moved. */
static bool step(struct op *ops, struct op *o, ncclResult_t *r)
{
	if (o->done || (o->prev >= 0 && !(o->send ? ops[o->prev].written : ops[o->prev].done)))
		return false;
	ncclComm_t comm = o->comm;
	uint64_t total = sizeof(struct msg) + o->bytes;
	if (o->send) {
		struct chan *c = chan_of(comm->seg, comm->rank, o->peer);
		if (atomic_load(&c->error)) {
			*r = nfail(comm, (ncclResult_t)atomic_load(&c->error), "%s", c->msg);
			return false;
		}
		if (!o->written) {
			uint64_t moved = 0;
			while (o->pos < total) {
				uint64_t n = o->pos < sizeof(struct msg)
						     ? ring_put(c, (const unsigned char *)&o->hdr + o->pos, sizeof(struct msg) - o->pos)
						     : ring_put(c, o->buf + (o->pos - sizeof(struct msg)), total - o->pos);
				if (!n)
					break;
				o->pos += n;
				moved += n;
			}
			if (o->pos == total) {
				o->written = true;
				o->end = atomic_load(&c->head);
			}
			return moved > 0;
		}
		/* done when the receiver has taken the last byte */
		if (atomic_load_explicit(&c->tail, memory_order_acquire) >= o->end) {
			o->done = true;
			return true;
		}
		return false;
	}
	struct chan *c = chan_of(comm->seg, o->peer, comm->rank);
	uint64_t moved = 0;
	while (o->pos < total) {
		uint64_t n;
		if (o->pos < sizeof(struct msg)) {
			n = ring_take(c, (unsigned char *)&o->hdr + o->pos, sizeof(struct msg) - o->pos);
			if (n && o->pos + n == sizeof(struct msg) && (*r = match(o, c))) {
				o->pos += n;
				return true;
			}
		} else {
			n = ring_take(c, o->buf + (o->pos - sizeof(struct msg)), total - o->pos);
		}
		if (!n)
			break;
		o->pos += n;
		moved += n;
	}
	if (o->pos == total)
		o->done = o->written = true;
	return moved > 0;
}

/* Run a group to its end or its failure. */
static ncclResult_t progress(struct group *g)
{
	unsigned idle = 0;
	double next_check = now() + 0.02;
	for (;;) {
		bool moved = false, all = true;
		ncclResult_t r = ncclSuccess;
		for (size_t i = 0; i < g->n && !r; i++) {
			struct op *o = &g->ops[i];
			if (atomic_load(&o->comm->aborted))
				return nfail(o->comm, ncclInvalidUsage, "ncclGroupEnd: rank %d's communicator was aborted "
					     "(ncclCommAbort) while its group ran", o->comm->rank);
			moved |= step(g->ops, o, &r);
			all &= o->done;
		}
		if (r)
			return r;
		if (all)
			return ncclSuccess;
		if (moved) {
			idle = 0;
			continue;
		}
		if (now() > next_check) {
			for (size_t i = 0; i < g->n && !r; i++)
				if (!g->ops[i].done)
					r = peer_gone(&g->ops[i]);
			if (r)
				return r;
			next_check = now() + 0.02;
		}
		nap(&idle);
	}
}

static void finish(struct group *g)
{
	for (size_t i = 0; i < g->n; i++)
		atomic_fetch_sub(&g->ops[i].comm->inflight, 1);
	free(g);
}

/* On the CUDA stand-in's stream. A failed group is the communicator's
 * asynchronous error, and the stream waits, as behind a hung NCCL kernel,
 * until the communicator is aborted or destroyed. */
static int run_queued(void *arg, bool cancelled, char *err)
{
	(void)err;
	struct group *g = arg;
	ncclResult_t r = cancelled ? ncclSuccess : progress(g);
	if (r) {
		ncclComm_t failed = NULL;
		for (size_t i = 0; i < g->n && !failed; i++)
			if (!g->ops[i].done)
				failed = g->ops[i].comm;
		if (!failed)
			failed = g->ops[0].comm;
		int expected = ncclSuccess;
		atomic_compare_exchange_strong(&failed->async, &expected, (int)r);
		unsigned idle = 0;
		while (!atomic_load(&failed->closing))
			nap(&idle);
	}
	finish(g);
	return 0;
}

static ncclResult_t launch(struct op *ops, size_t n)
{
	ncclComm_t comm = ops[0].comm;
	cudaStream_t stream = ops[0].stream;
	for (size_t i = 1; i < n; i++)
		if (ops[i].stream != stream)
			return nfail(ops[i].comm, ncclInvalidUsage, "ncclGroupEnd: one group on several streams is not "
				     "modelled by the stand-in");
	struct standin_stream *s = stream ? (struct standin_stream *)(void *)stream : NULL;
	if (s && s->magic != STANDIN_STREAM_MAGIC)
		return nfail(comm, ncclInvalidArgument, "ncclGroupEnd: the stream is not the CUDA stand-in's (or NULL)");
	struct group *g = malloc(sizeof(*g) + n * sizeof(g->ops[0]));
	if (!g)
		return nfail(comm, ncclSystemError, "ncclGroupEnd: out of memory");
	g->n = n;
	memcpy(g->ops, ops, n * sizeof(*ops));
	/* each operation's place: the group's number for its pair and
	 * direction, its index among them, their count, the one before it */
	for (size_t i = 0; i < n; i++) {
		struct op *o = &g->ops[i];
		uint32_t index = 0, count = 0;
		o->prev = -1;
		for (size_t j = 0; j < n; j++) {
			const struct op *q = &g->ops[j];
			if (q->comm != o->comm || q->peer != o->peer || q->send != o->send)
				continue;
			if (j < i) {
				index++;
				o->prev = (long)j;
			}
			count++;
		}
		o->group = o->send ? o->comm->sent_groups[o->peer] : o->comm->recv_groups[o->peer];
		o->index = index;
		o->nops = count;
		o->hdr = (struct msg){.magic = MSG_MAGIC, .from = o->comm->rank, .group = o->group, .count = o->count,
				      .bytes = o->bytes, .type = (int32_t)o->type, .index = index, .nops = count};
		atomic_fetch_add(&o->comm->inflight, 1);
	}
	for (size_t i = 0; i < n; i++) {
		const struct op *o = &g->ops[i];
		if (o->index == o->nops - 1)
			(o->send ? o->comm->sent_groups : o->comm->recv_groups)[o->peer]++;
	}
	if (s) {
		char err[STANDIN_ERR] = "";
		if (s->enqueue(s, run_queued, g, err)) {
			finish(g);
			return nfail(comm, ncclUnhandledCudaError, "ncclGroupEnd: the stream cannot take the group: %s", err);
		}
		return ncclSuccess;
	}
	ncclResult_t r = progress(g);
	finish(g);
	return r;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
	struct thread_group *t = thread_group();
	if (t->depth == 0)
		return nfail(NULL, ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
	if (--t->depth > 0)
		return ncclSuccess;
	ncclResult_t r = t->error;
	size_t n = t->nops;
	t->error = ncclSuccess;
	t->nops = 0;
	if (r) {
		char why[512];
		pthread_mutex_lock(&g_errlock);
		snprintf(why, sizeof(why), "%s", g_last);
		pthread_mutex_unlock(&g_errlock);
		return nfail(n ? t->ops[0].comm : NULL, r, "ncclGroupEnd: an operation of the group failed: %s", why);
	}
	if (!n)
		return ncclSuccess;
	return launch(t->ops, n);
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *result)
{
	ncclResult_t r = live(comm, "ncclCommGetAsyncError");
	if (r)
		return r;
	if (!result)
		return nfail(comm, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
	size_t k = pending_on(comm);
	if (k) {
		/* whoever waits for this communicator waits for a group that
		 * was never launched */
		*result = ncclInvalidUsage;
		return nfail(comm, ncclSuccess, "ncclCommGetAsyncError: rank %d waits on %zu operations of a group never "
			     "ended (ncclGroupStart without ncclGroupEnd)", comm->rank, k);
	}
	*result = (ncclResult_t)atomic_load(&comm->async);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess;
	ncclResult_t r = live(comm, "ncclCommAbort");
	if (r)
		return r;
	atomic_store(&comm->aborted, 1);
	atomic_store(&comm->closing, 1);
	atomic_store(&comm->seg->slots[comm->rank].state, SLOT_ABORTED);
	unsigned idle = 0;
	while (atomic_load(&comm->inflight) > 0)
		nap(&idle);
	teardown(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	ncclResult_t r = live(comm, "ncclCommDestroy");
	if (r)
		return r;
	size_t k = pending_on(comm);
	if (k || thread_group()->depth) {
		/* NCCL refuses it; the peers would wait for this rank forever,
		 * so they learn why */
		struct slot *me = &comm->seg->slots[comm->rank];
		snprintf(me->why, sizeof(me->why), "its group of %zu operations was never ended (ncclGroupStart without "
			 "ncclGroupEnd)", k);
		atomic_store(&me->state, SLOT_ABANDONED);
		return nfail(comm, ncclInvalidUsage, "ncclCommDestroy: rank %d has a group of %zu operations on this "
			     "communicator that was never ended (ncclGroupStart without ncclGroupEnd)", comm->rank, k);
	}
	/* destroy flushes: what is queued completes first */
	atomic_store(&comm->closing, 1);
	unsigned idle = 0;
	while (atomic_load(&comm->inflight) > 0)
		nap(&idle);
	atomic_store(&comm->seg->slots[comm->rank].state, SLOT_DESTROYED);
	teardown(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	ncclResult_t r = live(comm, "ncclCommCount");
	if (!r)
		*count = comm->nranks;
	return r;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	ncclResult_t r = live(comm, "ncclCommUserRank");
	if (!r)
		*rank = comm->rank;
	return r;
}
