/* Showing documents: conversion through the kinds' own readers, and the
 * one-line identification of vps-show -t. */
#include <inttypes.h>
#include <stdio.h>

#include "io/doc.h"
#include "util/internal.h"
#include "model/layout_io.h"
#include "model/model_io.h"
#include "model/parallel_io.h"
#include "plan/plan_io.h"
#include "stage/stage_io.h"
#include "vps/show.h"

/* ---- reports ----
 *
 * vps-exec writes reports (vps_exec_report_yaml in exec.c) and no tool acts
 * on them, so they have no reader but this one, which reads what that
 * writer writes, in its order, and checks each value as far as the writer
 * bounds it; tests/bats/show.bats converts a real report both ways. */

static const char *const transports[] = {"tcp", "ipc", "nccl", "ipc+nccl"};
static const char *const digests[] = {"match", "mismatch", "not checked"};

static vps_result_t read_one_of(struct vps_reader *r, const char *key, const char *const *names, size_t n)
{
	const char *s;
	VPS_CHECK(vps_r_str(r, key, &s));
	for (size_t i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return VPS_OK;
	return vps_r_error(r, key, "'%s' is not one vps-exec writes", s);
}

static vps_result_t read_seconds(struct vps_reader *r, const char *key)
{
	double v;
	VPS_CHECK(vps_r_double(r, key, &v));
	if (v < 0)
		return vps_r_error(r, key, "%g is negative", v);
	return VPS_OK;
}

static vps_result_t read_bytes3(struct vps_reader *r)
{
	int64_t v;
	VPS_CHECK(vps_r_int(r, "bytes_sent", &v, 0, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "bytes_received", &v, 0, INT64_MAX));
	return vps_r_int(r, "bytes_copied", &v, 0, INT64_MAX);
}

/* The head of one switch: rank and world. */
static vps_result_t read_switch_head(struct vps_reader *r, int64_t *rank, int64_t *world)
{
	VPS_CHECK(vps_r_int(r, "rank", rank, 0, INT64_MAX - 1));
	VPS_CHECK(vps_r_int(r, "world", world, 1, INT64_MAX));
	if (*rank >= *world)
		return vps_r_error(r, "rank", "%" PRId64 " is outside the world of %" PRId64, *rank, *world);
	return VPS_OK;
}

/* A double key reports gained after their first YAML version (a YAML
 * report of before lacks it; binary has every key): 0 when absent, which
 * an echo writes out. */
static vps_result_t read_seconds_opt(struct vps_reader *r, const char *key)
{
	if (vps_reader_is_binary(r) || vps_r_has(r, key))
		return read_seconds(r, key);
	struct vps_writer *w = vps_reader_echo_writer(r);
	return w ? vps_w_double(w, key, 0.0) : VPS_OK;
}

static vps_result_t read_report(struct vps_reader *r)
{
	uint64_t n, nst;
	int64_t v, rank, world;
	static const char *const times[] = {"setup_seconds", "waited_seconds", "pause_seconds",
					    "attach_seconds", "agree_seconds", "transfer_seconds"};
	/* since binary version 2 (the digest's time, the pause's wall clock) */
	static const char *const later[] = {"digest_seconds", "requested_at", "started_at", "done_at", "release_seconds"};
	VPS_CHECK(vps_r_seq_begin(r, "switches", &n));
	for (uint64_t k = 0; k < n; k++) {
		VPS_CHECK(vps_r_map_begin(r, NULL));
		VPS_CHECK(read_switch_head(r, &rank, &world));
		VPS_CHECK(vps_r_int(r, "switch", &v, 0, INT64_MAX));
		VPS_CHECK(read_one_of(r, "transport", transports, sizeof(transports) / sizeof(transports[0])));
		VPS_CHECK(read_bytes3(r));
		for (size_t i = 0; i < sizeof(times) / sizeof(times[0]); i++)
			VPS_CHECK(read_seconds(r, times[i]));
		for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++)
			VPS_CHECK(read_seconds_opt(r, later[i]));
		VPS_CHECK(read_seconds(r, "gb_per_second"));
		VPS_CHECK(vps_r_int(r, "premapped_bytes", &v, 0, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "mapped_in_pause_bytes", &v, 0, INT64_MAX));
		VPS_CHECK(vps_r_int_opt(r, "opened_in_pause", &v, 0, INT64_MAX, 0));
		/* reports of YAML version 1 before these were written have none */
		VPS_CHECK(vps_r_int_opt(r, "data_connections", &v, 0, INT64_MAX, 0));
		VPS_CHECK(vps_r_int_opt(r, "control_connections", &v, 0, INT64_MAX, 0));
		VPS_CHECK(read_one_of(r, "digest", digests, sizeof(digests) / sizeof(digests[0])));
		uint64_t digest;
		VPS_CHECK(vps_r_u64hex(r, "digest_value", &digest));
		VPS_CHECK(vps_r_seq_begin(r, "stages", &nst));
		for (uint64_t i = 0; i < nst; i++) {
			VPS_CHECK(vps_r_map_begin(r, NULL));
			VPS_CHECK(vps_r_int(r, "stage", &v, 0, INT64_MAX));
			if ((uint64_t)v != i)
				return vps_r_error(r, "stage", "%" PRId64 " where stage %" PRIu64 " comes", v, i);
			VPS_CHECK(read_bytes3(r));
			VPS_CHECK(read_seconds(r, "seconds"));
			VPS_CHECK(read_seconds(r, "gb_per_second"));
			VPS_CHECK(vps_r_map_end(r));
		}
		VPS_CHECK(vps_r_seq_end(r));
		VPS_CHECK(vps_r_map_end(r));
	}
	return vps_r_seq_end(r);
}

