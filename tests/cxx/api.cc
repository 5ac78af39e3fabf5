// A C++ program against libvps: every public header through vps/vps.h,
// compiled as strict C++11, the functions linked by their C names (the
// headers' extern "C"), and real calls: a layout of a model file, a plan
// and its staging verified, the options structs from their INIT macros,
// result codes by name, the version.
//
//   cxx_api MODEL_FILE   (make cxx; tests/bats/install.bats builds it
//                         against an installed library too)
#include <vps/vps.h>

#include <cstdio>
#include <cstring>
#include <string>

static int failures = 0;

static void check(bool ok, const char *what)
{
	if (!ok) {
		std::fprintf(stderr, "cxx_api: FAILED: %s (%s)\n", what, vps_last_error());
		failures++;
	}
}

static vps_layout *layout(const char *model, const char *spec)
{
	vps_model m;
	vps_parallel p;
	vps_devices d;
	vps_layout *l = NULL;
	vps_parallel_init(&p);
	vps_devices_packed(&d, 8, 0);
	if (vps_model_load(&m, model, NULL) || vps_parallel_parse(&p, spec, "--parallel") ||
	    vps_layout_new(&l, &m, &p, &d, spec))
		return NULL;
	return l;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: cxx_api MODEL_FILE\n");
		return 2;
	}
	// the header's version and the library's agree
	check(std::string(vps_version()) == VPS_VERSION_STRING, "vps_version() is VPS_VERSION_STRING");
	check(vps_version_number() == VPS_VERSION_NUMBER, "vps_version_number() is VPS_VERSION_NUMBER");

	// a missing model is VPS_ENOTFOUND, by name
	vps_model none;
	vps_result_t rc = vps_model_load(&none, "no-such-model", "");
	check(rc == VPS_ENOTFOUND, "a missing model is VPS_ENOTFOUND");
	const char *name = vps_result_name(rc);
	check(name && !std::strcmp(name, "VPS_ENOTFOUND"), "vps_result_name(VPS_ENOTFOUND)");

	vps_layout *a = layout(argv[1], "tp=2,dp=2,zero=1"), *b = layout(argv[1], "tp=1,pp=2,dp=2,zero=1");
	check(a && b, "two layouts of the model");
	if (!a || !b) {
		vps_layout_free(a);
		vps_layout_free(b);
		return 1;
	}
	// an options struct that is not from its INIT macro is refused
	vps_plan_opts unset;
	std::memset(&unset, 0, sizeof(unset));
	vps_plan *p = NULL;
	rc = vps_plan_compute(&p, a, b, &unset);
	check(rc == VPS_EINPUT && !std::strcmp(vps_result_name(rc), "VPS_EINPUT"), "version 0 is VPS_EINPUT");

	vps_plan_opts po = VPS_PLAN_OPTS_INIT;
	vps_exec_opts eo = VPS_EXEC_OPTS_INIT;
	vps_trainer_opts to = VPS_TRAINER_OPTS_INIT;
	check(po.version == VPS_PLAN_OPTS_VERSION && po.rank == -1, "VPS_PLAN_OPTS_INIT");
	check(eo.version == VPS_EXEC_OPTS_VERSION && eo.device == -1 && eo.timeout == 60.0, "VPS_EXEC_OPTS_INIT");
	check(to.version == VPS_TRAINER_OPTS_VERSION && to.device == -1, "VPS_TRAINER_OPTS_INIT");
	rc = vps_plan_compute(&p, a, b, &po);
	check(rc == VPS_OK, "plan");
	if (rc) {
		vps_layout_free(a);
		vps_layout_free(b);
		return 1;
	}
	std::printf("vps %s: %s: %zu pieces", vps_version(), vps_layout_model(a)->name, p->npieces);
	// the staged plan owns the plan (and the plan the layouts)
	vps_staged *s = NULL;
	rc = vps_stage(&s, p, (int64_t)1 << 20, -1);
	check(rc == VPS_OK, "stage within 1 MiB");
	if (rc) {
		vps_plan_free(p);
		return 1;
	}
	vps_verify_report rep;
	std::memset(&rep, 0, sizeof(rep));
	rc = vps_verify_staged(s, &rep);
	check(rc == VPS_OK && rep.violations == 0, "the staged plan verifies");
	std::printf(", %zu stages; verify: %s: %s\n", s->nstages, vps_result_name(rc), rep.summary);
	vps_verify_report_release(&rep);
	vps_staged_free(s);
	return failures ? 1 : 0;
}
