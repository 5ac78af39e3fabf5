/* libvps-cuda-standin.so: the table of lib/gpu/cuda/vps_cuda.h (the same
 * ABI as libvps-cuda.so) over host memory, so that every GPU code path of
 * vps runs where there is no GPU. A test instrument: libvps loads it only
 * when VPS_CUDA_LIBRARY names it.
 *
 * What it models, and how:
 * - Device memory. Each allocation is a POSIX shared-memory object
 *   (/dev/shm/vps-sgpu-PID-START-SERIAL, mode 0600), mapped where only the
 *   stand-in uses it; the device address handed out is a separate PROT_NONE
 *   reservation, so host code that dereferences a device pointer faults as
 *   it does on a GPU. Fresh allocations hold garbage, as cudaMalloc's do.
 * - IPC handles. The 64-byte handle names the object; another process
 *   opens it as it would a CUDA IPC handle (never the exporting process,
 *   which CUDA refuses; a second open in one process returns the same
 *   address, reference counted, as CUDA does). A handle is hostile input:
 *   its name is bounded, terminated and of one exact form, and the object's
 *   type, owner, mode, size and the exporter's liveness are checked.
 * - The stream. One worker thread per process runs queued work in order:
 *   copy kernels, device-to-device copies, NCCL groups (queued by the NCCL
 *   stand-in through struct standin_stream), timing marks. sync polls it and
 *   the communicator's asynchronous error as the real one polls
 *   cudaStreamQuery and ncclCommGetAsyncError.
 * - The copy kernel. The real kernel's arguments, its refusals and its
 *   descriptor arena (a list queued while 32 outgrown arenas wait for a
 *   sync is refused, as there). Beyond those, what the real kernel would get
 *   wrong is refused: negative extents, sizes that overflow, two copies of
 *   one launch writing the same bytes or one reading what another writes (a
 *   race between warps), and rows outside every allocation (an illegal
 *   address: reported at the next sync and sticky, as a fault kills a CUDA
 *   context).
 * - The digest kernel. The real kernel's lanes (gpu/cuda/vps_digest.h, the
 *   code nvcc compiles for the GPU) run one after another on the host,
 *   ordered on the stream after the work queued before it; a view outside
 *   every allocation faults the stream as the copy kernel's rows do.
 * - NCCL. As the real library: opened with dlopen (VPS_NCCL_LIBRARY, else
 *   libnccl.so.2, libnccl.so), called with the host addresses behind the
 *   device buffers and this stream.
 * What it does not model: timing, the GPU's memory ordering, peer access
 * and NVLink, several devices' separate memories (VPS_STANDIN_DEVICES only
 * sets the count). */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

#include <nccl.h>

#include "gpu/cuda/vps_cuda.h"
#include "gpu/cuda/vps_digest.h"
#include "standin.h"
#include "util/hash.h"

#define EXPORT __attribute__((visibility("default")))
#define OBJ_PREFIX "vps-sgpu-"
#define HANDLE_MAGIC "VPSSGPU1"
#define HANDLE_NAME 40
#define MAX_ALLOC ((uint64_t)1 << 40)
#define ARENA_RETIRED 32 /* as the real one's g_retired[] */
#define CHUNK ((uint64_t)64 << 10)
#define RACE_ROWS_MAX (1u << 22)

struct handle {
	char magic[8];
	uint64_t bytes;
	int32_t pid;
	uint32_t pad;
	char name[HANDLE_NAME];
};
_Static_assert(sizeof(struct handle) == VPS_CUDA_IPC_HANDLE, "handle size");

/* After an allocation's bytes, in its object: who has it open through a
 * handle. CUDA leaves a cudaFree of memory another process still has open
 * undefined; the exporter looks here and says so (see api_release). */
#define IMPORTERS 62
struct trailer {
	char magic[8];
	uint32_t pad[2];
	_Atomic int32_t pid[IMPORTERS];
};
#define TRAILER_MAGIC "VPSSGPUT"

static size_t object_bytes(uint64_t bytes)
{
	return (size_t)((bytes + 63) / 64 * 64) + sizeof(struct trailer);
}

static struct trailer *trailer_of(unsigned char *host, uint64_t bytes)
{
	return (struct trailer *)(void *)(host + (bytes + 63) / 64 * 64);
}

/* An allocation of this process, or another's opened through its handle. */
struct alloc {
	uint64_t dev;         /* the device address: a PROT_NONE reservation */
	uint64_t bytes;
	size_t span;          /* the reservation's length */
	unsigned char *host;  /* where the stand-in reads and writes it */
	size_t maplen;
	char name[HANDLE_NAME];
	int device;
	bool imported;
	int refs;             /* imported: opens not yet closed */
	int32_t owner;        /* imported: the exporter's pid */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *g_allocs; /* sorted by dev */
static size_t g_nallocs, g_cap;
static uint64_t g_serial;
static pid_t g_pid;
static uint64_t g_start;
static int g_device = -1;
static bool g_swept;

/* ---- errors ---- */

static int fail(char *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, VPS_CUDA_ERR, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* CUDA cannot be used in a child forked after the parent used it. */
static int check_process(char *err)
{
	if (!g_pid) {
		g_pid = getpid();
		g_start = standin_start_time(g_pid);
	} else if (getpid() != g_pid) {
		return fail(err, VPS_CUDA_ECUDA, "initialization error (stand-in: CUDA was used by process %d before "
			    "it forked this one; a forked child cannot use it)", (int)g_pid);
	}
	return 0;
}

/* ---- the stream: one worker thread, items in order ---- */

struct item {
	struct item *next;
	standin_run_fn run;
	void *arg;
};

static pthread_cond_t g_work = PTHREAD_COND_INITIALIZER, g_idle = PTHREAD_COND_INITIALIZER;
static struct item *g_head, *g_tail;
static bool g_busy, g_worker;
static char g_fault[STANDIN_ERR]; /* sticky: a kernel faulted */

static void *worker(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&g_lock);
	for (;;) {
		while (!g_head)
			pthread_cond_wait(&g_work, &g_lock);
		struct item *it = g_head;
		g_head = it->next;
		if (!g_head)
			g_tail = NULL;
		g_busy = true;
		bool cancelled = g_fault[0] != '\0';
		pthread_mutex_unlock(&g_lock);
		char err[STANDIN_ERR] = "";
		int rc = it->run(it->arg, cancelled, err);
		free(it);
		pthread_mutex_lock(&g_lock);
		if (rc && !g_fault[0])
			snprintf(g_fault, sizeof(g_fault), "%s", err[0] ? err : "a kernel failed");
		g_busy = false;
		if (!g_head)
			pthread_cond_broadcast(&g_idle);
	}
	return NULL;
}

/* Under g_lock. */
static int enqueue_locked(standin_run_fn run, void *arg, char *err)
{
	if (g_fault[0])
		return fail(err, VPS_CUDA_ECUDA, "%s", g_fault);
	if (!g_worker) {
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		int e = pthread_create(&t, &a, worker, NULL);
		pthread_attr_destroy(&a);
		if (e)
			return fail(err, VPS_CUDA_ECUDA, "the stream's thread: %s", strerror(e));
		g_worker = true;
	}
	struct item *it = calloc(1, sizeof(*it));
	if (!it)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	it->run = run;
	it->arg = arg;
	if (g_tail)
		g_tail->next = it;
	else
		g_head = it;
	g_tail = it;
	pthread_cond_signal(&g_work);
	return 0;
}

static int stream_enqueue(struct standin_stream *s, standin_run_fn run, void *arg, char *err)
{
	(void)s;
	pthread_mutex_lock(&g_lock);
	int rc = enqueue_locked(run, arg, err);
	pthread_mutex_unlock(&g_lock);
	return rc;
}

static struct standin_stream g_stream = {STANDIN_STREAM_MAGIC, stream_enqueue};

/* Under g_lock: wait until everything queued has run (cudaStreamSynchronize). */
static int drain_locked(char *err)
{
	while (g_head || g_busy)
		pthread_cond_wait(&g_idle, &g_lock);
	if (g_fault[0])
		return fail(err, VPS_CUDA_ECUDA, "%s", g_fault);
	return 0;
}

/* ---- the allocation table ---- */

/* Under g_lock: the allocation [dev, dev + bytes) lies in, or NULL. */
static struct alloc *find_locked(uint64_t dev, uint64_t bytes)
{
	size_t lo = 0, hi = g_nallocs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (g_allocs[mid].dev <= dev)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo)
		return NULL;
	struct alloc *a = &g_allocs[lo - 1];
	if (dev - a->dev > a->bytes || bytes > a->bytes - (dev - a->dev))
		return NULL;
	/* an empty range at the end belongs to it; a byte past it does not */
	if (dev - a->dev == a->bytes && bytes)
		return NULL;
	return a;
}