/* ---- conversion ---- */

/* Read the body of a document of kind with that kind's reader, keeping
 * nothing: what is read is what an echo writes. */
static vps_result_t read_kind(struct vps_reader *r, enum vps_doc_kind kind)
{
	vps_result_t rc;
	switch (kind) {
	case VPS_DOC_LAYOUT: {
		struct vps_layout *l = NULL;
		rc = vps_layout_read(r, &l);
		vps_layout_free(l);
		return rc;
	}
	case VPS_DOC_PLAN: {
		struct vps_plan *p = NULL;
		uint64_t stated;
		/* packed: a global plan's pieces take 25 bytes each, not 184 */
		rc = vps_plan_read_body_as(r, &p, &stated, true);
		vps_plan_free(p);
		return rc;
	}
	case VPS_DOC_STAGED: {
		struct vps_staged *s = vps_calloc(1, sizeof(*s));
		if (!s)
			return VPS_ENOMEM;
		rc = vps_staged_read_body(r, s);
		vps_staged_free(s);
		return rc;
	}
	case VPS_DOC_REPORT:
		return read_report(r);
	case VPS_DOC_MODEL: {
		struct vps_model m;
		return vps_model_read(r, NULL, &m);
	}
	case VPS_DOC_PARALLEL: {
		struct vps_parallel p;
		const char *model;
		VPS_CHECK(vps_r_str_opt(r, "model", &model, ""));
		return vps_parallel_read(r, NULL, &p);
	}
	case VPS_DOC_DEVICES: {
		struct vps_devices d;
		rc = vps_devices_read(r, NULL, &d);
		vps_devices_release(&d);
		return rc;
	}
	default:
		return vps_fail(VPS_EINPUT, "%s: a %s document is read in YAML only and has no binary encoding",
				vps_reader_name(r), vps_doc_kind_name(kind));
	}
}

