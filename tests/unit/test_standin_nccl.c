/* The NCCL stand-in (tests/standin/nccl.c) through NCCL's ABI, with host
 * buffers, ranks as processes: a correct grouped exchange among 2 to 4
 * ranks moves the right bytes; each misuse that hangs or corrupts real NCCL
 * fails here with NCCL's code and a message naming the call. */
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "standin_util.h"

static struct {
	ncclResult_t (*get_id)(ncclUniqueId *);
	ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*destroy)(ncclComm_t);
	ncclResult_t (*abort)(ncclComm_t);
	ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
	ncclResult_t (*group_start)(void);
	ncclResult_t (*group_end)(void);
	ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	const char *(*error_string)(ncclResult_t);
	const char *(*last_error)(ncclComm_t);
	int (*pending)(void);
} N;

static bool load(void)
{
	static int loaded;
	if (loaded)
		return loaded > 0;
	void *h = standin_open("libnccl-standin.so");
	loaded = -1;
	if (!h)
		return false;
#define SYM(f, name) *(void **)&N.f = dlsym(h, name)
	SYM(get_id, "ncclGetUniqueId");
	SYM(init_rank, "ncclCommInitRank");
	SYM(destroy, "ncclCommDestroy");
	SYM(abort, "ncclCommAbort");
	SYM(async_error, "ncclCommGetAsyncError");
	SYM(group_start, "ncclGroupStart");
	SYM(group_end, "ncclGroupEnd");
	SYM(send, "ncclSend");
	SYM(recv, "ncclRecv");
	SYM(error_string, "ncclGetErrorString");
	SYM(last_error, "ncclGetLastError");
	SYM(pending, "vps_standin_nccl_pending");
#undef SYM
	loaded = N.pending && N.last_error && N.recv ? 1 : -1;
	return loaded > 0;
}

struct job {
	int world;
	ncclUniqueId id;
};

static ncclComm_t join(const struct job *j, int rank)
{
	ncclComm_t c = NULL;
	ncclResult_t r = N.init_rank(&c, j->world, j->id, rank);
	if (r != ncclSuccess)
		fprintf(stderr, "  rank %d: ncclCommInitRank: %s (%s)\n", rank, N.error_string(r), N.last_error(NULL));
	return r == ncclSuccess ? c : NULL;
}

/* Until a first rank has made the communicator (its object exists), at
 * most 2 s. */
static void wait_for_communicator(const struct job *j)
{
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/%s", j->id.internal + 16);
	for (int i = 0; i < 2000 && access(path, F_OK); i++)
		usleep(1000);
}

static bool says(const char *what)
{
	const char *m = N.last_error(NULL);
	if (strstr(m, what))
		return true;
	fprintf(stderr, "  rank %d: the last error, '%s', does not say '%s'\n", child_rank, m, what);
	return false;
}

/* ---- a correct exchange ---- */

/* Bytes of the k-th message from a to b: some cross the ring's 256 KiB
 * several times, some are empty. */
static size_t msg_bytes(int a, int b, int k)
{
	if (a == 0 && b == 1 && k == 0)
		return (size_t)3 << 20;
	return k == 1 && a == b ? 0 : (size_t)(1000 + 4099 * a + 37 * b + 77777 * k);
}

static unsigned char msg_byte(int a, int b, int k, size_t i)
{
	return (unsigned char)(i * 131 + (size_t)a * 17 + (size_t)b * 5 + (size_t)k * 3 + (i >> 8));
}

/* Every rank sends two messages to every rank (itself too) and receives
 * two from each, all in one group, posted in a different order on each
 * rank; then a second group the other way round. */
