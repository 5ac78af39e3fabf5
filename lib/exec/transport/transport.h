/* Transports: how the bytes of one rank's transfers of a stage travel.
 *
 * The staged exchange (claiming the trainer's request, attaching its
 * buffers, the start, the stages in order, retains, early frees, the
 * verdict, the digest) is lib/exec.c, the same for every transport. A
 * transport is a table of four calls, as NCCL's src/transport is:
 *
 *   tcp   host memory over the rendezvous sockets, sendmsg/recvmsg straight
 *         from source rows into destination rows (lib/transport_tcp.c)
 *   ipc   ranks of one node map each other's registered buffers (shared
 *         memory objects, or CUDA IPC handles) and the receiver copies
 *         source rows into destination rows, one copy (lib/transport_ipc.c)
 *   nccl  GPU memory: a gather kernel into the staging buffer, one grouped
 *         ncclSend/ncclRecv per stage, a scatter kernel (lib/transport_nccl.c)
 *
 * `auto` is ipc for peers on this rank's node and nccl for the others: the
 * exchange gives each transport the transfers of its peers. */
#ifndef VPS_TRANSPORT_H
#define VPS_TRANSPORT_H

#include "exec/net/net.h"
#include "vps/exec.h"
#include "vps/layout.h"
#include "vps/registry.h"

struct vps_mapcache;
struct vps_cuda_api;

/* One switch, as a transport sees it. */
struct vps_switch {
	const struct vps_staged *s;
	const struct vps_plan *p0;  /* peers (sockets, NCCL ranks) are numbered by the first plan's world */
	int64_t w, ra, rb;          /* this rank in s's world, in A, in B (-1: none) */
	int where;                  /* enum vps_registry_where of every buffer of the switch */
	struct vps_rank_view va, vb;
	void **src, **dst;          /* this rank's buffers, as addresses in this process */
	int64_t *src_entry;         /* registry entries of the sources */
	struct vps_registry *reg;
	struct vps_net *net;
	struct vps_mapcache *maps;
	const struct vps_cuda_api *gpu; /* where = CUDA */
	double timeout;
};

/* The peer of a transfer, in the first plan's numbering. */
int64_t vps_switch_peer(const struct vps_switch *sw, const struct vps_xfer *x);

struct vps_transport_ops {
	const char *name;
	/* Per switch, after this rank's buffers are attached and before the
	 * start: what must be known of the peers' buffers. May be NULL. */
	vps_result_t (*begin)(void *self, struct vps_switch *sw);
	/* One stage: this rank's transfers of it that this transport carries
	 * (never retains). Returns when this rank's part is done, and, where
	 * the transport reads a peer's memory, when the peers are done with
	 * what this rank sends. */
	vps_result_t (*stage)(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
			      const char *what);
	/* Per switch, after the last stage (also after a failure). May be NULL. */
	void (*end)(void *self, struct vps_switch *sw);
	void (*free)(void *self);
};

struct vps_transport {
	const struct vps_transport_ops *ops;
	void *self;
};

enum vps_transport_kind { VPS_TRANSPORT_TCP, VPS_TRANSPORT_IPC, VPS_TRANSPORT_NCCL, VPS_TRANSPORT_AUTO };

vps_result_t vps_transport_tcp(struct vps_transport *t);
/* strict: every peer must be on this rank's node (not under auto). */
vps_result_t vps_transport_ipc(struct vps_transport *t, bool strict);
/* The communicator is made here, once per executor, over the rendezvous:
 * before the trainer's request under --wait, reused by every switch. */
vps_result_t vps_transport_nccl(struct vps_transport *t, struct vps_net *net, int64_t rank, int64_t world, int device,
				int64_t local_rank);

/* ---- buffers mapped into this process, kept across the switches of a
 * --serve (a fresh mapping faults every page in again) ---- */
struct vps_mapcache;
vps_result_t vps_mapcache_new(struct vps_mapcache **out);
void vps_mapcache_free(struct vps_mapcache *c);
/* Map a registered buffer: host memory (a shared-memory object, read-only
 * unless writable) or GPU memory (a CUDA IPC handle, opened once per
 * allocation). bytes is what the caller will touch from the buffer's start,
 * checked against the object. keep: the mapping outlives this switch (a
 * target, which is the next switch's source). warm: read every page of a
 * host mapping now, if that was not done before (this rank's own buffers:
 * their first pass belongs in the attach, not in a transfer). */
struct vps_buffer_desc {
	uint32_t where, buffer;
	int32_t device, pad;
	uint64_t offset, bytes;
	char shm_name[VPS_REGISTRY_NAME_MAX + 8];
	unsigned char ipc[64];
};
vps_result_t vps_mapcache_map(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *d,
			      bool writable, bool keep, bool warm, void **ptr);
/* Between switches, while waiting for the trainer's request: map a host
 * buffer the trainer registered (not GPU memory) without using it yet;
 * vps_mapcache_warm then reads up to budget bytes' worth of pages of what
 * is mapped, and says whether pages are left. vps_mapcache_prune unmaps
 * what is not in use and whose object is none of names (the trainer's
 * registered objects), so a buffer it freed is not pinned. */
vps_result_t vps_mapcache_prefetch(struct vps_mapcache *c, const struct vps_buffer_desc *d, bool writable);
bool vps_mapcache_warm(struct vps_mapcache *c, size_t budget);
void vps_mapcache_prune(struct vps_mapcache *c, const char *const *names, size_t nnames);
/* Bytes of this rank's buffers found warm (mapped and read before) and cold
 * by vps_mapcache_map(warm) since the last call; resets them. */
void vps_mapcache_take_stats(struct vps_mapcache *c, uint64_t *warm_bytes, uint64_t *cold_bytes);
/* End of a switch: unmap what was not kept. */
void vps_mapcache_end_switch(struct vps_mapcache *c, const struct vps_cuda_api *gpu);

/* Copies within this process's memory (retains, and ipc's pulls): strided
 * copies on the host, or one kernel for the whole list on the GPU. */
struct vps_local_copy {
	const struct vps_op *op;
	const void *src; /* the source buffer's base */
	void *dst;
};
vps_result_t vps_copy_ops(const struct vps_switch *sw, const struct vps_local_copy *c, size_t n);

/* Every op of a transfer fits its buffers: source views in buffers of
 * src_elements[b] elements, destination views in dst_elements[b] (either
 * may be NULL: not checked here). */
vps_result_t vps_check_op(const struct vps_op *op, const int64_t *src_elements, size_t nsrc,
			  const int64_t *dst_elements, size_t ndst);

#endif
