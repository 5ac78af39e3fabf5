/* The trainer registry: ownership, staleness, the switch protocol. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "exec/transport/transport.h"
#include "registry/bell.h"
#include "vps/registry.h"

static void name_for(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "vps-test-%d-%s", (int)getpid(), what);
}

TEST(a_live_registry_is_not_taken_a_stale_one_is_refused_or_replaced)
{
	char name[64];
	struct vps_registry *r = NULL, *o = NULL;
	name_for(name, sizeof(name), "own");
	CHECK_OK(vps_registry_create(&r, name, 42, 3, 16, 0));
	CHECK(vps_registry_create(&o, name, 42, 3, 16, 1) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "in use by pid") != NULL);
	CHECK_OK(vps_registry_open(&o, name));
	CHECK_EQ(vps_registry_layout_hash(o), 42);
	CHECK_EQ(vps_registry_rank(o), 3);
	vps_registry_close(o);
	vps_registry_close(r);
	/* a trainer that dies without closing leaves a stale registry */
	name_for(name, sizeof(name), "stale");
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *c;
		void *p;
		if (vps_registry_create(&c, name, 7, 0, 4, 0) || vps_registry_alloc_host(c, 0, 0, 0, 1, 100, &p))
			_exit(1);
		_exit(0);
	}
	int st;
	waitpid(child, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(vps_registry_open(&o, name) == VPS_ESTALE);
	CHECK(strstr(vps_last_error(), "is stale") != NULL);
	CHECK(vps_registry_create(&r, name, 8, 0, 4, 0) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "stale (its trainer, pid") != NULL);
	CHECK_OK(vps_registry_create(&r, name, 8, 0, 4, 1));
	CHECK_EQ(vps_registry_layout_hash(r), 8);
	CHECK_EQ(vps_registry_num_entries(r), 0);
	vps_registry_close(r);
	CHECK(access("/dev/shm/vps-test-x", F_OK) != 0);
}

TEST(buffers_are_shared_and_sources_map_read_only)
{
	char name[64];
	struct vps_registry *r, *o;
	float *t;
	name_for(name, sizeof(name), "buf");
	CHECK_OK(vps_registry_create(&r, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 2, 1, 1, 1000, (void **)&t));
	for (int i = 0; i < 1000; i++)
		t[i] = (float)i;
	CHECK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 2, 1, 1, 10, (void **)&t) == VPS_EINPUT);
	CHECK_OK(vps_registry_open(&o, name));
	int64_t e = vps_registry_find(o, VPS_ROLE_SOURCE, 2);
	CHECK_EQ(e, 0);
	float *seen;
	CHECK_OK(vps_registry_map(o, (uint32_t)e, false, (void **)&seen));
	CHECK(seen[999] == 999.0f);
	/* the executor's mapping of a source is read-only */
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[512], perms[8] = "";
	unsigned long lo, hi, at = (unsigned long)seen;
	while (maps && fgets(line, sizeof(line), maps))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && at >= lo && at < hi)
			break;
	if (maps)
		fclose(maps);
	CHECK(perms[0] == 'r' && perms[1] == '-');
	vps_registry_close(o);
	vps_registry_close(r);
}

TEST(the_switch_protocol)
{
	char name[64];
	struct vps_registry *trainer, *exec;
	uint64_t seq, got;
	name_for(name, sizeof(name), "proto");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_open(&exec, name));
	CHECK(vps_registry_claim(exec, 0, 0.01, &got) == VPS_ETIMEOUT);
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_request(trainer, &got) == VPS_EINPUT);
	CHECK_OK(vps_registry_claim(exec, 0, 1, &got));
	CHECK_EQ(got, seq);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_RUNNING);
	CHECK(vps_registry_wait(trainer, seq, 0.01) == VPS_ETIMEOUT);
	struct vps_registry_training t = {.step = 10, .consumed_samples = 160, .valid = 1};
	vps_registry_set_training(exec, &t);
	vps_registry_finish(exec, seq, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	struct vps_registry_training back;
	vps_registry_get_training(trainer, &back);
	CHECK_EQ(back.consumed_samples, 160);
	/* a failed switch carries the executor's words */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK_OK(vps_registry_claim(exec, got, 1, &got));
	vps_registry_finish(exec, seq, 0, "stage 3: rank 5 closed the connection");
	CHECK(vps_registry_wait(trainer, seq, 1) == VPS_EPEER);
	CHECK(strstr(vps_last_error(), "rank 5 closed the connection") != NULL);
	/* between switches the trainer describes its new layout */
	CHECK_OK(vps_registry_reset(trainer, 99, 4));
	CHECK_EQ(vps_registry_layout_hash(exec), 99);
	CHECK_EQ(vps_registry_target_rank(exec), -1);
	/* the next executor, failing outside a switch, stops the next request */
	vps_registry_close(exec);
	CHECK_OK(vps_registry_open(&exec, name));
	vps_registry_abort(exec, "bootstrap: rank 2 did not come");
	CHECK(vps_registry_request(trainer, &seq) == VPS_EPEER);
	CHECK(strstr(vps_last_error(), "rank 2 did not come") != NULL);
	/* the next switch is another executor's: a reset forgets the stop */
	CHECK_OK(vps_registry_reset(trainer, 99, 4));
	CHECK_OK(vps_registry_request(trainer, &seq));
	vps_registry_close(exec);
	vps_registry_close(trainer);
}

/* Whether process pid's (main) thread is blocked in a futex wait, by
 * /proc/PID/syscall: its syscall's number first. True also when that cannot
 * be read (the event order is then not forced, only likely). */
