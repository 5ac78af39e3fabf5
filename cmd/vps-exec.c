/* vps-exec: execute a staged plan on one rank. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "launcher.h"
#include "vps/exec.h"
#include "vps/io.h"
#include "vps/units.h"

const char *tool_name = "vps-exec";

static const char usage[] =
	"usage: vps-exec [--registry NAME] [--transport tcp|ipc|nccl|auto] [--device N]\n"
	"                [--timeout S] [--request-timeout S]\n"
	"                [--rank R] [--world W]\n"
	"                [--local-rank L] [--master HOST:PORT] [--bind ADDR] [--token-file FILE]\n"
	"                [--wait[=S]] [--check]\n"
	"                [--report FILE] [-q] STAGED\n"
	"       vps-exec --serve [options] STAGED STAGED...\n"
	"       vps-exec --new-token\n"
	"       vps-exec -h | --version\n"
	"options:\n"
	"  --registry NAME     the trainer's registry (default vps-%j-%r); %j the job (its staging), %r world\n"
	"                      rank, %a source rank, %b target rank, %l local rank, %% a percent sign\n"
	"  --transport T       how bytes move: tcp (host memory over TCP, the default), ipc (ranks of one\n"
	"                      node map each other's host or GPU buffers), nccl (GPU memory), auto (ipc\n"
	"                      within a node, nccl across)\n"
	"  --device N          the GPU (default: the local rank modulo the visible GPUs)\n"
	"  --timeout S         seconds without progress before giving up (default 60)\n"
	"  --request-timeout S seconds the ranks' trainers may request the switch apart, and this rank's\n"
	"                      trainer may take to request it (default 600)\n"
	"  --rank R            world rank (default: RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK)\n"
	"  --world W           world size, checked against the plan (default: WORLD_SIZE, ...)\n"
	"  --local-rank L      rank on this node (default: LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK)\n"
	"  --master HOST:PORT  rank 0's rendezvous (default: MASTER_ADDR, MASTER_PORT)\n"
	"  --bind ADDR         listen on this address (default: the master's on rank 0, the one that\n"
	"                      reaches the master on the others)\n"
	"  --token-file FILE   the job token, in a file only this user can read (default: VPS_TOKEN);\n"
	"                      peers that cannot prove it are dropped\n"
	"  --new-token         print a fresh job token and exit\n"
	"  --wait[=S]          connect first, then wait for the trainer's request; with S, wait at most S\n"
	"                      seconds for its registry to appear\n"
	"  --serve             one switch per STAGED, in order, on the same connections\n"
	"  --check             digest the state before and after; done only when they match\n"
	"  --report FILE       write the report as YAML (- for standard output)\n"
	"  -q, --quiet         no summary line\n"
	"  -h, --help          this text\n"
	"  --version           the version\n";

static void say(void *ctx, const char *message)
{
	fprintf(stderr, "vps-exec: rank %" PRId64 ": %s\n", *(const int64_t *)ctx, message);
}

static void progress(void *ctx, int64_t stage, int64_t nstages, int64_t bytes, double seconds)
{
	char b[VPS_UNITS_LEN], t[VPS_UNITS_LEN];
	(void)ctx;
	fprintf(stderr, "\rvps-exec: stage %" PRId64 "/%" PRId64 ": %s in %s   ", stage + 1, nstages,
		vps_format_bytes(bytes, b, sizeof(b)), vps_format_seconds(seconds, t, sizeof(t)));
	if (stage + 1 == nstages)
		fputc('\n', stderr);
}

#ifdef VPS_TEST_FAULTS
#include "exec/fault.h"

/* The tests' executor (BUILDDIR/fault-bin/vps-exec) alone: VPS_FAULT=KIND:STAGE,
 * KIND stall, exit, kill-trainer or cut, STAGE a number or "claim": a
 * silent rank, a dead rank, a dead trainer, broken links (docs/exec.md,
 * "Faults for the tests"). */
static bool fault_from_env(void)
{
	static const char *const kinds[] = {"stall:", "exit:", "kill-trainer:", "cut:"};
	const char *fault = getenv("VPS_FAULT");
	if (!fault || !*fault)
		return true;
	const char *colon = strchr(fault, ':');
	int kind = -1;
	int64_t stage = -1;
	for (int k = 0; k < 4; k++)
		if (!strncmp(fault, kinds[k], strlen(kinds[k])))
			kind = k;
	if (colon && !strcmp(colon + 1, "claim"))
		stage = VPS_FAULT_AT_CLAIM;
	else if (!colon || !tool_parse_i64(colon + 1, &stage) || stage < 0)
		kind = -1;
	if (kind >= 0) {
		vps_exec_set_fault((enum vps_exec_fault)kind, stage);
		return true;
	}
	tool_error(EXIT_USAGE, "VPS_FAULT=%s: expected stall, exit, kill-trainer or cut, ':', then a stage or 'claim'", fault);
	return false;
}
#endif

