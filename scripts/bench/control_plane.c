/* The executors' control plane at W ranks on one machine: every rank a
 * thread of this process running the real lib/exec/net code over loopback
 * TCP (its bootstrap through rank 0, its mesh, its control tree), with the
 * collectives a switch runs, in the executor's order, and a plan that
 * moves little (64 bytes to each ring neighbour). The ranks are spread
 * over processes that each hold as many as their open-file limit allows
 * (both ends of every connection are on this machine), and a process's
 * ranks share one loop thread for their control trees (vps_net_loop), not
 * one each: the machine cannot hold 2 W threads at 16,384 ranks.
 *
 * Prints, per phase, rank 0's wall time, its CPU time (its own thread's,
 * and the loop's time on its tree) and its messages, and per world the
 * busiest rank's messages per collective, each rank's connections and the
 * memory its network holds; scripts/bench/control_plane.sh makes the table.
 *   control_plane [--timeout S] [--pace MS] W...
 * --pace MS: the world's last rank comes MS milliseconds late to each
 *   collective, so that each lasts about as long as a larger world's does
 *   on this machine (its figures are printed as "paced" lines): rank 0's
 *   CPU time per collective grows with how long it waits, not with the
 *   world, which is what a small world paced like a large one shows.
 *   control_plane --registry NAME SECONDS: a trainer's registry that never
 *       asks for a switch (control_plane.sh measures an idle executor) */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/times.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exec/net/net.h"
#include "vps/registry.h"

/* The ranks' starts lie this far apart: 16,384 ranks come within 3.3 s. */
#define START_GAP 0.0002

/* The switches each rank runs on its connections, as vps-exec --serve
 * does: each phase's figure is rank 0's median over them. */
#define SWITCHES 15

enum { BOOTSTRAP, TRANSPORTS, ARRIVAL, TRAINING, START, STAGE, VERDICT, DIGEST, NPHASES };
static const char *const phase_name[NPHASES] = {"bootstrap", "transports", "arrival", "training",
						"start",     "stage",      "verdict", "digest"};

