/* vps-stage: turn a plan into the stages every rank executes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/stage.h"
#include "vps/units.h"

const char *tool_name = "vps-stage";

static const char usage[] =
	"usage: vps-stage (--budget SIZE | --budgets FILE) [--rank R] [--stats] [--yaml] [-o FILE]\n"
	"                 [-H] [-q] PLAN\n"
	"       vps-stage -h | --version\n"
	"options:\n"
	"  --budget SIZE       transient memory per rank for send and receive buffers (4096, 512M,\n"
	"                      2G = 2GiB, 2GB = 2*10^9 bytes: vps(7) UNITS)\n"
	"  --budgets FILE      per-rank budgets (vps: budgets); the smallest rules\n"
	"  --rank R            of a global plan: write only world rank R's transfers (the stages are\n"
	"                      the world's); a one-rank plan (vps-plan --rank R) is staged as rank\n"
	"                      R's part, its stages cut by the executors when the switch starts\n"
	"  --stats             print statistics as YAML instead of the staged plan\n"
	"  --yaml              write YAML instead of binary\n"
	"  -o, --output FILE   write FILE (through a temporary and a rename)\n"
	"  -H, --human         --stats in KiB, MiB, GiB even when not on a terminal\n"
	"  -q, --quiet         no summary line on standard error\n"
	"  -h, --help          this text\n"
	"  --version           the version\n";

/* Largest send + receive buffers of each rank over the stages (of an
 * uncut staged plan: over its units, the most it could need in a stage),
 * ranks [*lo, *hi): all, or the one written. NULL when out of memory. */
