/* The CUDA stand-in (tests/standin/cuda.c) through the table libvps loads:
 * IPC handles open in another process only, and a handle is hostile input;
 * device pointers fault on the host; the copy kernel refuses what the real
 * one refuses or gets wrong; a forked child cannot use it; a group never
 * ended shows at the wait. Each case runs in forked processes: a process
 * that used CUDA cannot fork one that does. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "exec/transport/transport.h"
#include "gpu/cuda/vps_cuda.h"
#include "standin_util.h"

static const struct vps_cuda_api *api;

static bool load(void)
{
	static int loaded;
	if (!loaded) {
		void *h = standin_open("libvps-cuda-standin.so");
		const struct vps_cuda_api *(*get)(void) = NULL;
		if (h)
			*(void **)&get = dlsym(h, "vps_cuda_api_get");
		api = get ? get() : NULL;
		loaded = api && api->abi == VPS_CUDA_ABI ? 1 : -1;
	}
	return loaded > 0;
}

static bool said(const char *err, const char *what)
{
	if (strstr(err, what))
		return true;
	fprintf(stderr, "  rank %d: '%s' does not say '%s'\n", child_rank, err, what);
	return false;
}

/* ---- IPC ---- */

struct pipes {
	int handle[2]; /* exporter -> importer */
	int done[2];   /* importer -> exporter */
};

static int ipc_rank(int rank, void *ctx)
{
	struct pipes *p = ctx;
	char err[VPS_CUDA_ERR] = "";
	enum { BYTES = 1 << 20, AT = 4096 };
	unsigned char h[VPS_CUDA_IPC_HANDLE];
	static unsigned char pattern[BYTES - AT], back[BYTES - AT];
	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (unsigned char)(i * 7 + 1);
	if (rank == 0) {
		void *base = NULL;
		uint64_t offset = 0, bytes = 0;
		int device = -1;
		CHILD_CHECK(!api->alloc(&base, BYTES, err));
		CHILD_CHECK(!api->to_device((char *)base + AT, pattern, sizeof(pattern), err));
		/* an interior pointer: its allocation, and the offset in it */
		CHILD_CHECK(!api->ipc_handle((char *)base + AT, h, &offset, &bytes, &device, err));
		CHILD_CHECK(offset == AT && bytes == BYTES && device == 0);
		/* host memory has no handle */
		CHILD_CHECK(api->ipc_handle(pattern, h + 0, &offset, &bytes, &device, err) == VPS_CUDA_EINPUT);
		CHILD_CHECK(!api->ipc_handle(base, h, &offset, &bytes, &device, err));
		/* CUDA opens a handle in another process only */
		void *mine = NULL;
		CHILD_CHECK(api->ipc_open(h, &mine, &bytes, err) == VPS_CUDA_ECUDA);
		CHILD_CHECK(said(err, "cannot be opened in the process that made it"));
		CHILD_CHECK(write(p->handle[1], h, sizeof(h)) == (ssize_t)sizeof(h));
		char c;
		CHILD_CHECK(read(p->done[0], &c, 1) == 1);
		/* cudaFree takes the allocation's own address only */
		CHILD_CHECK(api->release((char *)base + AT, err) == VPS_CUDA_ECUDA);
		CHILD_CHECK(said(err, "an interior pointer"));
		CHILD_CHECK(!api->release(base, err));
		CHILD_CHECK(write(p->handle[1], h, 1) == 1);
		/* alive until the importer has tried the freed handle */
		CHILD_CHECK(read(p->done[0], &c, 1) == 1);
		return 0;
	}
	CHILD_CHECK(read(p->handle[0], h, sizeof(h)) == (ssize_t)sizeof(h));
	void *base = NULL, *again = NULL;
	uint64_t bytes = 0;
	CHILD_CHECK(!api->ipc_open(h, &base, &bytes, err));
	CHILD_CHECK(bytes == BYTES);
	CHILD_CHECK(!api->to_host(back, (char *)base + AT, sizeof(back), err) && !memcmp(back, pattern, sizeof(back)));
	/* opened twice: the same address, closed twice */
	CHILD_CHECK(!api->ipc_open(h, &again, &bytes, err) && again == base);
	CHILD_CHECK(!api->ipc_close(base, err) && !api->ipc_close(base, err));
	CHILD_CHECK(api->ipc_close(base, err) == VPS_CUDA_ECUDA);
	/* hostile handles */
	unsigned char bad[VPS_CUDA_IPC_HANDLE];
	void *x = NULL;
	const struct {
		size_t at;
		const char *with;
		const char *says;
	} forged[] = {
		{0, "X", "not a handle of this stand-in"},
		{24, "vps-sgpu-1-2-3/../../etc", "is not an object name of this stand-in"},
		{24, "vps-sgpu-01-2-3", "names"},
		{16, "\x01\x00\x00\x00", "names"}, /* another pid than its name's */
	};
	for (size_t i = 0; i < sizeof(forged) / sizeof(*forged); i++) {
		memcpy(bad, h, sizeof(bad));
		if (forged[i].at == 24)
			memset(bad + 24, 0, 40);
		memcpy(bad + forged[i].at, forged[i].with, strlen(forged[i].with));
		err[0] = '\0';
		CHILD_CHECK(api->ipc_open(bad, &x, &bytes, err) == VPS_CUDA_ECUDA);
		CHILD_CHECK(said(err, forged[i].says));
	}
	memcpy(bad, h, sizeof(bad));
	memset(bad + 24, 'a', 40); /* not terminated */
	CHILD_CHECK(api->ipc_open(bad, &x, &bytes, err) == VPS_CUDA_ECUDA && said(err, "not terminated"));
	/* a size that differs from the object's, in a well-formed handle */
	memcpy(bad, h, sizeof(bad));
	uint64_t other = BYTES / 2;
	memcpy(bad + 8, &other, sizeof(other));
	CHILD_CHECK(api->ipc_open(bad, &x, &bytes, err) == VPS_CUDA_ECUDA && said(err, "its size is not the handle's"));
	/* freed: it no longer opens */
	char c = 1;
	CHILD_CHECK(write(p->done[1], &c, 1) == 1);
	CHILD_CHECK(read(p->handle[0], &c, 1) == 1);
	CHILD_CHECK(api->ipc_open(h, &x, &bytes, err) == VPS_CUDA_ECUDA && said(err, "freed?"));
	CHILD_CHECK(write(p->done[1], &c, 1) == 1);
	return 0;
}