struct rank {
	int64_t rank, world;
	int port;
	double timeout;
	double pace; /* seconds the last rank comes late to each collective */
	struct vps_net_loop *loop;
	vps_result_t rc;
	char error[512];
	int failed_phase;
	double failed_at;
	double wall[NPHASES][SWITCHES], cpu[NPHASES][SWITCHES];
	uint64_t msgs[NPHASES], wakes[NPHASES];
	int sw;  /* the switch the phases are timed for */
	uint64_t transports; /* what the transports' sum gave */
	struct vps_net_stats started, end;
	size_t npeers;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ready_now(void *ctx)
{
	(void)ctx;
	return 1;
}

/* The ranks an executor's mesh holds: its plan's peers (here its ring
 * neighbours) and its partners in the stage boundaries' all-reduce. */
static size_t mesh_peers(int64_t r, int64_t W, int64_t *out)
{
	size_t n = vps_net_tree_peers(r, W, out);
	if (W > 1)
		out[n++] = (r + 1) % W;
	if (W > 2)
		out[n++] = (r + W - 1) % W;
	return n;
}

/* One phase of a rank: the call, timed, and its messages counted. */
#define PHASE(r, n, p, call)                                                                     \
	do {                                                                                     \
		if ((r)->rc)                                                                     \
			break;                                                                   \
		struct vps_net_stats b_, a_;                                                     \
		if (n)                                                                           \
			vps_net_stats(n, &b_);                                                   \
		double w0_ = now(), c0_ = thread_cpu();                                          \
		(r)->rc = (call);                                                                \
		(r)->wall[p][(r)->sw] = now() - w0_;                                             \
		(r)->cpu[p][(r)->sw] = thread_cpu() - c0_;                                       \
		if (n) {                                                                         \
			vps_net_stats(n, &a_);                                                   \
			uint64_t m_ = (p) == STAGE ? a_.control_messages_sent + a_.control_messages_received - \
							     b_.control_messages_sent - b_.control_messages_received   \
						   : a_.control_messages_last_collective;                          \
			(r)->cpu[p][(r)->sw] += a_.control_cpu_seconds - b_.control_cpu_seconds; \
			(r)->msgs[p] = m_ > (r)->msgs[p] ? m_ : (r)->msgs[p];                      \
			m_ = a_.control_wakes - b_.control_wakes;                                \
			(r)->wakes[p] = m_ > (r)->wakes[p] ? m_ : (r)->wakes[p];                   \
		}                                                                                \
		if ((r)->rc) {                                                                   \
			(r)->failed_phase = p;                                                   \
			(r)->failed_at = now();                                                  \
		}                                                                                \
	} while (0)

static vps_result_t stage(struct vps_net *n, struct rank *r)
{
	if (r->world < 2)
		return VPS_OK;
	unsigned char out[2][64], in[2][64];
	struct iovec so[2], si[2];
	struct vps_net_msg m[2];
	int64_t nb[2] = {(r->rank + 1) % r->world, (r->rank + r->world - 1) % r->world};
	size_t k = r->world > 2 ? 2 : 1;
	for (size_t i = 0; i < k; i++) {
		memset(out[i], (int)(r->rank & 0xff), sizeof(out[i]));
		so[i] = (struct iovec){out[i], sizeof(out[i])};
		si[i] = (struct iovec){in[i], sizeof(in[i])};
		m[i] = (struct vps_net_msg){nb[i], true, true, &so[i], 1, &si[i], 1, 7};
	}
	vps_result_t rc = vps_net_exchange(n, m, k, "stage 0 of 1");
	for (size_t i = 0; !rc && i < k; i++)
		if (in[i][0] != (unsigned char)(nb[i] & 0xff))
			rc = VPS_ECHECK;
	return rc;
}

/* Rank W-1 of a paced world, before each collective: the tree waits for
 * it, and rank 0 idles as long as in a larger world. */
static void come_late(const struct rank *r)
{
	if (r->pace <= 0 || r->rank != r->world - 1)
		return;
	struct timespec ts = {(time_t)r->pace, (long)((r->pace - (double)(time_t)r->pace) * 1e9)};
	nanosleep(&ts, NULL);
}

static void *run_rank(void *arg)
{
	struct rank *r = arg;
	int64_t peers[70];
	r->npeers = mesh_peers(r->rank, r->world, peers);
	/* each rank listens on an address of its own in 127/8, as on a host of
	 * its own: the ports of one address would not hold 16,384 listeners and
	 * their connections */
	char here[32];
	snprintf(here, sizeof(here), "127.%d.%d.%d", 1 + (int)(r->rank >> 16), (int)(r->rank >> 8) & 255,
		 (int)r->rank & 255);
	struct vps_net_opts o = {.rank = r->rank, .world = r->world, .master_host = "127.0.0.1", .master_port = r->port,
				 .timeout = r->timeout, .token = "0123456789abcdef0123456789abcdef", .bind = here,
				 .plan_hash = 42, .peers = peers, .npeers = r->npeers, .loop = r->loop};
	struct vps_net *n = NULL;
	/* ranks come as a launcher starts them, not at one instant: a rank
	 * every START_GAP seconds */
	struct timespec ts = {0, (long)(START_GAP * 1e9 * (double)r->rank)};
	ts.tv_sec = ts.tv_nsec / 1000000000;
	ts.tv_nsec %= 1000000000;
	nanosleep(&ts, NULL);
	PHASE(r, (struct vps_net *)NULL, BOOTSTRAP, vps_net_start(&n, &o));
	if (n)
		vps_net_stats(n, &r->started);
	/* the executor's collectives, in its order (lib/exec/exec.c): the
	 * transports once, then per switch the arrival, the training state,
	 * the start, the stages, the verdict and the digest */
	uint64_t needed[1] = {(uint64_t)(r->rank % 3 == 0)};
	come_late(r);
	PHASE(r, n, TRANSPORTS, vps_net_allreduce_sum(n, needed, 1, "transports"));
	r->transports = needed[0];
	for (r->sw = 0; r->sw < SWITCHES && !r->rc; r->sw++) {
		const struct vps_net_trainer at_once = {ready_now, NULL, NULL};
		come_late(r);
		PHASE(r, n, ARRIVAL, vps_net_arrive(n, &at_once, 600));
		uint64_t training[8] = {0};
		if (r->rank == 0)
			training[0] = 1000, training[7] = 1;
		come_late(r);
		PHASE(r, n, TRAINING, vps_net_allreduce_sum(n, training, 8, "training state"));
		come_late(r);
		PHASE(r, n, START, vps_net_agree_result(n, VPS_OK, "start"));
		PHASE(r, n, STAGE, stage(n, r));
		come_late(r);
		PHASE(r, n, VERDICT, vps_net_agree_result(n, VPS_OK, "end of transfer"));
		uint64_t digest[2] = {(uint64_t)r->rank, 1};
		come_late(r);
		PHASE(r, n, DIGEST, vps_net_allreduce_sum(n, digest, 2, "digest"));
		if (!r->rc && (training[0] + 10 * training[7] != 1010 || digest[0] != (uint64_t)(r->world * (r->world - 1) / 2) ||
			       digest[1] != (uint64_t)r->world))
			r->rc = VPS_ECHECK, r->failed_phase = DIGEST, r->failed_at = now();
	}
	if (r->rc)
		snprintf(r->error, sizeof(r->error), "%s", vps_last_error());
	if (n)
		vps_net_stats(n, &r->end);
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
	int port = 0;
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof(sa)) && !getsockname(fd, (struct sockaddr *)&sa, &len))
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* This process's peak resident memory, in kB (VmHWM). */
static long peak_rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			kb = atol(line + 6);
	if (f)
		fclose(f);
	return kb;
}