/* Why data is no vps document, after "not a vps document". */
static vps_result_t not_vps(const char *name, const void *data, size_t len)
{
	const unsigned char *d = data;
	if (!len)
		return vps_fail(VPS_EFORMAT, "%s: not a vps document (empty)", name);
	if (vps_is_binary(data, len)) {
		if (len < 6)
			return vps_fail(VPS_EFORMAT, "%s: not a vps document (truncated header)", name);
		return vps_fail(VPS_EFORMAT, "%s: not a vps document (binary, of unknown kind %u)", name,
				(unsigned)(d[4] | d[5] << 8));
	}
	if (memchr(data, '\0', len))
		return vps_fail(VPS_EFORMAT, "%s: not a vps document (binary data)", name);
	struct vps_reader *r;
	vps_result_t rc = vps_reader_new(&r, name, data, len, 0);
	if (rc) {
		if (rc == VPS_ENOMEM)
			return rc;
		/* the parser's message, without the name it starts with */
		char msg[512];
		const char *e = vps_last_error();
		size_t nl = strlen(name);
		if (!strncmp(e, name, nl) && !strncmp(e + nl, ": ", 2))
			e += nl + 2;
		snprintf(msg, sizeof(msg), "%s", e);
		return vps_fail(VPS_EFORMAT, "%s: not a vps document (%s)", name, msg);
	}
	const char *kind = NULL;
	bool has = vps_r_has(r, "vps");
	if (has)
		rc = vps_r_str(r, "vps", &kind);
	if (has && !rc)
		rc = vps_fail(VPS_EFORMAT, "%s: not a vps document (unknown kind '%s')", name, kind);
	else if (!rc)
		rc = vps_fail(VPS_EFORMAT, "%s: not a vps document (no 'vps:' key)", name);
	vps_reader_free(r);
	return rc;
}

vps_result_t vps_show_convert(const char *name, const void *data, size_t len, enum vps_show_encoding to,
			      struct vps_bytes *out)
{
	enum vps_doc_kind kind = vps_doc_sniff(data, len);
	memset(out, 0, sizeof(*out));
	if (!kind || !strcmp(vps_doc_kind_name(kind), "unknown"))
		return not_vps(name, data, len);
	struct vps_reader *r = NULL;
	struct vps_writer *w = NULL;
	VPS_CHECK(vps_reader_new(&r, name, data, len, kind));
	vps_result_t rc = to == VPS_SHOW_JSON ? vps_writer_new_json(&w, kind)
					      : vps_writer_new(&w, kind, to == VPS_SHOW_YAML);
	if (!rc) {
		vps_reader_echo(r, w);
		rc = read_kind(r, kind);
	}
	if (!rc)
		rc = vps_reader_finish(r);
	if (!rc)
		rc = vps_writer_finish(w, out);
	vps_writer_free(w);
	vps_reader_free(r);
	return rc;
}

/* ---- identification ---- */

/* A plan's first fields: its hash, scope, world and two layouts. */
static vps_result_t plan_head(struct vps_reader *r, struct vps_show_info *info)
{
	struct vps_layout *a = NULL, *b = NULL;
	int64_t scope;
	VPS_CHECK(vps_r_u64hex(r, "hash", &info->hash));
	info->has_hash = true;
	VPS_CHECK(vps_r_int(r, "scope", &scope, -1, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "world", &info->world, 1, INT64_MAX));
	VPS_CHECK(vps_r_map_begin(r, "source"));
	VPS_CHECK(vps_layout_read(r, &a));
	vps_result_t rc = vps_r_map_end(r);
	if (!rc)
		rc = vps_r_map_begin(r, "target");
	if (!rc)
		rc = vps_layout_read(r, &b);
	if (!rc) {
		snprintf(info->model, sizeof(info->model), "%s", vps_layout_model(a)->name);
		info->world_a = vps_layout_world(a);
		info->world_b = vps_layout_world(b);
		info->rank = scope;
	}
	vps_layout_free(a);
	vps_layout_free(b);
	return rc;
}

