// libvps-cuda.so: what vps needs of CUDA and NCCL, behind vps_cuda.h.
//
// The runtime is linked statically (only the driver, libcuda.so.1, is needed
// at run time) and NCCL is opened with dlopen when a communicator is first
// asked for, so that ipc works on a machine with a GPU but no NCCL.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define HAVE_NCCL 1
#else
#define HAVE_NCCL 0
#endif

extern "C" {
#include "vps_cuda.h"
}
#include "vps_digest.h"

namespace {

// A warp copies one unit: up to kChunk bytes of one contiguous row.
constexpr uint64_t kChunk = 64 << 10;
constexpr int kBlock = 256;

struct Desc {
	uint64_t src, dst;      // byte addresses of the view's first row
	uint64_t first_unit;    // units of the descriptors before this one
	uint64_t row_bytes;     // contiguous bytes of a row
	uint64_t chunks;        // units per row
	int32_t nouter;
	int32_t pad;
	int64_t ext[VPS_CUDA_MAX_DIMS];   // outer extents
	int64_t sstr[VPS_CUDA_MAX_DIMS];  // outer strides, bytes
	int64_t dstr[VPS_CUDA_MAX_DIMS];
};

cudaStream_t g_stream;
int g_device = -1;
int g_sms = 1;

// Copy descriptors: pinned on the host and mirrored on the device at the
// same offsets, bump-allocated so that queuing a copy never waits for the
// stream (a gather, an NCCL group and a scatter are queued back to back);
// reset when sync finds the stream idle. Outgrown arenas are retired and
// freed then.
struct Arena {
	Desc *host, *dev;
	size_t cap, used;
};
Arena g_arena;
Arena g_retired[32];
int g_nretired;

int fail(char *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, VPS_CUDA_ERR, fmt, ap);
		va_end(ap);
	}
	return code;
}

