# vps: build, test, install.
#
#   make            libvps.a, libvps.so and the tools in bin/ (and how to put bin/ on PATH)
#   make check      the C unit tests, the Bats tests, the layering (make layers) and the framework checks,
#                   warnings as errors; the GPU paths on the stand-ins of CUDA and
#                   NCCL (tests/standin/)
#   make standin    only those stand-ins (build/standin/)
#   make fault-bin  the tools for the tests that make a rank fail (build/fault-bin/)
#   make cxx        a C++ program against libvps.a: the headers in strict C++ (make check)
#   make check-megatron  vps's layouts against Megatron-Core's own buffers, a
#                   Megatron-Core job switched by vps.megatron, and Megatron-LM's
#                   pretrain() switched by vps.megatron_training
#   make check-hf   vps's Hugging Face imports against transformers' models
#   make check-torch  vps's DTensor layouts against FSDP2/TP/PP/EP as torchtitan applies
#                   them, and a torchtitan job switched by vps.dtensor
#   make venv       the test environment build/venv (torch, megatron-core,
#                   transformers: python/requirements-test.txt)
#   make layers     libvps's rooms keep their layers, no cycles, only the API exported
#   make asan       the same under AddressSanitizer and UBSan (build-asan/)
#   make check-gpu  every GPU test and benchmark (scripts/gpu-check.sh; needs a GPU)
#   make gpu-debs   what gpu-check.sh installs on a GPU machine: Debian packages (.debs/), wheels (.whl/)
#   make fuzz       each libFuzzer harness for FUZZ_SECONDS (clang; build/fuzz/)
#   make fuzz-smoke the same for FUZZ_SMOKE_SECONDS each (CI)
#   make demo       a real switch on this machine
#   make install PREFIX=/usr/local
#   make clean      the build outputs (the test environment stays); distclean: it too
#
# Out-of-tree objects: BUILDDIR (default build). CUDA_HOME for the GPU parts.
# PYTHON: the interpreter of everything in Python (default build/venv's).
# Jobs: one a CPU unless -jN (-j1 too) or MAKEFLAGS in the environment says.

# Make 4.3 shows a command line's -j to recipes only, not here, but lets it
# win over this one; the environment's MAKEFLAGS is read through the shell.
# Not under a make that runs this one, nor beside clean (it would race).
ifeq ($(MAKELEVEL)$(filter clean distclean,$(MAKECMDGOALS)),0)
ENV_MAKEFLAGS := $(shell printf '%s' "$$MAKEFLAGS")
ifeq ($(filter -j%,$(MAKEFLAGS) $(ENV_MAKEFLAGS))$(findstring j,$(firstword -$(ENV_MAKEFLAGS))),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
endif

BUILDDIR ?= build
BINDIR ?= bin
PREFIX ?= /usr/local
CUDA_HOME ?= /usr/local/cuda
CC ?= cc

WARN = -Wall -Wextra -Wshadow -Wvla -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS ?= -O2 -g
# -fPIC: the same objects make libvps.a and libvps.so (for ctypes trainers)
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -pthread -fPIC $(WARN) $(CFLAGS) -Iinclude -Ilib -MMD -MP
LDLIBS = -lyaml -lzstd -lpthread -lm -lrt -ldl

ifneq ($(SANITIZE),)
ALL_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

LIB_SRC = $(sort $(shell find lib -name '*.c'))
LIB_OBJ = $(LIB_SRC:lib/%.c=$(BUILDDIR)/lib/%.o)
LIB = $(BUILDDIR)/libvps.a
# libvps.so.VERSION, its SONAME libvps.so.MAJOR (a link to it) and the
# name the linker and ctypes look for, libvps.so (a link to the SONAME);
# the version is the one of include/vps/base.h
VERSION := $(shell sed -n 's/.*VPS_VERSION_STRING "\(.*\)"/\1/p' include/vps/base.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))
SONAME = libvps.so.$(SOMAJOR)
SHLIB_REAL = libvps.so.$(VERSION)
SHLIB = $(BUILDDIR)/libvps.so
SHLIB_FILES = $(BUILDDIR)/$(SHLIB_REAL) $(BUILDDIR)/$(SONAME) $(SHLIB)
CMD_COMMON = $(BUILDDIR)/cmd/common.o $(BUILDDIR)/cmd/launcher.o
TOOLS = vps-layout vps-plan vps-stage vps-exec vps-trainer vps-verify vps-show
TOOL_BINS = $(TOOLS:%=$(BINDIR)/%)
TEST_SRC = $(wildcard tests/unit/test_*.c)
TEST_BINS = $(TEST_SRC:tests/unit/%.c=$(BUILDDIR)/tests/%)
HARNESS = $(BUILDDIR)/tests/harness.o $(BUILDDIR)/tests/jobs.o