static bool asleep_in_futex(pid_t pid)
{
	char path[64], buf[128];
	snprintf(path, sizeof(path), "/proc/%d/syscall", (int)pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return true;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	return atoi(buf) == SYS_futex;
}

/* Until pid sleeps in a futex wait, looking for at most about a minute. */
static bool until_asleep(pid_t pid)
{
	for (int i = 0; i < 60000; i++) {
		if (asleep_in_futex(pid))
			return true;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return false;
}

/* The request wakes the executor that waits for it, and the verdict the
 * trainer, each asleep on the registry's bell when the other rings it: the
 * wait ends by the ring, not by its time running out (a minute), so no
 * poll period lies between the two. Without the wake each side would sleep
 * the whole minute and see the bell moved only after it. */
TEST(a_request_wakes_the_executor_and_a_verdict_the_trainer)
{
	char name[64];
	struct vps_registry *trainer;
	uint64_t seq;
	name_for(name, sizeof(name), "bell");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	int ready[2];
	CHECK(pipe(ready) == 0);
	pid_t parent = getpid();
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *e;
		uint64_t s;
		if (vps_registry_open(&e, name))
			_exit(1);
		uint32_t bell = vps_registry_bell(e);
		if (vps_registry_claim(e, 0, 0, &s) != VPS_ETIMEOUT || write(ready[1], "y", 1) != 1)
			_exit(2);
		if (!vps_registry_await(e, bell, 60))
			_exit(3);
		/* the first look after the ring claims it */
		if (vps_registry_claim(e, 0, 0, &s) || write(ready[1], "c", 1) != 1)
			_exit(4);
		if (!until_asleep(parent))
			_exit(5);
		vps_registry_finish(e, s, 1, NULL);
		vps_registry_close(e);
		_exit(0);
	}
	close(ready[1]); /* a child that fails is an end of file here */
	char b = 0;
	CHECK(read(ready[0], &b, 1) == 1 && b == 'y');
	CHECK(until_asleep(child));
	uint32_t bell = vps_registry_bell(trainer);
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_bell(trainer) != bell);
	/* the executor claims (which rings nothing), then waits for this
	 * process to sleep on the bell before it gives its verdict */
	bool claimed = read(ready[0], &b, 1) == 1 && b == 'c';
	CHECK(claimed);
	bell = vps_registry_bell(trainer);
	if (claimed) {
		CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_RUNNING);
		CHECK(vps_registry_await(trainer, bell, 60));
		CHECK_OK(vps_registry_wait(trainer, seq, 0));
	}
	int st;
	waitpid(child, &st, 0);
	CHECK_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
	/* a bell that moved before the wait ends it at once; one that did not,
	 * after the time given */
	CHECK(vps_registry_await(trainer, bell, 60));
	CHECK(!vps_registry_await(trainer, vps_registry_bell(trainer), 0.001));
	close(ready[0]);
	vps_registry_close(trainer);
}

/* Where the bell lies in the shared header (struct reg_header in
 * lib/registry/registry.c: after the state word at 72; the fuzz harness
 * keeps the offsets before it), and the version word. */
#define BELL_AT 76
#define VERSION_AT 8

/* The header of registry NAME, mapped read-write as another process of
 * the same user may. */
static unsigned char *map_header(const char *name)
{
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

/* The bell is memory another process writes: a hint to look again, never
 * a request or a verdict. While a foreign process sets it to arbitrary
 * values (forwards, backwards, the same) and wakes its waiters without
 * end, an executor claims nothing that was not asked, a trainer sees no
 * verdict that was not given, each wait still ends at its own bound, and
 * a real request and verdict go through as before. */
TEST(a_bell_rung_by_a_stranger_is_only_a_reason_to_look)
{
	char name[64];
	struct vps_registry *trainer, *exec;
	uint64_t seq, got;
	name_for(name, sizeof(name), "stranger");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_open(&exec, name));
	unsigned char *h = map_header(name);
	CHECK(h != NULL);
	if (!h)
		return;
	CHECK_EQ(*(volatile uint32_t *)(h + BELL_AT), vps_registry_bell(exec));
	int stop[2];
	CHECK(pipe(stop) == 0);
	pid_t child = fork();
	if (child == 0) {
		close(stop[1]);
		if (fcntl(stop[0], F_SETFL, O_NONBLOCK) != 0)
			_exit(1);
		uint32_t x = 2463534242u;
		char b;
		while (read(stop[0], &b, 1) < 0) {
			x ^= x << 13, x ^= x >> 17, x ^= x << 5;
			__atomic_store_n((uint32_t *)(h + BELL_AT), x % 3 ? x : 0xffffffffu, __ATOMIC_SEQ_CST);
			syscall(SYS_futex, (uint32_t *)(h + BELL_AT), FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
		}
		_exit(0);
	}
	close(stop[0]);
	/* nothing asked: the claim ends at its bound, the state untouched */
	uint32_t before = vps_registry_bell(exec);
	CHECK(vps_registry_claim(exec, 0, 0.2, &got) == VPS_ETIMEOUT);
	CHECK(vps_registry_bell(exec) != before); /* the stranger rang meanwhile */
	CHECK_EQ(vps_registry_state(trainer, &seq), VPS_REG_IDLE);
	/* asked and not claimed: no verdict */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_wait(trainer, seq, 0.2) == VPS_ETIMEOUT);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_REQUESTED);
	/* claimed and not finished: still none */
	CHECK_OK(vps_registry_claim(exec, 0, 1, &got));
	CHECK_EQ(got, seq);
	CHECK(vps_registry_wait(trainer, seq, 0.2) == VPS_ETIMEOUT);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_RUNNING);
	vps_registry_finish(exec, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	close(stop[1]);
	int st;
	waitpid(child, &st, 0);
	CHECK_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
	/* a bound that is no time, or not a number, waits for nothing */
	uint32_t bell = vps_registry_bell(exec);
	CHECK(!vps_registry_await(exec, bell, -1));
	CHECK(!vps_registry_await(exec, bell, NAN));
	CHECK(!vps_registry_await(exec, bell, 0));
	/* a bell at its largest value rings over to zero */
	__atomic_store_n((uint32_t *)(h + BELL_AT), 0xffffffffu, __ATOMIC_SEQ_CST);
	bell = vps_registry_bell(exec);
	CHECK_EQ(bell, 0xffffffffu);
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK_EQ(vps_registry_bell(exec), 0);
	CHECK(vps_registry_await(exec, bell, 60));
	munmap(h, 4096);
	vps_registry_close(exec);
	vps_registry_close(trainer);
}