static int exchange_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	for (int round = 0; round < 2; round++) {
		unsigned char *out[8][2], *in[8][2];
		CHILD_CHECK(N.group_start() == ncclSuccess);
		for (int q = 0; q < j->world; q++) {
			int p = round ? j->world - 1 - q : (rank + q) % j->world;
			for (int k = 0; k < 2; k++) {
				size_t n = msg_bytes(rank, p, k), m = msg_bytes(p, rank, k);
				out[p][k] = malloc(n + 1);
				in[p][k] = malloc(m + 1);
				for (size_t i = 0; i < n; i++)
					out[p][k][i] = msg_byte(rank, p, k, i);
				memset(in[p][k], 0xee, m + 1);
				CHILD_CHECK(N.recv(in[p][k], m, ncclUint8, p, c, NULL) == ncclSuccess);
				CHILD_CHECK(N.send(out[p][k], n, ncclUint8, p, c, NULL) == ncclSuccess);
			}
		}
		ncclResult_t r = N.group_end();
		if (r != ncclSuccess)
			fprintf(stderr, "  rank %d: ncclGroupEnd: %s\n", rank, N.last_error(c));
		CHILD_CHECK(r == ncclSuccess);
		for (int p = 0; p < j->world; p++)
			for (int k = 0; k < 2; k++) {
				size_t m = msg_bytes(p, rank, k), wrong = 0;
				for (size_t i = 0; i < m; i++)
					wrong += in[p][k][i] != msg_byte(p, rank, k, i);
				/* and not a byte past its end */
				CHILD_CHECK(wrong == 0 && in[p][k][m] == 0xee);
				free(out[p][k]);
				free(in[p][k]);
			}
	}
	CHILD_CHECK(N.destroy(c) == ncclSuccess);
	return 0;
}

TEST(a_grouped_exchange_among_2_to_4_ranks_moves_the_right_bytes)
{
	if (!load()) {
		CHECK(!"the NCCL stand-in loads");
		return;
	}
	for (int w = 2; w <= 4; w++) {
		struct job j = {w, {{0}}};
		CHECK(N.get_id(&j.id) == ncclSuccess);
		int st[4];
		run_ranks(w, exchange_rank, &j, 60, st);
		for (int r = 0; r < w; r++)
			CHECK_EQ(st[r], 0);
	}
}

/* ---- misuse ---- */

/* rank 0 sends 4096 bytes; rank 1 receives 2048 (or, same bytes, 1024
 * floats where 4096 bytes come) */
static int mismatch_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	static unsigned char buf[4096];
	for (int round = 0; round < 2; round++) {
		CHILD_CHECK(N.group_start() == ncclSuccess);
		if (rank == 0)
			CHILD_CHECK(N.send(buf, round ? 1024 : 4096, round ? ncclFloat32 : ncclUint8, 1, c, NULL) == ncclSuccess);
		else
			CHILD_CHECK(N.recv(buf, round ? 4096 : 2048, ncclUint8, 0, c, NULL) == ncclSuccess);
		CHILD_CHECK(N.group_end() == ncclInvalidUsage);
		CHILD_CHECK(says("ncclSend/ncclRecv mismatch: rank 0 sends"));
		CHILD_CHECK(says(round ? "(1024 x ncclFloat32) to rank 1, which receives 4096 bytes (4096 x ncclUint8)"
				       : "4096 bytes (4096 x ncclUint8) to rank 1, which receives 2048 bytes"));
		if (round == 0) {
			/* a failed communicator says so to whoever uses it next */
			CHILD_CHECK(N.destroy(c) == ncclSuccess);
			c = join(j + 1, rank);
			if (!c)
				return 1;
		}
	}
	CHILD_CHECK(N.abort(c) == ncclSuccess);
	return 0;
}

TEST(a_send_whose_size_or_type_differs_from_its_receive_fails_on_both_sides)
{
	if (!load())
		return;
	struct job j[2] = {{2, {{0}}}, {2, {{0}}}};
	CHECK(N.get_id(&j[0].id) == ncclSuccess && N.get_id(&j[1].id) == ncclSuccess);
	int st[2];
	run_ranks(2, mismatch_rank, j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

/* rank 0 sends twice to rank 1 in one group; rank 1 receives once in a
 * group, then once more in the next: each side's group must pair with the
 * other's */
static int split_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	static unsigned char buf[2][512];
	CHILD_CHECK(N.group_start() == ncclSuccess);
	if (rank == 0) {
		CHILD_CHECK(N.send(buf[0], 512, ncclUint8, 1, c, NULL) == ncclSuccess);
		CHILD_CHECK(N.send(buf[1], 512, ncclUint8, 1, c, NULL) == ncclSuccess);
	} else {
		CHILD_CHECK(N.recv(buf[0], 512, ncclUint8, 0, c, NULL) == ncclSuccess);
	}
	CHILD_CHECK(N.group_end() == ncclInvalidUsage);
	CHILD_CHECK(says("ncclSend/ncclRecv do not pair within a group: rank 0's group 0 with sends to rank 1 sends it 2 "
			 "messages; rank 1's group 0 with receives from rank 0 receives 1"));
	N.abort(c);
	return 0;
}

TEST(sends_and_receives_that_pair_across_groups_fail_named)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, split_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

/* rank 0 posts its send and never ends the group; rank 1 waits for it */
static int no_group_end_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	static unsigned char buf[256];
	CHILD_CHECK(N.group_start() == ncclSuccess);
	if (rank == 1) {
		CHILD_CHECK(N.recv(buf, sizeof(buf), ncclUint8, 0, c, NULL) == ncclSuccess);
		CHILD_CHECK(N.group_end() == ncclRemoteError);
		CHILD_CHECK(says("ncclRecv 256 bytes from rank 0: rank 0 left its communicator: its group of 1 operations "
				 "was never ended (ncclGroupStart without ncclGroupEnd)"));
		CHILD_CHECK(N.destroy(c) == ncclSuccess);
		return 0;
	}
	CHILD_CHECK(N.send(buf, sizeof(buf), ncclUint8, 1, c, NULL) == ncclSuccess);
	CHILD_CHECK(N.pending() == 1);
	ncclResult_t async = ncclSuccess;
	CHILD_CHECK(N.async_error(c, &async) == ncclSuccess && async == ncclInvalidUsage);
	CHILD_CHECK(says("ncclCommGetAsyncError: rank 0 waits on 1 operations of a group never ended"));
	CHILD_CHECK(N.destroy(c) == ncclInvalidUsage);
	CHILD_CHECK(says("ncclCommDestroy: rank 0 has a group of 1 operations on this communicator that was never ended "
			 "(ncclGroupStart without ncclGroupEnd)"));
	return 0;
}