DEPS_STAMP = $(BUILDDIR)/.deps-ok

# Everything in Python (the module's tests, the PyTorch example, the
# Megatron-Core and Hugging Face checks) runs under PYTHON: by default the
# test environment build/venv, which scripts/venv.sh makes from the pinned
# python/requirements-test.txt and reuses while that file is unchanged. It
# is build/, not BUILDDIR: make asan (BUILDDIR=build-asan) shares it.
# PYTHON=/path/to/python runs the tests under an interpreter of one's own
# that has those packages; VENV_PYTHON names the Python 3.12 the
# environment is made from (default: the first one found).
VENV = $(CURDIR)/build/venv
VENV_STAMP = $(VENV)/.installed
PYTHON ?= $(VENV)/bin/python
# bats runs each test in a directory of its own: a relative path would break
PYTHON_ABS = $(if $(findstring /,$(PYTHON)),$(abspath $(PYTHON)),$(PYTHON))
ifeq ($(PYTHON_ABS),$(VENV)/bin/python)
PY_STAMP = $(VENV_STAMP)
else
PY_STAMP = $(BUILDDIR)/.python-ok
endif
# make install puts the module where the system's python3 finds it: Debian's
# looks in PREFIX/lib/python3.N/dist-packages for /usr/local
INSTALL_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
PYTHON_SITE ?= $(PREFIX)/lib/python3.$(shell $(INSTALL_PYTHON) -c 'import sys; print(sys.version_info[1])')/dist-packages

# ---- GPU support: libvps-cuda.so, loaded by libvps at run time ----
# Built whenever nvcc is found (CUDA_HOME); nccl.h from CUDA_HOME or
# NCCL_HOME. The tools never link it: they run where CUDA is absent.
NVCC ?= $(CUDA_HOME)/bin/nvcc
NCCL_HOME ?=
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
HAVE_NVCC := $(shell test -x $(NVCC) && echo 1)
CUDA_LIB = $(BUILDDIR)/libvps-cuda.so
ifeq ($(HAVE_NVCC),1)
CUDA_ALL = $(CUDA_LIB)
endif

.PHONY: all check check-gpu gpu-debs check-megatron check-hf check-torch test unit cxx bats layers asan demo install uninstall clean \
	deps python-deps venv distclean FORCE standin fault-bin python-lib \
	fuzz fuzz-smoke fuzz-build fuzz-corpus fuzz-deps
.DEFAULT_GOAL := all

all: $(LIB) $(SHLIB_FILES) $(TOOL_BINS) $(CUDA_ALL)
# a plain make says how to run the tools by name, unless they already are
ifeq ($(filter-out all,$(MAKECMDGOALS)),)
	@case ":$$PATH:" in *":$(abspath $(BINDIR)):"*) ;; \
	*) echo "vps: built; to run the tools by name: export PATH=\"$(abspath $(BINDIR)):\$$PATH\"" ;; esac
endif