/* A registry of another version (the bell took version 4's header word)
 * is refused by name, and nothing is read from it. */
TEST(a_registry_of_another_version_is_refused)
{
	char name[64];
	struct vps_registry *trainer, *exec;
	name_for(name, sizeof(name), "version");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	unsigned char *h = map_header(name);
	CHECK(h != NULL);
	if (!h)
		return;
	uint32_t version;
	memcpy(&version, h + VERSION_AT, 4);
	CHECK_EQ(version, VPS_REGISTRY_VERSION);
	for (uint32_t other = VPS_REGISTRY_VERSION - 1; other <= VPS_REGISTRY_VERSION + 1; other += 2) {
		memcpy(h + VERSION_AT, &other, 4);
		CHECK(vps_registry_open(&exec, name) == VPS_EFORMAT);
		char want[96];
		snprintf(want, sizeof(want), "version %u, this build reads %d", other, VPS_REGISTRY_VERSION);
		CHECK(strstr(vps_last_error(), want) != NULL);
	}
	memcpy(h + VERSION_AT, &version, 4);
	CHECK_OK(vps_registry_open(&exec, name));
	vps_registry_close(exec);
	munmap(h, 4096);
	vps_registry_close(trainer);
}

/* An abort names the request it ends, so that a trainer that asks again
 * at once (a retry, before the executor started for it has opened the
 * registry) waits for that executor instead of being failed by the old
 * one's stop, and no executor claims a request its trainer gave up. */
TEST(an_abort_ends_one_request_and_a_retry_waits_for_the_next_executor)
{
	char name[64];
	struct vps_registry *trainer, *old, *next;
	uint64_t seq, retry, got;
	name_for(name, sizeof(name), "abort");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	/* stopped with a request posted and not claimed: that request fails */
	CHECK_OK(vps_registry_open(&old, name));
	CHECK_OK(vps_registry_request(trainer, &seq));
	vps_registry_abort(old, "meet: rank 5 closed the connection");
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_FAILED);
	CHECK(vps_registry_wait(trainer, seq, 1) == VPS_EPEER);
	CHECK(strstr(vps_last_error(), "rank 5 closed the connection") != NULL);
	vps_registry_close(old);
	/* the retry, no reset in between and no executor yet: posted */
	CHECK_OK(vps_registry_request(trainer, &retry));
	CHECK_EQ(retry, seq + 1);
	CHECK(vps_registry_wait(trainer, retry, 0.01) == VPS_ETIMEOUT);
	CHECK_OK(vps_registry_open(&next, name));
	CHECK_OK(vps_registry_claim(next, 0, 1, &got));
	CHECK_EQ(got, retry);
	vps_registry_finish(next, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, retry, 1));

	/* stopped between switches: the next request fails at once, spent;
	 * the one after it is a retry */
	vps_registry_abort(next, "heartbeat: rank 3 is gone");
	CHECK(vps_registry_request(trainer, &seq) == VPS_EPEER);
	CHECK(strstr(vps_last_error(), "rank 3 is gone") != NULL);
	CHECK_EQ(seq, retry + 1);
	CHECK_EQ(vps_registry_state(trainer, &got), VPS_REG_FAILED);
	CHECK_EQ(got, seq);
	CHECK_OK(vps_registry_request(trainer, &retry));
	CHECK_EQ(retry, seq + 1);
	CHECK_OK(vps_registry_claim(next, seq, 1, &got));
	CHECK_EQ(got, retry);

	/* stopped after it failed a switch itself: the trainer was told, and
	 * its next request is left to the next executor */
	vps_registry_finish(next, got, 0, "stage 2: rank 1 closed the connection");
	vps_registry_abort(next, "stage 2: rank 1 closed the connection");
	CHECK(vps_registry_wait(trainer, retry, 1) == VPS_EPEER);
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_REQUESTED);
	vps_registry_close(next);
	vps_registry_close(trainer);
}

/* One executor at a time: a second one (a duplicate rank, another job
 * given the same names) is refused, naming the one that holds it, and
 * writes nothing; the first one's close lets go. */
