/* The executors' agreement on stage boundaries, as it runs: W ranks as
 * threads of this process, each with its own vps_net over loopback, whose
 * mesh holds only the partners of the all-reduce. Every rank must end with
 * the element-wise maximum, and no rank, rank 0 included, may send or
 * receive more than log2(W) + 1 vectors: the O(steps log W) bytes per rank
 * that docs/plan.md promises at 16,384 ranks. */
#include <arpa/inet.h>
#include <stdio.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <signal.h>
#include <time.h>
#include <sys/wait.h>

#include "harness.h"
#include "util/internal.h"
#include "exec/net/net_int.h"
#include "vps/stage.h"

struct rank_run {
	int64_t rank, world;
	int port;
	size_t count;
	int64_t *v;
	vps_result_t rc;
	char error[512];
	uint64_t sent, received;
};

static int64_t value(int64_t rank, size_t i)
{
	uint64_t x = (uint64_t)rank * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (int64_t)(x >> 2) - (int64_t)(1ll << 60); /* negative numbers too */
}

static void *run_rank(void *arg)
{
	struct rank_run *r = arg;
	int64_t peers[64];
	size_t np = vps_net_tree_peers(r->rank, r->world, peers);
	struct vps_net_opts o = {.rank = r->rank, .world = r->world, .master_host = "127.0.0.1", .master_port = r->port,
				 .timeout = 30.0, .token = "0123456789abcdef0123456789abcdef", .bind = "127.0.0.1",
				 .plan_hash = 42, .peers = peers, .npeers = np};
	struct vps_net *n = NULL;
	r->rc = vps_net_start(&n, &o);
	if (!r->rc)
		r->rc = vps_net_allreduce(n, r->v, r->count, vps_net_max, "test");
	if (r->rc)
		snprintf(r->error, sizeof(r->error), "%s", vps_last_error());
	else {
		struct vps_net_stats st;
		vps_net_stats(n, &st);
		r->sent = st.data_bytes_sent;
		r->received = st.data_bytes_received;
	}
	vps_net_free(n);
	return NULL;
}

/* A port on the loopback that nobody listens on now, below the kernel's
 * ephemeral range (as vps.free_port): a port a bind to 0 hands out goes
 * to the next outgoing connection that asks for any, and on a busy
 * machine one took it before rank 0 listened (rank 0: bind: Address
 * already in use; the others: nobody proved to be rank 0). 0 when 100
 * random ports are all taken. */
static int free_port(void)
{
	int high = 32768;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%d", &high) != 1)
			high = 32768;
		fclose(f);
	}
	if (high <= 10001)
		high = 32768;
	static unsigned seed;
	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	for (int tries = 0; tries < 100; tries++) {
		int port = 10000 + (int)(rand_r(&seed) % (unsigned)(high - 10000));
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sa = {0};
		sa.sin_family = AF_INET;
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sa.sin_port = htons((uint16_t)port);
		bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (fd >= 0)
			close(fd);
		if (ok)
			return port;
	}
	return 0;
}

/* W ranks all-reduce count numbers; returns the busiest rank's bytes (sent
 * or received), 0 on failure. */
static uint64_t allreduce_case(int64_t W, size_t count)
{
	struct rank_run *runs = calloc((size_t)W, sizeof(*runs));
	pthread_t *th = calloc((size_t)W, sizeof(*th));
	int64_t *want = calloc(count, sizeof(*want));
	int port = free_port();
	uint64_t most = 0, ok = 0;
	CHECK(runs && th && want && port > 0);
	if (!runs || !th || !want || port <= 0)
		goto done;
	for (size_t i = 0; i < count; i++)
		want[i] = INT64_MIN;
	for (int64_t r = 0; r < W; r++) {
		runs[r] = (struct rank_run){r, W, port, count, calloc(count, sizeof(int64_t)), 0, "", 0, 0};
		CHECK(runs[r].v != NULL);
		for (size_t i = 0; runs[r].v && i < count; i++) {
			runs[r].v[i] = value(r, i);
			want[i] = runs[r].v[i] > want[i] ? runs[r].v[i] : want[i];
		}
	}
	for (int64_t r = 0; r < W; r++)
		CHECK(pthread_create(&th[r], NULL, run_rank, &runs[r]) == 0);
	for (int64_t r = 0; r < W; r++)
		pthread_join(th[r], NULL);
	int64_t log2w = 0;
	while ((int64_t)1 << (log2w + 1) <= W)
		log2w++;
	uint64_t vec = count * sizeof(int64_t) + 16;
	ok = 1;
	for (int64_t r = 0; r < W; r++) {
		if (runs[r].rc) {
			harness_fail(__FILE__, __LINE__, "W=%lld rank %lld: %s", (long long)W, (long long)r, runs[r].error);
			ok = 0;
			continue;
		}
		if (memcmp(runs[r].v, want, count * sizeof(*want)))
			harness_fail(__FILE__, __LINE__, "W=%lld rank %lld: not the maximum", (long long)W, (long long)r);
		most = runs[r].sent > most ? runs[r].sent : most;
		most = runs[r].received > most ? runs[r].received : most;
	}
	/* log2(W) exchanges, plus one hand-off each way for a world that is
	 * not a power of two */
	uint64_t bound = (uint64_t)(log2w + ((W & (W - 1)) ? 1 : 0)) * vec;
	if (most > bound || most < (uint64_t)log2w * vec) {
		ok = 0;
		harness_fail(__FILE__, __LINE__, "W=%lld: the busiest rank moved %llu bytes, want %llu..%llu", (long long)W,
			     (unsigned long long)most, (unsigned long long)((uint64_t)log2w * vec),
			     (unsigned long long)bound);
	}
done:
	for (int64_t r = 0; runs && r < W; r++)
		free(runs[r].v);
	free(runs);
	free(th);
	free(want);
	return ok ? most : 0;
}