# ---- what a fresh machine lacks ----
# Each step installs the Debian packages it needs and no more, in one line
# that says what (scripts/install-deps.sh: with apt-get when we are root
# and it exists; otherwise the exact command is printed). Checked again
# when this Makefile changes, so that a dependency added reaches old trees.
#   make        the build: libyaml and libzstd headers
#   make demo   nothing more (bash, awk and coreutils, which Debian has)
#   make check  the build's, and bats, groff (man page lint), rsvg-convert
#               (the SVG test renders vps-plan --svg), pkg-config (the
#               install test), jq and zstd (the man pages' examples use
#               them, and tests/bats/examples.bats runs every example),
#               python3 (make layers, tests/bats/examples.py); the Python
#               of the tests is the test environment (make venv, below)
BUILD_DEBS = libyaml-dev libzstd-dev
CHECK_DEBS = $(BUILD_DEBS) bats groff-base librsvg2-bin pkgconf jq zstd python3
CHECK_DEPS_STAMP = $(BUILDDIR)/.deps-check-ok
.PHONY: check-deps
deps: $(DEPS_STAMP)
$(DEPS_STAMP): Makefile scripts/install-deps.sh
	@CC='$(CC)' scripts/install-deps.sh "$(strip make $(MAKECMDGOALS))" $(BUILD_DEBS)
	@mkdir -p $(BUILDDIR) && touch $@
check-deps: $(CHECK_DEPS_STAMP)
$(CHECK_DEPS_STAMP): Makefile scripts/install-deps.sh
	@CC='$(CC)' scripts/install-deps.sh "make check" $(CHECK_DEBS)
	@mkdir -p $(BUILDDIR) && touch $@
# make check says its packages in one line, the build's among them: its
# step runs before the build's, which then finds nothing missing
ifneq ($(filter check test bats layers check-deps,$(MAKECMDGOALS)),)
$(DEPS_STAMP): | $(CHECK_DEPS_STAMP)
endif

# what the Python tests need (make check): PyTorch, Megatron-Core,
# transformers, numpy, PyYAML; Pillow reads the PNG of the SVG test
python-deps: $(PY_STAMP)
venv: $(VENV_STAMP)
$(VENV_STAMP): python/requirements-test.txt scripts/venv.sh
	@scripts/venv.sh $(VENV) python/requirements-test.txt
	@touch $@
# an interpreter of the user's own is checked, never installed into
$(BUILDDIR)/.python-ok: python/requirements-test.txt scripts/venv.sh FORCE
	@scripts/venv.sh --check $(PYTHON_ABS) python/requirements-test.txt
	@mkdir -p $(BUILDDIR) && touch $@

# objects rebuild when the flags change (a sanitizer or -fPIC build)
FLAGS_STAMP = $(BUILDDIR)/.flags
$(FLAGS_STAMP): FORCE | $(DEPS_STAMP)
	@echo '$(CC) $(ALL_CFLAGS) $(LDFLAGS)' | cmp -s - $@ || echo '$(CC) $(ALL_CFLAGS) $(LDFLAGS)' > $@
FORCE:

# -fvisibility=hidden: libvps.so exports only what include/vps/ marks VPS_API
$(BUILDDIR)/lib/%.o: lib/%.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=hidden -c $< -o $@

$(BUILDDIR)/cmd/%.o: cmd/%.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Icmd -c $< -o $@

$(BUILDDIR)/tests/%.o: tests/unit/%.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/unit -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILDDIR)/$(SHLIB_REAL): $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)

# the links are checked on every make: a build tree from before the
# versioned name has a plain libvps.so that its time alone would keep
$(BUILDDIR)/$(SONAME): $(BUILDDIR)/$(SHLIB_REAL) FORCE
	@[ "$$(readlink $@)" = $(SHLIB_REAL) ] || { echo "ln -sf $(SHLIB_REAL) $@"; ln -sf $(SHLIB_REAL) $@; }

$(SHLIB): $(BUILDDIR)/$(SONAME) FORCE
	@[ "$$(readlink $@)" = $(SONAME) ] || { echo "ln -sf $(SONAME) $@"; ln -sf $(SONAME) $@; }

# what pip install of the source tree builds and puts beside the Python
# module (setup.py): the shared library, and libvps-cuda.so where nvcc is
python-lib: $(SHLIB_FILES) $(CUDA_ALL)

$(BINDIR)/%: $(BUILDDIR)/cmd/%.o $(CMD_COMMON) $(LIB)
	@mkdir -p $(BINDIR)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILDDIR)/tests/test_%: $(BUILDDIR)/tests/test_%.o $(HARNESS) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(CUDA_LIB): lib/gpu/cuda/vps_cuda.cu lib/gpu/cuda/vps_cuda.h | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -shared -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fvisibility=hidden --cudart static \
		$(CUDA_ARCHS) $(if $(NCCL_HOME),-I$(NCCL_HOME)/include) -Ilib/gpu/cuda -o $@ $< -ldl -lrt -lpthread

