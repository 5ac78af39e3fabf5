/* Transports: how the bytes of one rank's transfers of a stage travel.
 *
 * The staged exchange (claiming the trainer's request, attaching its
 * buffers, the start, the stages in order, retains, early frees, the
 * verdict, the digest) is lib/exec/exec.c, the same for every transport.
 * A transport is one table, as NCCL's struct ncclTransport is: its name,
 * which peers it can reach, a constructor, and the calls of a switch.
 *
 *   tcp   host memory over the rendezvous sockets, sendmsg/recvmsg straight
 *         from source rows into destination rows (tcp.c)
 *   ipc   ranks of one node map each other's registered buffers (shared
 *         memory objects, or CUDA IPC handles) and the receiver copies
 *         source rows into destination rows, one copy (ipc.c)
 *   nccl  GPU memory: a gather kernel into the staging buffer, one grouped
 *         ncclSend/ncclRecv per stage, a scatter kernel (nccl.c)
 *
 * The executor hands a transport what it must know of each peer (struct
 * vps_peer_info, in the switch: NCCL's ncclPeerInfo); a transport uses
 * only this interface, the network (exec/net), the registry and the GPU,
 * and never calls back into the executor. --transport names a list of
 * transports (vps_transport_choice, transport.c): each peer is carried by
 * the first whose can_connect holds, so `auto` is ipc for the peers on
 * this rank's node and nccl for the others. */
#ifndef VPS_TRANSPORT_H
#define VPS_TRANSPORT_H

#include "exec/net/net.h"
#include "vps/exec.h"
#include "vps/layout.h"
#include "vps/registry.h"

struct vps_mapcache;
struct vps_cuda_api;
struct vps_buffer_desc;

/* The peer of one of this rank's transfers, as the executor found it. */
struct vps_peer_info {
	int64_t rank;   /* its net rank: its sockets (exec/net) and its NCCL rank; -1: no peer */
	int node;       /* its node */
	bool same_node; /* on this rank's node */
};

/* sw->where of a trainer that registered host and GPU memory (optimizer
 * state offloaded to the host beside parameters on the GPU): each copy is
 * made where its buffers are (the retains and ipc), or a GPU view goes
 * through a host bounce buffer (tcp); nccl refuses it. */
#define VPS_WHERE_MIXED 2

/* One switch, as a transport sees it. */
struct vps_switch {
	const struct vps_staged *s;
	int64_t w, ra, rb;          /* this rank in s's world, in A, in B (-1: none) */
	int where;                  /* enum vps_registry_where of every buffer of the switch, or VPS_WHERE_MIXED */
	uint8_t *src_where;         /* each source buffer's (enum vps_registry_where), as registered */
	uint8_t *dst_where;         /* each target buffer's, once attached (else NULL) */
	struct vps_rank_view va, vb;
	void **src, **dst;          /* this rank's buffers, as addresses in this process */
	int64_t *src_entry;         /* registry entries of the sources */
	int64_t *dst_entry;         /* and of the targets, once attached (else NULL) */
	/* by transfer index of s: the peer of each transfer this rank sends or
	 * receives (rank -1 for the others and for retains) */
	const struct vps_peer_info *peers;
	struct vps_registry *reg;
	struct vps_net *net;
	struct vps_mapcache *maps;
	const struct vps_cuda_api *gpu; /* where = CUDA or MIXED */
	double timeout;
	/* This rank's transit area (vps/plan.h, VPS_BUFFER_TRANSIT): memory of
	 * the executor's own, neither layout's, that arrivals for a node-mate
	 * land in and forwards to it read; made at attach where the targets
	 * live (transit_where), NULL when the plan lands nothing in it. For
	 * ipc, transit_desc says how a node-mate maps it (a shared-memory
	 * object of this user, mode 0600, or a CUDA IPC handle). */
	void *transit;
	int64_t transit_bytes;
	int transit_where;
	struct vps_buffer_desc *transit_desc;
};

/* Where an op writes on this rank: a target buffer, or the transit area. */
static inline void *vps_switch_dst(const struct vps_switch *sw, uint32_t dst_buffer)
{
	return dst_buffer == VPS_BUFFER_TRANSIT ? sw->transit : sw->dst[dst_buffer];
}
static inline int vps_switch_dst_where(const struct vps_switch *sw, uint32_t dst_buffer)
{
	if (dst_buffer == VPS_BUFFER_TRANSIT)
		return sw->transit_where;
	return sw->dst_where ? sw->dst_where[dst_buffer] : VPS_WHERE_HOST;
}
/* Where an op reads on this rank: a source buffer, or for a forward (its
 * src_buffer flagged VPS_BUFFER_TARGET) a target buffer or the area. */
static inline void *vps_switch_src(const struct vps_switch *sw, uint32_t src_buffer)
{
	if (!(src_buffer & VPS_BUFFER_TARGET))
		return sw->src[src_buffer];
	return vps_switch_dst(sw, vps_buffer_index(src_buffer));
}
static inline int vps_switch_src_where(const struct vps_switch *sw, uint32_t src_buffer)
{
	if (!(src_buffer & VPS_BUFFER_TARGET))
		return sw->src_where[src_buffer];
	return vps_switch_dst_where(sw, vps_buffer_index(src_buffer));
}

/* The peer of transfer x, one of sw's. */
static inline const struct vps_peer_info *vps_switch_peer(const struct vps_switch *sw, const struct vps_xfer *x)
{
	return &sw->peers[x - sw->s->xfers];
}

/* What a transport's constructor may need: made once per executor, before
 * the trainer's request under --wait, used by every switch. */
struct vps_transport_env {
	struct vps_net *net;
	int64_t rank, world;   /* this rank's net rank and the net's size */
	int device;            /* vps_exec_opts.device */
	int64_t local_rank;
};

