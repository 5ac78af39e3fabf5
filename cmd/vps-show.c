/* vps-show: any vps document in YAML or binary; what a file is. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/show.h"

const char *tool_name = "vps-show";

static const char usage[] =
	"usage: vps-show [--yaml | --json | --binary] [-o FILE] FILE\n"
	"       vps-show -t FILE...\n"
	"       vps-show -h | --version\n"
	"options:\n"
	"  --yaml             write YAML (the default)\n"
	"  --json             write JSON, on one line\n"
	"  --binary           write the binary encoding (not to a terminal)\n"
	"  -o, --output FILE  write FILE (through a temporary and a rename)\n"
	"  -t, --type         one line per FILE: its kind, model, worlds, hash and encoding\n"
	"  -h, --help         this text\n"
	"  --version          the version\n";

static const char *display_name(const char *path) { return strcmp(path, "-") ? path : "<stdin>"; }

/* "FILE: what" for each file; 2 at the end when one was not a vps document
 * (or could not be read), as file(1) goes on past a file it cannot open. */
static int type_files(char **paths, int n)
{
	int status = EXIT_OK;
	for (int i = 0; i < n; i++) {
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
			status = rc == VPS_ENOMEM ? EXIT_CHECK : EXIT_USAGE;
			continue;
		}
		vps_show_describe(&info, line, sizeof(line));
		printf("%s: %s\n", name, line);
	}
	return tool_finish(status);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"yaml", no_argument, NULL, 'y'},
					     {"binary", no_argument, NULL, 'b'},
					     {"json", no_argument, NULL, 'j'},
					     {"output", required_argument, NULL, 'o'},
					     {"type", no_argument, NULL, 't'},
					     {"help", no_argument, NULL, 'h'},
					     {"version", no_argument, NULL, 'V'},
					     {0, 0, 0, 0}};
	enum vps_show_encoding to = VPS_SHOW_YAML;
	bool type = false, chose = false;
	const char *out = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "ho:t", opts, NULL)) != -1) {
		switch (c) {
		case 'y': to = VPS_SHOW_YAML; chose = true; break;
		case 'b': to = VPS_SHOW_BINARY; chose = true; break;
		case 'j': to = VPS_SHOW_JSON; chose = true; break;
		case 'o': out = optarg; break;
		case 't': type = true; break;
		case 'h': fputs(usage, stdout); return tool_finish(EXIT_OK);
		case 'V': printf("vps-show %s\n", VPS_VERSION_STRING); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	if (type) {
		if (chose || out)
			return tool_usage_error("-t prints one line per file: no --yaml, --json, --binary or -o with it\n%s", usage);
		if (optind == argc)
			return tool_usage_error("-t: expected one or more files\n%s", usage);
		return type_files(argv + optind, argc - optind);
	}
	if (argc - optind != 1)
		return tool_usage_error("expected one file (- for standard input)\n%s", usage);
	const char *path = argv[optind];
	struct vps_bytes in, doc;
	vps_result_t rc = vps_read_file(path, &in);
	if (rc)
		return tool_fail(rc);
	rc = vps_show_convert(display_name(path), in.data, in.len, to, &doc);
	vps_bytes_release(&in);
	if (rc)
		return tool_fail(rc);
	rc = vps_write_output(out, &doc, to == VPS_SHOW_BINARY);
	vps_bytes_release(&doc);
	if (rc)
		return tool_fail(rc);
	return tool_finish(EXIT_OK);
}