TEST(ipc_handles_open_in_another_process_and_are_checked_as_hostile_input)
{
	if (!load()) {
		CHECK(!"the CUDA stand-in loads");
		return;
	}
	struct pipes p;
	CHECK(pipe(p.handle) == 0 && pipe(p.done) == 0);
	int st[2];
	run_ranks(2, ipc_rank, &p, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
	close(p.handle[0]), close(p.handle[1]), close(p.done[0]), close(p.done[1]);
}

/* An exporter that dies: its handle no longer opens, and its objects go. */
static int dead_exporter_rank(int rank, void *ctx)
{
	struct pipes *p = ctx;
	char err[VPS_CUDA_ERR] = "";
	unsigned char h[VPS_CUDA_IPC_HANDLE];
	uint64_t offset, bytes;
	int device;
	if (rank == 0) {
		void *base = NULL;
		CHILD_CHECK(!api->alloc(&base, 4096, err) && !api->ipc_handle(base, h, &offset, &bytes, &device, err));
		CHILD_CHECK(write(p->handle[1], h, sizeof(h)) == (ssize_t)sizeof(h));
		_exit(child_failed);
	}
	CHILD_CHECK(read(p->handle[0], h, sizeof(h)) == (ssize_t)sizeof(h));
	/* until the exporter is reaped it is a zombie, which counts as gone */
	char path[80];
	snprintf(path, sizeof(path), "/dev/shm/%s", (const char *)h + 24);
	void *x;
	for (int i = 0; i < 500 && api->ipc_open(h, &x, &bytes, err) == 0; i++)
		api->ipc_close(x, err), usleep(10000);
	CHILD_CHECK(said(err, "has exited"));
	/* the first allocation of a process sweeps what dead ones left */
	void *mine = NULL;
	CHILD_CHECK(!api->alloc(&mine, 1, err));
	CHILD_CHECK(access(path, F_OK) != 0 && errno == ENOENT);
	return 0;
}

TEST(a_dead_exporters_handles_do_not_open_and_its_objects_are_swept)
{
	if (!load())
		return;
	struct pipes p;
	CHECK(pipe(p.handle) == 0 && pipe(p.done) == 0);
	int st[2];
	run_ranks(2, dead_exporter_rank, &p, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
	close(p.handle[0]), close(p.handle[1]), close(p.done[0]), close(p.done[1]);
}

/* ---- device memory is not host memory ---- */

static int deref_rank(int rank, void *ctx)
{
	(void)rank, (void)ctx;
	char err[VPS_CUDA_ERR] = "";
	void *dev = NULL;
	CHILD_CHECK(!api->alloc(&dev, 4096, err));
	unsigned char host[16];
	/* the host side of a copy must be host memory */
	CHILD_CHECK(api->to_host(dev, dev, 16, err) == VPS_CUDA_ECUDA && said(err, "is device memory"));
	CHILD_CHECK(api->to_device(dev, dev, 16, err) == VPS_CUDA_ECUDA);
	/* the device side must lie in one allocation */
	CHILD_CHECK(api->to_host(host, (char *)dev + 4090, 16, err) == VPS_CUDA_ECUDA && said(err, "not inside one"));
	CHILD_CHECK(api->fill((char *)dev + 4096, 0, 1, err) == VPS_CUDA_ECUDA);
	if (child_failed)
		return 1;
	/* and host code that reads a device pointer faults, as on a GPU (the
	 * fault itself, not a sanitizer's report of it) */
	signal(SIGSEGV, SIG_DFL);
	volatile unsigned char *p = dev;
	return p[0] == 0x42 ? 2 : 3;
}

TEST(device_pointers_fault_on_the_host_and_copies_check_both_sides)
{
	if (!load())
		return;
	int st[1];
	run_ranks(1, deref_rank, NULL, 30, st);
	CHECK_EQ(st[0], 128 + SIGSEGV);
}

/* ---- the copy kernel ---- */

static struct vps_cuda_copy row_copy(void *src, void *dst, int64_t rows, int64_t cols, int64_t sstride,
				     int64_t dstride)
{
	struct vps_cuda_copy c;
	memset(&c, 0, sizeof(c));
	c.src = (uint64_t)(uintptr_t)src;
	c.dst = (uint64_t)(uintptr_t)dst;
	c.ndim = 2;
	c.esize = 2;
	c.ext[0] = rows;
	c.ext[1] = cols;
	c.src_strides[0] = sstride;
	c.src_strides[1] = 1;
	c.dst_strides[0] = dstride;
	c.dst_strides[1] = 1;
	return c;
}

static int kernel_rank(int rank, void *ctx)
{
	(void)rank, (void)ctx;
	char err[VPS_CUDA_ERR] = "";
	void *a = NULL, *b = NULL;
	CHILD_CHECK(!api->alloc(&a, 1 << 16, err) && !api->alloc(&b, 1 << 16, err));
	/* two TP halves into one row-major tensor: rows interleave, no race */
	struct vps_cuda_copy c[2] = {row_copy(a, b, 64, 16, 16, 32), row_copy((char *)a + 2048, (char *)b + 32, 64, 16, 16, 32)};
	CHILD_CHECK(!api->copy(c, 2, err) && !api->sync(NULL, 10, err));
	/* the same destination twice in one launch: warps race */
	c[1] = row_copy((char *)a + 2048, (char *)b + 30, 64, 16, 16, 32);
	CHILD_CHECK(api->copy(c, 2, err) == VPS_CUDA_EINPUT && said(err, "copy 1 writes bytes at") &&
		    said(err, "that copy 0 writes"));
	/* reading what another copy of the launch writes */
	c[1] = row_copy(b, (char *)a + 8192, 4, 8, 8, 8);
	CHILD_CHECK(api->copy(c, 2, err) == VPS_CUDA_EINPUT && said(err, "race"));
	/* what the real kernel refuses, and what it would get wrong */
	struct vps_cuda_copy d = row_copy(a, b, 4, 4, 4, 4);
	d.ndim = 0;
	CHILD_CHECK(api->copy(&d, 1, err) == VPS_CUDA_EINPUT && said(err, "copy 0: 0 dimensions of 2-byte elements"));
	d = row_copy(a, b, 4, 4, 4, 4);
	d.esize = 0;
	CHILD_CHECK(api->copy(&d, 1, err) == VPS_CUDA_EINPUT);
	d = row_copy(a, b, -4, 4, 4, 4);
	CHILD_CHECK(api->copy(&d, 1, err) == VPS_CUDA_EINPUT && said(err, "extent -4 on axis 0"));
	d = row_copy(a, b, 2, INT64_MAX / 2 + 1, 4, 4);
	CHILD_CHECK(api->copy(&d, 1, err) == VPS_CUDA_EINPUT && said(err, "overflow"));
	/* nothing of those ran: the stream is healthy */
	CHILD_CHECK(!api->sync(NULL, 10, err));
	/* a row past its allocation: an illegal address, found at the wait,
	 * and every later call fails, as in a CUDA context that faulted */
	d = row_copy(a, b, 2, 16, (1 << 15), 16);
	CHILD_CHECK(!api->copy(&d, 1, err));
	CHILD_CHECK(api->sync(NULL, 10, err) == VPS_CUDA_ECUDA && said(err, "the GPU stream failed: an illegal memory "
									       "access was encountered (stand-in: copy 0 of 1 reads"));
	unsigned char host[4];
	CHILD_CHECK(api->to_host(host, a, 4, err) == VPS_CUDA_ECUDA && said(err, "illegal memory access"));
	return 0;
}

TEST(the_copy_kernel_refuses_what_the_real_one_refuses_or_gets_wrong)
{
	if (!load())
		return;
	int st[1];
	run_ranks(1, kernel_rank, NULL, 30, st);
	CHECK_EQ(st[0], 0);
}

/* ---- the executor's mapping cache over GPU memory ---- */

static struct vps_buffer_desc gpu_desc(const unsigned char h[VPS_CUDA_IPC_HANDLE], uint32_t buffer, uint64_t bytes)
{
	struct vps_buffer_desc d;
	memset(&d, 0, sizeof(d));
	d.where = VPS_WHERE_CUDA;
	d.buffer = buffer;
	d.bytes = bytes;
	memcpy(d.ipc, h, VPS_CUDA_IPC_HANDLE);
	return d;
}

/* What the executor opens while it waits is open when the switch maps it
 * (not counted as opened in the pause); a prefetched handle the trainer no
 * longer registers is closed by the prune; a target kept for the next
 * switch survives a prune that finds it unregistered (the trainer's reset
 * before it registers it again as a source). */
static int mapcache_rank(int rank, void *ctx)
{
	struct pipes *p = ctx;
	char err[VPS_CUDA_ERR] = "";
	enum { BYTES = 1 << 16 };
	unsigned char h[2][VPS_CUDA_IPC_HANDLE];
	char c = 0;
	if (rank == 0) {
		void *base[2] = {NULL, NULL};
		uint64_t offset, bytes;
		int device;
		for (int i = 0; i < 2; i++) {
			CHILD_CHECK(!api->alloc(&base[i], BYTES, err));
			CHILD_CHECK(!api->ipc_handle(base[i], h[i], &offset, &bytes, &device, err));
		}
		CHILD_CHECK(write(p->handle[1], h, sizeof(h)) == (ssize_t)sizeof(h));
		CHILD_CHECK(read(p->done[0], &c, 1) == 1);
		return 0;
	}
	CHILD_CHECK(read(p->handle[0], h, sizeof(h)) == (ssize_t)sizeof(h));
	struct vps_buffer_desc src = gpu_desc(h[0], 0, BYTES), dst = gpu_desc(h[1], 0, BYTES);
	struct vps_mapcache *m = NULL;
	CHILD_CHECK(!vps_mapcache_new(&m));
	/* waiting: the source's handle opened ahead */
	CHILD_CHECK(!vps_mapcache_prefetch(m, api, &src, false, false));
	CHILD_CHECK(vps_mapcache_take_opened(m) == 1);
	/* the switch: the source found open, the target opened now */
	void *ps = NULL, *pd = NULL;
	uint64_t warm = 0, cold = 0;
	CHILD_CHECK(!vps_mapcache_map(m, api, &src, false, false, true, &ps));
	CHILD_CHECK(!vps_mapcache_map(m, api, &dst, true, true, true, &pd));
	CHILD_CHECK(ps && pd && ps != pd);
	CHILD_CHECK(vps_mapcache_take_opened(m) == 1);
	vps_mapcache_take_stats(m, &warm, &cold);
	CHILD_CHECK(warm == BYTES && cold == BYTES);
	vps_mapcache_end_switch(m, api);
	/* the trainer between reset and registering again: nothing registered;
	 * the kept target stays open */
	vps_mapcache_prune(m, api, NULL, 0);
	CHILD_CHECK(!vps_mapcache_map(m, api, &dst, false, false, true, &pd));
	CHILD_CHECK(vps_mapcache_take_opened(m) == 0);
	vps_mapcache_end_switch(m, api);
	/* a prefetched handle the trainer dropped is closed */
	CHILD_CHECK(!vps_mapcache_prefetch(m, api, &src, false, false));
	vps_mapcache_prune(m, api, &dst, 1);
	CHILD_CHECK(!vps_mapcache_map(m, api, &src, false, false, true, &ps));
	CHILD_CHECK(vps_mapcache_take_opened(m) == 2);
	vps_mapcache_free(m);
	CHILD_CHECK(write(p->done[1], &c, 1) == 1);
	return 0;
}

TEST(the_mapping_cache_opens_gpu_memory_ahead_and_closes_what_the_trainer_dropped)
{
	if (!load())
		return;
	struct pipes p;
	CHECK(!pipe(p.handle) && !pipe(p.done));
	int st[2];
	run_ranks(2, mapcache_rank, &p, 30, st);
	CHECK_EQ(st[0], 0);
	CHECK_EQ(st[1], 0);
	close(p.handle[0]);
	close(p.handle[1]);
	close(p.done[0]);
	close(p.done[1]);
}

/* ---- the digest kernel ---- */

static int digest_rank(int rank, void *ctx)
{
	(void)rank, (void)ctx;
	char err[VPS_CUDA_ERR] = "";
	void *a = NULL;
	CHILD_CHECK(!api->alloc(&a, 4096, err) && !api->fill(a, 7, 4096, err));
	struct vps_cuda_digest v;
	memset(&v, 0, sizeof(v));
	v.addr = (uint64_t)(uintptr_t)a;
	v.ndim = 2;
	v.esize = 4;
	v.ext[0] = 8;
	v.ext[1] = 128;
	v.strides[0] = 128;
	v.strides[1] = 1;
	v.flat_strides[0] = 128;
	v.flat_strides[1] = 1;
	uint64_t sum = 0;
	CHILD_CHECK(!api->digest(&v, 1, &sum, err) && sum != 0);
	/* an extent that overflows is refused before anything runs */
	struct vps_cuda_digest d = v;
	d.ext[0] = INT64_MAX / 2;
	CHILD_CHECK(api->digest(&d, 1, &sum, err) == VPS_CUDA_EINPUT && said(err, "overflow"));
	/* one row past the allocation: an illegal address, and every later
	 * call fails, as in a CUDA context that faulted */
	d = v;
	d.ext[0] = 9;
	CHILD_CHECK(api->digest(&d, 1, &sum, err) == VPS_CUDA_ECUDA &&
		    said(err, "illegal memory access was encountered (stand-in: digest view 0 of 1 reads"));
	CHILD_CHECK(api->digest(&v, 1, &sum, err) == VPS_CUDA_ECUDA && said(err, "illegal memory access"));
	return 0;
}

TEST(the_digest_kernel_reads_only_inside_allocations)
{
	if (!load())
		return;
	int st[1];
	run_ranks(1, digest_rank, NULL, 30, st);
	CHECK_EQ(st[0], 0);
}

/* ---- a forked child ---- */

static int fork_rank(int rank, void *ctx)
{
	(void)rank, (void)ctx;
	char err[VPS_CUDA_ERR] = "";
	void *a = NULL;
	CHILD_CHECK(!api->alloc(&a, 64, err));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		void *b = NULL;
		_exit(api->alloc(&b, 64, err) == VPS_CUDA_ECUDA && strstr(err, "a forked child cannot use it") ? 0 : 1);
	}
	int w = 0;
	CHILD_CHECK(waitpid(pid, &w, 0) == pid && WIFEXITED(w) && WEXITSTATUS(w) == 0);
	return 0;
}

TEST(a_child_forked_after_cuda_was_used_cannot_use_it)
{
	if (!load())
		return;
	int st[1];
	run_ranks(1, fork_rank, NULL, 30, st);
	CHECK_EQ(st[0], 0);
}

/* ---- NCCL through the stand-in's stream ---- */

static int pending_rank(int rank, void *ctx)
{
	(void)rank, (void)ctx;
	char err[VPS_CUDA_ERR] = "";
	unsigned char id[VPS_CUDA_NCCL_ID];
	void *comm = NULL;
	CHILD_CHECK(!api->nccl_id(id, err) && !api->nccl_init(&comm, 1, 0, id, err));
	/* the NCCL the stand-in loaded, called as a buggy caller would */
	char path[4096];
	standin_path("libnccl-standin.so", path, sizeof(path));
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	int (*group_start)(void) = NULL;
	int (*send)(const void *, size_t, int, int, void *, void *) = NULL;
	if (h) {
		*(void **)&group_start = dlsym(h, "ncclGroupStart");
		*(void **)&send = dlsym(h, "ncclSend");
	}
	CHILD_CHECK(group_start && send);
	if (!group_start || !send)
		return 1;
	static char buf[64];
	CHILD_CHECK(group_start() == 0 && send(buf, sizeof(buf), 1, 0, comm, NULL) == 0);
	CHILD_CHECK(api->sync(comm, 10, err) == VPS_CUDA_ENCCL && said(err, "ncclGroupEnd is missing: 1 operations"));
	return 0;
}

TEST(a_group_never_ended_fails_the_wait)
{
	if (!load())
		return;
	char path[4096];
	standin_path("libnccl-standin.so", path, sizeof(path));
	setenv("VPS_NCCL_LIBRARY", path, 1);
	int st[1];
	run_ranks(1, pending_rank, NULL, 30, st);
	CHECK_EQ(st[0], 0);
}