static bool is_device_locked(const void *p, size_t bytes)
{
	uintptr_t u = (uintptr_t)p;
	for (size_t i = 0; i < g_nallocs; i++) {
		uint64_t lo = g_allocs[i].dev, hi = lo + g_allocs[i].span;
		if (u < hi && u + (bytes ? bytes : 1) > lo)
			return true;
	}
	return false;
}

static int insert_locked(const struct alloc *a, char *err)
{
	if (g_nallocs == g_cap) {
		size_t cap = g_cap ? 2 * g_cap : 64;
		struct alloc *v = realloc(g_allocs, cap * sizeof(*v));
		if (!v)
			return fail(err, VPS_CUDA_ECUDA, "out of memory");
		g_allocs = v;
		g_cap = cap;
	}
	size_t at = 0;
	while (at < g_nallocs && g_allocs[at].dev < a->dev)
		at++;
	memmove(&g_allocs[at + 1], &g_allocs[at], (g_nallocs - at) * sizeof(*g_allocs));
	g_allocs[at] = *a;
	g_nallocs++;
	return 0;
}

static void unmap_alloc(const struct alloc *a)
{
	munmap((void *)(uintptr_t)a->dev, a->span);
	if (a->host)
		munmap(a->host, a->maplen);
}

static void remove_locked(struct alloc *a)
{
	size_t at = (size_t)(a - g_allocs);
	memmove(&g_allocs[at], &g_allocs[at + 1], (g_nallocs - at - 1) * sizeof(*g_allocs));
	g_nallocs--;
}

/* The device address range: reserved, never accessible. One page more
 * than the allocation, so the address just past its end faults too. */
static int reserve(struct alloc *a, char *err)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	a->span = (size_t)((a->bytes + page - 1) / page * page) + page;
	void *p = mmap(NULL, a->span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return fail(err, VPS_CUDA_ECUDA, "out of memory (stand-in: reserve %zu bytes of address space: %s)", a->span,
			    strerror(errno));
	a->dev = (uint64_t)(uintptr_t)p;
	return 0;
}

static const char *describe_ptr_locked(const void *p)
{
	uintptr_t u = (uintptr_t)p;
	for (size_t i = 0; i < g_nallocs; i++)
		if (u >= g_allocs[i].dev && u < g_allocs[i].dev + g_allocs[i].span)
			return g_allocs[i].imported ? "memory opened from another process's IPC handle"
						    : "past the end of an allocation";
	return "not device memory";
}

/* The driver frees a process's memory when it exits: its objects go with
 * it (what a killed process leaves, the next one's first allocation
 * sweeps). */
__attribute__((destructor)) static void release_all(void)
{
	if (!g_pid || getpid() != g_pid)
		return;
	for (size_t i = 0; i < g_nallocs; i++)
		if (!g_allocs[i].imported) {
			char path[HANDLE_NAME + 1];
			snprintf(path, sizeof(path), "/%s", g_allocs[i].name);
			shm_unlink(path);
		}
}

/* ---- the API ---- */

static int device_count(void)
{
	const char *e = getenv("VPS_STANDIN_DEVICES");
	if (!e || !*e)
		return 1;
	char *end;
	long n = strtol(e, &end, 10);
	return *end || n < 0 || n > 64 ? -1 : (int)n;
}

static int api_device_count(int *n, char *err)
{
	*n = 0;
	int rc = check_process(err);
	if (rc)
		return rc;
	int c = device_count();
	if (c < 0)
		return fail(err, VPS_CUDA_ECUDA, "no usable GPU: VPS_STANDIN_DEVICES is not a count from 0 to 64");
	if (c == 0)
		return fail(err, VPS_CUDA_ECUDA, "no usable GPU: no CUDA-capable device is detected (stand-in: "
			    "VPS_STANDIN_DEVICES=0)");
	*n = c;
	return 0;
}

static int api_init(int device, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	if (g_device >= 0) {
		if (device != g_device)
			return fail(err, VPS_CUDA_EINPUT, "this process already uses GPU %d, not %d", g_device, device);
		return 0;
	}
	int n = device_count();
	if (n <= 0)
		return fail(err, VPS_CUDA_ECUDA, "cudaGetDeviceCount(&n): no CUDA-capable device is detected");
	if (device < 0 || device >= n)
		return fail(err, VPS_CUDA_EINPUT, "GPU %d does not exist (this machine has %d)", device, n);
	g_device = device;
	return 0;
}

