/* vps-exec: execute a staged plan on one rank. */
#include <getopt.h>
#include <inttypes.h>
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
	"                [--wait] [--check]\n"
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
	"  --wait              connect first, then wait for the trainer's request\n"
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

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"registry", required_argument, NULL, 'R'}, {"transport", required_argument, NULL, 'T'},
		{"device", required_argument, NULL, 'D'},
		{"timeout", required_argument, NULL, 't'},  {"request-timeout", required_argument, NULL, 'Q'},
		{"rank", required_argument, NULL, 'r'},
		{"world", required_argument, NULL, 'w'},    {"local-rank", required_argument, NULL, 'l'},
		{"master", required_argument, NULL, 'm'},   {"token", required_argument, NULL, 'k'},
		{"token-file", required_argument, NULL, 'K'}, {"bind", required_argument, NULL, 'B'},
		{"new-token", no_argument, NULL, 'N'},
		{"wait", no_argument, NULL, 'W'},           {"serve", no_argument, NULL, 'S'},
		{"check", no_argument, NULL, 'c'},          {"report", required_argument, NULL, 'p'},
		{"quiet", no_argument, NULL, 'q'},          {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},        {0, 0, 0, 0}};
	struct launch l = {-1, -1, -1, "", 0, NULL};
	struct vps_exec_opts o = {0};
	const char *report = NULL;
	bool serve = false, quiet = false;
	double timeout = 60;
	int c;
	o.device = -1;
	o.fault_stage = -1;
	o.request_timeout = 600;
	/* VPS_FAULT=KIND:STAGE, KIND stall, exit or kill-trainer, STAGE a number
	 * or "claim": a silent rank, a dead rank, a dead trainer, for tests */
	const char *fault = getenv("VPS_FAULT");
	if (fault && *fault) {
		static const char *const kinds[] = {"stall:", "exit:", "kill-trainer:"};
		const char *colon = strchr(fault, ':');
		o.fault = -1;
		for (int k = 0; k < 3; k++)
			if (!strncmp(fault, kinds[k], strlen(kinds[k])))
				o.fault = k;
		if (colon && !strcmp(colon + 1, "claim"))
			o.fault_stage = VPS_FAULT_AT_CLAIM;
		else if (!colon || !tool_parse_i64(colon + 1, &o.fault_stage) || o.fault_stage < 0)
			o.fault = -1;
		if (o.fault < 0)
			return tool_usage_error("VPS_FAULT=%s: expected stall, exit or kill-trainer, ':', then a stage or 'claim'",
						fault);
	}
	const char *token_file = NULL;
	char token[VPS_TOKEN_MAX + 3];
	while ((c = getopt_long(argc, argv, "hq", opts, NULL)) != -1) {
		switch (c) {
		case 'R': o.registry = optarg; break;
		case 'T':
			if (!strcmp(optarg, "tcp"))
				o.transport = VPS_EXEC_TCP;
			else if (!strcmp(optarg, "ipc"))
				o.transport = VPS_EXEC_IPC;
			else if (!strcmp(optarg, "nccl"))
				o.transport = VPS_EXEC_NCCL;
			else if (!strcmp(optarg, "auto"))
				o.transport = VPS_EXEC_AUTO;
			else
				return tool_usage_error("--transport %s: expected tcp, ipc, nccl or auto", optarg);
			break;
		case 'D': {
			int64_t d;
			if (!tool_parse_i64(optarg, &d) || d < 0 || d > 1023)
				return tool_usage_error("--device: '%s' is not a GPU number", optarg);
			o.device = (int)d;
			break;
		}
		case 't':
		case 'Q': {
			char *end;
			double v = strtod(optarg, &end);
			if (*end || v <= 0)
				return tool_usage_error("%s: '%s' is not a positive number of seconds",
							c == 't' ? "--timeout" : "--request-timeout", optarg);
			if (c == 't')
				timeout = v;
			else
				o.request_timeout = v;
			break;
		}
		case 'r':
			if (!tool_parse_i64(optarg, &l.rank))
				return tool_usage_error("--rank: '%s' is not a rank", optarg);
			break;
		case 'w':
			if (!tool_parse_i64(optarg, &l.world) || !l.world)
				return tool_usage_error("--world: '%s' is not a world size", optarg);
			break;
		case 'l':
			if (!tool_parse_i64(optarg, &l.local_rank))
				return tool_usage_error("--local-rank: '%s' is not a rank", optarg);
			break;
		case 'm': {
			const char *colon = strrchr(optarg, ':');
			int64_t port;
			if (!colon || colon == optarg || !tool_parse_i64(colon + 1, &port) || port < 1 || port > 65535)
				return tool_usage_error("--master: '%s' is not HOST:PORT", optarg);
			snprintf(l.master_host, sizeof(l.master_host), "%.*s", (int)(colon - optarg), optarg);
			l.master_port = (int)port;
			break;
		}
		case 'k':
			return tool_usage_error("--token: a secret on the command line shows in ps; export VPS_TOKEN or pass "
						"--token-file (vps-exec(1) SECURITY)");
		case 'K': token_file = optarg; break;
		case 'B': o.bind = optarg; break;
		case 'N': {
			char fresh[VPS_TOKEN_NEW + 1];
			if (vps_exec_new_token(fresh))
				return tool_fail(VPS_ESYS);
			printf("%s\n", fresh);
			return tool_finish(EXIT_OK);
		}
		case 'W': o.wait = true; break;
		case 'S': serve = true; break;
		case 'c': o.check = true; break;
		case 'p': report = optarg; break;
		case 'q': quiet = true; break;
		case 'h': fputs(usage, stdout); return tool_finish(EXIT_OK);
		case 'V': printf("vps-exec %s\n", VPS_VERSION_STRING); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	size_t nplans = (size_t)(argc - optind);
	if (!nplans)
		return tool_usage_error("expected a staged plan\n%s", usage);
	if (nplans > 1 && !serve)
		return tool_usage_error("several staged plans need --serve");
	if (vps_exec_token(token_file, token, sizeof(token)))
		return tool_usage_error("%s", vps_last_error());
	o.token = token;
	int st = launch_resolve(&l, true);
	if (st)
		return st;
	o.rank = l.rank;
	o.local_rank = l.local_rank;
	o.master_host = l.master_host;
	o.master_port = l.master_port;
	o.timeout = timeout;
	o.notice = say;
	o.notice_ctx = &l.rank;
	o.plan_names = (const char *const *)&argv[optind];
	if (isatty(STDERR_FILENO) && !quiet) {
		o.progress = progress;
	}
	struct vps_staged **plans = calloc(nplans, sizeof(*plans));
	struct vps_exec_report *reps = calloc(nplans, sizeof(*reps));
	vps_result_t rc = VPS_OK;
	int status = EXIT_OK;
	if (!plans || !reps) {
		free(plans);
		free(reps);
		return tool_usage_error("out of memory");
	}
	for (size_t i = 0; i < nplans && !rc; i++)
		rc = vps_staged_load(&plans[i], argv[optind + (int)i]);
	if (!rc && l.world >= 0 && l.world != vps_world_size(plans[0]->plan->world)) {
		status = tool_usage_error("the launcher's world is %" PRId64 ", the plan's transition world %" PRId64,
					  l.world, vps_world_size(plans[0]->plan->world));
		goto done;
	}
	if (!rc)
		rc = vps_exec_run(plans, nplans, &o, reps);
	if (rc) {
		fprintf(stderr, "vps-exec: rank %" PRId64 ": %s\n", l.rank, *vps_last_error() ? vps_last_error() : vps_strerror(rc));
		status = tool_status(rc);
		goto done;
	}
	for (size_t i = 0; i < nplans && !quiet; i++) {
		const struct vps_exec_report *r = &reps[i];
		double moved = (double)(r->bytes_sent + r->bytes_received);
		/* the units of the budgets (vps(7) UNITS); --report keeps the exact numbers */
		char sent[VPS_UNITS_LEN], recv[VPS_UNITS_LEN], copied[VPS_UNITS_LEN], took[VPS_UNITS_LEN],
			rate[VPS_UNITS_LEN], pause[VPS_UNITS_LEN], setup[VPS_UNITS_LEN];
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
	if (report) {
		struct vps_bytes b = {0};
		rc = vps_exec_report_yaml(reps, nplans, &b);
		if (!rc)
			rc = vps_write_output(report, &b, false);
		vps_bytes_release(&b);
		if (rc)
			status = tool_fail(rc);
	}
	status = tool_finish(status);
done:
	for (size_t i = 0; i < nplans; i++) {
		vps_staged_free(plans[i]);
		vps_exec_report_release(&reps[i]);
	}
	free(plans);
	free(reps);
	return status;
}
