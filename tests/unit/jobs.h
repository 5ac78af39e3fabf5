/* In-memory jobs for tests. */
#ifndef VPS_TEST_JOBS_H
#define VPS_TEST_JOBS_H

#include "vps/plan.h"

struct job {
	const struct vps_layout *l;
	struct vps_rank_view *views;
	unsigned char ***bufs; /* [rank][buffer] */
	int64_t n;
};

/* A layout of a model in configs/ under a parallel spec, ranks packed
 * gpus_per_node to a node from first_node (failures are recorded). */
struct vps_layout *test_layout(const char *model, const char *spec, int64_t gpus_per_node, int64_t first_node);

/* A tensor's id by its global name (failures are recorded). */
uint32_t test_tensor_id(const struct vps_layout *l, const char *name);
/* Elements of (tensor, state) in a rank view, and the smallest offset among
 * them in *first (-1 when none). */
int64_t test_view_held(const struct vps_rank_view *v, uint32_t tensor, int state, int64_t *first);
/* The ranks vps_layout_holders names for (tensor, state), as a bit set
 * (ranks below 64). */
uint64_t test_holder_set(const struct vps_layout *l, uint32_t tensor, int state);
/* Record a failure unless vps_layout_holders, over every (tensor, state)
 * of the layout of model under spec, names exactly the regions that
 * enumerating every rank's view finds (rank, buffer, offset and box). */
void test_holders_match(const char *model, const char *spec);

/* Allocate every rank's buffers, zeroed. */
void job_alloc(struct job *j, const struct vps_layout *l);
void job_free(struct job *j);
/* Fill every region with the pattern (step 0). */
void job_fill(struct job *j);
/* Wrong elements plus non-zero padding bytes. */
int64_t job_check(struct job *j);
/* Apply a plan's pieces directly, A buffers to B buffers. */
void job_apply_plan(const struct vps_plan *p, struct job *a, struct job *b);
/* Apply a plan in memory from a filled A and record a failure, naming
 * `what`, for every wrong element of B or a byte moved beyond the lower
 * bound (something resident on its device moved). */
void job_plan_exact(const struct vps_plan *p, const char *what);
/* Whether two pieces are one: their ends, what moves and its addressing. */
bool job_piece_eq(const struct vps_piece *x, const struct vps_piece *y);
/* Whether q, world rank r's own plan, is global plan p's part: p's pieces
 * with r at one end, in p's order (*want: how many). */
bool job_rank_part(const struct vps_plan *p, const struct vps_plan *q, int64_t r, size_t *want);

#endif