# ---- the stand-ins for libvps-cuda.so and NCCL (tests/standin/) ----
# Test instruments over host memory, so that make check runs every GPU path
# on a machine without a GPU (docs/exec.md, "The stand-ins"): never built
# into libvps, never installed, chosen only by VPS_CUDA_LIBRARY and
# VPS_NCCL_LIBRARY. nccl.h (CUDA_HOME or NCCL_HOME) gives NCCL's ABI.
STANDIN_DIR = $(BUILDDIR)/standin
STANDIN_CUDA = $(STANDIN_DIR)/libvps-cuda-standin.so
STANDIN_NCCL = $(STANDIN_DIR)/libnccl-standin.so
STANDIN_INC = $(if $(NCCL_HOME),-isystem $(NCCL_HOME)/include) -isystem $(CUDA_HOME)/include
STANDIN_ENV = VPS_CUDA_LIBRARY=$(abspath $(STANDIN_CUDA)) VPS_NCCL_LIBRARY=$(abspath $(STANDIN_NCCL))
standin: $(STANDIN_CUDA) $(STANDIN_NCCL)
# their tests speak NCCL's ABI too
$(BUILDDIR)/tests/test_standin_%.o: tests/unit/test_standin_%.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(STANDIN_INC) -Itests/unit -c $< -o $@

$(STANDIN_CUDA): tests/standin/cuda.c
$(STANDIN_NCCL): tests/standin/nccl.c
$(STANDIN_CUDA) $(STANDIN_NCCL): tests/standin/standin.h lib/gpu/cuda/vps_cuda.h $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@echo '#include <nccl.h>' | $(CC) $(STANDIN_INC) -E - >/dev/null 2>&1 || { \
		echo "the stand-ins need nccl.h: set CUDA_HOME or NCCL_HOME (see docs/exec.md)" >&2; exit 1; }
	$(CC) $(ALL_CFLAGS) $(STANDIN_INC) -fvisibility=hidden -shared -o $@ $(filter %.c,$^) $(LDFLAGS) -ldl -lrt -lpthread

