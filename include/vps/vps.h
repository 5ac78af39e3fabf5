/* vps: switch a running training job between parallel configurations.
 *
 * This header is the whole public API: every header of include/vps/. Each
 * of them also stands alone (vps/layout.h, vps/registry.h, ...) for a
 * program that wants less; vps/base.h holds what they all share (result
 * codes, vps_last_error, the version). Link with
 * `pkg-config --cflags --libs vps` (vps(7) FILES). */
#ifndef VPS_VPS_H
#define VPS_VPS_H

#include "vps/base.h"
#include "vps/box.h"
#include "vps/data.h"
#include "vps/exec.h"
#include "vps/io.h"
#include "vps/layout.h"
#include "vps/model.h"
#include "vps/parallel.h"
#include "vps/plan.h"
#include "vps/query.h"
#include "vps/registry.h"
#include "vps/show.h"
#include "vps/stage.h"
#include "vps/svg.h"
#include "vps/trainer.h"
#include "vps/units.h"
#include "vps/verify.h"

#endif