TEST(allreduce_max_of_a_power_of_two_world)
{
	allreduce_case(16, 4096);
}

TEST(allreduce_max_of_a_world_that_is_not_a_power_of_two)
{
	allreduce_case(13, 4096);
	allreduce_case(3, 1);
}

TEST(allreduce_max_of_one_rank_is_its_own)
{
	allreduce_case(1, 8);
}

TEST(tree_peers_are_symmetric_xor_partners)
{
	for (int64_t W = 1; W <= 70; W++)
		for (int64_t r = 0; r < W; r++) {
			int64_t p[64], q[64];
			size_t n = vps_net_tree_peers(r, W, p);
			for (size_t i = 0; i < n; i++) {
				CHECK(p[i] >= 0 && p[i] < W && p[i] != r);
				size_t m = vps_net_tree_peers(p[i], W, q);
				bool back = false;
				for (size_t k = 0; k < m; k++)
					back |= q[k] == r;
				CHECK(back);
			}
		}
}

/* scripts/bench/agree.sh: VPS_AGREE_WORLDS="128 1024" runs the agreement of
 * those worlds, the vector three numbers per XOR step as vps-exec's, and
 * prints the busiest rank's bytes next to the formula in docs/plan.md: a
 * plan without relays all-reduces VPS_DEMAND_COUNT numbers, a relayed plan
 * with hops up to VPS_MAX_HOP VPS_DEMAND_FORWARD_COUNT more in a second
 * all-reduce (fewer hops, fewer: VPS_DEMAND_FORWARD_AGREED). */
TEST(allreduce_max_at_the_worlds_asked_for)
{
	const char *env = getenv("VPS_AGREE_WORLDS");
	for (char *end; env && *env; env = end) {
		long long W = strtoll(env, &end, 10);
		if (end == env || W < 1 || W > 65536)
			break;
		int64_t steps = vps_stage_steps(W);
		uint64_t most = allreduce_case(W, VPS_DEMAND_COUNT(steps));
		uint64_t forward = allreduce_case(W, VPS_DEMAND_FORWARD_COUNT(steps));
		int64_t log2w = 0;
		while ((int64_t)1 << (log2w + 1) <= W)
			log2w++;
		uint64_t rounds = (uint64_t)(log2w + ((W & (W - 1)) ? 1 : 0));
		printf("agree: world %lld steps %lld busiest_rank_bytes %llu formula %llu relayed_bytes %llu "
		       "relayed_formula %llu\n", W, (long long)steps, (unsigned long long)most,
		       (unsigned long long)(rounds * (8 * VPS_DEMAND_COUNT(steps) + 16)),
		       (unsigned long long)(most + forward),
		       (unsigned long long)(rounds * (8 * (VPS_DEMAND_COUNT(steps) + VPS_DEMAND_FORWARD_COUNT(steps)) + 32)));
	}
}

/* ---- the control tree ---- */

TEST(control_tree_neighbours_are_a_tree_rooted_at_rank_0)
{
	for (int64_t W = 1; W <= 90; W++) {
		int64_t seen = 0;
		for (int64_t r = 0; r < W; r++) {
			int64_t p[8], q[8];
			size_t n = vps_net_ctl_neighbours(r, W, p);
			CHECK(n <= 1 + CTL_FANOUT);
			for (size_t i = 0; i < n; i++) {
				CHECK(p[i] >= 0 && p[i] < W && p[i] != r);
				/* the other side lists this rank: as its child, or its parent */
				size_t m = vps_net_ctl_neighbours(p[i], W, q);
				bool back = false;
				for (size_t k = 0; k < m; k++)
					back |= q[k] == r && (p[i] > r ? k == 0 : k >= (size_t)(p[i] > 0));
				CHECK(back);
			}
			CHECK(r == 0 || p[0] < r);
			seen += (int64_t)n - (r > 0);
		}
		CHECK_EQ(seen, W - 1); /* every rank but 0 is someone's child */
	}
}