# ---- the executor of the fault tests ----
# FAULT_BIN is bin/ for the tests that make a rank fail (VPS_FAULT;
# docs/exec.md, "Faults for the tests"): the tools, and a vps-exec built
# from the same source with -DVPS_TEST_FAULTS, which sets libvps.a's
# hidden fault hook from VPS_FAULT. bin/vps-exec and an installed one have
# no such code. Its parent is BUILDDIR, where the tools look for
# libvps-cuda.so.
FAULT_BIN = $(BUILDDIR)/fault-bin
FAULT_BINS = $(TOOLS:%=$(FAULT_BIN)/%)
fault-bin: $(FAULT_BINS)
$(BUILDDIR)/cmd/vps-exec-faults.o: cmd/vps-exec.c $(FLAGS_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DVPS_TEST_FAULTS -Icmd -c $< -o $@
$(FAULT_BIN)/vps-exec: $(BUILDDIR)/cmd/vps-exec-faults.o $(CMD_COMMON) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(FAULT_BIN)/%: $(BINDIR)/%
	@mkdir -p $(dir $@)
	ln -sf $(abspath $<) $@

# ---- C++ programs link the library (tests/cxx/) ----
# every public header as C++, strictly, and a program that calls the API
CXX_FLAGS = -std=c++11 -Wall -Wextra -Werror -pedantic -pthread
CXX_TEST = $(BUILDDIR)/tests/cxx_api
$(CXX_TEST): tests/cxx/api.cc $(wildcard include/vps/*.h) $(LIB) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXX_FLAGS) $(filter -fsanitize=%,$(ALL_CFLAGS)) -Iinclude -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)
cxx: $(CXX_TEST)
	$(CXX_TEST) configs/models/tiny-llama.yaml

# benchmark programs (scripts/bench/*.c), built by check so they do not rot
BENCH_BINS = $(patsubst scripts/bench/%.c,$(BUILDDIR)/bench/%,$(wildcard scripts/bench/*.c))
$(BUILDDIR)/bench/%: scripts/bench/%.c $(LIB) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)

# ---- tests ----
# test_gpu runs twice: as on this machine (its GPU parts skip without a
# GPU) and on the stand-ins
unit: $(TEST_BINS) $(BENCH_BINS) standin cxx
	@set -e; for t in $(TEST_BINS); do $$t; done
	$(STANDIN_ENV) $(BUILDDIR)/tests/test_gpu

bats: all standin fault-bin $(PY_STAMP) $(CHECK_DEPS_STAMP)
	VPS_BIN=$(abspath $(BINDIR)) VPS_FAULT_BIN=$(abspath $(FAULT_BIN)) VPS_PYTHON=$(PYTHON_ABS) \
		VPS_STANDIN=$(abspath $(STANDIN_DIR)) VPS_SANITIZED=$(SANITIZE) bats tests/bats

# the Python frameworks' own code against vps's rules (tests/megatron,
# tests/hf), after the Bats tests, not beside them: both load the two cores.
# Not under a sanitizer: a Python process cannot load that build's libvps.so.
check: $(CHECK_DEPS_STAMP) all unit bats
ifeq ($(SANITIZE),)
	@$(MAKE) --no-print-directory layers check-megatron check-hf check-torch
endif

# Megatron-Core builds a matrix of configurations on the CPU, a process per
# rank under gloo, and every rank's buffers, buckets and ZeRO-1 shards must
# be vps's; then a Megatron-Core job trains and vps.megatron switches it
# through vps-exec, and Megatron-LM's own pretrain() runs a GPT and a MoE job
# that vps.megatron_training switches (tests/megatron/README.md)
check-megatron: $(SHLIB_FILES) $(TOOL_BINS) $(PY_STAMP)
	VPS_LIBRARY=$(abspath $(SHLIB)) $(PYTHON_ABS) tests/megatron/check_megatron.py
	VPS_LIBRARY=$(abspath $(SHLIB)) VPS_BIN=$(abspath $(BINDIR)) $(PYTHON_ABS) tests/megatron/check_switch.py
	VPS_LIBRARY=$(abspath $(SHLIB)) VPS_BIN=$(abspath $(BINDIR)) $(PYTHON_ABS) tests/megatron/check_pretrain.py --pauses $(BUILDDIR)/pretrain-pauses.json
	VPS_LIBRARY=$(abspath $(SHLIB)) VPS_BIN=$(abspath $(BINDIR)) $(PYTHON_ABS) tests/gpu/megatron_job.py --device cpu

# every Hugging Face family vps imports, read by vps and built by
# transformers on the meta device: the same tensors through vps's name map
# (python/vps/hf.py, tests/hf/check_hf.py)
check-hf: $(SHLIB_FILES) $(PY_STAMP)
	VPS_LIBRARY=$(abspath $(SHLIB)) $(PYTHON_ABS) tests/hf/check_hf.py

# PyTorch's own parallelisms as torchtitan applies them (FSDP2, HSDP, TP,
# PP, EP) build a matrix of configurations on the CPU, a process per rank
# under gloo, and every rank's local shards of parameters and Adam's states
# must be where vps's family=dtensor layouts put them (tests/torch/README.md;
# CHECK_TORCH_FLAGS=--full for the fuller matrix); then a torchtitan job
# trains and vps.dtensor switches it through vps-exec: FSDP 2, grown to
# FSDP 4, then HSDP 2x2, FSDP 2 x TP 2 and FSDP 4, grown again to FSDP 8
check-torch: $(SHLIB_FILES) $(TOOL_BINS) $(PY_STAMP)
	VPS_LIBRARY=$(abspath $(SHLIB)) $(PYTHON_ABS) tests/torch/check_torch.py $(CHECK_TORCH_FLAGS)
	VPS_LIBRARY=$(abspath $(SHLIB)) VPS_BIN=$(abspath $(BINDIR)) $(PYTHON_ABS) tests/torch/check_switch.py

# libvps's rooms keep their layers, with no cycles, and libvps.so exports
# only what include/vps/ declares (scripts/layers.py, docs/architecture.md)
layers: $(LIB_OBJ) $(BUILDDIR)/$(SHLIB_REAL) $(CHECK_DEPS_STAMP)
	@python3 scripts/layers.py $(BUILDDIR)/lib $(BUILDDIR)/$(SHLIB_REAL)

test: check

# every GPU test and GPU benchmark, on a machine with a GPU (results in
# build/gpu-check-GPU.txt, or $$OUT/gpu-check-GPU.txt)
check-gpu:
	scripts/gpu-check.sh

# What scripts/gpu-check.sh needs on a GPU machine that has no package
# registry: Debian's libyaml and libzstd (headers and libraries), downloaded
# here into .debs/ (ignored) to be carried there and unpacked under /tmp.
GPU_DEBS = libyaml-dev libyaml-0-2 libzstd-dev libzstd1
# megatron-core (pure Python but for its dataset helpers) for tests/gpu/megatron_job.py; the GPU
# machine has torch, absl-py and numpy
GPU_WHEELS = megatron-core==0.19.2 emerging_optimizers==0.3.0
gpu-debs:
	@mkdir -p .debs
	cd .debs && apt-get download $(GPU_DEBS)
	$(PYTHON_ABS) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl $(GPU_WHEELS)

# the tools find configs/ beside their bin/ (a user's bin/, or PREFIX/share):
# the sanitized build's too, for the examples run as written
asan:
	@mkdir -p build-asan && ln -sfn ../configs build-asan/configs
	$(MAKE) BUILDDIR=build-asan BINDIR=build-asan/bin SANITIZE=address,undefined CFLAGS="-O1 -g" check

demo: all
	@scripts/demo.sh --back

# ---- fuzzing: libFuzzer harnesses (tests/fuzz/), clang only here ----
# libvps is rebuilt with clang's coverage and sanitizers in build/fuzz/obj;
# scripts/fuzz-corpus.sh seeds build/fuzz/corpus/NAME from the tools'
# outputs; scripts/fuzz.sh runs each harness in turn and writes
# build/fuzz/summary.tsv and build/fuzz/report.md (FUZZ_REPORT=1: also the
# table in docs/RELIABILITY.md).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 15
FUZZ_DIR = $(BUILDDIR)/fuzz
FUZZ_NAMES = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS = $(FUZZ_NAMES:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_LIB = $(FUZZ_DIR)/obj/libvps.a
FUZZ_STAMP = $(FUZZ_DIR)/.deps-ok
# Debian's packages for clang's libFuzzer runtime, and zstd for the corpus
FUZZ_DEB_PKGS = clang libclang-rt-14-dev libfuzzer-14-dev zstd

fuzz-deps: $(FUZZ_STAMP)
$(FUZZ_STAMP):
	@missing=""; mkdir -p $(FUZZ_DIR); \
	echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n); int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }' | \
		$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -x c - -o $(FUZZ_DIR)/probe >/dev/null 2>&1 || \
		missing="$$missing clang libclang-rt-14-dev libfuzzer-14-dev"; \
	command -v zstd >/dev/null 2>&1 || missing="$$missing zstd"; \
	scripts/install-deps.sh "make fuzz" $$missing
	@mkdir -p $(FUZZ_DIR) && touch $@

$(FUZZ_LIB): FORCE | $(FUZZ_STAMP)
	@$(MAKE) --no-print-directory BUILDDIR=$(FUZZ_DIR)/obj BINDIR=$(FUZZ_DIR)/obj/bin CC=$(FUZZ_CC) \
		SANITIZE=address,undefined CFLAGS="-O1 -g -fsanitize=fuzzer-no-link" $(FUZZ_LIB)

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -pthread $(WARN) -O1 -g -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=all -fno-omit-frame-pointer -Iinclude -Ilib -o $@ $< $(FUZZ_LIB) $(LDLIBS)

fuzz-build: $(FUZZ_BINS)

fuzz-corpus: all fuzz-build
	scripts/fuzz-corpus.sh $(BINDIR) $(FUZZ_DIR)

fuzz: fuzz-corpus
	scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_NAMES)

fuzz-smoke: fuzz-corpus
	scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SMOKE_SECONDS) $(FUZZ_NAMES)

# ---- install ----
# vps.pc gives programs linked with `pkg-config --libs vps` a run path to
# PREFIX/lib, so that they run from any prefix without ldconfig; a package
# built with DESTDIR, whose PREFIX/lib the loader searches, sets PC_RPATH=
PC_RPATH ?= -Wl,-rpath,$${libdir}
MAN1 = $(wildcard man/*.1)
MAN5 = $(wildcard man/*.5)
MAN7 = $(wildcard man/*.7)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/vps \
		$(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 \
		$(DESTDIR)$(PREFIX)/share/man/man7 $(DESTDIR)$(PREFIX)/share/vps
	install -m 755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib
	install -m 755 $(BUILDDIR)/$(SHLIB_REAL) $(DESTDIR)$(PREFIX)/lib
	ln -sf $(SHLIB_REAL) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libvps.so
	$(if $(CUDA_ALL),install -m 755 $(CUDA_LIB) $(DESTDIR)$(PREFIX)/lib)
	install -m 644 include/vps/*.h $(DESTDIR)$(PREFIX)/include/vps
	$(if $(MAN1),install -m 644 $(MAN1) $(DESTDIR)$(PREFIX)/share/man/man1)
	$(if $(MAN5),install -m 644 $(MAN5) $(DESTDIR)$(PREFIX)/share/man/man5)
	$(if $(MAN7),install -m 644 $(MAN7) $(DESTDIR)$(PREFIX)/share/man/man7)
	cp -R configs $(DESTDIR)$(PREFIX)/share/vps/
	install -d $(DESTDIR)$(PYTHON_SITE)/vps
	install -m 644 python/vps/*.py $(DESTDIR)$(PYTHON_SITE)/vps
	printf '# written by make install: where libvps.so and the configs are\nLIBDIR = "%s"\nDATADIR = "%s"\n' \
		'$(PREFIX)/lib' '$(PREFIX)/share/vps' > $(DESTDIR)$(PYTHON_SITE)/vps/_prefix.py
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@RPATH@|$(PC_RPATH)|' \
		vps.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/vps.pc
	@echo "vps: the Python module is in $(PYTHON_SITE)/vps; for a Python that does not look there:" \
		"export PYTHONPATH=$(PYTHON_SITE)"

uninstall:
	rm -f $(TOOLS:%=$(DESTDIR)$(PREFIX)/bin/%) $(DESTDIR)$(PREFIX)/lib/libvps.a $(DESTDIR)$(PREFIX)/lib/libvps.so \
		$(DESTDIR)$(PREFIX)/lib/$(SONAME) $(DESTDIR)$(PREFIX)/lib/$(SHLIB_REAL) \
		$(DESTDIR)$(PREFIX)/lib/libvps-cuda.so \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/vps.pc
	rm -rf $(DESTDIR)$(PREFIX)/include/vps $(DESTDIR)$(PREFIX)/share/vps $(DESTDIR)$(PYTHON_SITE)/vps
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/share/man/man1/,$(notdir $(MAN1))) \
		$(addprefix $(DESTDIR)$(PREFIX)/share/man/man5/,$(notdir $(MAN5))) \
		$(addprefix $(DESTDIR)$(PREFIX)/share/man/man7/,$(notdir $(MAN7)))

# the test environment outlives make clean (it is minutes and gigabytes
# from PyPI, and no build output): make distclean removes it too
clean:
	@if [ -d $(BUILDDIR) ]; then find $(BUILDDIR) -mindepth 1 -maxdepth 1 ! -name venv ! -name venv.lock \
		-exec rm -rf {} +; fi
	rm -rf build-asan $(BINDIR)

distclean: clean
	rm -rf $(VENV) $(VENV).lock

-include $(LIB_OBJ:.o=.d) $(BUILDDIR)/cmd/*.d $(BUILDDIR)/tests/*.d $(STANDIN_DIR)/*.d
.SECONDARY:
