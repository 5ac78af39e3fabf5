/* Static verification of layouts, plans and staged plans.
 *
 * A check collects violations instead of stopping at the first one: each is
 * a line of text naming the rank, tensor, state and box concerned. */
#ifndef VPS_VERIFY_H
#define VPS_VERIFY_H

#include "vps/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VPS_VERIFY_MAX_MESSAGES 200

struct vps_verify_report {
	int64_t violations;     /* all of them, even past the messages kept */
	char **messages;        /* the first VPS_VERIFY_MAX_MESSAGES */
	size_t nmessages;
	char summary[512];      /* one line, filled on success and on failure */
};

VPS_API void vps_verify_report_release(struct vps_verify_report *r);

/* Check a layout: every element of every (tensor, state) is held by some
 * rank, regions lie inside their buffers and match their buffer's state,
 * and no two regions of a buffer overlap. Enumerates all ranks.
 * @return VPS_OK (report filled; violations may be > 0) or an error. */
VPS_API vps_result_t vps_verify_layout(const struct vps_layout *l, struct vps_verify_report *rep);

struct vps_plan;
/* Check a plan: its content matches its stated hash; every piece's source
 * holds the box under A at the stated address and its destination has a B
 * region for it at the stated address; every destination region in the
 * plan's scope is covered exactly once. */
VPS_API vps_result_t vps_verify_plan(const struct vps_plan *p, struct vps_verify_report *rep);

struct vps_staged;
/* Check a staged plan: steps are i ^ j, one transfer per peer per stage,
 * every stage within the budget on every rank, staging offsets aligned and
 * inside their buffers, views inside their buffers, and the copies carry
 * exactly the plan's pieces. */
VPS_API vps_result_t vps_verify_staged(const struct vps_staged *s, struct vps_verify_report *rep);

/* Append a violation message (printf-style) to the report. */
VPS_API void vps_verify_add(struct vps_verify_report *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