TEST(one_executor_holds_a_registry_at_a_time)
{
	char name[64], want[160];
	struct vps_registry *trainer, *first, *second = NULL;
	uint64_t seq, got;
	name_for(name, sizeof(name), "one");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_EQ(vps_registry_executor_pid(trainer), 0);
	CHECK_OK(vps_registry_open(&first, name));
	CHECK_EQ(vps_registry_executor_pid(trainer), getpid());
	CHECK(vps_registry_open(&second, name) == VPS_EBUSY);
	CHECK(second == NULL);
	snprintf(want, sizeof(want), "registry %s is in use by another executor (pid %d", name, (int)getpid());
	CHECK(strstr(vps_last_error(), want) != NULL);
	/* the holder runs a switch undisturbed */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK_OK(vps_registry_claim(first, 0, 1, &got));
	vps_registry_finish(first, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	vps_registry_close(first);
	CHECK_EQ(vps_registry_executor_pid(trainer), 0);
	CHECK_OK(vps_registry_open(&second, name));
	vps_registry_close(second);

	/* an executor in another process: this process's open is refused, and
	 * the other's switch ends as that executor says */
	int ready[2], go[2];
	CHECK(pipe(ready) == 0 && pipe(go) == 0);
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *e;
		uint64_t s;
		char b = vps_registry_open(&e, name) ? 'n' : 'y';
		if (write(ready[1], &b, 1) != 1 || read(go[0], &b, 1) != 1 || b != 'y')
			_exit(1);
		if (vps_registry_claim(e, 1, 5, &s))
			_exit(2);
		vps_registry_finish(e, s, 1, NULL);
		vps_registry_close(e);
		_exit(0);
	}
	char b = 0;
	CHECK(read(ready[0], &b, 1) == 1 && b == 'y');
	CHECK(vps_registry_open(&second, name) == VPS_EBUSY);
	snprintf(want, sizeof(want), "in use by another executor (pid %d)", (int)child);
	CHECK(strstr(vps_last_error(), want) != NULL);
	CHECK_EQ(vps_registry_executor_pid(trainer), child);
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(write(go[1], "y", 1) == 1);
	CHECK_OK(vps_registry_wait(trainer, seq, 5));
	int st;
	waitpid(child, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
	vps_registry_close(trainer);
}

/* An executor killed mid-switch: the trainer learns it, its switch ends as
 * failed (so the trainer may ask again), and the next executor takes the
 * registry over; one killed after it stopped (its abort said why) leaves
 * the next executor a clean start. A zombie counts as gone. */
TEST(an_executor_that_is_gone_is_replaced)
{
	char name[64];
	struct vps_registry *trainer, *next;
	uint64_t seq, got;
	name_for(name, sizeof(name), "gone");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_request(trainer, &seq));
	int ready[2];
	CHECK(pipe(ready) == 0);
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *e;
		uint64_t s;
		char b = vps_registry_open(&e, name) || vps_registry_claim(e, 0, 5, &s) ? 'n' : 'y';
		if (write(ready[1], &b, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char b = 0;
	CHECK(read(ready[0], &b, 1) == 1 && b == 'y');
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_RUNNING);
	CHECK(vps_registry_open(&next, name) == VPS_EBUSY);
	kill(child, SIGKILL);
	/* not reaped yet: a zombie holds nothing */
	for (int i = 0; i < 500 && vps_registry_executor_pid(trainer); i++)
		usleep(10000);
	CHECK_EQ(vps_registry_executor_pid(trainer), 0);
	CHECK_OK(vps_registry_open(&next, name));
	waitpid(child, NULL, 0);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_FAILED);
	CHECK(vps_registry_wait(trainer, seq, 1) == VPS_EPEER);
	char want[96];
	snprintf(want, sizeof(want), "its executor (pid %d) is gone", (int)child);
	CHECK(strstr(vps_last_error(), want) != NULL);
	/* the trainer asks again; the new executor serves it */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK_OK(vps_registry_claim(next, 0, 1, &got));
	CHECK_EQ(got, seq);
	vps_registry_finish(next, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	/* an executor that stopped outside a switch said so; its successor
	 * starts clean */
	vps_registry_abort(next, "bootstrap: rank 2 did not come");
	CHECK(vps_registry_request(trainer, &seq) == VPS_EPEER);
	vps_registry_close(next);
	CHECK_OK(vps_registry_open(&next, name));
	CHECK_OK(vps_registry_request(trainer, &seq));
	vps_registry_close(next);
	close(ready[0]);
	close(ready[1]);
	vps_registry_close(trainer);
}

/* A trainer whose executor died mid-switch sees it in its wait, which ends
 * the switch: it may ask again before any executor comes back. */
TEST(a_trainer_ends_a_switch_whose_executor_died)
{
	char name[64];
	struct vps_registry *trainer;
	uint64_t seq;
	name_for(name, sizeof(name), "died");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_request(trainer, &seq));
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *e;
		uint64_t s;
		_exit(vps_registry_open(&e, name) || vps_registry_claim(e, 0, 5, &s) ? 1 : 0);
	}
	int st;
	waitpid(child, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(vps_registry_wait(trainer, seq, 5) == VPS_EPEER);
	CHECK(strstr(vps_last_error(), "is gone") != NULL);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_FAILED);
	CHECK_OK(vps_registry_request(trainer, &seq));
	vps_registry_close(trainer);
}

/* An executor that held the registry when the trainer asked, and died
 * before claiming the request (killed frozen), ends the wait at once as
 * one that died mid-switch does; one killed before the request leaves the
 * next request to the next executor. */