/* What one process of ranks [lo, hi) found, for the parent to combine. */
struct summary {
	int64_t failed;
	uint64_t most_msgs, most_data, most_ctl;
	size_t most_mem, most_mem_peak_other;
	long rss_kb;
	double phase_wall[NPHASES], phase_cpu[NPHASES];
	uint64_t phase_msgs[NPHASES], phase_wakes[NPHASES], rank0_msgs, rank0_bootstrap, rank0_mem_peak;
	bool has_rank0;
	int pinned; /* the process was pinned (rank 0 to a CPU of its own) */
	double failed_at; /* the first failure, the likely cause of the others */
	char error[512];
};

static double median(const double *v, int n)
{
	double s[SWITCHES];
	memcpy(s, v, (size_t)n * sizeof(*v));
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
			double t = s[j];
			s[j] = s[j - 1];
			s[j - 1] = t;
		}
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void summarise(const struct rank *x, int64_t W, struct summary *sum)
{
	bool wrong = !x->rc && x->transports != (uint64_t)((W + 2) / 3);
	if (x->rc || wrong) {
		if (!sum->failed++ || x->failed_at < sum->failed_at) {
			sum->failed_at = x->failed_at;
			/* the rank's words, cut to leave room for the rank and the phase */
			snprintf(sum->error, sizeof(sum->error), "rank %lld, %s: %.400s", (long long)x->rank,
				 x->failed_phase >= 0 ? phase_name[x->failed_phase] : "sums",
				 x->rc == VPS_ECHECK ? "wrong sums" : x->rc ? x->error : "wrong sums");
		}
		return;
	}
	uint64_t m = x->end.control_messages_per_collective;
	sum->most_msgs = m > sum->most_msgs ? m : sum->most_msgs;
	sum->most_data = x->started.data_connections > sum->most_data ? x->started.data_connections : sum->most_data;
	sum->most_ctl = x->started.control_connections > sum->most_ctl ? x->started.control_connections : sum->most_ctl;
	sum->most_mem = x->started.memory > sum->most_mem ? x->started.memory : sum->most_mem;
	if (x->rank && x->end.memory_peak > sum->most_mem_peak_other)
		sum->most_mem_peak_other = x->end.memory_peak;
	if (x->rank == 0) {
		sum->has_rank0 = true;
		for (int p = 0; p < NPHASES; p++) {
			int k = p == BOOTSTRAP || p == TRANSPORTS ? 1 : SWITCHES;
			sum->phase_wall[p] = median(x->wall[p], k);
			sum->phase_cpu[p] = median(x->cpu[p], k);
			sum->phase_msgs[p] = x->msgs[p];
			sum->phase_wakes[p] = x->wakes[p];
		}
		sum->rank0_msgs = m;
		sum->rank0_bootstrap = x->started.bootstrap_connections;
		sum->rank0_mem_peak = x->end.memory_peak;
	}
}

