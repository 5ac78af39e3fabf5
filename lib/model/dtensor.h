/* PyTorch DTensor layouts (family dtensor): what FSDP2, HSDP, tensor,
 * pipeline and expert parallelism hold on each rank, as torchtitan applies
 * them (docs/layout.md, "PyTorch DTensor layouts"). layout.c hands a
 * layout of this family here; nothing here calls layout.c or parallel.c. */
#ifndef VPS_DTENSOR_H
#define VPS_DTENSOR_H

#include "vps/layout.h"

struct dtensor;
struct vps_layout;

/* "dp_replicate=2,dp_shard=4,tp=2": the mesh axes that are not 1, in
 * torchtitan's order, dp_shard always (it names the family). */
void vps_dtensor_format(const struct vps_parallel *p, char *buf, size_t n);
/* Check p against the model with torchtitan's and FSDP2's rules; fills dp
 * (dp_replicate x dp_shard) and etp (tp, or 1 under expert parallelism). */
vps_result_t vps_dtensor_validate(struct vps_parallel *p, const struct vps_model *m, const char *where);

/* The per-stage parameter lists of a validated configuration. */
vps_result_t vps_dtensor_new(struct dtensor **out, const struct vps_model *m, const struct vps_parallel *p,
			     const char *where);
void vps_dtensor_free(struct dtensor *d);

void vps_dtensor_coords(const struct vps_parallel *p, int64_t rank, struct vps_coords *c);
/* Rank's buffers, parameters and regions (its device and coordinates are
 * the caller's). */
vps_result_t vps_dtensor_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *v);
vps_result_t vps_dtensor_holders(const struct vps_layout *l, const struct vps_tensor *t, uint32_t tensor, int state,
				 const struct vps_box *box, struct vps_holders *h);
/* The parameter's fully qualified name in torchtitan's model. */
size_t vps_dtensor_param_name(const struct vps_layout *l, const struct vps_param *p, char *buf, size_t n);
int64_t vps_dtensor_buffer_elements(const struct vps_layout *l, int64_t rank, uint32_t buffer);
vps_result_t vps_dtensor_stats(const struct vps_layout *l, struct vps_layout_stats *s);
bool vps_dtensor_has_state(const struct vps_layout *l, enum vps_state state);

#endif