/* What a rank's notices said, a line each. */
struct heard {
	char text[8192];
	size_t len, count;
};

static void hear(void *ctx, const char *message)
{
	struct heard *h = ctx;
	int k = snprintf(h->text + h->len, sizeof(h->text) - h->len, "%s\n", message);
	if (k > 0)
		h->len = h->len + (size_t)k < sizeof(h->text) ? h->len + (size_t)k : sizeof(h->text) - 1;
	h->count++;
}

/* The lines of h that hold what. */
static size_t heard_lines(const struct heard *h, const char *what)
{
	size_t n = 0;
	for (const char *p = h->text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* A rank of a tree test: its network over loopback with the ranks it
 * exchanges data with (none here: the tree links only), its results. */
struct tree_rank {
	int64_t rank, world;
	int port;
	double timeout;
	int fail;            /* agree_result with this failure */
	const char *words;   /* its words */
	int calls_to_arrive; /* ready() says 1 after this many looks */
	double window;       /* of the arrival (0: 600 s) */
	vps_result_t rc;
	char error[2048];
	uint64_t sum[3];
	unsigned char id[128];
	double seconds;      /* until the agreement ended */
	struct vps_net_stats started, st; /* once started, at the end */
	const char *token;   /* NULL: the job's */
	double notice_after, notice_every; /* notices heard when notice_after > 0 */
	double sum_after;    /* seconds before it joins the sum */
	struct heard heard;
};

static int ready_after(void *ctx)
{
	int *left = ctx;
	return --*left <= 0;
}

static void *run_tree_rank(void *arg)
{
	struct tree_rank *r = arg;
	struct vps_net_opts o = {.rank = r->rank,
				 .world = r->world,
				 .master_host = "127.0.0.1",
				 .master_port = r->port,
				 .timeout = r->timeout,
				 .token = r->token ? r->token : "0123456789abcdef0123456789abcdef",
				 .bind = "127.0.0.1",
				 .plan_hash = 42,
				 .notice = r->notice_after > 0 ? hear : NULL,
				 .notice_ctx = &r->heard,
				 .notice_after = r->notice_after,
				 .notice_every = r->notice_every};
	struct vps_net *n = NULL;
	r->rc = vps_net_start(&n, &o);
	if (!r->rc)
		vps_net_stats(n, &r->started);
	r->sum[0] = (uint64_t)r->rank;
	r->sum[1] = 1;
	r->sum[2] = (uint64_t)r->rank * (uint64_t)r->rank;
	if (r->sum_after > 0) {
		struct timespec ts = {0, (long)(r->sum_after * 1e9)};
		nanosleep(&ts, NULL);
	}
	if (!r->rc)
		r->rc = vps_net_allreduce_sum(n, r->sum, 3, "sum");
	for (size_t i = 0; i < sizeof(r->id); i++)
		r->id[i] = r->rank ? 0 : (unsigned char)(i * 7 + 1);
	if (!r->rc)
		r->rc = vps_net_broadcast(n, r->id, sizeof(r->id), "id");
	int left = r->calls_to_arrive;
	struct vps_net_trainer tr = {ready_after, NULL, &left};
	if (!r->rc)
		r->rc = vps_net_arrive(n, &tr, r->window > 0 ? r->window : 600);
	double t0 = vps_net_now();
	if (!r->rc && r->fail)
		vps_fail(r->fail, "%s", r->words);
	if (!r->rc)
		r->rc = vps_net_agree_result(n, r->fail, "verdict");
	r->seconds = vps_net_now() - t0;
	if (r->rc)
		snprintf(r->error, sizeof(r->error), "%s", vps_last_error());
	if (n)
		vps_net_stats(n, &r->st);
	vps_net_free(n);
	return NULL;
}

/* W ranks as threads run the tree's collectives; rank `bad` fails the
 * verdict with words (0: none fails). */
static struct tree_rank *tree_case(int64_t W, int64_t bad, int fail, const char *words)
{
	struct tree_rank *runs = calloc((size_t)W, sizeof(*runs));
	pthread_t *th = calloc((size_t)W, sizeof(*th));
	int port = free_port();
	CHECK(runs && th && port > 0);
	if (!runs || !th || port <= 0) {
		free(th);
		free(runs);
		return NULL;
	}
	for (int64_t r = 0; r < W; r++) {
		runs[r] = (struct tree_rank){.rank = r, .world = W, .port = port, .timeout = 30, .calls_to_arrive = 1 + (int)(r % 7)};
		if (r == bad) {
			runs[r].fail = fail;
			runs[r].words = words;
		}
	}
	for (int64_t r = 0; r < W; r++)
		CHECK(pthread_create(&th[r], NULL, run_tree_rank, &runs[r]) == 0);
	for (int64_t r = 0; r < W; r++)
		pthread_join(th[r], NULL);
	free(th);
	return runs;
}

TEST(collectives_over_the_tree_give_every_rank_the_result_in_a_few_messages)
{
	const int64_t worlds[] = {1, 2, 3, 5, 6, 21, 40};
	for (size_t k = 0; k < sizeof(worlds) / sizeof(*worlds); k++) {
		int64_t W = worlds[k];
		struct tree_rank *runs = tree_case(W, -1, 0, NULL);
		for (int64_t r = 0; runs && r < W; r++) {
			const struct tree_rank *x = &runs[r];
			if (x->rc) {
				harness_fail(__FILE__, __LINE__, "W=%lld rank %lld: %s", (long long)W, (long long)r, x->error);
				continue;
			}
			CHECK_EQ(x->sum[0], W * (W - 1) / 2);
			CHECK_EQ(x->sum[1], W);
			CHECK_EQ(x->sum[2], (W - 1) * W * (2 * W - 1) / 6);
			for (size_t i = 0; i < sizeof(x->id); i++)
				CHECK_EQ(x->id[i], (unsigned char)(i * 7 + 1));
			/* a part up and the result down on each tree link, and in an
			 * arrival "someone arrived" at most once each way */
			int64_t nb[8];
			uint64_t links = vps_net_ctl_neighbours(r, W, nb);
			CHECK(x->st.control_messages_per_collective <= 4 * links);
			CHECK_EQ(x->started.control_connections, W > 1 ? links : 0);
			CHECK_EQ(x->started.data_connections, 0);
			CHECK(x->st.bootstrap_connections == (W == 1 ? 0 : r == 0 ? (size_t)W - 1 : 1));
		}
		free(runs);
	}
}

TEST(a_failed_rank_is_named_to_every_rank_in_words_made_safe)
{
	/* no NUL after the text on the wire, control characters, bytes that are
	 * not UTF-8, and more than a failure carries */
	char words[1024];
	int len = snprintf(words, sizeof(words), "\x1b[31mred\x07 \xff\xfe caf\xc3\xa9 back\\slash ");
	memset(words + len, 'A', 600);
	snprintf(words + len + 600, sizeof(words) - (size_t)len - 600, "END");
	int64_t W = 6;
	struct tree_rank *runs = tree_case(W, 4, VPS_EINPUT, words);
	for (int64_t r = 0; runs && r < W; r++) {
		const struct tree_rank *x = &runs[r];
		if (r == 4) {
			CHECK_EQ(x->rc, VPS_EINPUT);
			CHECK(strncmp(x->error, "\x1b[31mred", 8) == 0);
			continue;
		}
		CHECK_EQ(x->rc, VPS_EPEER);
		const char *want = "rank 4 failed: \\x1b[31mred\\x07 \\xff\\xfe caf\xc3\xa9 back\\x5cslash AAAA";
		if (strncmp(x->error, want, strlen(want)))
			harness_fail(__FILE__, __LINE__, "rank %lld: %s", (long long)r, x->error);
		CHECK(!strstr(x->error, "END"));
		CHECK(strlen(x->error) < 500);
		for (const char *c = x->error; *c; c++)
			CHECK((unsigned char)*c >= 0x20 && *c != 0x7f);
	}
	free(runs);
}

/* Ranks of W but `bad` as threads, `bad` a process of its own that
 * stops (SIGSTOP) or exits once its network is up; the others begin a sum.
 * Each must fail naming it, within the timeout after its last sign of life
 * (twice it, at most, from the start: a neighbour is given the timeout to
 * finish its own start). */
static void lost_rank_case(int64_t W, int64_t bad, bool stop)
{
	int port = free_port();
	CHECK(port > 0);
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		struct vps_net_opts o = {.rank = bad, .world = W, .master_host = "127.0.0.1", .master_port = port,
					 .timeout = 1.0, .token = "0123456789abcdef0123456789abcdef", .bind = "127.0.0.1",
					 .plan_hash = 42};
		struct vps_net *n = NULL;
		if (vps_net_start(&n, &o))
			_exit(2);
		if (stop)
			raise(SIGSTOP);
		_exit(0);
	}
	struct tree_rank *runs = calloc((size_t)W, sizeof(*runs));
	pthread_t *th = calloc((size_t)W, sizeof(*th));
	for (int64_t r = 0; runs && th && r < W; r++) {
		runs[r] = (struct tree_rank){.rank = r, .world = W, .port = port, .timeout = 1.0, .calls_to_arrive = 1};
		if (r != bad)
			CHECK(pthread_create(&th[r], NULL, run_tree_rank, &runs[r]) == 0);
	}
	for (int64_t r = 0; runs && th && r < W; r++)
		if (r != bad)
			pthread_join(th[r], NULL);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	char named[64];
	/* a rank that exits with bytes unread resets its connections */
	snprintf(named, sizeof(named), stop ? "rank %lld gave no sign of life for 1 s" : "rank %lld", (long long)bad);
	for (int64_t r = 0; runs && th && r < W; r++) {
		if (r == bad)
			continue;
		CHECK(runs[r].rc == VPS_EPEER || runs[r].rc == VPS_ETIMEOUT);
		if (!strstr(runs[r].error, named))
			harness_fail(__FILE__, __LINE__, "W=%lld rank %lld: %s", (long long)W, (long long)r, runs[r].error);
	}
	free(runs);
	free(th);
}

TEST(a_stopped_rank_0_or_leaf_is_named_by_every_rank)
{
	lost_rank_case(5, 0, true);
	lost_rank_case(5, 3, true);
	lost_rank_case(7, 1, true); /* its child, rank 5, only knows it */
}

TEST(a_rank_that_exits_is_named_by_every_rank)
{
	lost_rank_case(6, 1, false);
}

/* A rank that gives up for a reason of its own closes its data
 * connections as it goes: its partner, mid-exchange, sees the connection
 * end before the reason reaches it by the tree, and waits for it; no rank
 * names the partner's symptom as the job's failure. */
struct leaving_rank {
	int64_t rank;
	int port;
	vps_result_t rc;
	char error[2048];
};

static void *run_leaving_rank(void *arg)
{
	struct leaving_rank *r = arg;
	int64_t peers[8];
	size_t np = vps_net_tree_peers(r->rank, 4, peers);
	struct vps_net_opts o = {.rank = r->rank, .world = 4, .master_host = "127.0.0.1", .master_port = r->port,
				 .timeout = 10.0, .token = "0123456789abcdef0123456789abcdef", .bind = "127.0.0.1",
				 .plan_hash = 42, .peers = peers, .npeers = np};
	struct vps_net *n = NULL;
	r->rc = vps_net_start(&n, &o);
	vps_result_t mine = VPS_OK;
	if (!r->rc && r->rank == 1) {
		/* the reason comes after the connection ends */
		shutdown(n->fds[vps_net_peer_index(n, 3)], SHUT_RDWR);
		struct timespec ts = {0, 300000000};
		nanosleep(&ts, NULL);
		mine = vps_fail(VPS_EINPUT, "the reason rank 1 gave up");
	} else if (!r->rc && r->rank == 3) {
		unsigned char b[8];
		struct iovec v = {b, sizeof(b)};
		struct vps_net_msg m = {.peer = 1, .recv = true, .recv_iov = &v, .recv_iovcnt = 1, .tag = 7};
		mine = vps_net_exchange(n, &m, 1, "stage 5");
	}
	if (!r->rc)
		r->rc = vps_net_agree_result(n, mine, "verdict");
	if (r->rc)
		snprintf(r->error, sizeof(r->error), "%s", vps_last_error());
	vps_net_free(n);
	return NULL;
}

TEST(a_partner_whose_connection_ended_names_the_reason_the_tree_brings)
{
	struct leaving_rank runs[4];
	pthread_t th[4];
	int port = free_port();
	CHECK(port > 0);
	for (int64_t r = 0; r < 4; r++) {
		runs[r] = (struct leaving_rank){.rank = r, .port = port};
		CHECK(pthread_create(&th[r], NULL, run_leaving_rank, &runs[r]) == 0);
	}
	for (int r = 0; r < 4; r++)
		pthread_join(th[r], NULL);
	CHECK_EQ(runs[1].rc, VPS_EINPUT);
	for (int r = 0; r < 4; r++)
		if (!strstr(runs[r].error, "the reason rank 1 gave up") || (r != 3 && strstr(runs[r].error, "rank 3")))
			harness_fail(__FILE__, __LINE__, "rank %d: %s", r, runs[r].error);
	/* the partner says what it saw, and why */
	CHECK(strstr(runs[3].error, "stage 5: rank 1 closed the connection; rank 1 failed: the reason") != NULL);
}

TEST(peer_text_is_cut_terminated_and_escaped)
{
	char out[32];
	const char in[] = {'o', 'k', ' ', '\n', '\\', (char)0xe2, (char)0x82, (char)0xac, (char)0xc0, (char)0xaf, 'x'};
	CHECK_EQ(vps_net_sanitize(out, sizeof(out), in, sizeof(in)), strlen(out));
	CHECK(strcmp(out, "ok \\x0a\\x5c\xe2\x82\xac\\xc0\\xafx") == 0);
	/* a NUL ends it; no byte past len is read; the output always ends */
	CHECK_EQ(vps_net_sanitize(out, sizeof(out), "ab\0cd", 5), 2);
	CHECK_EQ(vps_net_sanitize(out, 4, "abcdef", 6), 3);
	CHECK(strcmp(out, "abc") == 0);
	CHECK_EQ(vps_net_sanitize(out, 6, "ab\x01", 3), 2); /* no half escape */
	CHECK(strcmp(out, "ab") == 0);
}

TEST(a_trainer_later_than_the_window_is_named_by_every_rank)
{
	int64_t W = 6;
	int port = free_port();
	struct tree_rank runs[6];
	pthread_t th[6];
	for (int64_t r = 0; r < W; r++) {
		runs[r] = (struct tree_rank){.rank = r, .world = W, .port = port, .timeout = 30, .window = 0.8,
					     .calls_to_arrive = r == 4 ? 1 << 30 : 1};
		CHECK(pthread_create(&th[r], NULL, run_tree_rank, &runs[r]) == 0);
	}
	double t0 = vps_net_now();
	for (int64_t r = 0; r < W; r++)
		pthread_join(th[r], NULL);
	/* the window runs from the first request (and a sixteenth of it before
	 * "someone arrived" is said, whose age each rank takes off) */
	double took = vps_net_now() - t0;
	CHECK(took >= 0.8 && took < 3.0);
	CHECK_EQ(runs[4].rc, VPS_ETIMEOUT);
	CHECK(strstr(runs[4].error, "the trainer did not request the switch within 0.8 s of the first rank's request") != NULL);
	for (int64_t r = 0; r < W; r++)
		if (r != 4 && (runs[r].rc != VPS_EPEER || !strstr(runs[r].error, "rank 4 failed: the trainer did not request")))
			harness_fail(__FILE__, __LINE__, "rank %lld: %s", (long long)r, runs[r].error);
}

/* ---- waits that say whom they wait for ---- */

/* Ranks but the absent ones of W as threads, each told notices; returns
 * them once every thread ended. */
static void run_ranks(struct tree_rank *runs, int64_t W, const bool *absent)
{
	pthread_t th[8];
	for (int64_t r = 0; r < W; r++)
		if (!absent || !absent[r])
			CHECK(pthread_create(&th[r], NULL, run_tree_rank, &runs[r]) == 0);
	for (int64_t r = 0; r < W; r++)
		if (!absent || !absent[r])
			pthread_join(th[r], NULL);
}

TEST(a_bootstrap_names_whom_it_waits_for_once_or_every_period)
{
	/* rank 2 never comes: rank 0 knows it, rank 1 waits for rank 0 */
	int port = free_port();
	struct tree_rank runs[3];
	bool absent[3] = {false, false, true};
	for (int64_t r = 0; r < 3; r++)
		runs[r] = (struct tree_rank){.rank = r, .world = 3, .port = port, .timeout = 1.2, .calls_to_arrive = 1,
					     .notice_after = 0.1, .notice_every = r == 1 ? 0.2 : 0};
	run_ranks(runs, 3, absent);
	char want[128];
	snprintf(want, sizeof(want), "bootstrap: waiting for rank 2 to join at 127.0.0.1:%d (", port);
	CHECK_EQ(runs[0].rc, VPS_ETIMEOUT);
	CHECK(strstr(runs[0].error, "bootstrap: rank 2 did not come within 1.2 s") != NULL);
	/* once, before the timeout's message: the notice is not the error */
	CHECK_EQ(heard_lines(&runs[0].heard, want), 1);
	CHECK_EQ(runs[0].heard.count, 1);
	CHECK(strstr(runs[0].heard.text, "s so far; timeout 1.2 s)\n") != NULL);
	/* every period while it lasts */
	snprintf(want, sizeof(want), "bootstrap: waiting for rank 0 at 127.0.0.1:%d to hear from every rank (", port);
	CHECK(runs[1].rc != VPS_OK);
	CHECK(heard_lines(&runs[1].heard, want) >= 2);
	CHECK_EQ(heard_lines(&runs[1].heard, want), runs[1].heard.count);
	if (runs[0].heard.count != 1 || runs[1].heard.count < 2)
		fprintf(stderr, "rank 0 heard:\n%srank 1 heard:\n%s", runs[0].heard.text, runs[1].heard.text);
}

TEST(a_peer_with_another_token_is_named_after_a_few_refusals_and_refused_still)
{
	int port = free_port();
	struct tree_rank runs[2];
	for (int64_t r = 0; r < 2; r++)
		runs[r] = (struct tree_rank){.rank = r, .world = 2, .port = port, .timeout = 1.0, .calls_to_arrive = 1,
					     .notice_after = 0.1, .token = r ? "ffffffffffffffffffffffffffffffff" : NULL};
	run_ranks(runs, 2, NULL);
	CHECK_EQ(runs[0].rc, VPS_ETIMEOUT);
	CHECK_EQ(runs[1].rc, VPS_ETIMEOUT);
	CHECK_EQ(heard_lines(&runs[0].heard, "rank 1 at 127.0.0.1 (as its hello says) was refused 3 times: it does not "
					     "prove the job token (another job's VPS_TOKEN?)"),
		 1);
	CHECK_EQ(heard_lines(&runs[0].heard, "was refused"), 1);
	/* refused many more times than named, and counted in the error */
	CHECK(strstr(runs[0].error, "of them from 127.0.0.1 as rank 1: does every rank hold the same VPS_TOKEN?") != NULL);
	char want[128];
	snprintf(want, sizeof(want), "rank 0 at 127.0.0.1:%d turned this rank away 3 times: another job's VPS_TOKEN?", port);
	CHECK_EQ(heard_lines(&runs[1].heard, want), 1);
	CHECK_EQ(heard_lines(&runs[1].heard, "turned this rank away"), 2); /* and its wait says so */
	if (heard_lines(&runs[1].heard, want) != 1)
		fprintf(stderr, "rank 0 heard:\n%srank 1 heard:\n%s", runs[0].heard.text, runs[1].heard.text);
}

TEST(a_rank_whose_trainer_is_late_is_named_by_its_parent_and_the_others_wait_for_rank_0)
{
	int64_t W = 6;
	int port = free_port();
	struct tree_rank runs[6];
	for (int64_t r = 0; r < W; r++)
		runs[r] = (struct tree_rank){.rank = r, .world = W, .port = port, .timeout = 30, .window = 1.0,
					     .calls_to_arrive = r == 4 ? 1 << 30 : 1, .notice_after = 0.1};
	run_ranks(runs, W, NULL);
	CHECK_EQ(runs[4].rc, VPS_ETIMEOUT);
	/* rank 4 is rank 0's child; rank 1's subtree (1, 5) is ready */
	CHECK_EQ(heard_lines(&runs[0].heard, "the switch's start: this rank is ready; waiting for rank 4 at 127.0.0.1 "
					     "(or a rank below it in the control tree) ("),
		 1);
	CHECK_EQ(runs[0].heard.count, 1);
	CHECK_EQ(heard_lines(&runs[1].heard, "the switch's start: this rank and those below it in the control tree are "
					     "ready; waiting for the others, whose word comes from rank 0 through rank 0 at "
					     "127.0.0.1 ("),
		 1);
	CHECK_EQ(heard_lines(&runs[5].heard, "whose word comes from rank 0 through rank 1 at 127.0.0.1 ("), 1);
	/* the late rank's own wait is its trainer's, said by the executor */
	CHECK_EQ(runs[4].heard.count, 0);
	if (runs[0].heard.count != 1)
		fprintf(stderr, "rank 0 heard:\n%s", runs[0].heard.text);
}

TEST(a_collective_names_the_rank_it_waits_for)
{
	/* rank 2 joins the sum late: its parent, rank 0, names it; rank 1 waits
	 * for the result from rank 0 */
	int port = free_port();
	struct tree_rank runs[3];
	for (int64_t r = 0; r < 3; r++)
		runs[r] = (struct tree_rank){.rank = r, .world = 3, .port = port, .timeout = 30, .calls_to_arrive = 1,
					     .notice_after = 0.1, .sum_after = r == 2 ? 0.6 : 0};
	run_ranks(runs, 3, NULL);
	for (int64_t r = 0; r < 3; r++)
		CHECK_OK(runs[r].rc);
	CHECK_EQ(heard_lines(&runs[0].heard, "sum: this rank is ready; waiting for rank 2 at 127.0.0.1 (or a rank below it "
					     "in the control tree) ("),
		 1);
	CHECK_EQ(heard_lines(&runs[1].heard, "sum: this rank and those below it in the control tree are ready; waiting for "
					     "the others, whose word comes from rank 0 through rank 0 at 127.0.0.1 ("),
		 1);
	CHECK_EQ(runs[2].heard.count, 0);
	if (runs[0].heard.count != 1)
		fprintf(stderr, "rank 0 heard:\n%srank 1 heard:\n%s", runs[0].heard.text, runs[1].heard.text);
}

TEST(a_mesh_names_the_rank_it_cannot_connect_to_and_where)
{
	/* rank 1 bootstraps by hand, saying it listens where nobody answers,
	 * then never meshes: rank 0 connects there and waits */
	int port = free_port();
	struct tree_rank run0 = {.rank = 0, .world = 2, .port = port, .timeout = 1.5, .calls_to_arrive = 1,
				 .notice_after = 0.3};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, run_tree_rank, &run0) == 0);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	CHECK(lfd >= 0 && !bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) && !listen(lfd, 4) &&
	      !getsockname(lfd, (struct sockaddr *)&sa, &len));
	unsigned char key[VPS_AUTH_KEY];
	vps_auth_key("0123456789abcdef0123456789abcdef", key);
	struct outbound out = {.rank = 0, .kind = HELLO_CTL};
	CHECK_OK(vps_net_resolve("127.0.0.1", port, &out.sa));
	struct handshake hs = {.key = key, .me = 1, .world = 2, .plan_hash = 42, .kinds = 1u << HELLO_CTL, .lfd = -1,
			       .out = &out, .nout = 1, .deadline = vps_net_now() + 1.0,
			       .listen = (uint64_t)sa.sin_addr.s_addr << 16 | ntohs(sa.sin_port)};
	CHECK_OK(vps_net_handshake(&hs));
	uint64_t none = 0, answer[2] = {1, 1};
	CHECK_OK(vps_net_send_all(out.fd, &none, sizeof(none), 1.0, "test"));
	CHECK_OK(vps_net_recv_all(out.fd, answer, sizeof(answer), 1.0, "test"));
	CHECK(answer[0] == 0 && answer[1] == 0);
	close(out.fd);
	pthread_join(th, NULL);
	close(lfd);
	char want[160];
	snprintf(want, sizeof(want), "connecting the ranks: waiting for rank 1 at 127.0.0.1:%d (connected, no answer yet) (", ntohs(sa.sin_port));
	CHECK_EQ(run0.rc, VPS_ETIMEOUT);
	CHECK(strstr(run0.error, "connecting the ranks: no connection with rank 1 within 1.5 s") != NULL);
	CHECK_EQ(heard_lines(&run0.heard, want), 1);
	if (heard_lines(&run0.heard, want) != 1)
		fprintf(stderr, "rank 0 heard:\n%s", run0.heard.text);
}

