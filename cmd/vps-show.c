/* vps-show: any vps document in YAML or binary; what a file is. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/show.h"
#include "vps/units.h"

const char *tool_name = "vps-show";

static const char usage[] =
	"usage: vps-show [--yaml | --json | --binary] [-o FILE] [-q] FILE\n"
	"       vps-show -t FILE...\n"
	"       vps-show -h | --version\n"
	"options:\n"
	"  --yaml             write YAML (the default)\n"
	"  --json             write JSON, on one line\n"
	"  --binary           write the binary encoding (not to a terminal)\n"
	"  -o, --output FILE  write FILE (through a temporary and a rename)\n"
	"  -q, --quiet        with -o: no line on standard error saying what was written\n"
	"  -t, --type         one line per FILE: its kind, model, worlds, hash and encoding\n"
	"  -h, --help         this text\n"
	"  --version          the version\n";

static const char *display_name(const char *path) { return strcmp(path, "-") ? path : "<stdin>"; }

/* "FILE: what" for each file; 2 at the end when one was not a vps document
 * (or could not be read), as file(1) goes on past a file it cannot open. */
static int type_files(char **paths, size_t n)
{
	int status = EXIT_OK;
	for (size_t i = 0; i < n; i++) {
		const char *name = display_name(paths[i]);
		struct vps_bytes b;
		struct vps_show_info info;
		char line[512];
		vps_result_t rc = vps_read_file(paths[i], &b);
		if (rc) {
			/* the message starts with the name */
			const char *msg = vps_last_error(), *e = msg;
			if (!strncmp(e, paths[i], strlen(paths[i])) && !strncmp(e + strlen(paths[i]), ": ", 2))
				e += strlen(paths[i]) + 2;
			printf("%s: cannot read (%s)\n", name, *e ? e : vps_strerror(rc));
			status = EXIT_USAGE;
			continue;
		}
		rc = vps_show_identify(name, b.data, b.len, &info);
		vps_bytes_release(&b);
		if (rc) {
			const char *e = vps_last_error();
			size_t nl = strlen(name);
			if (!strncmp(e, name, nl) && !strncmp(e + nl, ": ", 2))
				e += nl + 2;
			if (info.kind)
				printf("%s: vps %s, unreadable (%s)\n", name,
				       info.kind == VPS_DOC_STAGED ? "staged plan" : vps_doc_kind_name(info.kind), e);
			else
				printf("%s: %s\n", name, *e ? e : vps_strerror(rc));
			status = EXIT_USAGE;
			continue;
		}
		vps_show_describe(&info, line, sizeof(line));
		printf("%s: %s\n", name, line);
	}
	return tool_finish(status);
}

/* What was written into the file out, as -t says it, and its size. */
static void summary(const char *out, const struct vps_bytes *doc)
{
	struct vps_show_info info;
	char line[512], size[VPS_UNITS_LEN];
	if (vps_show_identify(out, doc->data, doc->len, &info))
		snprintf(line, sizeof(line), "vps %s", vps_doc_kind_name(info.kind));
	else
		vps_show_describe(&info, line, sizeof(line));
	fprintf(stderr, "%s: %s, %s\n", out, line, vps_format_bytes((int64_t)doc->len, size, sizeof(size)));
}

/* The document in path, converted to the encoding asked for, to out; one
 * line on standard error for a file written, as every tool says what it
 * wrote (a document on standard output is what the user reads). */
static int convert(const char *path, enum vps_show_encoding to, const char *out, bool quiet)
{
	struct vps_bytes in, doc = {0};
	vps_result_t rc = vps_read_file(path, &in);
	if (rc)
		return tool_fail(rc);
	rc = vps_show_convert(display_name(path), in.data, in.len, to, &doc);
	vps_bytes_release(&in);
	if (!rc)
		rc = vps_write_output(out, &doc, to == VPS_SHOW_BINARY);
	if (!rc && !quiet && out && strcmp(out, "-"))
		summary(out, &doc);
	vps_bytes_release(&doc);
	return rc ? tool_fail(rc) : tool_finish(EXIT_OK);
}

int main(int argc, char **argv)
{
	bool binary = false, type = false;
	struct tool_option options[] = {
		TOOL_OPT_BOOL(0, "binary", &binary),
		TOOL_OPT_BOOL('t', "type", &type),
		TOOL_OPT_END,
	};
	static const struct tool_rule rules[] = {
		{"type", NULL, "yaml json binary output quiet",
		 "-t prints one line per file: no --yaml, --json, --binary, -o or -q with it"},
		{"yaml", NULL, "json binary", NULL},
		{"json", NULL, "binary", NULL},
		{0},
	};
	struct tool_cli cli = {
		.usage = usage, .shared = TOOL_OUTPUT | TOOL_YAML | TOOL_JSON | TOOL_QUIET, .options = options, .rules = rules};
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED && type)
		status = tool_operands(&cli, 1, SIZE_MAX, "one or more files");
	else if (status == TOOL_PARSED)
		status = tool_operands(&cli, 1, 1, "one file, or - for standard input");
	if (status != TOOL_PARSED)
		return status;
	if (type)
		return type_files(cli.operands, cli.noperands);
	enum vps_show_encoding to = binary ? VPS_SHOW_BINARY : cli.common.json ? VPS_SHOW_JSON : VPS_SHOW_YAML;
	return convert(cli.operands[0], to, cli.common.out, cli.common.quiet);
}
