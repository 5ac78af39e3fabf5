/* The executors' agreement on stage boundaries, as it runs: W ranks as
 * threads of this process, each with its own vps_net over loopback, whose
 * mesh holds only the partners of the all-reduce. Every rank must end with
 * the element-wise maximum, and no rank, rank 0 included, may send or
 * receive more than log2(W) + 1 vectors: the O(steps log W) bytes per rank
 * that docs/plan.md promises at 16,384 ranks. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "exec/net/net.h"
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
	struct vps_net_opts o = {r->rank,  r->world, "127.0.0.1", r->port, 30.0, "0123456789abcdef0123456789abcdef",
				 "127.0.0.1", 42, peers, np, NULL};
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

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {0};
	socklen_t len = sizeof(sa);
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	close(fd);
	return ntohs(sa.sin_port);
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
 * those worlds, the vector one number per XOR step as vps-exec's, and
 * prints the busiest rank's bytes next to the formula in docs/plan.md
 * (three numbers per step: VPS_DEMAND_COUNT). */
TEST(allreduce_max_at_the_worlds_asked_for)
{
	const char *env = getenv("VPS_AGREE_WORLDS");
	for (char *end; env && *env; env = end) {
		long long W = strtoll(env, &end, 10);
		if (end == env || W < 1 || W > 65536)
			break;
		int64_t steps = vps_stage_steps(W);
		uint64_t most = allreduce_case(W, VPS_DEMAND_COUNT(steps));
		int64_t log2w = 0;
		while ((int64_t)1 << (log2w + 1) <= W)
			log2w++;
		printf("agree: world %lld steps %lld busiest_rank_bytes %llu formula %llu\n", W, (long long)steps,
		       (unsigned long long)most,
		       (unsigned long long)((log2w + ((W & (W - 1)) ? 1 : 0)) * (8 * VPS_DEMAND_COUNT(steps) + 16)));
	}
}