static bool parse_transport(const char *arg, void *opts, char *why, size_t n)
{
	static const char *const names[] = {[VPS_EXEC_TCP] = "tcp", [VPS_EXEC_IPC] = "ipc", [VPS_EXEC_NCCL] = "nccl",
					    [VPS_EXEC_AUTO] = "auto"};
	struct vps_exec_opts *o = opts;
	for (size_t t = 0; t < sizeof(names) / sizeof(names[0]); t++)
		if (!strcmp(arg, names[t])) {
			o->transport = (enum vps_exec_transport)t;
			return true;
		}
	snprintf(why, n, "'%s' is not tcp, ipc, nccl or auto", arg);
	return false;
}

/* --wait, or --wait=S: the registry may take at most S seconds to appear. */
static bool parse_wait(const char *arg, void *opts, char *why, size_t n)
{
	struct vps_exec_opts *o = opts;
	o->wait = true;
	if (!arg)
		return true;
	char *end;
	errno = 0;
	double s = strtod(arg, &end);
	if (*arg && !*end && !errno && isfinite(s) && s > 0) {
		o->wait_limit = s;
		return true;
	}
	snprintf(why, n, "'%s' is not a positive number of seconds", arg);
	return false;
}

static bool refuse_token(const char *arg, void *unused, char *why, size_t n)
{
	(void)arg;
	(void)unused;
	snprintf(why, n, "a secret on the command line shows in ps; export VPS_TOKEN or pass --token-file "
			 "(vps-exec(1) SECURITY)");
	return false;
}

static int new_token(void)
{
	char fresh[VPS_TOKEN_NEW + 1];
	vps_result_t rc = vps_exec_new_token(fresh);
	if (rc)
		return tool_fail(rc);
	printf("%s\n", fresh);
	return tool_finish(EXIT_OK);
}

/* One line a switch: what moved, how fast, the digest's verdict. */
static void print_report(const struct vps_exec_report *r)
{
	double moved = (double)(r->bytes_sent + r->bytes_received);
	/* the units of the budgets (vps(7) UNITS); --report keeps the exact numbers */
	char sent[VPS_UNITS_LEN], recv[VPS_UNITS_LEN], copied[VPS_UNITS_LEN], took[VPS_UNITS_LEN], rate[VPS_UNITS_LEN],
		pause[VPS_UNITS_LEN], setup[VPS_UNITS_LEN];
	printf("vps-exec: rank %" PRId64 ": switch %" PRIu64 ": sent %s, received %s, copied %s in %s"
	       " (%s) over %s; pause %s, setup %s; digest: %s\n",
	       r->rank, r->switch_seq, vps_format_bytes(r->bytes_sent, sent, sizeof(sent)),
	       vps_format_bytes(r->bytes_received, recv, sizeof(recv)),
	       vps_format_bytes(r->bytes_copied, copied, sizeof(copied)),
	       vps_format_seconds(r->transfer_seconds, took, sizeof(took)),
	       vps_format_rate(r->transfer_seconds > 0 ? moved / r->transfer_seconds : 0.0, rate, sizeof(rate)),
	       r->transport, vps_format_seconds(r->pause_seconds, pause, sizeof(pause)),
	       vps_format_seconds(r->setup_seconds, setup, sizeof(setup)),
	       !r->checked ? "not checked" : r->digest_match ? "match" : "mismatch");
}

static vps_result_t write_report(const char *path, const struct vps_exec_report *reps, size_t n)
{
	struct vps_bytes b = {0};
	vps_result_t rc = vps_exec_report_yaml(reps, n, &b);
	if (!rc)
		rc = vps_write_output(path, &b, false);
	vps_bytes_release(&b);
	return rc;
}

/* What a run needs beyond the library's options. */
struct run {
	char **paths;
	size_t nplans;
	int64_t world; /* the launcher's, or -1 */
	const char *report;
	bool quiet;
};

