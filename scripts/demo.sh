#!/usr/bin/env bash
# make demo: what vps computes for a paper model, until the executor lands.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== LLaMA-2 7B under (tp,pp,dp) = (2,2,2) with ZeRO-1 =="
bin/vps-layout --model llama2-7b --parallel tp=2,pp=2,dp=2,zero=1 --stats --rank 0
bin/vps-layout --model llama2-7b --parallel tp=2,pp=2,dp=2,zero=1 | bin/vps-verify -