/* Ranks [lo, hi) of W as threads of this process, their control trees on
 * one loop thread. */
static void run_ranks(int64_t W, int64_t lo, int64_t hi, int port, double timeout, double pace, struct summary *sum)
{
	memset(sum, 0, sizeof(*sum));
	struct vps_net_loop *loop = NULL;
	struct rank *ranks = calloc((size_t)(hi - lo), sizeof(*ranks));
	pthread_t *th = calloc((size_t)(hi - lo), sizeof(*th));
	if (!ranks || !th || vps_net_loop_new(&loop)) {
		snprintf(sum->error, sizeof(sum->error), "ranks %lld to %lld: cannot start", (long long)lo, (long long)hi - 1);
		sum->failed = hi - lo;
		free(ranks);
		free(th);
		return;
	}
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 256 << 10);
	int64_t started = 0;
	for (int64_t r = lo; r < hi; r++) {
		ranks[r - lo] = (struct rank){.rank = r, .world = W, .port = port, .timeout = timeout, .pace = pace,
					      .loop = loop, .failed_phase = -1};
		if (pthread_create(&th[r - lo], &at, run_rank, &ranks[r - lo]))
			break;
		started++;
	}
	for (int64_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_attr_destroy(&at);
	if (started < hi - lo) {
		sum->failed = hi - lo - started;
		snprintf(sum->error, sizeof(sum->error), "rank %lld: no thread", (long long)(lo + started));
	}
	for (int64_t i = 0; i < started; i++)
		summarise(&ranks[i], W, sum);
	vps_net_loop_free(loop);
	sum->rss_kb = peak_rss_kb();
	free(ranks);
	free(th);
}

/* Rank 0 on a CPU of its own and every other rank on the others, where
 * this process may use two or more: on a cluster rank 0's cores are its
 * own, and thousands of threads run between its system calls on a shared
 * core cost it cold caches, not work of its own. 1 when it pinned. */
static int pin_rank0(bool rank0)
{
	cpu_set_t allowed, mine;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2)
		return 0;
	int first = 0;
	while (!CPU_ISSET(first, &allowed))
		first++;
	CPU_ZERO(&mine);
	if (rank0) {
		CPU_SET(first, &mine);
	} else {
		mine = allowed;
		CPU_CLR(first, &mine);
	}
	return sched_setaffinity(0, sizeof(mine), &mine) == 0;
}

/* W ranks over enough processes that each holds both ends of its ranks'
 * connections within its open-file limit. */