static int api_alloc(void **ptr, size_t bytes, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	struct alloc a = {0};
	a.bytes = bytes ? bytes : 1;
	a.device = g_device < 0 ? 0 : g_device;
	if (a.bytes > MAX_ALLOC)
		return fail(err, VPS_CUDA_ECUDA, "cudaMalloc(ptr, %zu): out of memory", bytes);
	pthread_mutex_lock(&g_lock);
	if (!g_swept) {
		standin_sweep(OBJ_PREFIX);
		g_swept = true;
	}
	uint64_t serial = ++g_serial;
	pthread_mutex_unlock(&g_lock);
	int n = snprintf(a.name, sizeof(a.name), OBJ_PREFIX "%x-%" PRIx64 "-%" PRIx64, (unsigned)g_pid, g_start, serial);
	if (n < 0 || (size_t)n >= sizeof(a.name))
		return fail(err, VPS_CUDA_ECUDA, "cudaMalloc: the stand-in's object name does not fit its handle");
	char path[HANDLE_NAME + 1];
	snprintf(path, sizeof(path), "/%s", a.name);
	int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return fail(err, VPS_CUDA_ECUDA, "cudaMalloc(ptr, %zu): out of memory (stand-in: /dev/shm%s: %s)", bytes,
			    path, strerror(errno));
	a.maplen = object_bytes(a.bytes);
	void *host = MAP_FAILED;
	int e = standin_reserve(fd, a.maplen);
	if (!e && (host = mmap(NULL, a.maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
		e = errno;
	close(fd);
	if (host == MAP_FAILED) {
		shm_unlink(path);
		return fail(err, VPS_CUDA_ECUDA, "cudaMalloc(ptr, %zu): out of memory (stand-in: /dev/shm%s: %s)", bytes,
			    path, strerror(e));
	}
	a.host = host;
	/* cudaMalloc's memory is not cleared: nothing may count on zeros */
	memset(a.host, 0xa5, (size_t)a.bytes);
	memcpy(trailer_of(a.host, a.bytes)->magic, TRAILER_MAGIC, 8);
	if ((rc = reserve(&a, err))) {
		munmap(a.host, a.maplen);
		shm_unlink(path);
		return rc;
	}
	pthread_mutex_lock(&g_lock);
	rc = insert_locked(&a, err);
	pthread_mutex_unlock(&g_lock);
	if (rc) {
		unmap_alloc(&a);
		shm_unlink(path);
		return rc;
	}
	*ptr = (void *)(uintptr_t)a.dev;
	return 0;
}

static int api_release(void *ptr, char *err)
{
	int rc = check_process(err);
	if (rc || !ptr)
		return rc;
	/* cudaFree waits for the device */
	pthread_mutex_lock(&g_lock);
	drain_locked(NULL);
	struct alloc *a = find_locked((uint64_t)(uintptr_t)ptr, 0);
	if (!a || a->imported || a->dev != (uint64_t)(uintptr_t)ptr) {
		const char *what = a && a->imported ? "memory opened from an IPC handle (cudaIpcCloseMemHandle closes it)"
					: a ? "an interior pointer of an allocation" : describe_ptr_locked(ptr);
		pthread_mutex_unlock(&g_lock);
		return fail(err, VPS_CUDA_ECUDA, "cudaFree(ptr): invalid argument (stand-in: %p is %s)", ptr, what);
	}
	struct alloc gone = *a;
	remove_locked(a);
	pthread_mutex_unlock(&g_lock);
	char path[HANDLE_NAME + 1];
	snprintf(path, sizeof(path), "/%s", gone.name);
	shm_unlink(path);
	/* undefined in CUDA: freeing what another process has open */
	struct trailer *t = trailer_of(gone.host, gone.bytes);
	int32_t holder = 0;
	for (int k = 0; k < IMPORTERS && !holder; k++) {
		int32_t pid = atomic_load(&t->pid[k]);
		if (pid > 0 && standin_start_time(pid))
			holder = pid;
	}
	unmap_alloc(&gone);
	if (holder) {
		fprintf(stderr, "cuda stand-in: cudaFree(%p) while process %d still has the allocation open through "
			"cudaIpcOpenMemHandle: undefined in CUDA\n", ptr, (int)holder);
		return fail(err, VPS_CUDA_ECUDA, "cudaFree(ptr): process %d still has this allocation open through "
			    "cudaIpcOpenMemHandle (stand-in: undefined in CUDA)", (int)holder);
	}
	return 0;
}

static int api_ipc_handle(const void *ptr, unsigned char out[VPS_CUDA_IPC_HANDLE], uint64_t *offset,
			  uint64_t *alloc_bytes, int *device, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	pthread_mutex_lock(&g_lock);
	struct alloc *a = find_locked((uint64_t)(uintptr_t)ptr, 1);
	if (!a) {
		pthread_mutex_unlock(&g_lock);
		return fail(err, VPS_CUDA_EINPUT, "%p is not device memory from cudaMalloc (type 0)", ptr);
	}
	if (a->imported) {
		pthread_mutex_unlock(&g_lock);
		return fail(err, VPS_CUDA_EINPUT, "no IPC handle for the allocation at %p: invalid argument (stand-in: it "
			    "was opened from another process's handle)", (void *)(uintptr_t)a->dev);
	}
	struct handle h;
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, HANDLE_MAGIC, sizeof(h.magic));
	h.bytes = a->bytes;
	h.pid = (int32_t)g_pid;
	memcpy(h.name, a->name, sizeof(h.name));
	memcpy(out, &h, sizeof(h));
	*offset = (uint64_t)(uintptr_t)ptr - a->dev;
	*alloc_bytes = a->bytes;
	*device = a->device;
	pthread_mutex_unlock(&g_lock);
	return 0;
}

/* A handle is hostile input: the one form this stand-in writes, nothing
 * else. */
static int parse_handle(const unsigned char raw[VPS_CUDA_IPC_HANDLE], struct handle *h, uint64_t *start, char *err)
{
	memcpy(h, raw, sizeof(*h));
	if (memcmp(h->magic, HANDLE_MAGIC, sizeof(h->magic)))
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid argument (stand-in: not a handle of "
			    "this stand-in)");
	if (!memchr(h->name, '\0', sizeof(h->name)))
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid argument (stand-in: the object name is "
			    "not terminated)");
	unsigned pid;
	uint64_t serial;
	int used = -1;
	if (sscanf(h->name, OBJ_PREFIX "%x-%" SCNx64 "-%" SCNx64 "%n", &pid, start, &serial, &used) != 3 || used < 0 ||
	    h->name[used]) {
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid argument (stand-in: '%.40s' is not an "
			    "object name of this stand-in)", h->name);
	}
	char canon[HANDLE_NAME];
	snprintf(canon, sizeof(canon), OBJ_PREFIX "%x-%" PRIx64 "-%" PRIx64, pid, *start, serial);
	if (strcmp(canon, h->name) || (int32_t)pid != h->pid || h->pid <= 0 || !h->bytes || h->bytes > MAX_ALLOC)
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid argument (stand-in: handle of %" PRIu64
			    " bytes from pid %d names '%s')", h->bytes, (int)h->pid, h->name);
	return 0;
}

static int api_ipc_open(const unsigned char raw[VPS_CUDA_IPC_HANDLE], void **base, uint64_t *bytes, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	struct handle h;
	uint64_t start;
	if ((rc = parse_handle(raw, &h, &start, err)))
		return rc;
	if (h.pid == (int32_t)g_pid)
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid context (stand-in: a handle cannot be "
			    "opened in the process that made it)");
	pthread_mutex_lock(&g_lock);
	for (size_t i = 0; i < g_nallocs; i++) {
		struct alloc *a = &g_allocs[i];
		if (a->imported && !strcmp(a->name, h.name) && a->bytes == h.bytes) {
			/* opened before: the same address, one reference more */
			a->refs++;
			*base = (void *)(uintptr_t)a->dev;
			*bytes = a->bytes;
			pthread_mutex_unlock(&g_lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&g_lock);
	if (!standin_alive(h.pid, start))
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid resource handle (stand-in: process %d, "
			    "which made it, has exited)", (int)h.pid);
	char path[HANDLE_NAME + 1];
	snprintf(path, sizeof(path), "/%s", h.name);
	int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
	if (fd < 0)
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid resource handle (stand-in: /dev/shm%s: "
			    "%s; freed?)", path, strerror(errno));
	struct stat st;
	const char *why = NULL;
	if (fstat(fd, &st) != 0)
		why = strerror(errno);
	else if (!S_ISREG(st.st_mode))
		why = "not a regular file";
	else if (st.st_uid != geteuid())
		why = "owned by another user";
	else if (st.st_mode & 077)
		why = "others may open it (mode is not 0600)";
	else if ((uint64_t)st.st_size != object_bytes(h.bytes))
		why = "its size is not the handle's";
	if (why) {
		close(fd);
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid resource handle (stand-in: /dev/shm%s: %s)",
			    path, why);
	}
	struct alloc a = {0};
	a.bytes = h.bytes;
	a.imported = true;
	a.refs = 1;
	a.owner = h.pid;
	a.device = g_device < 0 ? 0 : g_device;
	memcpy(a.name, h.name, sizeof(a.name));
	a.maplen = object_bytes(a.bytes);
	void *host = mmap(NULL, a.maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (host == MAP_FAILED)
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: out of memory (stand-in: map %zu bytes: %s)",
			    a.maplen, strerror(e));
	a.host = host;
	struct trailer *t = trailer_of(a.host, a.bytes);
	if (memcmp(t->magic, TRAILER_MAGIC, 8)) {
		munmap(a.host, a.maplen);
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcOpenMemHandle: invalid resource handle (stand-in: /dev/shm%s is "
			    "not an allocation of this stand-in)", path);
	}
	/* a slot for this process: the exporter's cudaFree looks there */
	for (int k = 0; k < IMPORTERS; k++) {
		int32_t none = 0;
		if (atomic_compare_exchange_strong(&t->pid[k], &none, (int32_t)g_pid))
			break;
	}
	if ((rc = reserve(&a, err))) {
		munmap(a.host, a.maplen);
		return rc;
	}
	pthread_mutex_lock(&g_lock);
	rc = insert_locked(&a, err);
	pthread_mutex_unlock(&g_lock);
	if (rc) {
		unmap_alloc(&a);
		return rc;
	}
	*base = (void *)(uintptr_t)a.dev;
	*bytes = a.bytes;
	return 0;
}

static int api_ipc_close(void *base, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	pthread_mutex_lock(&g_lock);
	drain_locked(NULL);
	struct alloc *a = find_locked((uint64_t)(uintptr_t)base, 0);
	if (!a || !a->imported || a->dev != (uint64_t)(uintptr_t)base) {
		pthread_mutex_unlock(&g_lock);
		return fail(err, VPS_CUDA_ECUDA, "cudaIpcCloseMemHandle(base): invalid argument (stand-in: %p was not "
			    "returned by cudaIpcOpenMemHandle)", base);
	}
	if (--a->refs > 0) {
		pthread_mutex_unlock(&g_lock);
		return 0;
	}
	struct alloc gone = *a;
	remove_locked(a);
	pthread_mutex_unlock(&g_lock);
	struct trailer *t = trailer_of(gone.host, gone.bytes);
	for (int k = 0; k < IMPORTERS; k++) {
		int32_t me = (int32_t)g_pid;
		if (atomic_compare_exchange_strong(&t->pid[k], &me, 0))
			break;
	}
	unmap_alloc(&gone);
	return 0;
}

/* The host address of [dev, dev + bytes), which must lie in one
 * allocation. */
static unsigned char *host_of(uint64_t dev, uint64_t bytes)
{
	pthread_mutex_lock(&g_lock);
	struct alloc *a = find_locked(dev, bytes);
	unsigned char *p = a ? a->host + (dev - a->dev) : NULL;
	pthread_mutex_unlock(&g_lock);
	return p;
}

/* Host memory must not be device memory, and the reverse. */
static int check_host_range(const void *p, size_t bytes, const char *call, char *err)
{
	pthread_mutex_lock(&g_lock);
	bool dev = is_device_locked(p, bytes);
	pthread_mutex_unlock(&g_lock);
	if (dev)
		return fail(err, VPS_CUDA_ECUDA, "%s: invalid argument (stand-in: the host side, %p, is device memory)",
			    call, p);
	return 0;
}

struct memop {
	unsigned char *dst;
	const unsigned char *src;
	size_t bytes;
	int value; /* < 0: a copy */
};

static int run_memop(void *arg, bool cancelled, char *err)
{
	(void)err;
	struct memop *m = arg;
	if (!cancelled && m->bytes) {
		if (m->value < 0)
			memcpy(m->dst, m->src, m->bytes);
		else
			memset(m->dst, m->value, m->bytes);
	}
	free(m);
	return 0;
}

/* Queue a host-side copy or fill; wait for it when sync. */
static int queue_memop(unsigned char *dst, const unsigned char *src, size_t bytes, int value, bool sync, char *err)
{
	struct memop *m = calloc(1, sizeof(*m));
	if (!m)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	*m = (struct memop){dst, src, bytes, value};
	pthread_mutex_lock(&g_lock);
	int rc = enqueue_locked(run_memop, m, err);
	if (rc)
		free(m);
	else if (sync)
		rc = drain_locked(err);
	pthread_mutex_unlock(&g_lock);
	return rc;
}

/* A copy between the host and a device allocation, as cudaMemcpyAsync on
 * g_stream checks it: the host range readable or writable, the device
 * range inside one allocation. */
static int host_device_copy(void *device, void *host, size_t bytes, bool to_device, char *err)
{
	const char *kind = to_device ? "HostToDevice" : "DeviceToHost";
	int rc = check_process(err);
	if (!rc)
		rc = check_host_range(host, bytes, to_device ? "cudaMemcpyAsync(host to device)" :
							  "cudaMemcpyAsync(device to host)", err);
	if (rc)
		return rc;
	unsigned char *d = host_of((uint64_t)(uintptr_t)device, bytes);
	if (!d)
		return fail(err, VPS_CUDA_ECUDA, "cudaMemcpyAsync(dst, src, %zu, cudaMemcpy%s, g_stream): invalid argument "
			    "(stand-in: the %s is not inside one allocation)", bytes, kind,
			    to_device ? "destination" : "source");
	return to_device ? queue_memop(d, host, bytes, -1, true, err) : queue_memop(host, d, bytes, -1, true, err);
}

static int api_to_device(void *dst, const void *src, size_t bytes, char *err)
{
	return host_device_copy(dst, (void *)(uintptr_t)src, bytes, true, err);
}

static int api_to_host(void *dst, const void *src, size_t bytes, char *err)
{
	return host_device_copy((void *)(uintptr_t)src, dst, bytes, false, err);
}

static int api_fill(void *dst, int value, size_t bytes, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	unsigned char *d = host_of((uint64_t)(uintptr_t)dst, bytes);
	if (!d)
		return fail(err, VPS_CUDA_ECUDA, "cudaMemsetAsync(dst, value, %zu, g_stream): invalid argument (stand-in: "
			    "not inside one allocation)", bytes);
	return queue_memop(d, NULL, bytes, value & 0xff, true, err);
}

static int api_memcpy_d2d(void *dst, const void *src, size_t bytes, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	uint64_t d = (uint64_t)(uintptr_t)dst, s = (uint64_t)(uintptr_t)src;
	unsigned char *hd = host_of(d, bytes), *hs = host_of(s, bytes);
	if (!hd || !hs)
		return fail(err, VPS_CUDA_ECUDA, "cudaMemcpyAsync(dst, src, %zu, cudaMemcpyDeviceToDevice, g_stream): "
			    "invalid argument (stand-in: the %s is not inside one allocation)", bytes,
			    hd ? "source" : "destination");
	if (bytes && hd < hs + bytes && hs < hd + bytes)
		return fail(err, VPS_CUDA_EINPUT, "cudaMemcpyAsync: the source and the destination overlap (stand-in: "
			    "undefined in CUDA)");
	return queue_memop(hd, hs, bytes, -1, false, err);
}

/* ---- the copy kernel ---- */

/* One copy as the real kernel sees it (describe() in vps_cuda.cu): rows of
 * row_bytes, outer axes with byte strides. */
struct rows {
	uint64_t src, dst; /* device addresses of the first row */
	uint64_t row_bytes;
	int nouter;
	int64_t ext[VPS_CUDA_MAX_DIMS], sstr[VPS_CUDA_MAX_DIMS], dstr[VPS_CUDA_MAX_DIMS];
	unsigned char *hsrc, *hdst; /* host addresses of the first row */
};

/* The real describe(), axis for axis; false when the sizes overflow. */
static bool describe(const struct vps_cuda_copy *c, struct rows *d)
{
	int64_t ext[VPS_CUDA_MAX_DIMS], ss[VPS_CUDA_MAX_DIMS], ds[VPS_CUDA_MAX_DIMS];
	int nd = 0;
	for (int k = 0; k < c->ndim; k++) {
		if (c->ext[k] == 1)
			continue;
		ext[nd] = c->ext[k];
		ss[nd] = c->src_strides[k];
		ds[nd] = c->dst_strides[k];
		nd++;
	}
	int w = 0;
	for (int k = 0; k < nd; k++) {
		int64_t se, de;
		if (w && !__builtin_mul_overflow(ss[k], ext[k], &se) && !__builtin_mul_overflow(ds[k], ext[k], &de) &&
		    ss[w - 1] == se && ds[w - 1] == de) {
			if (__builtin_mul_overflow(ext[w - 1], ext[k], &ext[w - 1]))
				return false;
			ss[w - 1] = ss[k];
			ds[w - 1] = ds[k];
			continue;
		}
		ext[w] = ext[k];
		ss[w] = ss[k];
		ds[w] = ds[k];
		w++;
	}
	nd = w;
	memset(d, 0, sizeof(*d));
	d->src = c->src;
	d->dst = c->dst;
	int64_t es = c->esize, rb = es;
	if (nd == 0) {
		d->nouter = 0;
	} else if (ss[nd - 1] == 1 && ds[nd - 1] == 1) {
		if (__builtin_mul_overflow(ext[nd - 1], es, &rb))
			return false;
		d->nouter = nd - 1;
	} else {
		d->nouter = nd;
	}
	d->row_bytes = (uint64_t)rb;
	for (int k = 0; k < d->nouter; k++) {
		d->ext[k] = ext[k];
		if (__builtin_mul_overflow(ss[k], es, &d->sstr[k]) || __builtin_mul_overflow(ds[k], es, &d->dstr[k]))
			return false;
	}
	return true;
}

static uint64_t row_count(const struct rows *d)
{
	uint64_t n = 1;
	for (int k = 0; k < d->nouter; k++)
		n *= (uint64_t)d->ext[k];
	return n;
}

/* The bytes a view touches, [lo, hi) from its first row's address; false
 * when they overflow. */
static bool view_span(const struct rows *d, const int64_t *str, int64_t *lo, int64_t *hi)
{
	int64_t l = 0, h = 0;
	for (int k = 0; k < d->nouter; k++) {
		int64_t reach;
		if (__builtin_mul_overflow(d->ext[k] - 1, str[k], &reach))
			return false;
		if (reach < 0 ? __builtin_add_overflow(l, reach, &l) : __builtin_add_overflow(h, reach, &h))
			return false;
	}
	if (__builtin_add_overflow(h, (int64_t)d->row_bytes, &h))
		return false;
	*lo = l;
	*hi = h;
	return true;
}

/* Row r's byte offsets from the first row, source and destination. */
static void row_offsets(const struct rows *d, uint64_t r, int64_t *so, int64_t *to)
{
	uint64_t s = 0, t = 0;
	for (int a = d->nouter - 1; a >= 0; a--) {
		uint64_t e = (uint64_t)d->ext[a], i = r % e;
		r /= e;
		s += i * (uint64_t)d->sstr[a];
		t += i * (uint64_t)d->dstr[a];
	}
	*so = (int64_t)s;
	*to = (int64_t)t;
}

struct span {
	uint64_t lo, hi;
	uint32_t copy;
	bool write;
};

static int cmp_span(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Two copies of one launch must not write the same bytes, nor one read
 * what another (or itself) writes: on a GPU their warps race. Rows of a
 * copy that continue each other count as one span. */
static int check_races(const struct rows *d, size_t n, uint64_t total_rows, char *err)
{
	if (total_rows > RACE_ROWS_MAX)
		return 0;
	struct span *v = malloc((size_t)(2 * total_rows + 1) * sizeof(*v));
	if (!v)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t rows = row_count(&d[i]);
		if (!d[i].row_bytes || !rows)
			continue;
		for (int w = 0; w < 2; w++) {
			size_t first = m;
			for (uint64_t r = 0; r < rows; r++) {
				int64_t so, to;
				row_offsets(&d[i], r, &so, &to);
				uint64_t lo = (w ? d[i].dst : d[i].src) + (uint64_t)(w ? to : so);
				if (m > first && v[m - 1].hi == lo) {
					v[m - 1].hi += d[i].row_bytes;
					continue;
				}
				v[m++] = (struct span){lo, lo + d[i].row_bytes, (uint32_t)i, w == 1};
			}
		}
	}
	qsort(v, m, sizeof(*v), cmp_span);
	uint64_t wend = 0, aend = 0;
	size_t wlast = 0, alast = 0;
	int rc = 0;
	for (size_t k = 0; k < m && !rc; k++) {
		const struct span *s = &v[k];
		const struct span *o = NULL;
		if (s->write && k && s->lo < aend)
			o = &v[alast];
		else if (!s->write && k && s->lo < wend)
			o = &v[wlast];
		if (o)
			rc = fail(err, VPS_CUDA_EINPUT, "copy %u %s bytes at 0x%" PRIx64 " that copy %u %s (stand-in: the "
				  "real kernel's warps would race)", s->copy, s->write ? "writes" : "reads", s->lo, o->copy,
				  o->write ? "writes" : "reads");
		if (s->hi > aend) {
			aend = s->hi;
			alast = k;
		}
		if (s->write && s->hi > wend) {
			wend = s->hi;
			wlast = k;
		}
	}
	free(v);
	return rc;
}

struct kernel {
	size_t n;
	char fault[STANDIN_ERR]; /* an illegal address: the launch faults */
	struct rows d[];
};

static int run_kernel(void *arg, bool cancelled, char *err)
{
	struct kernel *k = arg;
	int rc = 0;
	if (!cancelled && k->fault[0]) {
		snprintf(err, STANDIN_ERR, "%s", k->fault);
		rc = 1;
	} else if (!cancelled) {
		for (size_t i = 0; i < k->n; i++) {
			const struct rows *d = &k->d[i];
			uint64_t rows = row_count(d);
			for (uint64_t r = 0; r < rows && d->row_bytes; r++) {
				int64_t so, to;
				row_offsets(d, r, &so, &to);
				memcpy(d->hdst + to, d->hsrc + so, d->row_bytes);
			}
		}
	}
	free(k);
	return rc;
}

/* The real one's descriptor arena, only counted: what it refuses, this
 * refuses. */
static size_t g_arena_cap, g_arena_used;
static int g_nretired;

static int api_copy(const struct vps_cuda_copy *c, size_t n, char *err)
{
	int rc = check_process(err);
	if (rc || !n)
		return rc;
	if (n > (size_t)INT32_MAX)
		return fail(err, VPS_CUDA_EINPUT, "%zu copies in one kernel", n);
	pthread_mutex_lock(&g_lock);
	if (g_fault[0]) {
		rc = fail(err, VPS_CUDA_ECUDA, "%s", g_fault);
		pthread_mutex_unlock(&g_lock);
		return rc;
	}
	if (g_arena_used + n > g_arena_cap) {
		if (g_nretired == ARENA_RETIRED) {
			pthread_mutex_unlock(&g_lock);
			return fail(err, VPS_CUDA_EINPUT, "too many copy lists queued without a sync");
		}
		size_t cap = g_arena_cap * 2 > n ? g_arena_cap * 2 : n;
		if (cap < 1024)
			cap = 1024;
		if (g_arena_cap)
			g_nretired++;
		g_arena_cap = cap;
	}
	pthread_mutex_unlock(&g_lock);
	struct kernel *k = calloc(1, sizeof(*k) + n * sizeof(k->d[0]));
	if (!k)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	k->n = n;
	uint64_t units = 0, total_rows = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		if (c[i].ndim < 1 || c[i].ndim > VPS_CUDA_MAX_DIMS || c[i].esize < 1) {
			rc = fail(err, VPS_CUDA_EINPUT, "copy %zu: %d dimensions of %d-byte elements", i, c[i].ndim, c[i].esize);
			break;
		}
		/* what the real kernel would get wrong: it multiplies extents as
		 * unsigned numbers and sizes without a check */
		for (int a = 0; a < c[i].ndim && !rc; a++)
			if (c[i].ext[a] < 0)
				rc = fail(err, VPS_CUDA_EINPUT, "copy %zu: extent %" PRId64 " on axis %d (stand-in: the real "
					  "kernel would copy %" PRIu64 " rows)", i, c[i].ext[a], a, (uint64_t)c[i].ext[a]);
		struct rows *d = &k->d[i];
		if (!rc && !describe(&c[i], d))
			rc = fail(err, VPS_CUDA_EINPUT, "copy %zu: its sizes overflow 64 bits (stand-in: the real kernel "
				  "would wrap them)", i);
		uint64_t rows = rc ? 0 : row_count(d);
		if (!rc && (__builtin_add_overflow(total_rows, rows, &total_rows) ||
			    __builtin_add_overflow(units, rows * ((d->row_bytes + CHUNK - 1) / CHUNK), &units)))
			rc = fail(err, VPS_CUDA_EINPUT, "copy %zu: too many rows", i);
		if (rc || !rows || !d->row_bytes)
			continue;
		/* every byte of each view in one allocation, else the launch
		 * faults as an illegal address does */
		int64_t slo, shi, dlo, dhi;
		if (!view_span(d, d->sstr, &slo, &shi) || !view_span(d, d->dstr, &dlo, &dhi)) {
			rc = fail(err, VPS_CUDA_EINPUT, "copy %zu: its views' extents overflow 64 bits (stand-in: the real "
				  "kernel would wrap them)", i);
			continue;
		}
		unsigned char *hs = host_of(d->src + (uint64_t)slo, (uint64_t)(shi - slo));
		unsigned char *hd = host_of(d->dst + (uint64_t)dlo, (uint64_t)(dhi - dlo));
		if ((!hs || !hd) && !k->fault[0]) {
			snprintf(k->fault, sizeof(k->fault), "an illegal memory access was encountered (stand-in: copy %zu of "
				 "%zu %s [0x%" PRIx64 ", +%" PRId64 ") outside every allocation)", i, n,
				 hs ? "writes" : "reads", hs ? d->dst + (uint64_t)dlo : d->src + (uint64_t)slo,
				 hs ? dhi - dlo : shi - slo);
		}
		if (hs && hd) {
			d->hsrc = hs - slo;
			d->hdst = hd - dlo;
		}
	}
	if (!rc && units && !k->fault[0])
		rc = check_races(k->d, n, total_rows, err);
	if (rc || !units) {
		free(k);
		return rc;
	}
	pthread_mutex_lock(&g_lock);
	g_arena_used += n;
	rc = enqueue_locked(run_kernel, k, err);
	pthread_mutex_unlock(&g_lock);
	if (rc)
		free(k);
	return rc;
}

/* ---- the digest kernel ---- */

struct digest_view {
	struct vps_cuda_digest v;
	const unsigned char *host; /* element (0, ..) */
};

struct digest {
	size_t n;
	uint64_t *sum;             /* the caller's, which waits */
	char fault[STANDIN_ERR];
	struct digest_view d[];
};

static int run_digest(void *arg, bool cancelled, char *err)
{
	struct digest *k = arg;
	int rc = 0;
	uint64_t sum = 0;
	if (!cancelled && k->fault[0]) {
		snprintf(err, STANDIN_ERR, "%s", k->fault);
		rc = 1;
	} else if (!cancelled && k->n) {
		/* the real kernel's lanes, one after another (vps_digest.h), over
		 * the host memory behind the views */
		struct vps_cuda_digest *v = malloc(k->n * sizeof(*v));
		struct vps_dk_desc *d = malloc(k->n * sizeof(*d));
		uint64_t slot[VPS_DK_BLOCK];
		if (!v || !d) {
			snprintf(err, STANDIN_ERR, "out of memory");
			rc = 1;
		} else {
			for (uint32_t l = 0; l < VPS_DK_BLOCK; l++)
				slot[l] = vps_dk_slot_key(l);
			for (size_t i = 0; i < k->n; i++) {
				v[i] = k->d[i].v;
				v[i].addr = (uint64_t)(uintptr_t)k->d[i].host;
			}
			size_t m = 0;
			uint64_t units = vps_dk_prepare(v, k->n, d, &m);
			for (uint64_t u = 0; u < units; u++)
				for (int lane = 0; lane < VPS_DK_LANES; lane++)
					sum += vps_dk_lane(d, (int)m, u, lane, slot);
		}
		free(v);
		free(d);
	}
	*k->sum = sum;
	free(k);
	return rc;
}

/* The byte offsets [lo, hi) a view touches from element (0, ..); false
 * when they overflow (the real kernel would wrap them). */
static bool digest_span(const struct vps_cuda_digest *v, int64_t *lo, int64_t *hi)
{
	int64_t l = 0, h = 0;
	for (int a = 0; a < v->ndim; a++) {
		int64_t reach;
		if (__builtin_mul_overflow(v->ext[a] - 1, v->strides[a], &reach) ||
		    __builtin_mul_overflow(reach, (int64_t)v->esize, &reach))
			return false;
		if (reach < 0 ? __builtin_add_overflow(l, reach, &l) : __builtin_add_overflow(h, reach, &h))
			return false;
		int64_t f;
		if (__builtin_mul_overflow(v->ext[a] - 1, v->flat_strides[a], &f))
			return false;
	}
	if (__builtin_add_overflow(h, (int64_t)v->esize, &h))
		return false;
	*lo = l;
	*hi = h;
	return true;
}

static int api_digest(const struct vps_cuda_digest *v, size_t n, uint64_t *sum, char *err)
{
	*sum = 0;
	int rc = check_process(err);
	if (rc)
		return rc;
	if (n > (size_t)INT32_MAX)
		return fail(err, VPS_CUDA_EINPUT, "%zu views in one digest", n);
	struct digest *k = calloc(1, sizeof(*k) + n * sizeof(k->d[0]));
	if (!k)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	uint64_t got = 0;
	k->sum = &got;
	for (size_t i = 0; i < n && !rc; i++) {
		if (v[i].ndim < 1 || v[i].ndim > VPS_CUDA_MAX_DIMS || (v[i].esize != 2 && v[i].esize != 4)) {
			rc = fail(err, VPS_CUDA_EINPUT, "digest view %zu: %d dimensions of %d-byte elements", i, v[i].ndim,
				  v[i].esize);
			break;
		}
		bool empty = false;
		for (int a = 0; a < v[i].ndim; a++) {
			if (v[i].ext[a] < 0)
				rc = fail(err, VPS_CUDA_EINPUT, "digest view %zu: extent %" PRId64 " on axis %d", i, v[i].ext[a],
					  a);
			empty |= v[i].ext[a] == 0;
		}
		if (rc || empty)
			continue;
		int64_t lo, hi;
		if (!digest_span(&v[i], &lo, &hi)) {
			rc = fail(err, VPS_CUDA_EINPUT, "digest view %zu: its extent overflows 64 bits (stand-in: the real "
				  "kernel would wrap it)", i);
			break;
		}
		const unsigned char *h = host_of(v[i].addr + (uint64_t)lo, (uint64_t)(hi - lo));
		if (!h && !k->fault[0])
			snprintf(k->fault, sizeof(k->fault), "an illegal memory access was encountered (stand-in: digest view "
				 "%zu of %zu reads [0x%" PRIx64 ", +%" PRId64 ") outside every allocation)", i, n,
				 v[i].addr + (uint64_t)lo, hi - lo);
		if (h) {
			k->d[k->n].v = v[i];
			k->d[k->n].host = h - lo;
			k->n++;
		}
	}
	if (rc) {
		free(k);
		return rc;
	}
	pthread_mutex_lock(&g_lock);
	rc = enqueue_locked(run_digest, k, err);
	if (rc)
		free(k);
	else
		rc = drain_locked(err);
	if (!rc) {
		g_arena_used = 0;
		g_nretired = 0;
	}
	pthread_mutex_unlock(&g_lock);
	if (!rc)
		*sum = got;
	return rc;
}

/* ---- NCCL, opened at run time, as the real one does ---- */

static struct {
	void *lib;
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
	const char *(*last_error)(ncclComm_t); /* NCCL 2.13 on; optional */
	int (*pending)(void);                  /* the NCCL stand-in's only */
} g_nccl;

static int load_nccl(char *err)
{
	if (g_nccl.lib)
		return 0;
	const char *names[] = {getenv("VPS_NCCL_LIBRARY"), "libnccl.so.2", "libnccl.so"};
	void *lib = NULL;
	const char *why = "";
	for (size_t i = 0; i < sizeof(names) / sizeof(*names) && !lib; i++) {
		if (!names[i] || !*names[i])
			continue;
		if (!(lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)))
			why = dlerror();
	}
	if (!lib)
		return fail(err, VPS_CUDA_ENCCL, "NCCL is not available: %s (set VPS_NCCL_LIBRARY to libnccl.so.2)", why);
#define SYM(field, name)                                                                                       \
	if (!(*(void **)&g_nccl.field = dlsym(lib, name))) {                                                    \
		dlclose(lib);                                                                                   \
		return fail(err, VPS_CUDA_ENCCL, "NCCL library lacks %s", name);                                \
	}
	SYM(get_id, "ncclGetUniqueId")
	SYM(init_rank, "ncclCommInitRank")
	SYM(destroy, "ncclCommDestroy")
	SYM(abort, "ncclCommAbort")
	SYM(async_error, "ncclCommGetAsyncError")
	SYM(group_start, "ncclGroupStart")
	SYM(group_end, "ncclGroupEnd")
	SYM(send, "ncclSend")
	SYM(recv, "ncclRecv")
	SYM(error_string, "ncclGetErrorString")
#undef SYM
	*(void **)&g_nccl.last_error = dlsym(lib, "ncclGetLastError");
	*(void **)&g_nccl.pending = dlsym(lib, "vps_standin_nccl_pending");
	g_nccl.lib = lib;
	return 0;
}

/* NCCL's words for a failure, and its last error where it keeps one. */
static int nccl_fail(char *err, const char *call, ncclResult_t r, ncclComm_t comm)
{
	const char *last = g_nccl.last_error ? g_nccl.last_error(comm) : NULL;
	return fail(err, VPS_CUDA_ENCCL, "%s: %s%s%s%s", call, g_nccl.error_string(r), last && *last ? " (" : "",
		    last && *last ? last : "", last && *last ? ")" : "");
}

static int api_nccl_id(unsigned char id[VPS_CUDA_NCCL_ID], char *err)
{
	int rc = check_process(err);
	if (!rc)
		rc = load_nccl(err);
	if (rc)
		return rc;
	ncclUniqueId u;
	_Static_assert(sizeof(u) <= VPS_CUDA_NCCL_ID, "NCCL id size");
	ncclResult_t r = g_nccl.get_id(&u);
	if (r != ncclSuccess)
		return nccl_fail(err, "g_nccl.get_id(&u)", r, NULL);
	memcpy(id, &u, sizeof(u));
	return 0;
}

static int api_nccl_init(void **comm, int nranks, int rank, const unsigned char id[VPS_CUDA_NCCL_ID], char *err)
{
	int rc = check_process(err);
	if (!rc)
		rc = load_nccl(err);
	if (rc)
		return rc;
	ncclUniqueId u;
	memcpy(&u, id, sizeof(u));
	ncclComm_t c;
	ncclResult_t r = g_nccl.init_rank(&c, nranks, u, rank);
	if (r != ncclSuccess)
		return nccl_fail(err, "g_nccl.init_rank(&c, nranks, u, rank)", r, NULL);
	*comm = c;
	return 0;
}

static int api_nccl_exchange(void *comm, const struct vps_cuda_p2p *p, size_t n, char *err)
{
	int rc = check_process(err);
	if (rc || !n)
		return rc;
	if (!g_nccl.lib)
		return fail(err, VPS_CUDA_ENCCL, "NCCL is not loaded: no communicator was made");
	/* NCCL sees the host memory behind each device buffer */
	void **host = calloc(n, sizeof(*host));
	if (!host)
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	for (size_t i = 0; i < n && !rc; i++)
		if (!(host[i] = host_of(p[i].buf, p[i].bytes)))
			rc = fail(err, VPS_CUDA_ENCCL, "%s %" PRIu64 " bytes %s rank %d: invalid argument (stand-in: the "
				  "buffer at 0x%" PRIx64 " is not inside one allocation)", p[i].send ? "send" : "receive",
				  p[i].bytes, p[i].send ? "to" : "from", p[i].peer, p[i].buf);
	ncclResult_t r = rc ? ncclSuccess : g_nccl.group_start();
	if (!rc && r != ncclSuccess)
		rc = nccl_fail(err, "g_nccl.group_start()", r, (ncclComm_t)comm);
	for (size_t i = 0; i < n && !rc; i++) {
		r = p[i].send ? g_nccl.send(host[i], p[i].bytes, ncclUint8, p[i].peer, (ncclComm_t)comm,
					    (cudaStream_t)(void *)&g_stream)
			      : g_nccl.recv(host[i], p[i].bytes, ncclUint8, p[i].peer, (ncclComm_t)comm,
					    (cudaStream_t)(void *)&g_stream);
		if (r != ncclSuccess) {
			char what[96];
			snprintf(what, sizeof(what), "%s %" PRIu64 " bytes %s rank %d", p[i].send ? "send" : "receive",
				 p[i].bytes, p[i].send ? "to" : "from", p[i].peer);
			rc = nccl_fail(err, what, r, (ncclComm_t)comm);
			g_nccl.group_end();
			break;
		}
	}
	if (!rc && (r = g_nccl.group_end()) != ncclSuccess)
		rc = nccl_fail(err, "g_nccl.group_end()", r, (ncclComm_t)comm);
	free(host);
	return rc;
}

static int api_nccl_free(void *comm, char *err)
{
	int rc = check_process(err);
	if (rc || !comm)
		return rc;
	ncclResult_t r = g_nccl.destroy((ncclComm_t)comm);
	if (r != ncclSuccess)
		return nccl_fail(err, "g_nccl.destroy((ncclComm_t)comm)", r, NULL);
	return 0;
}

/* ---- the wait ---- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int api_sync(void *comm, double timeout, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	/* a group never ended was never queued: the wait would see an idle
	 * stream, and the caller read what never arrived */
	int open = g_nccl.pending ? g_nccl.pending() : 0;
	if (open)
		return fail(err, VPS_CUDA_ENCCL, "ncclGroupEnd is missing: %d operations were posted in a group that was "
			    "never ended (stand-in)", open);
	double start = now();
	for (;;) {
		pthread_mutex_lock(&g_lock);
		bool idle = !g_head && !g_busy;
		if (g_fault[0]) {
			rc = fail(err, VPS_CUDA_ECUDA, "the GPU stream failed: %s", g_fault);
			pthread_mutex_unlock(&g_lock);
			return rc;
		}
		if (idle) {
			g_arena_used = 0;
			g_nretired = 0;
			pthread_mutex_unlock(&g_lock);
			return 0;
		}
		pthread_mutex_unlock(&g_lock);
		if (comm && g_nccl.lib) {
			ncclResult_t ae = ncclSuccess;
			g_nccl.async_error((ncclComm_t)comm, &ae);
			if (ae != ncclSuccess && ae != ncclInProgress) {
				/* the message before the abort, which frees the communicator */
				const char *last = g_nccl.last_error ? g_nccl.last_error((ncclComm_t)comm) : NULL;
				fail(err, VPS_CUDA_ENCCL, "NCCL failed: %s%s%s%s", g_nccl.error_string(ae), last && *last ? " (" : "",
				     last && *last ? last : "", last && *last ? ")" : "");
				g_nccl.abort((ncclComm_t)comm);
				return VPS_CUDA_ENCCL;
			}
		}
		if (timeout >= 0 && now() - start > timeout) {
			if (comm && g_nccl.lib)
				g_nccl.abort((ncclComm_t)comm);
			return fail(err, VPS_CUDA_ETIMEOUT, "the GPU made no progress for %.1f s", timeout);
		}
		/* the real one naps 20 us between queries; a host stream that
		 * shares two cores with its peers needs them more */
		struct timespec ts = {0, 200000};
		nanosleep(&ts, NULL);
	}
}