TEST(a_missing_group_end_fails_named_and_its_peer_is_told)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, no_group_end_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
	/* and an end without a start */
	CHECK(N.group_end() == ncclInvalidUsage);
	CHECK(strstr(N.last_error(NULL), "ncclGroupEnd: no ncclGroupStart before it"));
}

static int out_of_range_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	static unsigned char buf[64];
	CHILD_CHECK(N.send(buf, 64, ncclUint8, 2, c, NULL) == ncclInvalidArgument);
	CHILD_CHECK(says("ncclSend: peer 2 is out of range [0, 2)"));
	/* in a group, the group fails at its end and moves nothing */
	CHILD_CHECK(N.group_start() == ncclSuccess);
	CHILD_CHECK(N.recv(buf, 64, ncclUint8, -1, c, NULL) == ncclInvalidArgument);
	CHILD_CHECK(N.group_end() == ncclInvalidArgument);
	CHILD_CHECK(says("ncclGroupEnd: an operation of the group failed: ncclRecv: peer -1 is out of range [0, 2)"));
	CHILD_CHECK(N.pending() == 0);
	CHILD_CHECK(N.send(buf, 64, (ncclDataType_t)ncclNumTypes, 1 - rank, c, NULL) == ncclInvalidArgument);
	CHILD_CHECK(says("ncclSend: datatype 12 is not an NCCL type"));
	CHILD_CHECK(N.destroy(c) == ncclSuccess);
	return 0;
}

TEST(a_peer_out_of_range_fails_named)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, out_of_range_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

/* rank 1 posts nothing for rank 0. Rank 0's send blocks; an abort from
 * another thread unblocks it; rank 2, blocked in a receive from rank 0,
 * learns that rank 0 aborted. */
struct aborter {
	ncclComm_t c;
};

static void *abort_later(void *arg)
{
	struct timespec ts = {0, 300000000};
	nanosleep(&ts, NULL);
	N.abort(((struct aborter *)arg)->c);
	return NULL;
}

static int abort_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	static unsigned char buf[1 << 20];
	if (rank == 1) {
		/* it posts nothing for rank 0: it waits for rank 2, which leaves
		 * once rank 0 has aborted */
		CHILD_CHECK(N.recv(buf, 64, ncclUint8, 2, c, NULL) == ncclRemoteError);
		CHILD_CHECK(says("ncclRecv 64 bytes from rank 2: rank 2 "));
		return 0;
	}
	if (rank == 2) {
		CHILD_CHECK(N.recv(buf, sizeof(buf), ncclUint8, 0, c, NULL) == ncclRemoteError);
		CHILD_CHECK(says("ncclRecv 1048576 bytes from rank 0: rank 0 aborted its communicator (ncclCommAbort)"));
		CHILD_CHECK(N.destroy(c) == ncclSuccess);
		return 0;
	}
	struct aborter a = {c};
	pthread_t t;
	pthread_create(&t, NULL, abort_later, &a);
	time_t t0 = time(NULL);
	CHILD_CHECK(N.send(buf, sizeof(buf), ncclUint8, 1, c, NULL) == ncclInvalidUsage);
	CHILD_CHECK(time(NULL) - t0 < 3);
	CHILD_CHECK(says("rank 0's communicator was aborted (ncclCommAbort) while its group ran"));
	pthread_join(t, NULL);
	return 0;
}

