/* An executor's reports, for people and scripts (vps-exec --report). */
#include "io/doc.h"
#include "util/internal.h"
#include "vps/exec.h"

void vps_exec_report_release(struct vps_exec_report *r)
{
	free(r->stages);
	r->stages = NULL;
}

vps_result_t vps_exec_report_yaml(const struct vps_exec_report *reps, size_t n, struct vps_bytes *out)
{
	struct vps_writer *w;
	vps_result_t rc;
	VPS_CHECK(vps_writer_new(&w, VPS_DOC_REPORT, true));
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "switches", n, false), rc, done);
	for (size_t k = 0; k < n; k++) {
		const struct vps_exec_report *r = &reps[k];
		double moved = (double)(r->bytes_sent + r->bytes_received);
		VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "rank", r->rank), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "world", r->world), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "switch", (int64_t)r->switch_seq), rc, done);
		VPS_CHECK_GOTO(vps_w_str(w, "transport", r->transport ? r->transport : "tcp"), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_sent", r->bytes_sent), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_received", r->bytes_received), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_copied", r->bytes_copied), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "setup_seconds", r->setup_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "waited_seconds", r->waited_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "pause_seconds", r->pause_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "attach_seconds", r->attach_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "agree_seconds", r->agree_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "transfer_seconds", r->transfer_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "digest_seconds", r->digest_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "requested_at", r->requested_at), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "started_at", r->started_at), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "done_at", r->done_at), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "release_seconds", r->release_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "gb_per_second",
					    r->transfer_seconds > 0 ? moved / r->transfer_seconds / 1e9 : 0.0),
			       rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "premapped_bytes", (int64_t)r->premapped_bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "mapped_in_pause_bytes", (int64_t)r->mapped_in_pause_bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "opened_in_pause", (int64_t)r->opened_in_pause), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "data_connections", (int64_t)r->data_connections), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "control_connections", (int64_t)r->control_connections), rc, done);
		VPS_CHECK_GOTO(vps_w_str(w, "digest", !r->checked ? "not checked" : r->digest_match ? "match" : "mismatch"),
			       rc, done);
		VPS_CHECK_GOTO(vps_w_u64hex(w, "digest_value", r->digest_after), rc, done);
		VPS_CHECK_GOTO(vps_w_seq_begin(w, "stages", r->nstages, false), rc, done);
		for (size_t i = 0; i < r->nstages; i++) {
			const struct vps_exec_stage_report *st = &r->stages[i];
			double b = (double)(st->bytes_sent + st->bytes_received);
			VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "stage", (int64_t)i), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_sent", st->bytes_sent), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_received", st->bytes_received), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_copied", st->bytes_copied), rc, done);
			VPS_CHECK_GOTO(vps_w_double(w, "seconds", st->seconds), rc, done);
			VPS_CHECK_GOTO(vps_w_double(w, "gb_per_second", st->seconds > 0 ? b / st->seconds / 1e9 : 0.0), rc,
				       done);
			VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
		}
		VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
		VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	}
	VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
	rc = vps_writer_finish(w, out);
done:
	vps_writer_free(w);
	return rc;
}