/* ---- timing marks ---- */

struct mark {
	double at;
	bool done;
};

static int run_mark(void *arg, bool cancelled, char *err)
{
	(void)cancelled, (void)err;
	struct mark **m = arg;
	pthread_mutex_lock(&g_lock);
	(*m)->at = now();
	(*m)->done = true;
	pthread_mutex_unlock(&g_lock);
	free(m);
	return 0;
}

static int api_mark(void **event, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	struct mark *m = calloc(1, sizeof(*m));
	struct mark **ref = malloc(sizeof(*ref));
	if (!m || !ref) {
		free(m);
		free(ref);
		return fail(err, VPS_CUDA_ECUDA, "out of memory");
	}
	*ref = m;
	pthread_mutex_lock(&g_lock);
	rc = enqueue_locked(run_mark, ref, err);
	pthread_mutex_unlock(&g_lock);
	if (rc) {
		free(m);
		free(ref);
		return rc;
	}
	*event = m;
	return 0;
}

static int api_elapsed(void *start, void *end, double *seconds, char *err)
{
	int rc = check_process(err);
	if (rc)
		return rc;
	struct mark *a = start, *b = end;
	pthread_mutex_lock(&g_lock);
	while (!b->done && (g_head || g_busy))
		pthread_cond_wait(&g_idle, &g_lock);
	if (!a->done || !b->done)
		rc = fail(err, VPS_CUDA_ECUDA, "cudaEventElapsedTime: device not ready (stand-in: a mark was not reached)");
	else
		*seconds = b->at - a->at;
	pthread_mutex_unlock(&g_lock);
	return rc;
}