TEST(abort_unblocks_its_rank_and_the_peers_that_wait_for_it)
{
	if (!load())
		return;
	struct job j = {3, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[3];
	run_ranks(3, abort_rank, &j, 30, st);
	for (int r = 0; r < 3; r++)
		CHECK_EQ(st[r], 0);
}

static int dead_peer_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	if (rank == 1)
		_exit(0);
	static unsigned char buf[4096];
	CHILD_CHECK(N.group_start() == ncclSuccess);
	CHILD_CHECK(N.send(buf, sizeof(buf), ncclUint8, 1, c, NULL) == ncclSuccess);
	CHILD_CHECK(N.recv(buf, sizeof(buf), ncclUint8, 1, c, NULL) == ncclSuccess);
	CHILD_CHECK(N.group_end() == ncclRemoteError);
	CHILD_CHECK(says("rank 1: rank 1 (pid "));
	CHILD_CHECK(says(") exited"));
	N.abort(c);
	return 0;
}

TEST(a_peer_that_exits_fails_the_groups_that_wait_for_it)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, dead_peer_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

/* init: a rank that disagrees on the world, a rank twice, a forged id */
static int init_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = NULL;
	if (rank == 1) {
		wait_for_communicator(j);
		CHILD_CHECK(N.init_rank(&c, 3, j->id, 1) == ncclInvalidUsage);
		CHILD_CHECK(says("ncclCommInitRank: rank 1 says nranks=3, the communicator was made with nranks=2"));
		CHILD_CHECK(N.init_rank(&c, 2, j->id, 0) == ncclInvalidUsage);
		CHILD_CHECK(says("ncclCommInitRank: rank 0 is in the communicator already"));
		ncclUniqueId forged = j->id;
		forged.internal[20] = '/';
		CHILD_CHECK(N.init_rank(&c, 2, forged, 1) == ncclInvalidArgument);
		CHILD_CHECK(says("the unique id is not one of ncclGetUniqueId's"));
		CHILD_CHECK(N.init_rank(&c, 2, j->id, 2) == ncclInvalidArgument);
		CHILD_CHECK(says("ncclCommInitRank: rank 2 is out of range [0, 2)"));
		c = join(j, 1);
	} else {
		c = join(j, 0);
	}
	CHILD_CHECK(c != NULL);
	/* two ranks on one device: allowed here */
	CHILD_CHECK(c && N.destroy(c) == ncclSuccess);
	return 0;
}

TEST(init_refuses_a_world_it_does_not_share_a_rank_twice_and_a_forged_id)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, init_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

/* A rank whose init returns may destroy its communicator at once, while a
 * peer still waits to see the world whole: that peer's init succeeds (the
 * lag makes rank 0 look at its peers only after rank 1 has left). */
static int quick_leaver_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	if (rank == 0) {
		setenv("VPS_STANDIN_NCCL_INIT_LAG", "0.3", 1);
	} else {
		wait_for_communicator(j);
		usleep(50000); /* and waits in its lag */
	}
	ncclComm_t c = join(j, rank);
	CHILD_CHECK(c != NULL);
	CHILD_CHECK(c && N.destroy(c) == ncclSuccess);
	return 0;
}

TEST(a_peer_that_leaves_as_soon_as_init_returns_fails_no_one)
{
	if (!load())
		return;
	struct job j = {2, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[2];
	run_ranks(2, quick_leaver_rank, &j, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
}

static int after_free_rank(int rank, void *ctx)
{
	const struct job *j = ctx;
	ncclComm_t c = join(j, rank);
	if (!c)
		return 1;
	N.abort(c);
	if (rank == 0) {
		/* stderr to /dev/null: the stop is expected */
		if (freopen("/dev/null", "w", stderr))
			N.destroy(c);
	}
	return 0;
}

TEST(a_communicator_used_after_abort_stops_the_process)
{
	if (!load())
		return;
	struct job j = {1, {{0}}};
	CHECK(N.get_id(&j.id) == ncclSuccess);
	int st[1];
	run_ranks(1, after_free_rank, &j, 30, st);
	CHECK_EQ(st[0], 128 + SIGABRT);
}
