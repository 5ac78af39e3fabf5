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
	"  --rank R            of a global plan: write only world rank R's transfers (the stages are\n"
	"                      the world's); a one-rank plan (vps-plan --rank R) is staged as rank\n"
	"                      R's part, its stages cut by the executors when the switch starts\n"
	"  --stats             print statistics as YAML instead of the staged plan\n"
	"  --yaml              write YAML instead of binary\n"
	"  -o, --output FILE   write FILE (through a temporary and a rename)\n"
	"  -h, --help          this text\n"
	"  --version           the version\n";

/* Largest send + receive buffers of each rank over the stages (of an
 * uncut staged plan: over its units, the most it could need in a stage). */
static void print_peaks(const struct vps_staged *s)
{
	int64_t W = vps_world_size(s->plan->world);
	int64_t lo = s->scope < 0 ? 0 : s->scope, hi = s->scope < 0 ? W : s->scope + 1;
	int64_t *peak = calloc((size_t)(hi - lo), sizeof(*peak)), *cur = calloc((size_t)(hi - lo), sizeof(*cur));
	if (!peak || !cur) {
		free(peak);
		free(cur);
		return;
	}
	int64_t stage = -1, step = -1, chunk = -1;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (s->cut ? x->stage != stage : x->step != step || x->chunk != chunk) {
			memset(cur, 0, (size_t)(hi - lo) * sizeof(*cur));
			stage = x->stage;
			step = x->step;
			chunk = x->chunk;
		}
		int64_t r[2] = {x->src, x->dst};
		for (int k = 0; k < 1 + (x->dst != x->src); k++) {
			if (r[k] < lo || r[k] >= hi)
				continue;
			cur[r[k] - lo] += x->bytes;
			if (cur[r[k] - lo] > peak[r[k] - lo])
				peak[r[k] - lo] = cur[r[k] - lo];
		}
	}
	printf("peak_per_rank: [");
	for (int64_t r = lo; r < hi; r++)
		printf("%s%" PRId64, r > lo ? ", " : "", peak[r - lo]);
	printf("]\n");
	free(peak);
	free(cur);
}

static void print_stats(const struct vps_staged *s)
{
	struct vps_stage_stats st;
	vps_staged_stats(s, &st);
	printf("model: %s\n", vps_layout_model(s->plan->a)->name);
	printf("world: %" PRId64 "\n", vps_world_size(s->plan->world));
	printf("scope: %" PRId64 "\n", s->scope);
	printf("budget: %" PRId64 "\n", s->budget);
	printf("steps: %" PRId64 "\n", s->steps);
	printf("steps_used: %" PRId64 "\n", st.steps_used);
	printf("units: %" PRId64 "\n", st.units);
	printf("cut: %s\n", s->cut ? "true" : "false");
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
	print_peaks(s);
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
	/* a global plan stays packed: staging reads its pieces once, in order */
	if ((rc = vps_plan_load_as(&p, argv[optind], true)) || (rc = vps_plan_check_hash(p, name)))
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
