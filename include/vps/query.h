/* Queries: the everyday questions about a layout or a plan, answered as
 * records, one a line, without writing out everything.
 *
 *   - vps_query_holders(): who holds a tensor (a name or a glob), or a box of
 *     it, in which state, at which offset of which buffer. Computed from
 *     vps_layout_holders(): ranks come as base + i*stride for i < count, so
 *     the answer never enumerates the ranks.
 *   - vps_query_transfers(), vps_query_staged(): what one world rank sends,
 *     receives and retains in a plan or a staged plan, to and from whom,
 *     filtered by peer, tensor, state and (staged) stage.
 *
 * Records (vps/io.h) are written in one of three formats: YAML (a
 * sequence, one flow mapping a line), TSV (a header line of the column
 * names, then one line a record) or JSON lines (one object a line). The
 * columns are listed below and in vps-layout(1) and vps-plan(1). */
#ifndef VPS_QUERY_H
#define VPS_QUERY_H

#include "vps/io.h"
#include "vps/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The columns of the two kinds of answer. */
VPS_API extern const struct vps_field vps_holder_fields[];
VPS_API extern const size_t vps_holder_nfields;
VPS_API extern const struct vps_field vps_transfer_fields[];
VPS_API extern const size_t vps_transfer_nfields;

/* "LO:HI,LO:HI,..." (1 to VPS_MAX_DIMS axes, 0 <= LO < HI < 2^48).
 * @return VPS_EINPUT with what is wrong. */
VPS_API vps_result_t vps_box_parse(const char *s, struct vps_box *b);
/* The compact form of ranks base + i*stride, i < count: "5" (one rank),
 * "0-7" (stride 1), "0-6:2" (first-last:stride). */
VPS_API void vps_ranks_format(int64_t base, int64_t stride, int64_t count, char *buf, size_t n);

struct vps_query {
	const char *tensor;  /* a tensor name, or an fnmatch(3) glob; NULL: every tensor */
	int state;           /* enum vps_state, or -1: every state */
	bool has_box;        /* holders: only what intersects box, clipped to it */
	struct vps_box box;
	int64_t rank;        /* transfers: the world rank asked about (-1: a one-rank plan's own) */
	int64_t peer;        /* transfers: only those with this world rank (-1: any) */
	int64_t stage;       /* staged transfers: only this stage (-1: any) */
};
VPS_API void vps_query_init(struct vps_query *q);

/* Holders of the (tensor, state) pairs the query names, as records of
 * vps_holder_fields. A name no tensor has and a glob no tensor matches are
 * VPS_ENOTFOUND; a box of another dimensionality than a matched tensor, or
 * outside its shape, is VPS_EINPUT. */
VPS_API vps_result_t vps_query_holders(const struct vps_layout *l, const struct vps_query *q, enum vps_format f,
			       struct vps_bytes *out);

/* The pieces of plan p that world rank q->rank sends, receives or retains,
 * as records of vps_transfer_fields (stage and chunk -1). */
VPS_API vps_result_t vps_query_transfers(const struct vps_plan *p, const struct vps_query *q, enum vps_format f,
				 struct vps_bytes *out);

/* The same over a staged plan: one record per part of a piece that one
 * copy of one transfer carries (a piece cut across chunks comes in parts),
 * in the order the rank executes them, with the transfer's stage (-1 when
 * not cut yet) and chunk. VPS_EFORMAT when a copy does not lie in the
 * pieces it names (vps-verify(1) says more). */
VPS_API vps_result_t vps_query_staged(const struct vps_staged *s, const struct vps_query *q, enum vps_format f,
			      struct vps_bytes *out);

/* Read a plan or staged plan document (by its kind) and answer the
 * transfers query over it. name is used in messages. */
VPS_API vps_result_t vps_query_document(const char *name, const void *data, size_t len, const struct vps_query *q,
				enum vps_format f, struct vps_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
