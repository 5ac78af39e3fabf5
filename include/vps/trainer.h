/* The reference trainer: what vps-trainer runs. It stands in for a
 * Megatron job in tests and demos: it allocates its shards for a layout in
 * a registry, fills them with the deterministic pattern, runs fake
 * optimizer steps (each step rewrites every state with that step's
 * pattern), reads its samples like Megatron's pretraining sampler, asks for
 * a switch, checks every element it receives, and carries on under the new
 * layout from where the data loader stood. */
#ifndef VPS_TRAINER_H
#define VPS_TRAINER_H

#include "vps/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of struct vps_trainer_opts these headers declare
 * (vps/base.h, "Options structs"). */
#define VPS_TRAINER_OPTS_VERSION 1

struct vps_trainer_opts {
	unsigned int version;     /* VPS_TRAINER_OPTS_VERSION, as VPS_TRAINER_OPTS_INIT sets it */
	const char *registry;     /* name (no pattern) */
	int64_t rank;             /* world rank in the first plan */
	int64_t steps_before;     /* steps under the first source layout */
	int64_t steps_after;      /* steps after each switch */
	int64_t global_batch;
	int64_t micro_batch;
	const char *samples_log;  /* append consumed sample ids, one per line (NULL: none) */
	double timeout;           /* for each switch */
	bool cuda;                /* hold the state in GPU memory (libvps-cuda.so) */
	int device;               /* that GPU; -1: local_rank modulo the visible GPUs */
	int64_t local_rank;
	/* With cuda: where GPU memory comes from (NULL: cudaMalloc). A Python
	 * trainer passes PyTorch's allocator here through ctypes; what it
	 * returns stays the caller's to free. */
	void *(*cuda_alloc)(void *ctx, size_t bytes);
	void *cuda_alloc_ctx;
	/* said once by a wait for the executor that has lasted a few seconds:
	 * what it waits for, under which name (may be NULL) */
	void (*notice)(void *ctx, const char *message);
	void *notice_ctx;
	/* the staged plans' files, named in messages (NULL: "staged plan N") */
	const char *const *plan_names;
};

/* Every field's default, vps-trainer's: rank 0, 3 steps before the first
 * switch and 2 after each, micro batch 1, 120 s a switch, host memory
 * (registry, though, has none: name it):
 *     struct vps_trainer_opts o = VPS_TRAINER_OPTS_INIT;
 * (every field in order: C++ has no designated initializers before C++20) */
#define VPS_TRAINER_OPTS_INIT \
	{ VPS_TRAINER_OPTS_VERSION, NULL, 0, 3, 2, 0, 1, NULL, 120.0, false, -1, 0, NULL, NULL, NULL, NULL, NULL }

struct vps_trainer_result {
	int64_t switches;
	int64_t wrong_elements;   /* destination elements not equal to the pattern */
	int64_t dirty_padding;    /* padding elements that are not zero */
	int64_t step;             /* steps taken in all */
	int64_t consumed_samples;
	bool training_state_ok;   /* the switch carried step and samples */
};

/* Run the trainer's side of one switch per plan, in order. */
VPS_API vps_result_t vps_trainer_run(struct vps_staged *const *plans, size_t nplans, const struct vps_trainer_opts *o,
			     struct vps_trainer_result *res);

#ifdef __cplusplus
}
#endif

#endif
