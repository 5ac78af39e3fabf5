/* libFuzzer harness: the registry reader, as vps-exec uses it.
 *
 * The input is the whole shared-memory object /dev/shm/vpsfuzz-PID: the
 * harness writes it there, opens it with vps_registry_open and reads every
 * entry, looks each (role, buffer) up, reads the state, failure text and
 * training scalars, and maps each host entry read-only. Three fields are
 * overwritten first: the owner's pid and start time, with this process's
 * (a registry whose owner is gone is refused before anything else is read,
 * and no input could name a live owner otherwise), and the executor that
 * holds it, with none (an input naming a live one is refused as busy).
 *
 * Host entries may name the object vpsfuzzbuf (1 MiB, made here). With
 * VPS_FUZZ_SEEDS=DIR the harness writes seed registries (made by
 * vps_registry_create and friends) into DIR and exits. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vps/registry.h"

/* struct reg_header in lib/registry/registry.c: magic[8], then five uint32 (version,
 * header_size, entry_size, max_entries, nentries), the owner's int32 pid at
 * 28 and uint64 start time at 32, and after the hashes, ranks, state and
 * sequence number the uint64 executor word at 88 (its pid in the low 32
 * bits). Checked against a real registry below. */
#define OWNER_PID_AT 28
#define OWNER_START_AT 32
#define EXECUTOR_AT 88
#define BUF_NAME "vpsfuzzbuf"
#define BUF_SIZE (1 << 20)

static char reg_name[64];
static int32_t my_pid;
static uint64_t my_start;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
	fprintf(stderr, "fuzz_registry: %s: %s (%s)\n", what, strerror(errno), vps_last_error());
	abort();
}

static void remove_objects(void)
{
	char path[80];
	snprintf(path, sizeof(path), "/%s", reg_name);
	shm_unlink(path);
	shm_unlink("/" BUF_NAME);
}

/* An object of /dev/shm this process may write: made now, or left by an
 * earlier run of this user (a plain object, 0600); another user's, or one
 * others may open, is not truncated or written. */
static int own_shm(const char *path)
{
	int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
	if (fd >= 0 || errno != EEXIST)
		return fd;
	fd = shm_open(path, O_RDWR | O_NOFOLLOW, 0);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
			(st.st_mode & 077))) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

/* Bytes of a registry made by the library itself. */
static void *read_object(const char *name, size_t *len)
{
	char path[80];
	snprintf(path, sizeof(path), "/%s", name);
	int fd = shm_open(path, O_RDONLY, 0);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		die("open a registry made by the library");
	void *d = malloc((size_t)st.st_size);
	if (!d || pread(fd, d, (size_t)st.st_size, 0) != st.st_size)
		die("read a registry made by the library");
	close(fd);
	*len = (size_t)st.st_size;
	return d;
}

static void write_seeds(const char *dir)
{
	static const unsigned char ipc[64] = {1, 2, 3};
	for (int k = 0; k < 4; k++) {
		struct vps_registry *r;
		char name[64], path[4096];
		snprintf(name, sizeof(name), "vpsfuzz-seed-%d", (int)getpid());
		if (vps_registry_create(&r, name, 0x1234abcdULL + (uint64_t)k, k, (uint32_t)(1 + 2 * k), 1))
			die("vps_registry_create");
		for (int i = 0; i < 2 * k; i++) {
			vps_result_t rc = i == 3 ? vps_registry_add_cuda(r, 1, (uint32_t)i, 0, 0, 256, 0, ipc, 64)
						 : vps_registry_add_host(r, i & 1, (uint32_t)i, i % 3, i & 1, 1024,
									 BUF_NAME, (uint64_t)i * 4096);
			if (rc)
				die("register a buffer");
		}
		if (k >= 2)
			vps_registry_set_target(r, 0x5678ULL, 1);
		if (k == 3) {
			struct vps_registry_training t = {100, 6400, 100, 64, 1, 8, 8, 1};
			uint64_t seq;
			vps_registry_set_training(r, &t);
			vps_registry_request(r, &seq);
		}
		size_t len;
		void *d = read_object(name, &len);
		snprintf(path, sizeof(path), "%s/registry-%d", dir, k);
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(d, 1, len, f) != len || fclose(f) != 0)
			die(path);
		free(d);
		vps_registry_close(r);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	my_pid = (int32_t)getpid();
	snprintf(reg_name, sizeof(reg_name), "vpsfuzz-%d", (int)my_pid);
	int fd = own_shm("/" BUF_NAME);
	if (fd < 0 || ftruncate(fd, BUF_SIZE) != 0)
		die("/dev/shm/" BUF_NAME);
	close(fd);
	/* the owner fields are where the comment above says */
	struct vps_registry *r = NULL, *e = NULL;
	if (vps_registry_create(&r, reg_name, 1, 0, 1, 1) || vps_registry_open(&e, reg_name))
		die("vps_registry_create and _open");
	size_t len;
	unsigned char *d = read_object(reg_name, &len);
	memcpy(&my_start, d + OWNER_START_AT, 8);
	int32_t pid, executor;
	memcpy(&pid, d + OWNER_PID_AT, 4);
	memcpy(&executor, d + EXECUTOR_AT, 4);
	free(d);
	vps_registry_close(e);
	vps_registry_close(r);
	if (pid != my_pid || my_start == 0 || executor != my_pid) {
		fprintf(stderr, "fuzz_registry: struct reg_header moved: update OWNER_PID_AT/OWNER_START_AT/EXECUTOR_AT\n");
		abort();
	}
	const char *seeds = getenv("VPS_FUZZ_SEEDS");
	if (seeds) {
		write_seeds(seeds);
		exit(0);
	}
	atexit(remove_objects);
	return 0;
}

static void read_registry(struct vps_registry *r)
{
	volatile uint64_t sink = vps_registry_layout_hash(r) ^ vps_registry_target_hash(r);
	sink += (uint64_t)vps_registry_rank(r) + (uint64_t)vps_registry_target_rank(r);
	uint64_t seq;
	sink += (uint64_t)vps_registry_state(r, &seq) + seq;
	sink += strlen(vps_registry_failure(r));
	struct vps_registry_training t;
	vps_registry_get_training(r, &t);
	sink += (uint64_t)t.step;
	uint32_t n = vps_registry_num_entries(r);
	for (uint32_t i = 0; i < n; i++) {
		struct vps_registry_entry_info e;
		if (vps_registry_entry(r, i, &e) != VPS_OK)
			continue;
		sink += strlen(e.shm_name) + (uint64_t)e.elements + e.bytes;
		int64_t j = vps_registry_find(r, e.role, e.buffer);
		if (j < 0 || (uint32_t)j > i) {
			fprintf(stderr, "fuzz_registry: entry %u not found by its role and buffer\n", i);
			abort();
		}
		void *p;
		if (e.where == VPS_WHERE_HOST && !strcmp(e.shm_name, BUF_NAME) &&
		    vps_registry_map(r, i, false, &p) == VPS_OK) {
			/* the mapping holds what the entry says it does */
			const volatile unsigned char *b = p;
			if (e.bytes)
				sink += b[0] + b[e.bytes - 1];
		}
	}
	(void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[80];
	snprintf(path, sizeof(path), "/%s", reg_name);
	int fd = own_shm(path);
	if (fd < 0 || ftruncate(fd, 0) != 0)
		die(path);
	if (size && pwrite(fd, data, size, 0) != (ssize_t)size)
		die("write the registry");
	if (size >= OWNER_START_AT + 8) {
		pwrite(fd, &my_pid, 4, OWNER_PID_AT);
		pwrite(fd, &my_start, 8, OWNER_START_AT);
	}
	if (size >= EXECUTOR_AT + 8) {
		static const uint64_t none;
		pwrite(fd, &none, 8, EXECUTOR_AT);
	}
	close(fd);
	struct vps_registry *r;
	if (vps_registry_open(&r, reg_name) == VPS_OK) {
		read_registry(r);
		vps_registry_close(r);
	}
	return 0;
}
