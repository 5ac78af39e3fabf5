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

struct vps_trainer_opts {
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

#endif