/* An acceptor of the version before this one (the digest's function
 * changed): its challenge carries the magic "VPSNET3". */
static void *old_acceptor(void *arg)
{
	int fd = accept(*(int *)arg, NULL, NULL);
	if (fd >= 0) {
		struct challenge c = {0x3354454e535056ULL, {0}};
		char buf[256];
		if (send(fd, &c, sizeof(c), MSG_NOSIGNAL) == (ssize_t)sizeof(c))
			while (recv(fd, buf, sizeof(buf), 0) > 0) /* until the connector hangs up */
				;
		close(fd);
	}
	return NULL;
}

TEST(an_executor_of_the_version_before_is_refused_by_name)
{
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	CHECK(lfd >= 0 && !bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) && !listen(lfd, 4) &&
	      !getsockname(lfd, (struct sockaddr *)&sa, &len));
	pthread_t th;
	CHECK(pthread_create(&th, NULL, old_acceptor, &lfd) == 0);
	unsigned char key[VPS_AUTH_KEY];
	vps_auth_key("0123456789abcdef0123456789abcdef", key);
	struct outbound out = {.rank = 0, .kind = HELLO_CTL};
	CHECK_OK(vps_net_resolve("127.0.0.1", ntohs(sa.sin_port), &out.sa));
	struct handshake hs = {.key = key, .me = 1, .world = 2, .plan_hash = 42, .kinds = 1u << HELLO_CTL, .lfd = -1,
			       .out = &out, .nout = 1, .deadline = vps_net_now() + 3.0};
	CHECK_EQ(vps_net_handshake(&hs), VPS_EPEER);
	char want[96];
	snprintf(want, sizeof(want), "127.0.0.1:%d is not a vps-exec of this version (rank 0 was expected there)",
		 ntohs(sa.sin_port));
	CHECK(strstr(vps_last_error(), want) != NULL);
	if (out.fd >= 0)
		close(out.fd);
	shutdown(lfd, SHUT_RDWR);
	pthread_join(th, NULL);
	close(lfd);
}