TEST(a_trainer_ends_a_request_whose_executor_died_before_claiming_it)
{
	char name[64];
	struct vps_registry *trainer, *next;
	uint64_t seq, got;
	name_for(name, sizeof(name), "dropped");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	int ready[2];
	CHECK(pipe(ready) == 0);
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *e;
		char b = vps_registry_open(&e, name) ? 'n' : 'y';
		if (write(ready[1], &b, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char b = 0;
	CHECK(read(ready[0], &b, 1) == 1 && b == 'y');
	CHECK_OK(vps_registry_request(trainer, &seq));
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	CHECK(vps_registry_wait(trainer, seq, 5) == VPS_EPEER);
	char want[96];
	snprintf(want, sizeof(want), "its executor (pid %d) is gone", (int)child);
	CHECK(strstr(vps_last_error(), want) != NULL);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_FAILED);
	/* its word is still there: the next request is not taken for dropped */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_wait(trainer, seq, 0.3) == VPS_ETIMEOUT);
	CHECK_OK(vps_registry_open(&next, name));
	CHECK_OK(vps_registry_claim(next, 0, 1, &got));
	CHECK_EQ(got, seq);
	vps_registry_finish(next, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	vps_registry_close(next);
	close(ready[0]);
	close(ready[1]);
	vps_registry_close(trainer);
}

/* The executor a trainer started for a switch, dead before it opened the
 * registry (bad arguments, a crash at start), ends the wait at once, where
 * nothing else could tell it from one still starting; one that is alive
 * is waited for, and the expectation holds for its own switch only. */
TEST(a_trainer_ends_a_request_whose_executor_died_before_opening_the_registry)
{
	char name[64], want[128];
	struct vps_registry *trainer, *e;
	uint64_t seq, got;
	name_for(name, sizeof(name), "never");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	pid_t child = fork();
	if (child == 0)
		_exit(3);
	/* a zombie, not yet reaped, is as gone as a reaped one */
	CHECK_OK(vps_registry_expect_executor(trainer, (int)child));
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_wait(trainer, seq, 10) == VPS_EPEER);
	snprintf(want, sizeof(want), "the executor started for it (pid %d) exited", (int)child);
	CHECK(strstr(vps_last_error(), want) != NULL);
	CHECK_EQ(vps_registry_state(trainer, NULL), VPS_REG_FAILED);
	waitpid(child, NULL, 0);
	/* the next request is not the dead one's: waited for until an executor comes */
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_wait(trainer, seq, 0.6) == VPS_ETIMEOUT);
	/* a live one, said after the request: waited for, and it serves */
	CHECK_OK(vps_registry_expect_executor(trainer, (int)getpid()));
	CHECK(vps_registry_wait(trainer, seq, 0.6) == VPS_ETIMEOUT);
	CHECK_OK(vps_registry_open(&e, name));
	CHECK(vps_registry_expect_executor(e, (int)getpid()) == VPS_EBUSY);
	CHECK_OK(vps_registry_claim(e, 0, 1, &got));
	CHECK_EQ(got, seq);
	vps_registry_finish(e, got, 1, NULL);
	CHECK_OK(vps_registry_wait(trainer, seq, 1));
	CHECK(vps_registry_expect_executor(trainer, 0) == VPS_EINPUT);
	vps_registry_close(e);
	vps_registry_close(trainer);
}

/* What a trainer waits for, in words; an executor that does not hold the
 * registry cannot claim. */
TEST(states_and_waits_are_words)
{
	CHECK(!strcmp(vps_registry_state_name(VPS_REG_IDLE), "idle"));
	CHECK(!strcmp(vps_registry_state_name(VPS_REG_REQUESTED), "requested"));
	CHECK(!strcmp(vps_registry_state_name(VPS_REG_RUNNING), "running"));
	CHECK(!strcmp(vps_registry_state_name(VPS_REG_DONE), "done"));
	CHECK(!strcmp(vps_registry_state_name(VPS_REG_FAILED), "failed"));
	CHECK(!strcmp(vps_registry_state_name(7), "unknown"));
	char name[64], what[256];
	struct vps_registry *trainer, *exec;
	uint64_t seq, got;
	name_for(name, sizeof(name), "words");
	CHECK_OK(vps_registry_create(&trainer, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_request(trainer, &seq));
	CHECK(vps_registry_wait(trainer, seq, 0.01) == VPS_ETIMEOUT);
	CHECK(strstr(vps_last_error(), "not done after 0.0 s: requested; no executor has attached to it (is vps-exec "
			"running, with the same --registry?)") != NULL);
	CHECK(strstr(vps_last_error(), name) != NULL);
	CHECK_OK(vps_registry_open(&exec, name));
	vps_registry_describe(trainer, what, sizeof(what));
	CHECK(strstr(what, "requested; its executor (pid") != NULL);
	CHECK(vps_registry_claim(trainer, 0, 0, &got) == VPS_EBUSY);
	CHECK_OK(vps_registry_claim(exec, 0, 0, &got));
	vps_registry_describe(trainer, what, sizeof(what));
	CHECK(strstr(what, "running in its executor (pid") != NULL);
	vps_registry_finish(exec, got, 0, "stage 3: rank 5 closed the connection");
	vps_registry_describe(trainer, what, sizeof(what));
	CHECK(!strcmp(what, "failed: stage 3: rank 5 closed the connection"));
	vps_registry_close(exec);
	vps_registry_close(trainer);
}

TEST(registry_names_expand_their_parts)
{
	struct vps_registry_name_parts parts = {0x1234abcd5ee1404aULL, 5, 3, -1, 1};
	char out[VPS_REGISTRY_NAME_MAX + 1];
	CHECK_OK(vps_registry_expand(VPS_REGISTRY_DEFAULT, &parts, out, sizeof(out)));
	CHECK(!strcmp(out, "vps-5ee1404a-5"));
	CHECK_OK(vps_registry_expand("j%j.r%r.a%a.b%b.l%l.%%", &parts, out, sizeof(out)));
	CHECK(!strcmp(out, "j5ee1404a.r5.a3.b-1.l1.%"));
	CHECK(vps_registry_expand("vps-%q", &parts, out, sizeof(out)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "unknown '%q'") != NULL);
	CHECK(vps_registry_expand("vps-%", &parts, out, sizeof(out)) == VPS_EINPUT);
	CHECK(vps_registry_expand("a/%r", &parts, out, sizeof(out)) == VPS_EINPUT);
	CHECK(vps_registry_expand("", &parts, out, sizeof(out)) == VPS_EINPUT);
	char longer[80];
	memset(longer, 'x', 60);
	snprintf(longer + 60, sizeof(longer) - 60, "-%%j");
	CHECK(vps_registry_expand(longer, &parts, out, sizeof(out)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "longer than 64") != NULL);
	char small[8];
	CHECK(vps_registry_expand("vps-%j", &parts, small, sizeof(small)) == VPS_EINPUT);
}

static bool shm_exists(const char *name)
{
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	return access(path, F_OK) == 0;
}

/* An object of bytes that are not a registry, as another program leaves. */
static void foreign_object(const char *name)
{
	char path[128];
	unsigned char junk[4096];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char)(i * 131 + 7);
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
	CHECK(fd >= 0);
	if (fd >= 0) {
		CHECK(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
		close(fd);
	}
}

static void remove_object(const char *name)
{
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	unlink(path);
}

static bool shm_says_too_small(void)
{
	const char *e = vps_last_error();
	return !strncmp(e, "/dev/shm: needs ", 16) && strstr(e, " free (docker: --shm-size)") != NULL;
}

/* Whether /dev/shm/NAME holds pages for `bytes` (not sparse). */
static bool reserved(const char *name, uint64_t bytes)
{
	char path[128];
	struct stat st;
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	return stat(path, &st) == 0 && (uint64_t)st.st_blocks * 512 >= bytes;
}

/* A buffer larger than what /dev/shm has free is refused before anything
 * is made: not sparse, to die of SIGBUS at its first write. Its size is
 * the free space (statvfs) and 1 GiB more, refused before a page is taken:
 * nothing on a shared machine notices. */
TEST(a_buffer_larger_than_dev_shm_is_refused_and_nothing_is_left)
{
	struct statvfs st;
	if (statvfs("/dev/shm", &st) != 0 || !st.f_blocks) {
		fprintf(stderr, "test_registry: /dev/shm has no size limit: nothing is too large for it, not tested\n");
		return;
	}
	uint64_t free_bytes = (uint64_t)st.f_bavail * st.f_frsize, more = free_bytes + (1u << 30);
	char name[64], object[80];
	struct vps_registry *r;
	void *p = NULL;
	name_for(name, sizeof(name), "roomless");
	CHECK_OK(vps_registry_create(&r, name, 1, 0, 4, 0));
	CHECK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 1, 1, (int64_t)(more / 4), &p) == VPS_ENOMEM);
	CHECK(shm_says_too_small());
	CHECK(p == NULL);
	CHECK_EQ(vps_registry_num_entries(r), 0);
	snprintf(object, sizeof(object), "%s.0", name);
	CHECK(!shm_exists(object));
	/* the failed buffer took no serial: the next one is NAME.0 */
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 1, 1, 1000, &p));
	CHECK(reserved(object, 4000) && reserved(name, 4096));
	vps_registry_close(r);
	CHECK(!shm_exists(object) && !shm_exists(name));
	CHECK(vps_registry_check_room(more) == VPS_ENOMEM);
	CHECK(shm_says_too_small());
	CHECK_OK(vps_registry_check_room(4096));
}

