/* What programs depend on beyond each function: result codes with pinned
 * values and names, the version, options structs that carry theirs. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"

TEST(every_code_has_its_pinned_value_and_its_own_name)
{
	/* the values are ABI (vps/base.h): these never change */
	static const struct {
		vps_result_t rc;
		int value;
		const char *name;
	} codes[] = {
		{VPS_OK, 0, "VPS_OK"},
		{VPS_EINPUT, 1, "VPS_EINPUT"},
		{VPS_ECHECK, 2, "VPS_ECHECK"},
		{VPS_ESYS, 3, "VPS_ESYS"},
		{VPS_ENOMEM, 4, "VPS_ENOMEM"},
		{VPS_EFORMAT, 5, "VPS_EFORMAT"},
		{VPS_ECUDA, 6, "VPS_ECUDA"},
		{VPS_ENCCL, 7, "VPS_ENCCL"},
		{VPS_ETIMEOUT, 8, "VPS_ETIMEOUT"},
		{VPS_EPEER, 9, "VPS_EPEER"},
		{VPS_EUNSUPPORTED, 10, "VPS_EUNSUPPORTED"},
		{VPS_ENOTFOUND, 11, "VPS_ENOTFOUND"},
		{VPS_ESTALE, 12, "VPS_ESTALE"},
		{VPS_EBUSY, 13, "VPS_EBUSY"},
		{VPS_EINTERNAL, 14, "VPS_EINTERNAL"},
	};
	size_t n = sizeof(codes) / sizeof(codes[0]);
	for (size_t i = 0; i < n; i++) {
		CHECK_EQ(codes[i].rc, codes[i].value);
		const char *name = vps_result_name(codes[i].rc);
		CHECK(name && !strcmp(name, codes[i].name));
		CHECK(strcmp(vps_strerror(codes[i].rc), "unknown error") != 0);
	}
	/* a binding lists the codes as 0, 1, 2, ... up to the first NULL: it
	 * finds exactly these, each name once */
	size_t listed = 0;
	while (vps_result_name((vps_result_t)listed))
		listed++;
	CHECK_EQ(listed, n);
	for (size_t i = 0; i < listed; i++)
		for (size_t j = i + 1; j < listed; j++)
			CHECK(strcmp(vps_result_name((vps_result_t)i), vps_result_name((vps_result_t)j)) != 0);
}

TEST(an_unknown_code_has_no_name_and_a_plain_description)
{
	static const int unknown[] = {15, 16, 100, -1, 0x7fffffff};
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		CHECK(vps_result_name((vps_result_t)unknown[i]) == NULL);
		CHECK(!strcmp(vps_strerror((vps_result_t)unknown[i]), "unknown error"));
	}
}

TEST(the_headers_version_is_the_librarys)
{
	char made[32];
	snprintf(made, sizeof(made), "%d.%d.%d", VPS_VERSION_MAJOR, VPS_VERSION_MINOR, VPS_VERSION_PATCH);
	CHECK(!strcmp(made, VPS_VERSION_STRING));
	CHECK(!strcmp(vps_version(), VPS_VERSION_STRING));
	CHECK_EQ(vps_version_number(), VPS_VERSION_NUMBER);
	CHECK_EQ(VPS_VERSION_NUMBER, VPS_VERSION_MAJOR * 10000 + VPS_VERSION_MINOR * 100 + VPS_VERSION_PATCH);
}

TEST(options_from_their_init_macros_carry_their_version_and_the_defaults)
{
	struct vps_plan_opts po = VPS_PLAN_OPTS_INIT;
	struct vps_exec_opts eo = VPS_EXEC_OPTS_INIT;
	struct vps_trainer_opts to = VPS_TRAINER_OPTS_INIT;
	CHECK_EQ(po.version, VPS_PLAN_OPTS_VERSION);
	CHECK_EQ(po.rank, -1);
	CHECK(!po.train.known && !po.lost && !po.relay);
	CHECK(po.relay_mode == VPS_RELAY_AUTO && !po.topology);
	CHECK_EQ(eo.version, VPS_EXEC_OPTS_VERSION);
	CHECK_EQ(eo.transport, VPS_EXEC_TCP);
	CHECK_EQ(eo.device, -1);
	CHECK(eo.timeout == 60 && eo.request_timeout == 600 && !eo.registry && !eo.progress && !eo.plan_names);
	/* the macro lists every field in order: a field added in the middle
	 * shifts the values after it, which these catch */
	CHECK(!eo.wait && !eo.check && !eo.notice && !eo.notice_ctx && eo.notice_every == 0 && eo.wait_limit == 0);
	CHECK_EQ(to.version, VPS_TRAINER_OPTS_VERSION);
	CHECK(to.steps_before == 3 && to.steps_after == 2 && to.micro_batch == 1 && to.timeout == 120);
	CHECK_EQ(to.device, -1);
}

