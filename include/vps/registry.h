/* The trainer registry: how a training process publishes its buffers to
 * vps-exec and asks for a switch.
 *
 * A registry is a POSIX shared-memory object (/dev/shm/NAME, mode 0600)
 * created by the trainer. It holds a versioned header, the hash and rank of
 * the layout the trainer runs under (source) and of the layout it switches
 * to (target), one entry per buffer (role, buffer id in the rank's layout,
 * state, dtype, size, and where the bytes are: a shared-memory object and an
 * offset for host memory, or a CUDA IPC handle and an offset), a control
 * block (idle -> requested -> running -> done | failed, with a sequence
 * number and the failure text) and the training scalars that travel with a
 * switch. The owner's pid and start time are recorded: a registry whose
 * owner is gone is stale and is refused, never silently reused. One
 * executor at a time holds a registry (its pid and start time too, taken
 * by compare-and-swap when it opens it): another is refused while that one
 * lives, and an executor writes only into a registry it holds.
 *
 * The API is small and uses only integers, strings and pointers so that a
 * Python trainer can call it through ctypes. */
#ifndef VPS_REGISTRY_H
#define VPS_REGISTRY_H

#include "vps/base.h"
#include "vps/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VPS_REGISTRY_VERSION 4
#define VPS_REGISTRY_NAME_MAX 64
/* The registry name vps-trainer and vps-exec use unless told another: the
 * job's tag keeps two jobs on one node apart, the rank the devices of one
 * job (vps_registry_expand). */
#define VPS_REGISTRY_DEFAULT "vps-%j-%r"

enum vps_registry_state {
	VPS_REG_IDLE = 0,
	VPS_REG_REQUESTED = 1,
	VPS_REG_RUNNING = 2,
	VPS_REG_DONE = 3,
	VPS_REG_FAILED = 4,
};

enum vps_registry_role { VPS_ROLE_SOURCE = 0, VPS_ROLE_TARGET = 1 };
enum vps_registry_where { VPS_WHERE_HOST = 0, VPS_WHERE_CUDA = 1 };

/* Training scalars; the executor copies source rank 0's into every
 * destination, with the target's micro batch and accumulation. */
struct vps_registry_training {
	int64_t step, consumed_samples, scheduler_step;
	int64_t global_batch, micro_batch, grad_accum, dp;
	int64_t valid; /* 1 when set */
};

struct vps_registry_entry_info {
	int role;       /* enum vps_registry_role */
	uint32_t buffer;
	int state, dtype;
	int64_t elements;
	uint64_t bytes;
	int where;      /* enum vps_registry_where */
	char shm_name[VPS_REGISTRY_NAME_MAX + 8];
	uint64_t offset;
	int device;
	unsigned char ipc_handle[64];
	int released;   /* the executor no longer reads it */
};

struct vps_registry;

/* What a registry name pattern may name. */
struct vps_registry_name_parts {
	uint64_t job;       /* %j: a tag of the job, 8 hex digits of its low 32 bits (vps-trainer and
			     * vps-exec: vps_staged_world_hash of the first staged plan) */
	int64_t rank;       /* %r: world rank */
	int64_t a_rank;     /* %a: rank under the source layout (-1: joining) */
	int64_t b_rank;     /* %b: rank under the target layout (-1: leaving) */
	int64_t local_rank; /* %l: rank on the node */
};
/* Expand a registry name pattern into out (size bytes): %j, %r, %a, %b and
 * %l as parts gives them, %% a percent sign.
 * @return VPS_EINPUT for another %, or a name that is not 1 to
 * VPS_REGISTRY_NAME_MAX characters without '/'. */
VPS_API vps_result_t vps_registry_expand(const char *pattern, const struct vps_registry_name_parts *parts, char *out,
					 size_t size);

/* Create a registry for a trainer running rank `rank` of the layout with
 * hash layout_hash (rank -1 and hash 0 for a joining device that has no
 * source). An existing registry of that name is refused when its owner is
 * alive; a stale one (owner gone) of this user's is replaced only with
 * replace_stale, with the buffer objects NAME.N it made. An object NAME that
 * is not a vps registry, or is another user's, is never removed.
 * @return VPS_EINPUT with the reason when the name is taken, VPS_ENOMEM
 * when /dev/shm has no room for it (as vps_registry_alloc_host). */
VPS_API vps_result_t vps_registry_create(struct vps_registry **out, const char *name, uint64_t layout_hash, int64_t rank,
				 uint32_t max_entries, int replace_stale);