static vps_result_t identify(struct vps_reader *r, enum vps_doc_kind kind, struct vps_show_info *info)
{
	switch (kind) {
	case VPS_DOC_LAYOUT: {
		struct vps_layout *l = NULL;
		VPS_CHECK(vps_layout_read_stated(r, &l, &info->hash));
		info->has_hash = true;
		snprintf(info->model, sizeof(info->model), "%s", vps_layout_model(l)->name);
		info->world_a = vps_layout_world(l);
		vps_layout_free(l);
		return VPS_OK;
	}
	case VPS_DOC_PLAN:
		return plan_head(r, info);
	case VPS_DOC_STAGED: {
		uint64_t hash;
		int64_t v, scope;
		VPS_CHECK(vps_r_u64hex(r, "hash", &hash));
		VPS_CHECK(vps_r_int(r, "budget", &v, 0, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "scope", &scope, -1, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "steps", &v, 0, INT64_MAX));
		VPS_CHECK(vps_r_map_begin(r, "plan"));
		VPS_CHECK(plan_head(r, info));
		/* the staged plan's own hash and scope (one rank's part of a
		 * global plan holds the global plan) */
		info->hash = hash;
		info->rank = scope;
		return VPS_OK;
	}
	case VPS_DOC_REPORT: {
		uint64_t n;
		VPS_CHECK(vps_r_seq_begin(r, "switches", &n));
		info->switches = (int64_t)n;
		if (n) {
			VPS_CHECK(vps_r_map_begin(r, NULL));
			VPS_CHECK(read_switch_head(r, &info->rank, &info->world));
		}
		return VPS_OK;
	}
	case VPS_DOC_MODEL: {
		struct vps_model m;
		VPS_CHECK(vps_model_read(r, NULL, &m));
		snprintf(info->model, sizeof(info->model), "%s", m.name);
		return VPS_OK;
	}
	case VPS_DOC_PARALLEL: {
		const char *model;
		VPS_CHECK(vps_r_str_opt(r, "model", &model, ""));
		snprintf(info->model, sizeof(info->model), "%s", model);
		return VPS_OK;
	}
	default:
		return VPS_OK; /* the header was read: the kind is known */
	}
}

vps_result_t vps_show_identify(const char *name, const void *data, size_t len, struct vps_show_info *info)
{
	memset(info, 0, sizeof(*info));
	info->world_a = info->world_b = info->world = info->rank = info->switches = -1;
	const unsigned char *d = data;
	size_t i = 0;
	while (i < len && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r'))
		i++;
	info->encoding = vps_is_binary(data, len) ? "binary" : i < len && d[i] == '{' ? "json" : "yaml";
	enum vps_doc_kind kind = vps_doc_sniff(data, len);
	if (!kind || !strcmp(vps_doc_kind_name(kind), "unknown"))
		return not_vps(name, data, len);
	info->kind = kind;
	struct vps_reader *r;
	VPS_CHECK(vps_reader_new(&r, name, data, len, kind));
	vps_result_t rc = identify(r, kind, info);
	vps_reader_free(r);
	return rc;
}

void vps_show_describe(const struct vps_show_info *in, char *buf, size_t n)
{
	size_t k = 0;
#define PUT(...)                                                                 \
	do {                                                                     \
		if (k < n)                                                       \
			k += (size_t)snprintf(buf + k, n - k, __VA_ARGS__);      \
	} while (0)
	switch (in->kind) {
	case VPS_DOC_STAGED: PUT("vps staged plan"); break;
	case VPS_DOC_PLAN: PUT("vps plan"); break;
	case VPS_DOC_DEVICES: PUT("vps devices"); break;
	default: PUT("vps %s", vps_doc_kind_name(in->kind)); break;
	}
	bool plan = in->kind == VPS_DOC_PLAN || in->kind == VPS_DOC_STAGED;
	if (plan && in->rank >= 0)
		PUT(" for rank %" PRId64, in->rank);
	if (in->model[0])
		PUT(", model %s", in->model);
	if (plan)
		PUT(", world %" PRId64 " -> %" PRId64 " (%" PRId64 " ranks)", in->world_a, in->world_b, in->world);
	else if (in->world_a >= 0)
		PUT(", world %" PRId64, in->world_a);
	if (in->kind == VPS_DOC_REPORT) {
		if (in->rank >= 0)
			PUT(", rank %" PRId64 " of %" PRId64, in->rank, in->world);
		PUT(", %" PRId64 " switch%s", in->switches, in->switches == 1 ? "" : "es");
	}
	if (in->has_hash)
		PUT(", hash 0x%016" PRIx64, in->hash);
	PUT(", %s", in->encoding ? in->encoding : "yaml");
#undef PUT
}
