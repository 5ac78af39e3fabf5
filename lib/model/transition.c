/* Transition documents: a model, a source and a target configuration, and
 * where each runs. */
#include <stdio.h>
#include <stdlib.h>

#include "io/doc.h"
#include "util/internal.h"
#include "vps/plan.h"

/* One side: `parallel` (a spec or a configuration name), and where it runs. */
static vps_result_t side(struct vps_reader *r, const char *key, const struct vps_model *m, const char *parallel_path,
			 struct vps_layout **out)
{
	const char *spec;
	int64_t gpn, first;
	struct vps_parallel p;
	struct vps_devices d;
	char hint[64], where[512];
	VPS_CHECK(vps_r_map_begin(r, key));
	VPS_CHECK(vps_r_str(r, "parallel", &spec));
	snprintf(where, sizeof(where), "%s: line %d: %s", vps_reader_name(r), vps_r_line(r, "parallel"), key);
	VPS_CHECK(vps_r_int_opt(r, "gpus_per_node", &gpn, 1, 1 << 20, 8));
	VPS_CHECK(vps_r_int_opt(r, "first_node", &first, 0, INT32_MAX, 0));
	VPS_CHECK(vps_r_map_end(r));
	vps_result_t rc = vps_parallel_load(&p, spec, parallel_path, hint, sizeof(hint));
	if (rc) {
		vps_error_prefix("%s", where);
		return rc;
	}
	vps_devices_packed(&d, gpn, first);
	return vps_layout_new(out, m, &p, &d, where);
}

/* One of the paper's times for a system: a positive number of seconds, or
 * absent (0). */
static vps_result_t paper_time(struct vps_reader *r, const char *key, double *v)
{
	*v = 0;
	if (!vps_r_has(r, key) && !vps_reader_is_binary(r))
		return VPS_OK;
	VPS_CHECK(vps_r_double(r, key, v));
	/* the binary encoding writes every field: 0 there means none */
	if (*v < 0 || (*v == 0 && !vps_reader_is_binary(r)) || *v > 1e9)
		return vps_r_error(r, key, "a time of the paper is a positive number of seconds up to 1e9");
	return VPS_OK;
}

/* The baselines' times of the paper's table: MCP's save and load go
 * together. */
static vps_result_t paper_times(struct vps_reader *r, struct vps_transition *info)
{
	bool save = vps_r_has(r, "paper_mcp_save_seconds"), load = vps_r_has(r, "paper_mcp_load_seconds");
	if (save != load && !vps_reader_is_binary(r))
		return vps_r_error(r, save ? "paper_mcp_save_seconds" : "paper_mcp_load_seconds",
				   "paper_mcp_save_seconds and paper_mcp_load_seconds go together");
	VPS_CHECK(paper_time(r, "paper_mcp_save_seconds", &info->paper_mcp_save_seconds));
	VPS_CHECK(paper_time(r, "paper_mcp_load_seconds", &info->paper_mcp_load_seconds));
	return paper_time(r, "paper_hotspa_seconds", &info->paper_hotspa_seconds);
}

vps_result_t vps_transition_load(const char *arg, const char *trans_path, const char *model_path,
				 const char *parallel_path, struct vps_transition *info, struct vps_layout **a,
				 struct vps_layout **b)
{
	char path[4096];
	struct vps_bytes bytes;
	struct vps_reader *r = NULL;
	struct vps_model m;
	const char *s;
	*a = *b = NULL;
	memset(info, 0, sizeof(*info));
	VPS_CHECK(vps_config_find(arg, trans_path, "transition", path, sizeof(path)));
	VPS_CHECK(vps_read_file(path, &bytes));
	vps_result_t rc = vps_reader_new(&r, path, bytes.data, bytes.len, VPS_DOC_TRANSITION);
	if (rc)
		goto done;
	VPS_CHECK_GOTO(vps_r_str(r, "name", &s), rc, done);
	snprintf(info->name, sizeof(info->name), "%s", s);
	VPS_CHECK_GOTO(vps_r_str_opt(r, "description", &s, ""), rc, done);
	snprintf(info->description, sizeof(info->description), "%s", s);
	VPS_CHECK_GOTO(vps_r_str(r, "model", &s), rc, done);
	VPS_CHECK_GOTO(vps_model_load(&m, s, model_path), rc, done);
	VPS_CHECK_GOTO(side(r, "from", &m, parallel_path, a), rc, done);
	VPS_CHECK_GOTO(side(r, "to", &m, parallel_path, b), rc, done);
	if (vps_r_has(r, "paper_seconds") || vps_reader_is_binary(r))
		VPS_CHECK_GOTO(vps_r_double(r, "paper_seconds", &info->paper_seconds), rc, done);
	VPS_CHECK_GOTO(paper_times(r, info), rc, done);
	rc = vps_reader_finish(r);
done:
	if (rc) {
		vps_layout_free(*a);
		vps_layout_free(*b);
		*a = *b = NULL;
	}
	vps_reader_free(r);
	vps_bytes_release(&bytes);
	return rc;
}

/* A transition's description, from the head of the file at path. */
static vps_result_t describe(const char *path, struct vps_transition *t)
{
	struct vps_bytes bytes;
	struct vps_reader *r = NULL;
	const char *s;
	VPS_CHECK(vps_read_file(path, &bytes));
	vps_result_t rc = vps_reader_new(&r, path, bytes.data, bytes.len, VPS_DOC_TRANSITION);
	if (!rc)
		rc = vps_r_str_opt(r, "description", &s, "");
	if (!rc)
		snprintf(t->description, sizeof(t->description), "%s", s);
	vps_reader_free(r);
	vps_bytes_release(&bytes);
	return rc;
}

vps_result_t vps_transition_list(const char *trans_path, struct vps_transition **list, size_t *n)
{
	char **names, path[4096];
	size_t count;
	*list = NULL;
	*n = 0;
	VPS_CHECK(vps_config_names(trans_path, &names, &count));
	struct vps_transition *t = count ? calloc(count, sizeof(*t)) : NULL;
	vps_result_t rc = count && !t ? vps_fail(VPS_ENOMEM, "out of memory listing transitions") : VPS_OK;
	for (size_t i = 0; i < count && !rc; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "%s", names[i]);
		rc = vps_config_find(names[i], trans_path, "transition", path, sizeof(path));
		if (!rc)
			rc = describe(path, &t[i]);
	}
	vps_config_names_free(names, count);
	if (rc) {
		free(t);
		return rc;
	}
	*list = t;
	*n = count;
	return VPS_OK;
}