/* Open an existing registry (the executor) and hold it: one executor at a
 * time. An executor that held it and is gone (killed, or a zombie) is
 * replaced: a switch it was running is marked failed, and what it said
 * when it stopped (vps_registry_abort) is forgotten. Closing the handle
 * lets go. Fails when it is not the calling user's own, private object
 * (as vps_registry_check_object).
 * @return VPS_ENOTFOUND when there is none yet (or its trainer is still
 * making it), VPS_ESTALE when its trainer is gone, VPS_EBUSY naming the
 * live executor (its pid) that holds it. */
VPS_API vps_result_t vps_registry_open(struct vps_registry **out, const char *name);
/* Whether an open shared-memory object (fd, named name in messages) may hold
 * a job's state: a regular file owned by the calling process's effective
 * user, with no group or other permission. Every object the executor maps
 * is checked. @return VPS_EINPUT naming /dev/shm/NAME, its owner or its
 * mode, and what is expected. */
VPS_API vps_result_t vps_registry_check_object(int fd, const char *name);
/* Unmap. The trainer's close also removes the object and its buffers; an
 * executor's lets go of the registry. */
VPS_API void vps_registry_close(struct vps_registry *r);
/* Remove a registry and the buffer objects NAME.N it made, by name: only a
 * vps registry of this user's whose trainer is gone or is the calling
 * process (stale cleanup, a trainer's signal handler); VPS_EINPUT, leaving
 * everything, for anything else. An absent NAME is not an error. */
VPS_API vps_result_t vps_registry_unlink(const char *name);
/* Whether /dev/shm has `bytes` free (statvfs) for the host buffers about to
 * be allocated: a trainer checks a rank's whole need first, so that a
 * /dev/shm too small is said once, with that need, before anything is made.
 * Only the message: vps_registry_alloc_host reserves what it makes, which
 * no other process can take meanwhile. A /dev/shm without a size limit has
 * room. @return VPS_ENOMEM "/dev/shm: needs N MiB, M MiB free (docker:
 * --shm-size)". */
VPS_API vps_result_t vps_registry_check_room(uint64_t bytes);

VPS_API const char *vps_registry_name(const struct vps_registry *r);
VPS_API uint64_t vps_registry_layout_hash(const struct vps_registry *r);
VPS_API int64_t vps_registry_rank(const struct vps_registry *r);
VPS_API uint64_t vps_registry_target_hash(const struct vps_registry *r);
VPS_API int64_t vps_registry_target_rank(const struct vps_registry *r);
/* Declare the layout the trainer switches to and its rank there. */
VPS_API vps_result_t vps_registry_set_target(struct vps_registry *r, uint64_t target_hash, int64_t target_rank);

/* Allocate a host buffer in a new shared-memory object owned by the
 * registry and register it. *ptr receives the trainer's mapping. Its pages
 * are reserved before it is mapped (as the registry's own are by
 * vps_registry_create): a /dev/shm too small fails here, never with SIGBUS
 * at the first write. @return VPS_ENOMEM "/dev/shm: needs N MiB, M MiB free
 * (docker: --shm-size)" then, with nothing made or mapped. */
VPS_API vps_result_t vps_registry_alloc_host(struct vps_registry *r, enum vps_registry_role role,
			uint32_t buffer, enum vps_state state, enum vps_dtype dtype,
				     int64_t elements, void **ptr);
/* Free a buffer that vps_registry_alloc_host allocated (ptr as it gave it),
 * once no entry registers it: unmap it and remove its object. Executors
 * that still map it keep their mapping until they unmap it. A trainer frees
 * the sources of a switch once it is done, so that a long run does not
 * grow. VPS_EINPUT for a pointer it did not give or a buffer still
 * registered. */
VPS_API vps_result_t vps_registry_free_host(struct vps_registry *r, void *ptr);
/* Register bytes the trainer already has in a shared-memory object. */
VPS_API vps_result_t vps_registry_add_host(struct vps_registry *r, enum vps_registry_role role,
			uint32_t buffer, enum vps_state state, enum vps_dtype dtype,
				   int64_t elements, const char *shm_name, uint64_t offset);
/* Register GPU memory by its CUDA IPC handle (cudaIpcMemHandle_t bytes). */
VPS_API vps_result_t vps_registry_add_cuda(struct vps_registry *r, enum vps_registry_role role,
			uint32_t buffer, enum vps_state state, enum vps_dtype dtype,
				   int64_t elements, int device, const void *ipc_handle, uint64_t offset);

/* Register GPU memory by device pointer, as a trainer holds it: the
 * allocation's base is found (PyTorch's caching allocator hands out
 * interior pointers) and its IPC handle and ptr's offset are stored. The
 * allocation must be plain cudaMalloc memory on the calling process's
 * current device. Loads GPU support (VPS_EUNSUPPORTED where it cannot be
 * had) and checks that the buffer lies inside its allocation. */