static int run_world(int64_t W, double timeout, double pace, int64_t per_process)
{
	int port = free_port();
	/* rank 0 in a process of its own, ahead of the others: on a cluster it
	 * has its own cores, and what it does alone (the bootstrap, its part of
	 * each collective) is what is measured of it */
	int64_t nproc = 1 + (W - 1 + per_process - 1) / per_process;
	struct summary *sums = mmap(NULL, (size_t)nproc * sizeof(*sums), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
				    -1, 0);
	pid_t *pids = calloc((size_t)nproc, sizeof(*pids));
	if (!port || sums == MAP_FAILED || !pids) {
		fprintf(stderr, "control_plane: %lld ranks: out of memory or ports\n", (long long)W);
		return 1;
	}
	fflush(stdout);
	double t0 = now();
	struct tms tm0, tm1;
	times(&tm0);
	for (int64_t k = 0; k < nproc; k++) {
		int64_t lo = k ? 1 + (k - 1) * per_process : 0, hi = k ? lo + per_process : 1;
		hi = hi < W ? hi : W;
		pids[k] = fork();
		if (pids[k] == 0) {
			if (k)
				(void)!setpriority(PRIO_PROCESS, 0, 10);
			int pinned = pin_rank0(k == 0);
			run_ranks(W, lo, hi, port, timeout, pace, &sums[k]);
			sums[k].pinned = pinned;
			_exit(0);
		}
		if (pids[k] < 0) {
			sums[k].failed = hi - lo;
			snprintf(sums[k].error, sizeof(sums[k].error), "fork: %s", strerror(errno));
		}
	}
	for (int64_t k = 0; k < nproc; k++) {
		int st = 0;
		if (pids[k] > 0 && waitpid(pids[k], &st, 0) == pids[k] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			int64_t lo = k ? 1 + (k - 1) * per_process : 0, hi = k ? lo + per_process : 1;
			sums[k].failed = (hi < W ? hi : W) - lo;
			sums[k].failed_at = 0;
			snprintf(sums[k].error, sizeof(sums[k].error), "the process of ranks %lld to %lld %s %d", (long long)lo,
				 (long long)(hi < W ? hi : W) - 1, WIFSIGNALED(st) ? "died of signal" : "exited with",
				 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		}
	}
	double wall = now() - t0;
	times(&tm1);
	double cpu = (double)(tm1.tms_cutime + tm1.tms_cstime - tm0.tms_cutime - tm0.tms_cstime) /
		     (double)sysconf(_SC_CLK_TCK);
	struct summary all = {0};
	const struct summary *z = NULL;
	long rss_kb = 0;
	for (int64_t k = 0; k < nproc; k++) {
		const struct summary *x = &sums[k];
		if (x->failed && !all.failed)
			snprintf(all.error, sizeof(all.error), "%s", x->error);
		all.failed += x->failed;
		all.most_msgs = x->most_msgs > all.most_msgs ? x->most_msgs : all.most_msgs;
		all.most_data = x->most_data > all.most_data ? x->most_data : all.most_data;
		all.most_ctl = x->most_ctl > all.most_ctl ? x->most_ctl : all.most_ctl;
		all.most_mem = x->most_mem > all.most_mem ? x->most_mem : all.most_mem;
		if (x->most_mem_peak_other > all.most_mem_peak_other)
			all.most_mem_peak_other = x->most_mem_peak_other;
		rss_kb += x->rss_kb;
		if (x->has_rank0)
			z = x;
	}
	int rc = 0;
	if (all.failed || !z) {
		fprintf(stderr, "control_plane: %lld ranks: %lld failed%s\n", (long long)W, (long long)all.failed,
			z ? "" : ", rank 0 among them");
		/* the first failure first: the others are likely its echo */
		int64_t first = -1;
		for (int64_t k = 0; k < nproc; k++)
			if (sums[k].failed && (first < 0 || sums[k].failed_at < sums[first].failed_at))
				first = k;
		if (first >= 0)
			fprintf(stderr, "control_plane: %lld ranks: first: %s\n", (long long)W, sums[first].error);
		rc = 1;
	} else {
		for (int p = 0; p < NPHASES; p++)
			printf("%s %lld %s wall %.6f cpu %.6f messages %" PRIu64 " wakes %" PRIu64 " pace_ms %.1f\n",
			       pace > 0 ? "paced" : "phase", (long long)W, phase_name[p], z->phase_wall[p], z->phase_cpu[p],
			       z->phase_msgs[p], z->phase_wakes[p], pace * 1e3);
		/* a paced world is the reference's twin: its phases alone */
		if (pace <= 0) {
			int64_t depth = 0;
			for (int64_t level = 1, below = 1; below < W; depth++, level *= 4, below += level)
				;
			printf("world %lld processes %lld depth %lld rank0_messages_per_collective %" PRIu64
			       " busiest_messages_per_collective %" PRIu64 " data_connections_max %" PRIu64
			       " control_connections_max %" PRIu64 " rank0_bootstrap_connections %" PRIu64
			       " memory_max %zu rank0_memory_peak %" PRIu64 " other_memory_peak %zu rss_kb_per_rank %.1f"
			       " wall %.2f cpu %.2f rank0_pinned %d\n",
			       (long long)W, (long long)nproc, (long long)depth, z->rank0_msgs, all.most_msgs, all.most_data,
			       all.most_ctl, z->rank0_bootstrap, all.most_mem, z->rank0_mem_peak, all.most_mem_peak_other,
			       (double)rss_kb / (double)W, wall, cpu, z->pinned);
		}
	}
	fflush(stdout);
	munmap(sums, (size_t)nproc * sizeof(*sums));
	free(pids);
	return rc;
}

/* A registry whose trainer never asks for a switch: what an executor waits
 * on between switches. */
static int idle_registry(const char *name, double seconds)
{
	struct vps_registry *reg;
	if (vps_registry_create(&reg, name, 1, 0, 16, 1) || vps_registry_set_target(reg, 1, 0)) {
		fprintf(stderr, "control_plane: registry %s: %s\n", name, vps_last_error());
		return 1;
	}
	struct timespec ts = {(time_t)seconds, 0};
	nanosleep(&ts, NULL);
	vps_registry_close(reg);
	vps_registry_unlink(name);
	return 0;
}

int main(int argc, char **argv)
{
	double timeout = 120, pace_ms = 0;
	int i = 1;
	if (argc == 4 && !strcmp(argv[1], "--registry"))
		return idle_registry(argv[2], atof(argv[3]));
	if (i + 1 < argc && !strcmp(argv[i], "--timeout"))
		timeout = atof(argv[i + 1]), i += 2;
	if (i + 1 < argc && !strcmp(argv[i], "--pace")) {
		char *end;
		pace_ms = strtod(argv[i + 1], &end);
		if (*end || end == argv[i + 1] || !(pace_ms >= 0 && pace_ms <= 60000)) {
			fprintf(stderr, "control_plane: --pace %s: not milliseconds from 0 to 60000\n", argv[i + 1]);
			return 2;
		}
		i += 2;
	}
	if (i >= argc) {
		fprintf(stderr, "usage: control_plane [--timeout S] [--pace MS] W...\n");
		return 2;
	}
	/* as many ranks a process as its open files hold, at ~25 descriptors
	 * a rank (its mesh, its tree, its listener, its loop's) */
	struct rlimit nofile;
	getrlimit(RLIMIT_NOFILE, &nofile);
	nofile.rlim_cur = nofile.rlim_max;
	setrlimit(RLIMIT_NOFILE, &nofile);
	getrlimit(RLIMIT_NOFILE, &nofile);
	int64_t per_process = (int64_t)(nofile.rlim_cur > 64000 ? 64000 : nofile.rlim_cur) / 32;
	if (per_process < 8) {
		fprintf(stderr, "control_plane: %llu open files a process is too few\n", (unsigned long long)nofile.rlim_cur);
		return 1;
	}
	int rc = 0;
	for (; i < argc && !rc; i++) {
		long long W = atoll(argv[i]);
		if (W < 1 || W > (1 << 20)) {
			fprintf(stderr, "control_plane: %s: not a world size\n", argv[i]);
			return 2;
		}
		rc = run_world(W, timeout, pace_ms / 1e3, per_process);
	}
	return rc;
}