/* Load the staged plans, switch, report. */
static int execute(const struct run *run, const struct vps_exec_opts *o)
{
	struct vps_staged **plans = calloc(run->nplans, sizeof(*plans));
	struct vps_exec_report *reps = calloc(run->nplans, sizeof(*reps));
	vps_result_t rc = plans && reps ? VPS_OK : VPS_ENOMEM;
	int status = EXIT_OK;
	for (size_t i = 0; i < run->nplans && !rc; i++)
		rc = vps_staged_load(&plans[i], run->paths[i]);
	if (!rc && run->world >= 0 && run->world != vps_world_size(plans[0]->plan->world)) {
		status = tool_error(EXIT_USAGE, "the launcher's world is %" PRId64 ", the plan's transition world %" PRId64,
				    run->world, vps_world_size(plans[0]->plan->world));
		goto done;
	}
	if (!rc)
		rc = vps_exec_run(plans, run->nplans, o, reps);
	if (rc) {
		char rank[32];
		snprintf(rank, sizeof(rank), "rank %" PRId64, o->rank);
		status = tool_fail_at(rank, rc);
		goto done;
	}
	for (size_t i = 0; i < run->nplans && !run->quiet; i++)
		print_report(&reps[i]);
	if (run->report && (rc = write_report(run->report, reps, run->nplans)))
		status = tool_fail(rc);
	status = tool_finish(status);
done:
	for (size_t i = 0; i < run->nplans && plans && reps; i++) {
		vps_staged_free(plans[i]);
		vps_exec_report_release(&reps[i]);
	}
	free(plans);
	free(reps);
	return status;
}

int main(int argc, char **argv)
{
	struct launch l = {-1, -1, -1, "", 0, NULL};
	struct vps_exec_opts o = VPS_EXEC_OPTS_INIT;
	const char *token_file = NULL, *report = NULL;
	char token[VPS_TOKEN_MAX + 3];
	bool serve = false, fresh_token = false;
	struct tool_option options[] = {
		TOOL_OPT_STRING(0, "registry", &o.registry),
		TOOL_OPT_FUNC(0, "transport", &o, parse_transport),
		TOOL_OPT_FUNC(0, "device", &o.device, tool_device),
		TOOL_OPT_SECONDS("timeout", &o.timeout),
		TOOL_OPT_SECONDS("request-timeout", &o.request_timeout),
		TOOL_OPT_RANK("rank", &l.rank),
		TOOL_OPT_INT("world", &l.world, 1, INT64_MAX, "a world size"),
		TOOL_OPT_RANK("local-rank", &l.local_rank),
		TOOL_OPT_FUNC(0, "master", &l, launch_master),
		TOOL_OPT_FUNC(0, "token", NULL, refuse_token),
		TOOL_OPT_STRING(0, "token-file", &token_file),
		TOOL_OPT_STRING(0, "bind", &o.bind),
		TOOL_OPT_BOOL(0, "new-token", &fresh_token),
		TOOL_OPT_FUNC_OPTIONAL("wait", &o, parse_wait),
		TOOL_OPT_BOOL(0, "serve", &serve),
		TOOL_OPT_BOOL(0, "check", &o.check),
		TOOL_OPT_STRING(0, "report", &report),
		TOOL_OPT_END,
	};
	struct tool_cli cli = {.usage = usage, .shared = TOOL_QUIET, .options = options};
#ifdef VPS_TEST_FAULTS
	if (!fault_from_env())
		return EXIT_USAGE;
#endif
	int status = tool_parse(&cli, argc, argv);
	if (status != TOOL_PARSED)
		return status;
	if (fresh_token)
		return new_token();
	if ((status = tool_operands(&cli, 1, SIZE_MAX, "a staged plan")) != TOOL_PARSED)
		return status;
	if (cli.noperands > 1 && !serve)
		return tool_usage_error("several staged plans need --serve");
	vps_result_t rc = vps_exec_token(token_file, token, sizeof(token));
	if (rc)
		return tool_fail(rc);
	if (!launch_resolve(&l, true))
		return EXIT_USAGE;
	o.token = token;
	o.rank = l.rank;
	o.local_rank = l.local_rank;
	o.master_host = l.master_host;
	o.master_port = l.master_port;
	o.notice = say;
	o.notice_ctx = &l.rank;
	/* on a terminal a wait says again every 10 s whom it waits for; in a log, once */
	o.notice_every = isatty(STDERR_FILENO) ? 10 : 0;
	o.plan_names = (const char *const *)cli.operands;
	if (isatty(STDERR_FILENO) && !cli.common.quiet)
		o.progress = progress;
	struct run run = {cli.operands, cli.noperands, l.world, report, cli.common.quiet};
	return execute(&run, &o);
}