VPS_API vps_result_t vps_registry_add_cuda_ptr(struct vps_registry *r, enum vps_registry_role role,
			uint32_t buffer, enum vps_state state, enum vps_dtype dtype,
				       int64_t elements, const void *ptr);

VPS_API uint32_t vps_registry_num_entries(const struct vps_registry *r);
VPS_API vps_result_t vps_registry_entry(const struct vps_registry *r, uint32_t i, struct vps_registry_entry_info *out);
/* Index of the entry of (role, buffer), or -1. */
VPS_API int64_t vps_registry_find(const struct vps_registry *r, enum vps_registry_role role, uint32_t buffer);
/* Map a host entry into this process (the executor). Sources are mapped
 * read-only: the executor cannot write a source buffer. */
VPS_API vps_result_t vps_registry_map(struct vps_registry *r, uint32_t i, bool writable, void **ptr);
/* Trainer, between switches: forget every entry and the target, and
 * declare the layout now run (its former targets are re-added as sources
 * with vps_registry_add_host and their shared-memory names). It forgets an
 * executor's abort too: the next switch is served by another executor. */
VPS_API vps_result_t vps_registry_reset(struct vps_registry *r, uint64_t layout_hash, int64_t rank);
/* Mark an entry no longer read (the trainer may free it). */
VPS_API void vps_registry_release(struct vps_registry *r, uint32_t i);

/* ---- the switch protocol ---- */
/* Trainer: request a switch; *seq receives its sequence number. */
VPS_API vps_result_t vps_registry_request(struct vps_registry *r, uint64_t *seq);
/* Wait until the switch seq is done or failed (or timeout seconds pass).
 * @return VPS_OK when done, VPS_EPEER with the executor's message when
 * failed, VPS_ETIMEOUT. */
VPS_API vps_result_t vps_registry_wait(struct vps_registry *r, uint64_t seq, double timeout);
/* Executor: wait for a request newer than after_seq; claim it (running).
 * VPS_EBUSY when this handle no longer holds the registry. The claim,
 * finish, abort, release and set_training of an executor's handle that
 * does not hold its registry write nothing. */
VPS_API vps_result_t vps_registry_claim(struct vps_registry *r, uint64_t after_seq, double timeout, uint64_t *seq);
/* Executor: end the switch (ok: done; otherwise failed with message). */
VPS_API void vps_registry_finish(struct vps_registry *r, uint64_t seq, int ok, const char *message);
/* Executor: it failed outside a switch (bootstrap, a peer). It ends the
 * request in flight (failed, with the message), or when none is, makes the
 * next request fail at once; a request after that one is a retry, left for
 * the next executor to claim. After a switch this executor ended as failed
 * it does nothing: the trainer was told. */
VPS_API void vps_registry_abort(struct vps_registry *r, const char *message);
VPS_API int vps_registry_state(const struct vps_registry *r, uint64_t *seq);
/* A state in words: idle, requested, running, done, failed ("unknown"
 * for another number). */
VPS_API const char *vps_registry_state_name(enum vps_registry_state state);
/* What the switch waits for, in words, for a trainer's messages: its
 * state, and whether an executor holds the registry ("requested; no
 * executor has attached to it (...)"). */
VPS_API void vps_registry_describe(const struct vps_registry *r, char *out, size_t size);
/* The pid of the live executor that holds the registry, or 0. */
VPS_API int vps_registry_executor_pid(const struct vps_registry *r);
/* Trainer: the executor it started for the switch in flight, or else the
 * next one requested, is process pid: a wait for that switch fails
 * (VPS_EPEER) once pid has exited while no executor holds the registry,
 * rather than waiting out its timeout for an executor that never comes.
 * VPS_EBUSY on an executor's handle. */
VPS_API vps_result_t vps_registry_expect_executor(struct vps_registry *r, int pid);
/* The trainer that made the registry still runs (the executor watches it:
 * a trainer gone mid-switch takes its state with it). */
VPS_API bool vps_registry_owner_alive(const struct vps_registry *r);
VPS_API int vps_registry_owner_pid(const struct vps_registry *r);
VPS_API const char *vps_registry_failure(const struct vps_registry *r);

VPS_API void vps_registry_get_training(const struct vps_registry *r, struct vps_registry_training *t);
VPS_API void vps_registry_set_training(struct vps_registry *r, const struct vps_registry_training *t);

#ifdef __cplusplus
}
#endif

#endif