struct vps_transport {
	const char *name;
	/* Whether it can carry this rank's transfers with peer. */
	bool (*can_connect)(const struct vps_peer_info *peer);
	/* For the refusal when a peer is left that no transport of a
	 * --transport reaches: which peers this one reaches (NULL: any). */
	const char *reach;
	/* It may move GPU memory in this process's CUDA context, which the
	 * executor then makes before the request, not in the pause. */
	bool gpu_context;
	vps_result_t (*setup)(void **self, const struct vps_transport_env *env);
	/* Per switch, before the pause: every rank's trainer has registered
	 * its sources (the ranks waited for that together), none need have
	 * asked for the switch yet, and this rank's buffers are not attached:
	 * sw has the plan, the peers, the registry and this rank's source view
	 * (va, src_entry: -1 for a source not registered), with `where`
	 * unknown (-1). x[0..n) as begin gets them. What can be readied
	 * before the request (ipc: the peers' source descriptors, mapped or
	 * opened now, so that begin finds them so). Only a failure to talk to
	 * the peers fails it; what cannot be readied is left to begin. May be
	 * NULL. */
	vps_result_t (*prepare)(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n);
	/* Per switch, after this rank's buffers are attached and before the
	 * start: x[0..n) are the switch's transfers it carries, in order; what
	 * must be known of the peers' buffers. May be NULL. */
	vps_result_t (*begin)(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n);
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

extern const struct vps_transport vps_transport_tcp, vps_transport_ipc, vps_transport_nccl;

/* What a --transport names: its transports, in the order a peer tries
 * them, and the name a report gives them when more than one is made (each
 * made alone goes by its own name). */
#define VPS_TRANSPORT_MAX 2
struct vps_transport_choice {
	enum vps_exec_transport kind;
	const char *label;
	const struct vps_transport *carriers[VPS_TRANSPORT_MAX + 1]; /* NULL-terminated */
};

/* The choice of kind (enum vps_exec_transport), or NULL for an unknown one. */
const struct vps_transport_choice *vps_transport_choice(int kind);

/* ---- buffers mapped into this process, kept across the switches of a
 * --serve (a fresh mapping faults every page in again): mapcache.c ---- */
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
/* Between switches, while waiting for the trainer's request: map a buffer
 * the trainer registered, or (peer) a peer's source that a transport
 * learned of, without using it yet: host memory is mapped, GPU memory's
 * IPC handle opened (gpu needed), so that the switch finds it open.
 * vps_mapcache_warm then reads up to budget bytes' worth of pages of what
 * host memory is mapped, and says whether pages are left.
 * vps_mapcache_prune unmaps what was prefetched and is none of registered
 * (what the trainer has registered now), so that nothing the trainer freed
 * stays mapped or open; a peer's, and a target kept from the switch
 * before, is unmapped at the end of the switch that reads it, as every
 * mapping a switch does not keep. */
vps_result_t vps_mapcache_prefetch(struct vps_mapcache *c, const struct vps_cuda_api *gpu,
				   const struct vps_buffer_desc *d, bool writable, bool peer);
bool vps_mapcache_warm(struct vps_mapcache *c, size_t budget);
void vps_mapcache_prune(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *registered,
			size_t n);
/* Bytes of this rank's buffers found warm (host memory mapped and read
 * before, GPU memory's handle open before) and cold by
 * vps_mapcache_map(warm) since the last call; resets them. */
void vps_mapcache_take_stats(struct vps_mapcache *c, uint64_t *warm_bytes, uint64_t *cold_bytes);
/* Objects mapped and IPC handles opened since the last call; resets it. */
uint64_t vps_mapcache_take_opened(struct vps_mapcache *c);
/* Unmap (close) d's object now, whatever it was mapped for: a peer's
 * transit area read for the last time, whose owner frees it once every
 * reader said it is done. */
void vps_mapcache_close(struct vps_mapcache *c, const struct vps_cuda_api *gpu, const struct vps_buffer_desc *d);
/* End of a switch: unmap what was not kept. */
void vps_mapcache_end_switch(struct vps_mapcache *c, const struct vps_cuda_api *gpu);

/* ---- copies within this process's memory, a service the transports and
 * the executor's retains share: copy.c ---- */
/* A copy between the two kinds of memory (a struct vps_local_copy's where
 * beside enum vps_registry_where's): staged through both sides. */
#define VPS_COPY_TO_GPU 3
#define VPS_COPY_TO_HOST 4

struct vps_local_copy {
	const struct vps_op *op;
	const void *src; /* the source buffer's base */
	void *dst;
	int where;       /* enum vps_registry_where of both, or VPS_COPY_TO_GPU/HOST */
};
/* Strided copies on the host, and one kernel for those on the GPU, waited
 * for under sw->timeout; those between host and GPU memory packed
 * contiguous on their source's side, moved across, and unpacked on the
 * other. */
vps_result_t vps_copy_ops(const struct vps_switch *sw, const struct vps_local_copy *c, size_t n);
/* Where a copy of op runs: its source is in src_where memory, its target
 * in dst_where (VPS_COPY_TO_GPU or VPS_COPY_TO_HOST when they differ). */
vps_result_t vps_copy_where(const struct vps_op *op, int src_where, int dst_where, int *where);

/* Every op of a transfer fits its buffers: source views in buffers of
 * src_bytes[b] bytes, destination views in dst_bytes[b] (either may be
 * NULL: not checked here). */
vps_result_t vps_check_op(const struct vps_op *op, const int64_t *src_bytes, size_t nsrc, const int64_t *dst_bytes,
			  size_t ndst);

#endif