static int64_t *peaks(const struct vps_staged *s, int64_t *lo_out, int64_t *hi_out)
{
	int64_t W = vps_world_size(s->plan->world);
	int64_t lo = s->scope < 0 ? 0 : s->scope, hi = s->scope < 0 ? W : s->scope + 1;
	int64_t *peak = calloc((size_t)(hi - lo), sizeof(*peak)), *cur = calloc((size_t)(hi - lo), sizeof(*cur));
	*lo_out = lo;
	*hi_out = hi;
	if (!peak || !cur) {
		free(peak);
		free(cur);
		return NULL;
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
	free(cur);
	return peak;
}

static void print_peaks(const struct vps_staged *s, bool h)
{
	int64_t lo, hi;
	int64_t *peak = peaks(s, &lo, &hi);
	if (!peak)
		return;
	char n[TOOL_NUM];
	printf("peak_per_rank: [");
	for (int64_t r = lo; r < hi; r++)
		printf("%s%s", r > lo ? ", " : "", tool_bytes(peak[r - lo], h, n, sizeof(n)));
	printf("]\n");
	free(peak);
}

static void print_stats(const struct vps_staged *s, bool h)
{
	struct vps_stage_stats st;
	char n[TOOL_NUM];
	vps_staged_stats(s, &st);
	printf("model: %s\n", vps_layout_model(s->plan->a)->name);
	printf("world: %" PRId64 "\n", vps_world_size(s->plan->world));
	printf("scope: %" PRId64 "\n", s->scope);
	printf("budget: %s\n", tool_bytes(s->budget, h, n, sizeof(n)));
	printf("steps: %" PRId64 "\n", s->steps);
	printf("steps_used: %" PRId64 "\n", st.steps_used);
	printf("units: %" PRId64 "\n", st.units);
	printf("cut: %s\n", s->cut ? "true" : "false");
	printf("stages: %" PRId64 "\n", st.stages);
	printf("transfers: %" PRId64 "\n", st.transfers);
	printf("bytes_moved: %s\n", tool_bytes(st.bytes_moved, h, n, sizeof(n)));
	printf("bytes_retained: %s\n", tool_bytes(st.bytes_retained, h, n, sizeof(n)));
	printf("copies_before_merging: %" PRId64 "\n", st.pieces);
	printf("copies_after_merging: %" PRId64 "\n", st.ops);
	printf("merge_ratio: %.2f\n", st.ops ? (double)st.pieces / (double)st.ops : 0.0);
	printf("peak_max: %s\n", tool_bytes(st.peak_max, h, n, sizeof(n)));
	printf("stage_bytes: [");
	for (size_t i = 0; i < s->nstages; i++)
		printf("%s%s", i ? ", " : "", tool_bytes(s->stages[i].bytes, h, n, sizeof(n)));
	printf("]\n");
	print_peaks(s, h);
}

/* The summary line (stderr): stages, budget, peak. */
static void print_summary(const struct vps_staged *s)
{
	struct vps_stage_stats st;
	char bud[VPS_UNITS_LEN], pk[VPS_UNITS_LEN], mv[VPS_UNITS_LEN];
	vps_staged_stats(s, &st);
	vps_format_bytes(s->budget, bud, sizeof(bud));
	vps_format_bytes(st.bytes_moved, mv, sizeof(mv));
	int64_t lo, hi, peak = st.peak_max;
	int64_t *per = s->scope >= 0 ? peaks(s, &lo, &hi) : NULL;
	if (per)
		peak = per[0];
	free(per);
	vps_format_bytes(peak, pk, sizeof(pk));
	if (s->scope < 0)
		fprintf(stderr, "staged: %" PRId64 " stage%s within a %s budget, peak %s a rank; %s moved in %" PRId64
			" transfer%s\n",
			st.stages, tool_s(st.stages), bud, pk, mv, st.transfers, tool_s(st.transfers));
	else if (s->cut)
		fprintf(stderr, "staged: rank %" PRId64 " in %" PRId64 " stage%s within a %s budget, its peak %s; %s sent and"
			" received in %" PRId64 " transfer%s\n",
			s->scope, st.stages, tool_s(st.stages), bud, pk, mv, st.transfers, tool_s(st.transfers));
	else
		fprintf(stderr, "staged: rank %" PRId64 " in %" PRId64 " unit%s, cut into stages when the switch starts; a %s"
			" budget, largest unit %s; %s sent and received in %" PRId64 " transfer%s\n",
			s->scope, st.units, tool_s(st.units), bud, pk, mv, st.transfers, tool_s(st.transfers));
}

/* Each stage is a rendezvous of the ranks and a round of messages: many
 * thousands of them are almost surely a budget given in the wrong unit. */
enum { MANY_STAGES = 5000, FEW_STAGES = 100 };

static void warn_many_stages(const struct vps_staged *s)
{
	struct vps_stage_stats st;
	vps_staged_stats(s, &st);
	if (st.stages <= MANY_STAGES)
		return;
	/* the stages shrink about as the budget grows */
	double want = (double)s->budget * (double)st.stages / FEW_STAGES;
	int64_t mib = 1 << 20, suggest = want >= 9e18 ? INT64_MAX : ((int64_t)want + mib - 1) / mib * mib;
	char bud[VPS_UNITS_LEN], sug[VPS_UNITS_LEN];
	fprintf(stderr, "vps-stage: warning: %" PRId64 " stages within a %s budget; a budget of about %s gives about %d\n",
		st.stages, vps_format_bytes(s->budget, bud, sizeof(bud)), vps_format_bytes(suggest, sug, sizeof(sug)),
		FEW_STAGES);
}

/* --budgets: the smallest of its budgets and --budget rules. */
static vps_result_t smallest_budget(const char *budgets, int64_t *budget)
{
	int64_t b;
	vps_result_t rc = vps_budgets_load(budgets, &b);
	if (!rc && (*budget < 0 || b < *budget))
		*budget = b;
	return rc;
}

int main(int argc, char **argv)
{
	const char *budgets = NULL;
	int64_t budget = -1, rank = -1;
	bool stats = false;
	struct tool_option options[] = {
		TOOL_OPT_SIZE("budget", &budget),
		TOOL_OPT_STRING(0, "budgets", &budgets),
		TOOL_OPT_RANK("rank", &rank),
		TOOL_OPT_BOOL(0, "stats", &stats),
		TOOL_OPT_END,
	};
	static const struct tool_rule rules[] = {{NULL, "budget budgets", NULL, NULL}, {0}};
	struct tool_cli cli = {.usage = usage,
			       .shared = TOOL_OUTPUT | TOOL_YAML | TOOL_HUMAN | TOOL_QUIET,
			       .options = options,
			       .rules = rules};
	struct tool_common *c = &cli.common;
	struct vps_plan *p = NULL;
	struct vps_staged *s = NULL;
	struct vps_bytes bytes = {0};
	vps_result_t rc;
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED)
		status = tool_operands(&cli, 1, 1, "one plan file, or - for standard input");
	if (status != TOOL_PARSED)
		return status;
	const char *path = cli.operands[0], *name = strcmp(path, "-") ? path : "<stdin>";
	if (budgets && (rc = smallest_budget(budgets, &budget)))
		goto fail;
	/* a global plan stays packed: staging reads its pieces once, in order */
	if ((rc = vps_plan_load_as(&p, path, true)) || (rc = vps_plan_check_hash(p, name)))
		goto fail;
	if ((rc = vps_stage(&s, p, budget, rank)))
		goto fail;
	p = NULL;
	if (stats) {
		print_stats(s, tool_human(c->human));
		status = tool_finish(EXIT_OK);
		goto done;
	}
	if ((rc = vps_staged_serialize(s, c->yaml, &bytes)) || (rc = vps_write_output(c->out, &bytes, !c->yaml)))
		goto fail;
	status = tool_finish(EXIT_OK);
	if (!status && !c->quiet)
		warn_many_stages(s);
	if (!status && tool_summary_wanted(c->quiet, c->out))
		print_summary(s);
	goto done;
fail:
	status = tool_fail(rc);
done:
	vps_bytes_release(&bytes);
	vps_staged_free(s);
	vps_plan_free(p);
	return status;
}