/* Make every fallocate(2) of this process fail with err, as a seccomp
 * filter can: the reservation as it fails when another process fills
 * /dev/shm between the free-space check and it. */
static bool fallocate_fails(int err)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
	return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* Whether a call made under fallocate_fails ended as `want` says: VPS_OK,
 * or VPS_ENOMEM saying /dev/shm is too small, with `object` not there. */
static bool ended(vps_result_t rc, vps_result_t want, const char *object)
{
	return rc == want && (!rc || (shm_says_too_small() && !shm_exists(object)));
}

/* In a child whose fallocate(2) fails with err: a buffer of a registry
 * made before, and a registry, end as `want` says, and closing leaves no
 * object. 0 when they do, 99 when no seccomp filter can be installed here,
 * another code for what went wrong. */
static int reserve_under(int err, vps_result_t want)
{
	pid_t child = fork();
	if (child == 0) {
		char name[64], object[80], second[64];
		name_for(name, sizeof(name), "nospace");
		name_for(second, sizeof(second), "nospace2");
		snprintf(object, sizeof(object), "%s.0", name);
		struct vps_registry *r = NULL, *r2 = NULL;
		void *p = NULL;
		if (vps_registry_create(&r, name, 1, 0, 4, 0))
			_exit(1);
		if (!fallocate_fails(err)) {
			vps_registry_close(r);
			_exit(99);
		}
		int code = 0;
		vps_result_t rc = vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 1, 1, 100000, &p);
		if (!ended(rc, want, object) || (!rc && (!reserved(object, 400000) || ((float *)p)[99999] != 0.0f)))
			code = 2;
		else if (!ended(vps_registry_create(&r2, second, 1, 0, 4, 0), want, second))
			code = 3;
		/* closing removes what was made, on failure too: nothing stays behind */
		vps_registry_close(r2);
		vps_registry_close(r);
		_exit(code ? code : shm_exists(name) || shm_exists(object) || shm_exists(second) ? 4 : 0);
	}
	int st;
	if (child < 0 || waitpid(child, &st, 0) != child)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(a_reservation_that_fails_says_so_and_leaves_nothing)
{
	int got = reserve_under(ENOSPC, VPS_ENOMEM);
	if (got == 99) {
		fprintf(stderr, "test_registry: no seccomp filter here: a failed reservation not tested\n");
		return;
	}
	CHECK_EQ(got, 0);
	/* where fallocate is not supported, the pages are taken another way */
	CHECK_EQ(reserve_under(EOPNOTSUPP, VPS_OK), 0);
}

/* What an executor waits for, by code: a registry not there yet, or one
 * its trainer is still making (its magic is written last), is not found;
 * one whose trainer is gone is stale (the test above). */
TEST(an_absent_or_half_made_registry_is_not_found)
{
	char name[64], path[128];
	struct vps_registry *o = NULL;
	name_for(name, sizeof(name), "absent");
	CHECK(vps_registry_open(&o, name) == VPS_ENOTFOUND);
	CHECK(strstr(vps_last_error(), "No such file") != NULL);
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
	CHECK(fd >= 0);
	if (fd >= 0) {
		CHECK(ftruncate(fd, 4096) == 0);
		close(fd);
	}
	CHECK(vps_registry_open(&o, name) == VPS_ENOTFOUND);
	CHECK(strstr(vps_last_error(), "is not ready yet") != NULL);
	CHECK(o == NULL);
	remove_object(name);
}

