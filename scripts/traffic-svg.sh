#!/usr/bin/env bash
# The picture README.md and docs/plan.md show: vps-plan --svg of a paper
# scenario (LLaMA-2 70B from 64 GPUs to 128, the new 64 joining). The SVG
# holds no date or path, so a rerun writes the same bytes (tests/bats/svg.bats
# checks that docs/traffic.svg is what the current vps-plan draws).
#   scripts/traffic-svg.sh [OUT]     (default docs/traffic.svg; VPS_BIN: the tools)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin=${VPS_BIN:-$top/bin}
export VPS_CONFIG_PATH=$top/configs
"$bin/vps-plan" --transition llama2-70b-s5-s6 --svg "${1:-$top/docs/traffic.svg}" -q
