/* What the document harnesses share: read a document of one kind and,
 * when it is accepted, check the promise of lib/io/doc.h that what vps reads
 * it writes back and reads again, the same in YAML and in binary. A
 * violation aborts, which libFuzzer reports as a crash with its input. */
#ifndef VPS_FUZZ_COMMON_H
#define VPS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vps/io.h"
#include "vps/layout.h"
#include "vps/model.h"
#include "vps/plan.h"
#include "vps/show.h"
#include "vps/stage.h"

enum fuzz_doc { FUZZ_LAYOUT, FUZZ_PLAN, FUZZ_STAGED, FUZZ_MODEL, FUZZ_NDOCS };

static void fuzz_die(const char *what, enum fuzz_doc k)
{
	fprintf(stderr, "fuzz: document kind %d: %s (%s)\n", (int)k, what, vps_last_error());
	abort();
}

static vps_result_t fuzz_parse(enum fuzz_doc k, const void *d, size_t n, void **out)
{
	switch (k) {
	case FUZZ_LAYOUT:
		return vps_layout_parse((struct vps_layout **)out, "fuzz", d, n);
	case FUZZ_PLAN:
		return vps_plan_parse((struct vps_plan **)out, "fuzz", d, n);
	case FUZZ_STAGED:
		return vps_staged_parse((struct vps_staged **)out, "fuzz", d, n);
	default: {
		struct vps_model *m = calloc(1, sizeof(*m));
		if (!m)
			return VPS_ENOMEM;
		vps_result_t rc = vps_model_parse(m, "fuzz", d, n);
		if (rc == VPS_OK)
			rc = vps_model_validate(m, "fuzz");
		if (rc)
			free(m);
		else
			*out = m;
		return rc;
	}
	}
}

static void fuzz_free(enum fuzz_doc k, void *x)
{
	switch (k) {
	case FUZZ_LAYOUT:
		vps_layout_free(x);
		break;
	case FUZZ_PLAN:
		vps_plan_free(x);
		break;
	case FUZZ_STAGED:
		vps_staged_free(x);
		break;
	default:
		free(x);
	}
}

/* Models have no serializer of their own (they travel inside layouts). */
static vps_result_t fuzz_serialize(enum fuzz_doc k, const void *x, bool yaml, struct vps_bytes *out)
{
	switch (k) {
	case FUZZ_LAYOUT:
		return vps_layout_serialize(x, NULL, 0, yaml, out);
	case FUZZ_PLAN:
		return vps_plan_serialize(x, yaml, out);
	case FUZZ_STAGED:
		return vps_staged_serialize(x, yaml, out);
	default:
		return VPS_EUNSUPPORTED;
	}
}

/* What the tools do with a document once read, beyond writing it. */
static void fuzz_use(enum fuzz_doc k, const void *x)
{
	if (k == FUZZ_PLAN) {
		struct vps_plan_stats s;
		if (vps_plan_stats(x, NULL, true, &s) == VPS_OK)
			vps_plan_stats_release(&s);
	} else if (k == FUZZ_STAGED) {
		struct vps_stage_stats st;
		vps_staged_stats(x, &st);
	} else if (k == FUZZ_LAYOUT) {
		struct vps_layout_stats s;
		vps_layout_stats(x, &s);
	}
}

/* vps-show reads with the kinds' own readers: it accepts what they accept,
 * and what vps wrote (y1, NULL when d was refused) comes back from binary
 * byte for byte. -t reads any input without harm. */
static void fuzz_show(enum fuzz_doc k, const uint8_t *d, size_t n, bool accepted, const struct vps_bytes *y1)
{
	static const enum vps_doc_kind kinds[] = {VPS_DOC_LAYOUT, VPS_DOC_PLAN, VPS_DOC_STAGED};
	struct vps_show_info info;
	char line[512];
	if (vps_show_identify("fuzz", d, n, &info) == VPS_OK)
		vps_show_describe(&info, line, sizeof(line));
	if (k == FUZZ_MODEL || vps_doc_sniff(d, n) != kinds[k])
		return;
	struct vps_bytes b = {0}, y = {0};
	vps_result_t rc = vps_show_convert("fuzz", d, n, VPS_SHOW_BINARY, &b);
	if (rc != VPS_ENOMEM && (rc == VPS_OK) != accepted)
		fuzz_die(accepted ? "vps-show refuses a document its reader accepts"
				  : "vps-show accepts a document its reader refuses", k);
	vps_bytes_release(&b);
	if (!y1)
		return;
	if (vps_show_convert("fuzz", y1->data, y1->len, VPS_SHOW_BINARY, &b) != VPS_OK ||
	    vps_show_convert("fuzz", b.data, b.len, VPS_SHOW_YAML, &y) != VPS_OK)
		fuzz_die("vps-show does not convert what vps wrote", k);
	if (y.len != y1->len || memcmp(y.data, y1->data, y.len) != 0)
		fuzz_die("vps-show: YAML -> binary -> YAML is not byte-identical", k);
	vps_bytes_release(&b);
	vps_bytes_release(&y);
}

static void fuzz_document(enum fuzz_doc k, const uint8_t *d, size_t n)
{
	void *x = NULL;
	if (fuzz_parse(k, d, n, &x) != VPS_OK) {
		fuzz_show(k, d, n, false, NULL);
		return;
	}
	fuzz_use(k, x);
	struct vps_bytes y1 = {0}, bin = {0}, y2 = {0};
	if (fuzz_serialize(k, x, true, &y1) == VPS_EUNSUPPORTED) {
		fuzz_free(k, x);
		return;
	}
	if (y1.len == 0)
		fuzz_die("an accepted document does not serialize to YAML", k);
	if (fuzz_serialize(k, x, false, &bin) != VPS_OK)
		fuzz_die("an accepted document does not serialize to binary", k);
	void *a = NULL, *b = NULL;
	if (fuzz_parse(k, y1.data, y1.len, &a) != VPS_OK)
		fuzz_die("vps does not read the YAML it wrote", k);
	if (fuzz_parse(k, bin.data, bin.len, &b) != VPS_OK)
		fuzz_die("vps does not read the binary it wrote", k);
	if (fuzz_serialize(k, b, true, &y2) != VPS_OK)
		fuzz_die("a document read back does not serialize", k);
	if (y1.len != y2.len || memcmp(y1.data, y2.data, y1.len) != 0)
		fuzz_die("YAML -> binary -> YAML is not byte-identical", k);
	fuzz_show(k, d, n, true, &y1);
	vps_bytes_release(&y1);
	vps_bytes_release(&y2);
	vps_bytes_release(&bin);
	fuzz_free(k, a);
	fuzz_free(k, b);
	fuzz_free(k, x);
}

#endif