/* A registry made by a child that exits without closing it, with two host
 * buffers: NAME, NAME.0 and NAME.1 stay behind, stale. */
static void stale_registry(const char *name)
{
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *c;
		void *p;
		if (vps_registry_create(&c, name, 7, 0, 4, 0) || vps_registry_alloc_host(c, 0, 0, 0, 1, 100, &p) ||
		    vps_registry_alloc_host(c, 0, 1, 0, 1, 100, &p))
			_exit(1);
		_exit(0);
	}
	int st;
	waitpid(child, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(the_stale_cleanup_removes_only_a_registry_and_its_own_objects)
{
	char name[64], other[96];
	struct vps_registry *r = NULL;
	/* NAME that is not a registry: refused, by create and by unlink, and kept */
	name_for(name, sizeof(name), "foreign");
	foreign_object(name);
	CHECK(vps_registry_create(&r, name, 1, 0, 4, 1) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "is not a vps registry") != NULL);
	CHECK(strstr(vps_last_error(), "left alone") != NULL);
	CHECK(vps_registry_unlink(name) == VPS_EINPUT);
	CHECK(shm_exists(name));
	remove_object(name);

	/* a stale registry goes with the objects it made, not with a foreign
	 * NAME.7 (above its object counter), NAME.01 or NAME.x */
	name_for(name, sizeof(name), "sweep");
	stale_registry(name);
	const char *foreign[] = {"7", "01", "x", "1x"};
	for (size_t i = 0; i < 4; i++) {
		snprintf(other, sizeof(other), "%s.%s", name, foreign[i]);
		foreign_object(other);
	}
	snprintf(other, sizeof(other), "%s.1", name);
	CHECK(shm_exists(other));
	CHECK_OK(vps_registry_create(&r, name, 8, 0, 4, 1));
	CHECK(!shm_exists(other));
	snprintf(other, sizeof(other), "%s.0", name);
	CHECK(!shm_exists(other));
	for (size_t i = 0; i < 4; i++) {
		snprintf(other, sizeof(other), "%s.%s", name, foreign[i]);
		CHECK(shm_exists(other));
	}
	/* the trainer's own close is the same sweep */
	void *p;
	CHECK_OK(vps_registry_alloc_host(r, 0, 0, 0, 1, 10, &p));
	vps_registry_close(r);
	CHECK(!shm_exists(name));
	snprintf(other, sizeof(other), "%s.0", name);
	CHECK(!shm_exists(other));
	for (size_t i = 0; i < 4; i++) {
		snprintf(other, sizeof(other), "%s.%s", name, foreign[i]);
		CHECK(shm_exists(other));
		remove_object(other);
	}

	/* unlink leaves a live registry of another process alone */
	name_for(name, sizeof(name), "live");
	int ready[2];
	CHECK(pipe(ready) == 0);
	pid_t child = fork();
	if (child == 0) {
		struct vps_registry *c;
		char b = vps_registry_create(&c, name, 7, 0, 4, 0) ? 'n' : 'y';
		if (write(ready[1], &b, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char b = 0;
	CHECK(read(ready[0], &b, 1) == 1 && b == 'y');
	CHECK(vps_registry_unlink(name) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "in use by pid") != NULL);
	CHECK(shm_exists(name));
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(ready[0]);
	close(ready[1]);
	/* now stale: unlink removes it */
	CHECK_OK(vps_registry_unlink(name));
	CHECK(!shm_exists(name));
}

TEST(objects_others_can_open_or_another_user_owns_are_refused)
{
	char name[64], path[128], obj[96];
	struct vps_registry *r, *o = NULL;
	void *p;
	name_for(name, sizeof(name), "perm");
	snprintf(path, sizeof(path), "/dev/shm/%s", name);
	CHECK_OK(vps_registry_create(&r, name, 1, 0, 4, 0));
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 0, 1, 100, &p));
	/* the registry open to others */
	CHECK(chmod(path, 0666) == 0);
	CHECK(vps_registry_open(&o, name) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "mode 0666 lets other users open it") != NULL);
	CHECK(strstr(vps_last_error(), name) != NULL);
	CHECK(chmod(path, 0640) == 0);
	CHECK(vps_registry_open(&o, name) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "mode 0640") != NULL);
	CHECK(chmod(path, 0600) == 0);
	/* a buffer object open to others */
	CHECK_OK(vps_registry_open(&o, name));
	struct vps_registry_entry_info e;
	CHECK_OK(vps_registry_entry(o, 0, &e));
	snprintf(obj, sizeof(obj), "/dev/shm/%s", e.shm_name);
	CHECK(chmod(obj, 0604) == 0);
	void *seen = NULL;
	CHECK(vps_registry_map(o, 0, false, &seen) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "mode 0604") != NULL);
	CHECK(strstr(vps_last_error(), e.shm_name) != NULL);
	CHECK(chmod(obj, 0600) == 0);
	CHECK_OK(vps_registry_map(o, 0, false, &seen));
	vps_registry_close(o);
	o = NULL;
	/* another user's registry: only root can make one here */
	if (geteuid() == 0) {
		CHECK(chown(path, 65534, 65534) == 0);
		CHECK(vps_registry_open(&o, name) == VPS_EINPUT);
		CHECK(strstr(vps_last_error(), "owned by uid 65534, not by this user (uid 0)") != NULL);
		CHECK(chown(path, 0, 0) == 0);
		CHECK(chown(obj, 65534, 65534) == 0);
		CHECK_OK(vps_registry_open(&o, name));
		CHECK(vps_registry_map(o, 0, true, &seen) == VPS_EINPUT);
		CHECK(strstr(vps_last_error(), "owned by uid 65534") != NULL);
		vps_registry_close(o);
		/* nor is another user's object removed with the registry */
		vps_registry_close(r);
		CHECK(!shm_exists(name));
		CHECK(shm_exists(e.shm_name));
		remove_object(e.shm_name);
	} else {
		printf("  objects_others_can_open_or_another_user_owns_are_refused: ownership part skipped, "
		       "not root (cannot give an object to another user)\n");
		vps_registry_close(r);
	}
}