/* struct vps_plan_opts of version 1 predates relay_mode: relay false is
 * no relays there, as it was, whatever the fields after it hold; true is
 * VPS_RELAY_ALWAYS at either version. A mode that names none is refused. */
TEST(version_1_plan_options_plan_without_relays_unless_asked)
{
	for (int version = 1; version <= 2; version++)
		for (int relay = 0; relay < 2; relay++) {
			struct vps_plan *p = NULL;
			struct vps_plan_opts po = VPS_PLAN_OPTS_INIT;
			po.version = (unsigned)version;
			po.relay = relay;
			if (version == 1)
				po.relay_mode = (enum vps_relay)77; /* past what version 1 has: never read */
			CHECK_OK(vps_plan_compute(&p, test_layout("tiny-llama", "tp=1,dp=1,zero=1", 8, 0),
						  test_layout("tiny-llama", "tp=1,dp=4,zero=1", 8, 0), &po));
			if (p)
				CHECK_EQ(p->relay, relay ? VPS_RELAY_ALWAYS : version == 1 ? VPS_RELAY_NEVER : VPS_RELAY_AUTO);
			vps_plan_free(p);
		}
	struct vps_layout *a = test_layout("tiny-llama", "tp=1,dp=1,zero=1", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,dp=4,zero=1", 8, 0);
	struct vps_plan *p = NULL;
	struct vps_plan_opts po = VPS_PLAN_OPTS_INIT;
	po.relay_mode = (enum vps_relay)77;
	CHECK_EQ(vps_plan_compute(&p, a, b, &po), VPS_EINPUT);
	CHECK(p == NULL && strstr(vps_last_error(), "relay mode 77"));
	vps_layout_free(a);
	vps_layout_free(b);
}

/* A struct never set (version 0), one from newer headers, or none: refused
 * with VPS_EINPUT, naming the struct, before anything is read or owned. */
TEST(options_of_an_unknown_version_are_refused)
{
	struct vps_layout *a = test_layout("tiny-llama", "tp=2,dp=2,zero=1", 8, 0);
	struct vps_layout *b = test_layout("tiny-llama", "tp=1,dp=4,zero=1", 8, 0);
	struct vps_plan *p = NULL;
	struct vps_plan_opts po = VPS_PLAN_OPTS_INIT;
	po.version = 0;
	CHECK_EQ(vps_plan_compute(&p, a, b, &po), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "struct vps_plan_opts of version 0") && strstr(vps_last_error(), "VPS_PLAN_OPTS_INIT"));
	po.version = VPS_PLAN_OPTS_VERSION + 1;
	CHECK_EQ(vps_plan_compute(&p, a, b, &po), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "newer headers"));
	CHECK_EQ(vps_plan_compute(&p, a, b, NULL), VPS_EINPUT);
	CHECK(p == NULL);
	/* the layouts are still the caller's, and a right version plans */
	po.version = VPS_PLAN_OPTS_VERSION;
	CHECK_OK(vps_plan_compute(&p, a, b, &po));
	vps_plan_free(p);

	struct vps_exec_opts eo = VPS_EXEC_OPTS_INIT;
	struct vps_exec_report rep;
	eo.version = 0;
	CHECK_EQ(vps_exec_run(NULL, 0, &eo, &rep), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "struct vps_exec_opts of version 0"));
	struct vps_trainer_opts to = VPS_TRAINER_OPTS_INIT;
	struct vps_trainer_result res;
	to.version = VPS_TRAINER_OPTS_VERSION + 7;
	CHECK_EQ(vps_trainer_run(NULL, 0, &to, &res), VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "struct vps_trainer_opts of version"));
}
