/* Executing a staged plan on one rank: attach to the trainer's registry,
 * rendezvous with the peers, then run the stages in order, each rank's
 * transfers of a stage moved by a transport (tcp, ipc, nccl), its retains
 * copied in place, sources released after their last stage. */
#ifndef VPS_EXEC_H
#define VPS_EXEC_H

#include "vps/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How bytes travel between ranks (vps-exec(1), TRANSPORTS). */
enum vps_exec_transport {
	VPS_EXEC_TCP = 0,  /* host memory over TCP sockets */
	VPS_EXEC_IPC = 1,  /* ranks of one node map each other's buffers (host or GPU) */
	VPS_EXEC_NCCL = 2, /* GPU memory over NCCL */
	VPS_EXEC_AUTO = 3, /* ipc within a node, nccl across nodes */
};

/* The version of struct vps_exec_opts these headers declare (vps/base.h,
 * "Options structs"). */
#define VPS_EXEC_OPTS_VERSION 1

struct vps_exec_opts {
	unsigned int version;   /* VPS_EXEC_OPTS_VERSION, as VPS_EXEC_OPTS_INIT sets it */
	int transport;          /* enum vps_exec_transport */
	int device;             /* GPU of GPU memory and NCCL; -1: local rank modulo the visible GPUs */
	const char *registry;   /* name (vps_registry_expand); NULL: VPS_REGISTRY_DEFAULT */
	int64_t rank;           /* world rank in the first plan */
	int64_t local_rank;
	const char *master_host;
	int master_port;
	double timeout;         /* seconds without progress */
	double request_timeout; /* seconds the ranks' trainers may request apart */
	const char *token;      /* the job's secret (vps_exec_token); NULL only for a world of one */
	const char *bind;       /* address this rank listens on; NULL: the master's (rank 0) or the
				 * one that reaches the master (the others) */
	bool wait;              /* connect first, then wait for the trainer's request */
	bool check;             /* digest before and after; done only when they match */
	/* progress callback after each stage (may be NULL) */
	void (*progress)(void *ctx, int64_t stage, int64_t nstages, int64_t bytes, double seconds);
	void *progress_ctx;
	/* said by a wait that has lasted a few seconds: what it waits for,
	 * under which name, whom (the rank, and its address when known); and a
	 * peer refused for the job token, after a few refusals (may be NULL) */
	void (*notice)(void *ctx, const char *message);
	void *notice_ctx;
	/* the staged plans' files, named in messages (NULL: "staged plan N") */
	const char *const *plan_names;
	/* > 0: a wait says it again every notice_every seconds (for a
	 * terminal); 0: once */
	double notice_every;
	double wait_limit;      /* under wait: seconds the registry may take to appear (0: as long as it takes) */
};

/* Every field's default, vps-exec's: tcp, the local rank's GPU, the default
 * registry, rank 0, timeouts of 60 s and 600 s, no callbacks:
 *     struct vps_exec_opts o = VPS_EXEC_OPTS_INIT;
 * (every field in order: C++ has no designated initializers before C++20) */
#define VPS_EXEC_OPTS_INIT                                                                            \
	{ VPS_EXEC_OPTS_VERSION, VPS_EXEC_TCP, -1, NULL, 0, 0, NULL, 0, 60.0, 600.0, NULL, NULL, false, false, \
	  NULL, NULL, NULL, NULL, NULL, 0.0, 0.0 }

/* A job token: VPS_TOKEN_MIN to VPS_TOKEN_MAX characters. */
#define VPS_TOKEN_MIN 16
#define VPS_TOKEN_MAX 256
#define VPS_TOKEN_NEW 32

/* The job token from file (which must be a regular file of this user,
 * readable by nobody else), or from the environment's VPS_TOKEN when file
 * is NULL. out (at least VPS_TOKEN_MAX + 3 bytes) receives it, or "" when
 * neither names one. */
VPS_API vps_result_t vps_exec_token(const char *file, char *out, size_t size);
/* A fresh token: VPS_TOKEN_NEW hexadecimal digits from the kernel's
 * random source. */
VPS_API vps_result_t vps_exec_new_token(char out[VPS_TOKEN_NEW + 1]);

struct vps_exec_stage_report {
	int64_t bytes_sent, bytes_received, bytes_copied;
	double seconds;
};

struct vps_exec_report {
	int64_t rank, world;
	size_t nstages;
	struct vps_exec_stage_report *stages;
	int64_t bytes_sent, bytes_received, bytes_copied;
	double setup_seconds;     /* open registry, bootstrap, connect, communicators: overlapped with training under --wait */
	double attach_seconds;    /* of the pause: mapping buffers, opening IPC handles, peers' descriptors */
	double agree_seconds;     /* of the pause: the rendezvous (training state, start, verdict, digest sums) */
	double waited_seconds;    /* waiting for the trainer's request (and every rank's) */
	double pause_seconds;     /* from every rank's request claimed to destinations marked done */
	double transfer_seconds;  /* of the pause: the stages */
	double digest_seconds;    /* of the pause: this rank's digests, before and after (--check) */
	/* wall clock (seconds since the epoch): this rank's request claimed,
	 * every rank's request known here (the pause's start on this rank),
	 * and its switch marked done; the pause of a synchronous job is from
	 * the last rank's requested_at to each rank's done_at */
	double requested_at, started_at, done_at;
	/* after the pause, the trainer already on its way: letting go of the
	 * switch's mappings (closing CUDA IPC handles is slow) */
	double release_seconds;
	/* objects mapped and CUDA IPC handles opened in the pause, this rank's
	 * own and its peers': 0 when everything was opened while it waited */
	uint64_t opened_in_pause;
	/* this rank's host buffers: bytes mapped and read once before the
	 * request (or kept from the switch before), and bytes whose first pass
	 * fell in the pause's attach (slow on VMs: docs/exec.md) */
	uint64_t premapped_bytes, mapped_in_pause_bytes;
	const char *transport;    /* the transports' name: tcp, ipc, nccl; auto: ipc, or ipc+nccl
				   * when some rank's switch crosses nodes */
	bool checked, digest_match;
	uint64_t digest_before, digest_after;
	uint64_t switch_seq;
	/* this rank's connections to other ranks: to those it exchanges data
	 * with, and to its neighbours in the control tree (at most 5) */
	size_t data_connections, control_connections;
};

VPS_API void vps_exec_report_release(struct vps_exec_report *r);

/* Run one switch per staged plan in order (more than one: a long-running
 * executor that keeps its connections, --serve). All plans must be over the
 * same devices. One report per switch is filled in reports[]. */
VPS_API vps_result_t vps_exec_run(struct vps_staged *const *plans, size_t nplans, const struct vps_exec_opts *o,
			  struct vps_exec_report *reports);

/* The layout-independent digest of this rank's part of a layout: the
 * elements of its regions it is the lowest-numbered holder of, so that
 * summing over ranks counts every replica once. buffers[i] is the rank's
 * buffer i. */
VPS_API vps_result_t vps_exec_digest(const struct vps_layout *l, int64_t rank, void *const *buffers, uint64_t *digest);

struct vps_bytes;
VPS_API vps_result_t vps_exec_report_yaml(const struct vps_exec_report *reps, size_t n, struct vps_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
