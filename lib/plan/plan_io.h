/* Plans inside documents (staged plans embed their plan's pieces). */
#ifndef VPS_PLAN_IO_H
#define VPS_PLAN_IO_H

#include "io/doc.h"
#include "vps/plan.h"

vps_result_t vps_training_write(struct vps_writer *w, const char *key, const struct vps_training *t);
vps_result_t vps_training_read(struct vps_reader *r, const char *key, struct vps_training *t);
vps_result_t vps_piece_write(struct vps_writer *w, const struct vps_model *m, const struct vps_piece *p);
/* Elements of buffer `buffer` of world rank wr under A (source) or B, -1
 * when the rank is not in that layout (a joining source or a leaving
 * target: vps-verify names those, or a transit area, VPS_BUFFER_TRANSIT
 * on the B side, whose size the plan's pieces give) and -2 when it has no
 * such buffer. */
int64_t vps_plan_side_elements(const struct vps_plan *p, bool source, int64_t wr, uint32_t buffer);
vps_result_t vps_plan_write_body(struct vps_writer *w, const struct vps_plan *p);
/* Into a counting writer: what vps_plan_write_body writes, measured; pieces
 * of a size already seen are added to *more instead of written. */
vps_result_t vps_plan_count_body(struct vps_writer *w, const struct vps_plan *p, uint64_t *more);
/* Read a plan body; *stored_hash receives the hash the file states. */
vps_result_t vps_plan_read_body(struct vps_reader *r, struct vps_plan **out, uint64_t *stored_hash);
/* compact: a global plan's pieces stay packed (pieces NULL; read them with
 * vps_piece_iter). */
vps_result_t vps_plan_read_body_as(struct vps_reader *r, struct vps_plan **out, uint64_t *stored_hash, bool compact);

#endif