static int count_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0;
	char line[512];
	while (f && fgets(line, sizeof(line), f))
		n++;
	if (f)
		fclose(f);
	return n;
}

/* A trainer switching many times frees each switch's sources: the object
 * goes and so does its mapping, and nothing else. */
TEST(a_trainer_frees_a_host_buffer_it_no_longer_registers)
{
	char name[64], obj[96];
	struct vps_registry *r, *o;
	void *p, *q;
	name_for(name, sizeof(name), "free");
	CHECK_OK(vps_registry_create(&r, name, 1, 0, 8, 0));
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 0, 1, 1 << 16, &p));
	struct vps_registry_entry_info e;
	CHECK_OK(vps_registry_entry(r, 0, &e));
	snprintf(obj, sizeof(obj), "/dev/shm/%s", e.shm_name);
	CHECK(access(obj, F_OK) == 0);
	/* registered still: refused, nothing freed */
	CHECK(vps_registry_free_host(r, p) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "still registered") != NULL);
	CHECK(access(obj, F_OK) == 0);
	/* not one of its buffers */
	CHECK(vps_registry_free_host(r, &q) == VPS_EINPUT);
	/* an executor's handle frees nothing */
	CHECK_OK(vps_registry_open(&o, name));
	CHECK(vps_registry_free_host(o, p) == VPS_EINPUT);
	vps_registry_close(o);
	/* after a switch, many times over: flat */
	CHECK_OK(vps_registry_reset(r, 2, 0));
	CHECK_OK(vps_registry_free_host(r, p));
	CHECK(access(obj, F_OK) != 0);
	int before = count_maps();
	for (int k = 0; k < 50; k++) {
		CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_TARGET, 0, 0, 1, 1 << 16, &q));
		memset(q, 1, 1 << 16);
		CHECK_OK(vps_registry_reset(r, 2, 0));
		CHECK_OK(vps_registry_free_host(r, q));
	}
	CHECK_EQ(count_maps(), before);
	/* freed once: a second free is refused */
	CHECK(vps_registry_free_host(r, q) == VPS_EINPUT);
	vps_registry_close(r);
}

static struct vps_buffer_desc host_desc(const struct vps_registry *r, uint32_t entry)
{
	struct vps_registry_entry_info info;
	struct vps_buffer_desc d = {0};
	if (vps_registry_entry(r, entry, &info) == VPS_OK) {
		d.where = VPS_WHERE_HOST;
		d.buffer = info.buffer;
		d.bytes = info.bytes;
		snprintf(d.shm_name, sizeof(d.shm_name), "%s", info.shm_name);
	}
	return d;
}

/* What the executor maps and reads while it waits counts as premapped when
 * the switch maps it; a buffer the trainer no longer registers is unmapped
 * by the prune and costs its first pass again. */
TEST(buffers_mapped_ahead_of_the_request_are_warm_in_the_switch)
{
	char name[64];
	struct vps_registry *r;
	struct vps_mapcache *c;
	void *p, *q;
	name_for(name, sizeof(name), "warm");
	CHECK_OK(vps_registry_create(&r, name, 5, 0, 8, 0));
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_SOURCE, 0, 0, 1, 300000, &p));
	CHECK_OK(vps_registry_alloc_host(r, VPS_ROLE_TARGET, 0, 0, 1, 200000, &q));
	struct vps_buffer_desc src = host_desc(r, 0), dst = host_desc(r, 1);
	CHECK_EQ(src.bytes, 1200000);
	CHECK_OK(vps_mapcache_new(&c));
	CHECK_OK(vps_mapcache_prefetch(c, NULL, &src, false, false));
	int polls = 0;
	while (vps_mapcache_warm(c, 64 << 10))
		polls++;
	/* 64 KiB a poll over 1.2 MB: the work is sliced */
	CHECK(polls >= 15);
	uint64_t warm, cold;
	void *ps, *pd;
	CHECK_OK(vps_mapcache_map(c, NULL, &src, false, false, true, &ps));
	CHECK_OK(vps_mapcache_map(c, NULL, &dst, true, true, true, &pd));
	vps_mapcache_take_stats(c, &warm, &cold);
	CHECK_EQ(warm, 1200000);
	CHECK_EQ(cold, 800000);
	vps_mapcache_take_stats(c, &warm, &cold);
	CHECK_EQ(warm + cold, 0);
	/* the executor's view is the trainer's memory */
	((float *)p)[7] = 3.5f;
	CHECK(((const float *)ps)[7] == 3.5f);
	vps_mapcache_end_switch(c, NULL);
	/* the kept target stays warm; a source the trainer dropped is pruned */
	vps_mapcache_prune(c, NULL, &dst, 1);
	CHECK_OK(vps_mapcache_map(c, NULL, &dst, false, false, true, &pd));
	CHECK_OK(vps_mapcache_map(c, NULL, &src, false, false, true, &ps));
	vps_mapcache_take_stats(c, &warm, &cold);
	CHECK_EQ(warm, 800000);
	CHECK_EQ(cold, 1200000);
	/* a name that is not a shared-memory object's is refused, not mapped */
	struct vps_buffer_desc bad = src;
	snprintf(bad.shm_name, sizeof(bad.shm_name), "a/b");
	CHECK(vps_mapcache_prefetch(c, NULL, &bad, false, false) == VPS_EINPUT);
	vps_mapcache_free(c);
	vps_registry_close(r);
}
