#!/usr/bin/env bash
# Seed corpora for the libFuzzer harnesses (tests/fuzz/), generated with the
# tools from configs/ and the tests' documents, never committed:
#
#   scripts/fuzz-corpus.sh [BIN [OUT]]     (default: bin build/fuzz)
#
# writes OUT/corpus/yaml, OUT/corpus/binary (seeds; each starts with the
# harness's selector byte, see the harness), OUT/models (the test models
# and configurations transitions may name) and OUT/corpus/registry (by the
# registry harness itself, OUT/fuzz_registry).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-bin}
OUT=${2:-build/fuzz}
export PATH="$PWD/$BIN:$PATH"
for t in vps-layout vps-plan vps-stage; do
	command -v "$t" >/dev/null || { echo "fuzz-corpus: $BIN/$t missing (run make)" >&2; exit 1; }
done
command -v zstd >/dev/null || { echo "fuzz-corpus: needs zstd (apt-get install zstd)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
Y="$OUT/corpus/yaml" B="$OUT/corpus/binary" M="$OUT/models"
rm -rf "$Y" "$B" "$M" "$OUT/corpus/registry"
mkdir -p "$Y" "$B" "$M" "$OUT/corpus/registry"

# seed FILE DIR NAME SELECTOR: the selector byte (octal), then the file
seed() { { printf "\\$4"; cat "$1"; } > "$2/$3"; }
# the payload of a binary document: what follows the 16-byte header, unpacked
payload() { tail -c +17 "$1" | zstd -dcq; }

# the harnesses' selectors (tests/fuzz/fuzz_yaml.c, fuzz_binary.c)
Y_LAYOUT=000 Y_PLAN=001 Y_STAGED=002 Y_MODEL=003 Y_PARALLEL=004 Y_DEVICES=005
Y_TOPOLOGY=006 Y_BUDGETS=007 Y_TRANSITION=010
B_RAW=000 B_WRAP=200 # kind in bits 0-1: 0 layout, 1 plan, 2 staged

for m in configs/models/tiny-*.yaml; do
	seed "$m" "$Y" "model-$(basename "$m" .yaml)" $Y_MODEL
	cp "$m" "$M/"
done
# one model file as a Hugging Face config.json
printf '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "model_type": "llama"}\n' > "$tmp/config.json"
seed "$tmp/config.json" "$Y" model-config-json $Y_MODEL

# Smaller still than the test models, so that a layout, plan or staged
# plan is a few kilobytes: libFuzzer's time goes to the structure, not to
# thousands of like pieces.
printf 'vps: model\nversion: 1\nname: mini-llama\nhidden: 32\nlayers: 2\nheads: 4\nquery_groups: 2\nhead_dim: 8\nffn: 64\nvocab: 50\nnorm: rmsnorm\nactivation: swiglu\nposition: rope\n' \
	> "$M/mini-llama.yaml"
printf 'vps: model\nversion: 1\nname: mini-gpt\nhidden: 32\nlayers: 2\nheads: 4\nquery_groups: 4\nhead_dim: 8\nffn: 64\nvocab: 51\nnorm: layernorm\nactivation: gelu\nposition: learned\nmax_positions: 16\nbias: true\ntied_embeddings: true\n' \
	> "$M/mini-gpt.yaml"
printf 'vps: model\nversion: 1\nname: mini-moe\nhidden: 32\nlayers: 2\nheads: 4\nquery_groups: 2\nhead_dim: 8\nvocab: 50\nnorm: rmsnorm\nactivation: swiglu\nposition: rope\nqk_norm: true\nexperts: 4\nmoe_ffn: 16\n' \
	> "$M/mini-moe.yaml"

# layouts, plans and staged plans of those models, in both encodings
n=0
while read -r model a b; do
	n=$((n + 1))
	vps-layout --model "$M/$model.yaml" --parallel "$a" -o "$tmp/a.bin"
	vps-layout --model "$M/$model.yaml" --parallel "$b" -o "$tmp/b.bin"
	vps-layout -i "$tmp/a.bin" --rank 0 --yaml -o "$tmp/a.yaml"
	vps-plan "$tmp/a.bin" "$tmp/b.bin" -o "$tmp/p.bin"
	vps-plan "$tmp/a.bin" "$tmp/b.bin" --yaml -o "$tmp/p.yaml"
	vps-stage --budget 1GiB "$tmp/p.bin" -o "$tmp/s.bin"
	vps-stage --budget 16KiB --rank 1 --yaml "$tmp/p.bin" -o "$tmp/s.yaml"
	seed "$tmp/a.yaml" "$Y" "layout-$n" $Y_LAYOUT
	seed "$tmp/p.yaml" "$Y" "plan-$n" $Y_PLAN
	seed "$tmp/s.yaml" "$Y" "staged-$n" $Y_STAGED
	i=0
	for f in a.bin p.bin s.bin; do
		seed "$tmp/$f" "$B" "raw-$f-$n" "00$i"
		payload "$tmp/$f" > "$tmp/$f.payload"
		seed "$tmp/$f.payload" "$B" "wrap-$f-$n" "20$i"
		i=$((i + 1))
	done
	# a configuration of the model, as vps-layout --parallel reads one
	printf 'vps: parallel\nversion: 1\nmodel: %s\n%s\n' "$model" "$(echo "$a" | tr ',' '\n' | sed 's/=/: /')" \
		> "$M/$model-$n.yaml"
	seed "$M/$model-$n.yaml" "$Y" "parallel-$n" $Y_PARALLEL
	printf 'vps: transition\nversion: 1\nname: t%d\ndescription: "%s %s -> %s"\nmodel: %s\nfrom:\n  parallel: %s-%d\n  first_node: 0\nto:\n  parallel: "%s"\n  first_node: 1\n' \
		"$n" "$model" "$a" "$b" "$model" "$model" "$n" "$b" > "$tmp/t.yaml"
	seed "$tmp/t.yaml" "$Y" "transition-$n" $Y_TRANSITION
done <<'LIST'
mini-llama tp=2,dp=2,zero=1 tp=1
mini-gpt tp=2 pp=2
mini-moe ep=2,dp=2 tp=2
LIST

for f in configs/parallel/gpt3-1.3b-2-2-1.yaml configs/parallel/qwen3-30b-a3b-2-4-4-2.yaml; do
	seed "$f" "$Y" "parallel-$(basename "$f" .yaml)" $Y_PARALLEL
done
for f in configs/topologies/*.yaml; do
	seed "$f" "$Y" "topology-$(basename "$f" .yaml)" $Y_TOPOLOGY
done
printf 'vps: devices\nversion: 1\ndevices: [[0, 0], [0, 1], [3, 0], [3, 1]]\n' > "$tmp/d.yaml"
seed "$tmp/d.yaml" "$Y" devices $Y_DEVICES
printf 'vps: budgets\nversion: 1\nbudgets: [8GiB, 512MiB, 16GiB]\n' > "$tmp/b.yaml"
seed "$tmp/b.yaml" "$Y" budgets $Y_BUDGETS

if [ -x "$OUT/fuzz_registry" ]; then
	VPS_FUZZ_SEEDS="$OUT/corpus/registry" "$OUT/fuzz_registry" 2>/dev/null
fi
for d in "$OUT"/corpus/*; do
	echo "fuzz-corpus: $(ls "$d" | wc -l) seeds in $d"
done
