/* vps-stage: turn a plan into the stages every rank executes. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/stage.h"

const char *tool_name = "vps-stage";

static const char usage[] =
	"usage: vps-stage (--budget SIZE | --budgets FILE) [--rank R] [--stats] [--yaml] [-o FILE] PLAN\n"
	"       vps-stage -h | --version\n"
	"options:\n"
	"  --budget SIZE       transient memory per rank for send and receive buffers (4096, 512MiB, 2GiB)\n"
	"  --budgets FILE      per-rank budgets (vps: budgets); the smallest rules\n"
	"  --rank R            write only world rank R's transfers (the stages are the world's)\n"
	"  --stats             print statistics as YAML instead of the staged plan\n"
	"  --yaml              write YAML instead of binary\n"
	"  -o, --output FILE   write FILE (through a temporary and a rename)\n"
	"  -h, --help          this text\n"
	"  --version           the version\n";

static void print_stats(const struct vps_staged *s)
{
	struct vps_stage_stats st;
	vps_staged_stats(s, &st);
	int64_t W = vps_world_size(s->plan->world);
	printf("model: %s\n", vps_layout_model(s->plan->a)->name);
	printf("world: %" PRId64 "\n", W);
	printf("budget: %" PRId64 "\n", s->budget);
	printf("steps: %" PRId64 "\n", s->steps);
	printf("steps_used: %" PRId64 "\n", st.steps_used);
	printf("units: %" PRId64 "\n", st.units);
	printf("stages: %" PRId64 "\n", st.stages);
	printf("transfers: %" PRId64 "\n", st.transfers);
	printf("bytes_moved: %" PRId64 "\n", st.bytes_moved);
	printf("bytes_retained: %" PRId64 "\n", st.bytes_retained);
	printf("copies_before_merging: %" PRId64 "\n", st.pieces);
	printf("copies_after_merging: %" PRId64 "\n", st.ops);
	printf("merge_ratio: %.2f\n", st.ops ? (double)st.pieces / (double)st.ops : 0.0);
	printf("peak_max: %" PRId64 "\n", st.peak_max);
	printf("stage_bytes: [");
	for (size_t i = 0; i < s->nstages; i++)
		printf("%s%" PRId64, i ? ", " : "", s->stages[i].bytes);
	printf("]\n");
	int64_t *peak = calloc((size_t)W, sizeof(*peak)), *cur = calloc((size_t)W, sizeof(*cur));
	if (!peak || !cur) {
		free(peak);
		free(cur);
		return;
	}
	int64_t stage = -1;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (x->stage != stage) {
			memset(cur, 0, (size_t)W * sizeof(*cur));
			stage = x->stage;
		}
		cur[x->src] += x->bytes;
		if (x->dst != x->src)
			cur[x->dst] += x->bytes;
		if (cur[x->src] > peak[x->src])
			peak[x->src] = cur[x->src];
		if (cur[x->dst] > peak[x->dst])
			peak[x->dst] = cur[x->dst];
	}
	printf("peak_per_rank: [");
	for (int64_t r = 0; r < W; r++)
		printf("%s%" PRId64, r ? ", " : "", peak[r]);
	printf("]\n");
	free(peak);
	free(cur);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"budget", required_argument, NULL, 'b'}, {"budgets", required_argument, NULL, 'B'},
		{"rank", required_argument, NULL, 'r'},   {"stats", no_argument, NULL, 's'},
		{"yaml", no_argument, NULL, 'y'},         {"output", required_argument, NULL, 'o'},
		{"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
		{0, 0, 0, 0}};
	const char *out = NULL, *budgets = NULL;
	int64_t budget = -1, rank = -1;
	bool stats = false, yaml = false;
	int c;
	vps_result_t rc;
	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (vps_parse_bytes(optarg, &budget))
				return tool_usage_error("--budget: %s", vps_last_error());
			break;
		case 'B': budgets = optarg; break;
		case 'r':
			if (!tool_parse_i64(optarg, &rank))
				return tool_usage_error("--rank: '%s' is not a rank", optarg);
			break;
		case 's': stats = true; break;
		case 'y': yaml = true; break;
		case 'o': out = optarg; break;
		case 'h': fputs(usage, stdout); return tool_finish(EXIT_OK);
		case 'V': printf("vps-stage %s\n", VPS_VERSION_STRING); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	if (argc - optind != 1)
		return tool_usage_error("expected one plan\n%s", usage);
	if (budget < 0 && !budgets)
		return tool_usage_error("--budget or --budgets is required");
	if (budgets) {
		int64_t b;
		if ((rc = vps_budgets_load(budgets, &b)))
			return tool_fail(rc);
		budget = budget < 0 || b < budget ? b : budget;
	}
	struct vps_plan *p = NULL;
	struct vps_staged *s = NULL;
	struct vps_bytes bytes = {0};
	int status;
	const char *name = strcmp(argv[optind], "-") ? argv[optind] : "<stdin>";
	if ((rc = vps_plan_load(&p, argv[optind])) || (rc = vps_plan_check_hash(p, name)))
		goto fail;
	if ((rc = vps_stage(&s, p, budget, rank)))
		goto fail;
	p = NULL;
	if (stats) {
		print_stats(s);
		status = tool_finish(EXIT_OK);
		goto done;
	}
	if ((rc = vps_staged_serialize(s, yaml, &bytes)) || (rc = vps_write_output(out, &bytes, !yaml)))
		goto fail;
	status = tool_finish(EXIT_OK);
	goto done;
fail:
	status = tool_fail(rc);
done:
	vps_bytes_release(&bytes);
	vps_staged_free(s);
	vps_plan_free(p);
	return status;
}
