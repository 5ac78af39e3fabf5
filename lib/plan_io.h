/* Plans inside documents (staged plans embed their plan's pieces). */
#ifndef VPS_PLAN_IO_H
#define VPS_PLAN_IO_H

#include "doc.h"
#include "vps/plan.h"

vps_result_t vps_training_write(struct vps_writer *w, const char *key, const struct vps_training *t);
vps_result_t vps_training_read(struct vps_reader *r, const char *key, struct vps_training *t);
vps_result_t vps_piece_write(struct vps_writer *w, const struct vps_model *m, const struct vps_piece *p);
vps_result_t vps_piece_read(struct vps_reader *r, const struct vps_model *m, int64_t world, struct vps_piece *p);
vps_result_t vps_plan_write_body(struct vps_writer *w, const struct vps_plan *p);
/* Read a plan body; *stored_hash receives the hash the file states. */
vps_result_t vps_plan_read_body(struct vps_reader *r, struct vps_plan **out, uint64_t *stored_hash);

#endif
