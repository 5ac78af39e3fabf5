/* The boundary between libvps and libvps-cuda.so.
 *
 * libvps never links CUDA or NCCL: one build of the tools runs on machines
 * without either. What needs them lives in libvps-cuda.so, which libvps
 * loads with dlopen the first time GPU memory or NCCL is asked for, and
 * reaches through the one table below. The table speaks plain C (no CUDA
 * types), and every call returns 0 or a nonzero VPS_CUDA_E* with a message
 * in err (VPS_CUDA_ERR bytes), so that libvps-cuda.so needs nothing of
 * libvps either.
 *
 * Every call works on the calling thread's current device and on one
 * stream per process that the library owns: kernels, copies and NCCL calls
 * are ordered on it; vps_cuda_api.sync waits for it. */
#ifndef VPS_CUDA_H
#define VPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#define VPS_CUDA_ABI 6
#define VPS_CUDA_ERR 256
#define VPS_CUDA_IPC_HANDLE 64
#define VPS_CUDA_NCCL_ID 128
#define VPS_CUDA_MAX_DIMS 4

enum { VPS_CUDA_OK = 0, VPS_CUDA_ECUDA = 1, VPS_CUDA_ENCCL = 2, VPS_CUDA_EINPUT = 3, VPS_CUDA_ETIMEOUT = 4 };

/* One strided copy: ext[] elements of esize bytes, row-major, from the
 * view at src (element strides src_strides) to the view at dst. Addresses
 * are device addresses. */
struct vps_cuda_copy {
	uint64_t src, dst;
	int32_t ndim, esize;
	int64_t ext[VPS_CUDA_MAX_DIMS];
	int64_t src_strides[VPS_CUDA_MAX_DIMS], dst_strides[VPS_CUDA_MAX_DIMS];
};

/* One strided view whose elements the digest sums (lib/model/data.c's
 * vps_digest_region, computed where the bytes are): element (i0, ..) of
 * ext[] is at byte address addr + esize * sum_k ik * strides[k] (strides in
 * elements, of any sign) and is element flat + sum_k ik * flat_strides[k]
 * of its logical tensor, whose (tensor, state) gives key. */
struct vps_cuda_digest {
	uint64_t addr;  /* device address of element (0, ..) */
	uint64_t key;   /* vps_mix64((tensor << 8) ^ state) */
	int64_t flat;
	int32_t ndim, esize; /* esize: 2 or 4 */
	int64_t ext[VPS_CUDA_MAX_DIMS];
	int64_t strides[VPS_CUDA_MAX_DIMS], flat_strides[VPS_CUDA_MAX_DIMS];
};

/* One point-to-point transfer of a grouped NCCL exchange. */
struct vps_cuda_p2p {
	uint64_t buf; /* device address */
	uint64_t bytes;
	int32_t peer;
	int32_t send; /* 1 send, 0 receive */
};

struct vps_cuda_api {
	int abi;        /* VPS_CUDA_ABI */
	int has_nccl;   /* built with NCCL */
	/* Select the device and create the stream; once per process. */
	int (*init)(int device, char *err);
	int (*device_count)(int *n, char *err);
	/* The allocation that ptr lies in: its IPC handle, ptr's offset from the
	 * allocation's base, the allocation's size and its device (PyTorch's
	 * caching allocator hands out interior pointers). */
	int (*ipc_handle)(const void *ptr, unsigned char handle[VPS_CUDA_IPC_HANDLE], uint64_t *offset,
			  uint64_t *alloc_bytes, int *device, char *err);
	/* Map another process's allocation; *bytes receives its size. */
	int (*ipc_open)(const unsigned char handle[VPS_CUDA_IPC_HANDLE], void **base, uint64_t *bytes, char *err);
	int (*ipc_close)(void *base, char *err);
	int (*alloc)(void **ptr, size_t bytes, char *err);
	int (*release)(void *ptr, char *err);
	/* Synchronous copies between host and device, and a fill. */
	int (*to_device)(void *dst, const void *src, size_t bytes, char *err);
	int (*to_host)(void *dst, const void *src, size_t bytes, char *err);
	int (*fill)(void *dst, int value, size_t bytes, char *err);
	/* Every copy of the list in one kernel, queued on the stream. */
	int (*copy)(const struct vps_cuda_copy *c, size_t n, char *err);
	/* Wait for the stream, at most timeout seconds (< 0: no limit); a
	 * communicator that is not NULL is checked for asynchronous errors.
	 * On a timeout (a peer that stopped, VPS_CUDA_ETIMEOUT) and on an
	 * asynchronous error (VPS_CUDA_ENCCL) it is aborted, which frees it. */
	int (*sync)(void *comm, double timeout, char *err);
	/* NCCL: a unique id on one rank, then a communicator on every rank. */
	int (*nccl_id)(unsigned char id[VPS_CUDA_NCCL_ID], char *err);
	int (*nccl_init)(void **comm, int nranks, int rank, const unsigned char id[VPS_CUDA_NCCL_ID], char *err);
	/* Every transfer of the list in one NCCL group, queued on the stream. */
	int (*nccl_exchange)(void *comm, const struct vps_cuda_p2p *p, size_t n, char *err);
	int (*nccl_free)(void *comm, char *err);
	/* cudaMemcpy device to device, queued on the stream (the benchmarks'
	 * yardstick). */
	int (*memcpy_d2d)(void *dst, const void *src, size_t bytes, char *err);
	/* Timing on the stream, for benchmarks: seconds between two marks. */
	int (*mark)(void **event, char *err);
	int (*elapsed)(void *start, void *end, double *seconds, char *err);
	void (*mark_free)(void *event);
	/* The digest of every view of the list, in one kernel after what the
	 * stream holds, waited for: the sum mod 2^64 over their elements of
	 * vps_digest.h's term of (key, the element's logical index, its 16 or
	 * 32 bits), which is vps_digest_region's. */
	int (*digest)(const struct vps_cuda_digest *v, size_t n, uint64_t *sum, char *err);
};

/* The one symbol libvps looks up. */
const struct vps_cuda_api *vps_cuda_api_get(void);

#endif