static void api_mark_free(void *event)
{
	/* a mark still queued is the stream's to fill: wait for it */
	struct mark *m = event;
	if (!m)
		return;
	pthread_mutex_lock(&g_lock);
	while (!m->done && (g_head || g_busy))
		pthread_cond_wait(&g_idle, &g_lock);
	pthread_mutex_unlock(&g_lock);
	free(m);
}

static const struct vps_cuda_api g_api = {
	.abi = VPS_CUDA_ABI,
	.has_nccl = 1,
	.init = api_init,
	.device_count = api_device_count,
	.ipc_handle = api_ipc_handle,
	.ipc_open = api_ipc_open,
	.ipc_close = api_ipc_close,
	.alloc = api_alloc,
	.release = api_release,
	.to_device = api_to_device,
	.to_host = api_to_host,
	.fill = api_fill,
	.copy = api_copy,
	.sync = api_sync,
	.nccl_id = api_nccl_id,
	.nccl_init = api_nccl_init,
	.nccl_exchange = api_nccl_exchange,
	.nccl_free = api_nccl_free,
	.memcpy_d2d = api_memcpy_d2d,
	.mark = api_mark,
	.elapsed = api_elapsed,
	.mark_free = api_mark_free,
	.digest = api_digest,
};

EXPORT const struct vps_cuda_api *vps_cuda_api_get(void)
{
	return &g_api;
}