#define CU(call)                                                                                       \
	do {                                                                                           \
		cudaError_t e_ = (call);                                                               \
		if (e_ != cudaSuccess)                                                                 \
			return fail(err, VPS_CUDA_ECUDA, "%s: %s", #call, cudaGetErrorString(e_));     \
	} while (0)

template <typename V>
__device__ __forceinline__ void copy_vec(char *t, const char *s, uint64_t len, int lane)
{
	// head and tail bytewise; the body in V-wide words, four loads in flight
	uint64_t head = (sizeof(V) - ((uintptr_t)s & (sizeof(V) - 1))) & (sizeof(V) - 1);
	if (head > len)
		head = len;
	for (uint64_t i = lane; i < head; i += 32)
		t[i] = s[i];
	const V *vs = reinterpret_cast<const V *>(s + head);
	V *vt = reinterpret_cast<V *>(t + head);
	uint64_t n = (len - head) / sizeof(V);
	uint64_t i = lane;
	for (; i + 96 < n; i += 128) {
		V a = vs[i], b = vs[i + 32], c = vs[i + 64], d = vs[i + 96];
		vt[i] = a;
		vt[i + 32] = b;
		vt[i + 64] = c;
		vt[i + 96] = d;
	}
	for (; i < n; i += 32)
		vt[i] = vs[i];
	uint64_t done = head + n * sizeof(V);
	for (uint64_t k = done + lane; k < len; k += 32)
		t[k] = s[k];
}

__device__ __forceinline__ void copy_warp(char *t, const char *s, uint64_t len, int lane)
{
	// the widest word at which source and destination are equally misaligned
	uintptr_t skew = (uintptr_t)s ^ (uintptr_t)t;
	if (!(skew & 15))
		copy_vec<uint4>(t, s, len, lane);
	else if (!(skew & 7))
		copy_vec<uint2>(t, s, len, lane);
	else if (!(skew & 3))
		copy_vec<uint32_t>(t, s, len, lane);
	else if (!(skew & 1))
		copy_vec<uint16_t>(t, s, len, lane);
	else
		for (uint64_t k = lane; k < len; k += 32)
			t[k] = s[k];
}

__global__ void __launch_bounds__(kBlock) copy_kernel(const Desc *d, int n, uint64_t units)
{
	int lane = threadIdx.x & 31;
	uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
	for (uint64_t u = warp; u < units; u += nwarps) {
		int lo = 0, hi = n - 1;
		while (lo < hi) {
			int mid = (lo + hi + 1) >> 1;
			if (d[mid].first_unit <= u)
				lo = mid;
			else
				hi = mid - 1;
		}
		const Desc &q = d[lo];
		uint64_t k = u - q.first_unit;
		uint64_t row = k / q.chunks, chunk = k - row * q.chunks;
		uint64_t so = 0, to = 0;
		for (int a = q.nouter - 1; a >= 0; a--) {
			uint64_t e = (uint64_t)q.ext[a];
			uint64_t i = row % e;
			row /= e;
			so += i * (uint64_t)q.sstr[a];
			to += i * (uint64_t)q.dstr[a];
		}
		uint64_t begin = chunk * kChunk;
		uint64_t len = q.row_bytes - begin < kChunk ? q.row_bytes - begin : kChunk;
		copy_warp(reinterpret_cast<char *>(q.dst + to + begin), reinterpret_cast<const char *>(q.src + so + begin),
			  len, lane);
	}
}

// A copy as rows: the innermost axis (merged with every outer axis that
// continues it in both views) is one contiguous row.
void describe(const vps_cuda_copy &c, Desc &d)
{
	int64_t ext[VPS_CUDA_MAX_DIMS], ss[VPS_CUDA_MAX_DIMS], ds[VPS_CUDA_MAX_DIMS];
	int nd = vps_dk_merge_axes(c.ndim, c.ext, c.src_strides, c.dst_strides, ext, ss, ds);
	memset(&d, 0, sizeof(d));
	d.src = c.src;
	d.dst = c.dst;
	int64_t es = c.esize;
	if (nd == 0) {
		d.row_bytes = (uint64_t)es;
		d.nouter = 0;
	} else if (ss[nd - 1] == 1 && ds[nd - 1] == 1) {
		d.row_bytes = (uint64_t)(ext[nd - 1] * es);
		d.nouter = nd - 1;
	} else {
		// strided innermost: a row is one element
		d.row_bytes = (uint64_t)es;
		d.nouter = nd;
	}
	for (int k = 0; k < d.nouter; k++) {
		d.ext[k] = ext[k];
		d.sstr[k] = ss[k] * es;
		d.dstr[k] = ds[k] * es;
	}
	d.chunks = (d.row_bytes + kChunk - 1) / kChunk;
}

// ---- the digest: vps_digest_region's sum, over device memory ----
// (vps_digest.h: what each lane reads and sums)

// Six blocks of 256 an SM: 40 registers a thread, none spilled in the loops
// over vectors; the grid is what fits at once (g_dig_per_sm), each warp
// taking units in turn, so that no second wave runs alone.
constexpr int kDigestBlocksPerSm = 6;

__global__ void __launch_bounds__(kBlock, kDigestBlocksPerSm) digest_kernel(const vps_dk_desc *d, int n, uint64_t units,
							 unsigned long long *out)
{
	__shared__ __align__(16) uint64_t slot[VPS_DK_BLOCK];
	for (int l = threadIdx.x; l < VPS_DK_BLOCK; l += blockDim.x)
		slot[l] = vps_dk_slot_key((uint32_t)l);
	__syncthreads();
	int lane = threadIdx.x & 31;
	uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	uint64_t nwarps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
	uint64_t acc = 0;
	for (uint64_t u = warp; u < units; u += nwarps)
		acc += vps_dk_lane(d, n, u, lane, slot);
	// the sum is mod 2^64, so the order of the additions does not matter
	for (int s = 16; s > 0; s >>= 1)
		acc += __shfl_xor_sync(0xffffffffu, acc, s);
	if (lane == 0 && acc)
		atomicAdd(out, (unsigned long long)acc);
}

// ---- NCCL, opened at run time ----
#if HAVE_NCCL
struct Nccl {
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
} g_nccl;

int load_nccl(char *err)
{
	if (g_nccl.lib)
		return 0;
	const char *names[] = {getenv("VPS_NCCL_LIBRARY"), "libnccl.so.2", "libnccl.so"};
	void *lib = NULL;
	const char *why = "";
	for (const char *n : names) {
		if (!n || !*n)
			continue;
		if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)))
			break;
		why = dlerror();
	}
	if (!lib)
		return fail(err, VPS_CUDA_ENCCL, "NCCL is not available: %s (set VPS_NCCL_LIBRARY to libnccl.so.2)", why);
#define SYM(field, name)                                                                            \
	if (!(*(void **)&g_nccl.field = dlsym(lib, name))) {                                         \
		dlclose(lib);                                                                        \
		return fail(err, VPS_CUDA_ENCCL, "NCCL library lacks %s", name);                     \
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
	g_nccl.lib = lib;
	return 0;
}

#define NC(call)                                                                                       \
	do {                                                                                           \
		ncclResult_t r_ = (call);                                                              \
		if (r_ != ncclSuccess)                                                                 \
			return fail(err, VPS_CUDA_ENCCL, "%s: %s", #call, g_nccl.error_string(r_));    \
	} while (0)
#endif

// ---- the API ----

int api_init(int device, char *err)
{
	if (g_device >= 0) {
		if (device != g_device)
			return fail(err, VPS_CUDA_EINPUT, "this process already uses GPU %d, not %d", g_device, device);
		return 0;
	}
	int n = 0;
	CU(cudaGetDeviceCount(&n));
	if (device < 0 || device >= n)
		return fail(err, VPS_CUDA_EINPUT, "GPU %d does not exist (this machine has %d)", device, n);
	CU(cudaSetDevice(device));
	CU(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
	CU(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, device));
	g_device = device;
	return 0;
}

int api_device_count(int *n, char *err)
{
	*n = 0;
	cudaError_t e = cudaGetDeviceCount(n);
	if (e == cudaSuccess)
		return 0;
	*n = 0;
	// CUDA's words name a cause only the initiated read ("driver version is
	// insufficient" where there is no driver at all): say it plainly first
	int driver = 0;
	char why[160];
	if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)
		snprintf(why, sizeof(why), "no NVIDIA driver is installed");
	else if (driver < CUDART_VERSION)
		snprintf(why, sizeof(why), "the NVIDIA driver runs CUDA up to %d.%d, and libvps-cuda.so was built with %d.%d",
			 driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
	else if (e == cudaErrorNoDevice)
		snprintf(why, sizeof(why), "CUDA sees none (CUDA_VISIBLE_DEVICES=%s)",
			 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
	else
		snprintf(why, sizeof(why), "CUDA cannot use the GPUs");
	return fail(err, VPS_CUDA_ECUDA, "no usable GPU was found: %s (CUDA says: %s)", why, cudaGetErrorString(e));
}

typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

int address_range(const void *p, uint64_t *base, uint64_t *bytes, char *err)
{
	static range_fn fn;
	if (!fn) {
		cudaDriverEntryPointQueryResult q;
		void *f = NULL;
		CU(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q));
		if (!f || q != cudaDriverEntryPointSuccess)
			return fail(err, VPS_CUDA_ECUDA, "the driver has no cuMemGetAddressRange");
		fn = (range_fn)f;
	}
	CUdeviceptr b = 0;
	size_t n = 0;
	CUresult r = fn(&b, &n, (CUdeviceptr)(uintptr_t)p);
	if (r != CUDA_SUCCESS)
		return fail(err, VPS_CUDA_EINPUT, "%p is not in a CUDA allocation (driver error %d)", p, (int)r);
	*base = (uint64_t)b;
	*bytes = (uint64_t)n;
	return 0;
}

int api_ipc_handle(const void *ptr, unsigned char handle[VPS_CUDA_IPC_HANDLE], uint64_t *offset,
		   uint64_t *alloc_bytes, int *device, char *err)
{
	cudaPointerAttributes a;
	CU(cudaPointerGetAttributes(&a, ptr));
	if (a.type != cudaMemoryTypeDevice)
		return fail(err, VPS_CUDA_EINPUT, "%p is not device memory from cudaMalloc (type %d)", ptr, (int)a.type);
	uint64_t base, bytes;
	if (int rc = address_range(ptr, &base, &bytes, err))
		return rc;
	cudaIpcMemHandle_t h;
	cudaError_t e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
	if (e != cudaSuccess)
		return fail(err, VPS_CUDA_EINPUT,
			    "no IPC handle for the allocation at %p: %s (memory from cuMemCreate, such as PyTorch's "
			    "expandable segments, cannot be shared this way)",
			    (void *)(uintptr_t)base, cudaGetErrorString(e));
	static_assert(sizeof(h) <= VPS_CUDA_IPC_HANDLE, "IPC handle size");
	memset(handle, 0, VPS_CUDA_IPC_HANDLE);
	memcpy(handle, &h, sizeof(h));
	*offset = (uint64_t)(uintptr_t)ptr - base;
	*alloc_bytes = bytes;
	*device = a.device;
	return 0;
}

int api_ipc_open(const unsigned char handle[VPS_CUDA_IPC_HANDLE], void **base, uint64_t *bytes, char *err)
{
	cudaIpcMemHandle_t h;
	memcpy(&h, handle, sizeof(h));
	void *p = NULL;
	CU(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
	uint64_t b, n;
	if (int rc = address_range(p, &b, &n, err)) {
		cudaIpcCloseMemHandle(p);
		return rc;
	}
	*base = p;
	*bytes = n - ((uint64_t)(uintptr_t)p - b);
	return 0;
}

int api_ipc_close(void *base, char *err)
{
	CU(cudaIpcCloseMemHandle(base));
	return 0;
}

int api_alloc(void **ptr, size_t bytes, char *err)
{
	CU(cudaMalloc(ptr, bytes ? bytes : 1));
	return 0;
}

int api_release(void *ptr, char *err)
{
	CU(cudaFree(ptr));
	return 0;
}

int api_to_device(void *dst, const void *src, size_t bytes, char *err)
{
	CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
	CU(cudaStreamSynchronize(g_stream));
	return 0;
}

int api_to_host(void *dst, const void *src, size_t bytes, char *err)
{
	CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream));
	CU(cudaStreamSynchronize(g_stream));
	return 0;
}

int api_fill(void *dst, int value, size_t bytes, char *err)
{
	CU(cudaMemsetAsync(dst, value, bytes, g_stream));
	CU(cudaStreamSynchronize(g_stream));
	return 0;
}

void free_arena(Arena &a)
{
	cudaFreeHost(a.host);
	cudaFree(a.dev);
	a = Arena{};
}

int api_copy(const vps_cuda_copy *c, size_t n, char *err)
{
	if (!n)
		return 0;
	if (n > (size_t)INT32_MAX)
		return fail(err, VPS_CUDA_EINPUT, "%zu copies in one kernel", n);
	if (g_arena.used + n > g_arena.cap) {
		if (g_nretired == (int)(sizeof(g_retired) / sizeof(*g_retired)))
			return fail(err, VPS_CUDA_EINPUT, "too many copy lists queued without a sync");
		size_t cap = g_arena.cap * 2 > n ? g_arena.cap * 2 : n;
		if (cap < 1024)
			cap = 1024;
		Arena a{};
		a.cap = cap;
		CU(cudaMallocHost((void **)&a.host, cap * sizeof(Desc)));
		if (cudaMalloc((void **)&a.dev, cap * sizeof(Desc)) != cudaSuccess) {
			cudaFreeHost(a.host);
			return fail(err, VPS_CUDA_ECUDA, "cannot allocate %zu copy descriptors on the GPU", cap);
		}
		if (g_arena.cap)
			g_retired[g_nretired++] = g_arena;
		g_arena = a;
	}
	Desc *h = g_arena.host + g_arena.used, *dv = g_arena.dev + g_arena.used;
	uint64_t units = 0;
	for (size_t i = 0; i < n; i++) {
		if (c[i].ndim < 1 || c[i].ndim > VPS_CUDA_MAX_DIMS || c[i].esize < 1)
			return fail(err, VPS_CUDA_EINPUT, "copy %zu: %d dimensions of %d-byte elements", i, c[i].ndim,
				    c[i].esize);
		describe(c[i], h[i]);
		uint64_t rows = 1;
		for (int k = 0; k < h[i].nouter; k++)
			rows *= (uint64_t)h[i].ext[k];
		h[i].first_unit = units;
		units += rows * h[i].chunks;
	}
	if (!units)
		return 0;
	g_arena.used += n;
	CU(cudaMemcpyAsync(dv, h, n * sizeof(Desc), cudaMemcpyHostToDevice, g_stream));
	uint64_t warps_per_block = kBlock / 32;
	uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
	uint64_t most = (uint64_t)g_sms * 8;
	if (blocks > most)
		blocks = most;
	copy_kernel<<<(unsigned)blocks, kBlock, 0, g_stream>>>(dv, (int)n, units);
	CU(cudaGetLastError());
	return 0;
}

// The stream is idle: the copy descriptors may be reused.
void stream_idle()
{
	g_arena.used = 0;
	while (g_nretired)
		free_arena(g_retired[--g_nretired]);
}

double now()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int api_sync(void *comm, double timeout, char *err)
{
	double start = now();
	for (;;) {
		cudaError_t e = cudaStreamQuery(g_stream);
		if (e == cudaSuccess) {
			stream_idle();
			return 0;
		}
		if (e != cudaErrorNotReady)
			return fail(err, VPS_CUDA_ECUDA, "the GPU stream failed: %s", cudaGetErrorString(e));
#if HAVE_NCCL
		if (comm) {
			ncclResult_t ae = ncclSuccess;
			g_nccl.async_error((ncclComm_t)comm, &ae);
			if (ae != ncclSuccess && ae != ncclInProgress) {
				g_nccl.abort((ncclComm_t)comm);
				return fail(err, VPS_CUDA_ENCCL, "NCCL failed: %s", g_nccl.error_string(ae));
			}
		}
#endif
		if (timeout >= 0 && now() - start > timeout) {
#if HAVE_NCCL
			if (comm)
				g_nccl.abort((ncclComm_t)comm);
#endif
			return fail(err, VPS_CUDA_ETIMEOUT, "the GPU made no progress for %.1f s", timeout);
		}
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
}

// Digest descriptors and the sum's word: the call waits for the stream,
// so one buffer, grown when outgrown, serves every call.
vps_dk_desc *g_dig_host, *g_dig_dev;
unsigned long long *g_dig_sum;
size_t g_dig_cap;
int g_dig_per_sm;

int api_digest(const vps_cuda_digest *v, size_t n, uint64_t *sum, char *err)
{
	*sum = 0;
	if (n > (size_t)INT32_MAX)
		return fail(err, VPS_CUDA_EINPUT, "%zu views in one digest", n);
	for (size_t i = 0; i < n; i++) {
		if (v[i].ndim < 1 || v[i].ndim > VPS_CUDA_MAX_DIMS || (v[i].esize != 2 && v[i].esize != 4))
			return fail(err, VPS_CUDA_EINPUT, "digest view %zu: %d dimensions of %d-byte elements", i, v[i].ndim,
				    v[i].esize);
		for (int k = 0; k < v[i].ndim; k++)
			if (v[i].ext[k] < 0)
				return fail(err, VPS_CUDA_EINPUT, "digest view %zu: extent %lld on axis %d", i,
					    (long long)v[i].ext[k], k);
	}
	if (n > g_dig_cap) {
		size_t cap = n < 256 ? 256 : n;
		CU(cudaStreamSynchronize(g_stream));
		cudaFreeHost(g_dig_host);
		cudaFree(g_dig_dev);
		g_dig_host = NULL;
		g_dig_dev = NULL;
		g_dig_cap = 0;
		CU(cudaMallocHost((void **)&g_dig_host, cap * sizeof(vps_dk_desc)));
		CU(cudaMalloc((void **)&g_dig_dev, cap * sizeof(vps_dk_desc)));
		g_dig_cap = cap;
	}
	if (!g_dig_sum)
		CU(cudaMalloc((void **)&g_dig_sum, sizeof(*g_dig_sum)));
	if (!g_dig_per_sm)
		CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&g_dig_per_sm, digest_kernel, kBlock, 0));
	// the previous call waited for the stream: the host descriptors are free
	size_t m = 0;
	uint64_t units = vps_dk_prepare(v, n, g_dig_host, &m);
	CU(cudaMemsetAsync(g_dig_sum, 0, sizeof(*g_dig_sum), g_stream));
	if (units) {
		CU(cudaMemcpyAsync(g_dig_dev, g_dig_host, m * sizeof(vps_dk_desc), cudaMemcpyHostToDevice, g_stream));
		uint64_t warps_per_block = kBlock / 32;
		uint64_t blocks = (units + warps_per_block - 1) / warps_per_block;
		uint64_t most = (uint64_t)g_sms * (uint64_t)(g_dig_per_sm > 0 ? g_dig_per_sm : 1);
		if (blocks > most)
			blocks = most;
		digest_kernel<<<(unsigned)blocks, kBlock, 0, g_stream>>>(g_dig_dev, (int)m, units, g_dig_sum);
		CU(cudaGetLastError());
	}
	unsigned long long got = 0;
	CU(cudaMemcpyAsync(&got, g_dig_sum, sizeof(got), cudaMemcpyDeviceToHost, g_stream));
	CU(cudaStreamSynchronize(g_stream));
	stream_idle();
	*sum = (uint64_t)got;
	return 0;
}

int api_nccl_id(unsigned char id[VPS_CUDA_NCCL_ID], char *err)
{
#if HAVE_NCCL
	if (int rc = load_nccl(err))
		return rc;
	ncclUniqueId u;
	static_assert(sizeof(u) <= VPS_CUDA_NCCL_ID, "NCCL id size");
	NC(g_nccl.get_id(&u));
	memcpy(id, &u, sizeof(u));
	return 0;
#else
	(void)id;
	return fail(err, VPS_CUDA_ENCCL, "libvps-cuda.so was built without nccl.h");
#endif
}

int api_nccl_init(void **comm, int nranks, int rank, const unsigned char id[VPS_CUDA_NCCL_ID], char *err)
{
#if HAVE_NCCL
	if (int rc = load_nccl(err))
		return rc;
	ncclUniqueId u;
	memcpy(&u, id, sizeof(u));
	ncclComm_t c;
	NC(g_nccl.init_rank(&c, nranks, u, rank));
	*comm = c;
	return 0;
#else
	(void)comm, (void)nranks, (void)rank, (void)id;
	return fail(err, VPS_CUDA_ENCCL, "libvps-cuda.so was built without nccl.h");
#endif
}

int api_nccl_exchange(void *comm, const vps_cuda_p2p *p, size_t n, char *err)
{
#if HAVE_NCCL
	if (!n)
		return 0;
	NC(g_nccl.group_start());
	for (size_t i = 0; i < n; i++) {
		ncclResult_t r = p[i].send ? g_nccl.send((const void *)(uintptr_t)p[i].buf, p[i].bytes, ncclUint8, p[i].peer,
							 (ncclComm_t)comm, g_stream)
					   : g_nccl.recv((void *)(uintptr_t)p[i].buf, p[i].bytes, ncclUint8, p[i].peer,
							 (ncclComm_t)comm, g_stream);
		if (r != ncclSuccess) {
			g_nccl.group_end();
			return fail(err, VPS_CUDA_ENCCL, "%s %llu bytes %s rank %d: %s", p[i].send ? "send" : "receive",
				    (unsigned long long)p[i].bytes, p[i].send ? "to" : "from", p[i].peer,
				    g_nccl.error_string(r));
		}
	}
	NC(g_nccl.group_end());
	return 0;
#else
	(void)comm, (void)p, (void)n;
	return fail(err, VPS_CUDA_ENCCL, "libvps-cuda.so was built without nccl.h");
#endif
}

int api_nccl_free(void *comm, char *err)
{
#if HAVE_NCCL
	if (comm)
		NC(g_nccl.destroy((ncclComm_t)comm));
	return 0;
#else
	(void)comm, (void)err;
	return 0;
#endif
}

int api_memcpy_d2d(void *dst, const void *src, size_t bytes, char *err)
{
	CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
	return 0;
}

int api_mark(void **event, char *err)
{
	cudaEvent_t e;
	CU(cudaEventCreate(&e));
	CU(cudaEventRecord(e, g_stream));
	*event = e;
	return 0;
}

int api_elapsed(void *start, void *end, double *seconds, char *err)
{
	CU(cudaEventSynchronize((cudaEvent_t)end));
	float ms = 0;
	CU(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
	*seconds = ms * 1e-3;
	return 0;
}

void api_mark_free(void *event)
{
	if (event)
		cudaEventDestroy((cudaEvent_t)event);
}

const vps_cuda_api g_api = {
	VPS_CUDA_ABI,     HAVE_NCCL,     api_init,   api_device_count, api_ipc_handle, api_ipc_open,
	api_ipc_close,    api_alloc,     api_release, api_to_device,   api_to_host,    api_fill,
	api_copy,         api_sync,      api_nccl_id, api_nccl_init,   api_nccl_exchange, api_nccl_free,
	api_memcpy_d2d,   api_mark,      api_elapsed,   api_mark_free,  api_digest,
};

} // namespace

extern "C" __attribute__((visibility("default"))) const vps_cuda_api *vps_cuda_api_get(void)
{
	return &g_api;
}
