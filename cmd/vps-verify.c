/* vps-verify: check layouts, plans and staged plans. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/layout.h"
#include "vps/plan.h"
#include "vps/stage.h"
#include "vps/verify.h"

const char *tool_name = "vps-verify";

static const char usage[] =
	"usage: vps-verify [-q] FILE...\n"
	"       vps-verify -h | --version\n"
	"options:\n"
	"  -q, --quiet    print nothing for a file that passes\n"
	"  -h, --help     this text\n"
	"  --version      the version\n";

static int report(const char *name, const struct vps_verify_report *rep, bool quiet)
{
	for (size_t i = 0; i < rep->nmessages; i++)
		printf("%s: %s\n", name, rep->messages[i]);
	if (rep->violations > (int64_t)rep->nmessages)
		printf("%s: ... and %lld more\n", name, (long long)(rep->violations - (int64_t)rep->nmessages));
	if (rep->violations) {
		printf("%s: FAILED: %lld violation%s; %s\n", name, (long long)rep->violations,
		       rep->violations == 1 ? "" : "s", rep->summary);
		return EXIT_CHECK;
	}
	if (!quiet)
		printf("%s: ok: %s\n", name, rep->summary);
	return EXIT_OK;
}

/* A document too large for this machine is a fact about the input: exit 2,
 * naming the file and what did not fit. The checks' message says what (each
 * names what it could not hold); a reader runs out somewhere in its
 * structures, so reading says how large the input was. */
static int out_of_memory(const char *name, bool checking, size_t len)
{
	if (checking)
		fprintf(stderr, "%s: %s: checking it: %s\n", tool_name, name, vps_last_error());
	else if (len)
		fprintf(stderr, "%s: %s: reading it: out of memory: what its %zu bytes describe does not fit\n", tool_name,
			name, len);
	else
		fprintf(stderr, "%s: %s: reading it: out of memory\n", tool_name, name);
	return EXIT_USAGE;
}

/* Check one file: its exit status. */
static int verify_one(const char *path, bool quiet)
{
	const char *name = strcmp(path, "-") ? path : "<stdin>";
	int status;
	struct vps_bytes b;
	struct vps_verify_report rep = {0};
	vps_result_t rc = vps_read_file(path, &b);
	if (rc == VPS_ENOMEM)
		return out_of_memory(name, false, 0);
	if (rc)
		return tool_fail(rc);
	enum vps_doc_kind kind = vps_doc_sniff(b.data, b.len);
	bool checking = false;
	switch (kind) {
	case VPS_DOC_LAYOUT: {
		struct vps_layout *l;
		rc = vps_layout_parse(&l, name, b.data, b.len);
		if (!rc) {
			checking = true;
			rc = vps_verify_layout(l, &rep);
			vps_layout_free(l);
		}
		break;
	}
	case VPS_DOC_PLAN: {
		struct vps_plan *p;
		rc = vps_plan_parse(&p, name, b.data, b.len);
		if (!rc) {
			checking = true;
			rc = vps_verify_plan(p, &rep);
			vps_plan_free(p);
		}
		break;
	}
	case VPS_DOC_STAGED: {
		struct vps_staged *st;
		rc = vps_staged_parse(&st, name, b.data, b.len);
		if (!rc) {
			checking = true;
			rc = vps_verify_staged(st, &rep);
			vps_staged_free(st);
		}
		break;
	}
	default:
		vps_bytes_release(&b);
		if (kind)
			return tool_fail(vps_doc_wrong_kind(name, kind, VPS_DOC_BIT(VPS_DOC_LAYOUT) | VPS_DOC_BIT(VPS_DOC_PLAN) |
									  VPS_DOC_BIT(VPS_DOC_STAGED)));
		return tool_error(EXIT_USAGE, "%s: not a vps layout, plan or staged plan", name);
	}
	size_t len = b.len;
	vps_bytes_release(&b);
	if (rc == VPS_ENOMEM)
		return out_of_memory(name, checking, len);
	if (rc)
		return tool_fail(rc);
	status = report(name, &rep, quiet);
	vps_verify_report_release(&rep);
	return status;
}

int main(int argc, char **argv)
{
	struct tool_option options[] = {TOOL_OPT_END};
	struct tool_cli cli = {.usage = usage, .shared = TOOL_QUIET, .options = options};
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED)
		status = tool_operands(&cli, 1, SIZE_MAX, "one or more files");
	if (status != TOOL_PARSED)
		return status;
	/* like gzip -t: every file checked, the exit status the worst (2, bad
	 * input, over 1, a violation); each line on time, in file order */
	status = EXIT_OK;
	for (size_t i = 0; i < cli.noperands; i++) {
		int s = verify_one(cli.operands[i], cli.common.quiet);
		fflush(stdout);
		if (s > status)
			status = s;
	}
	return tool_finish(status);
}
