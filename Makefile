# sparq: the entry point. `make` builds build/sparq, build/libsparq.a and
# build/libsparq.so; `make run` runs the main job on the default model;
# `make test` runs every test (C programs and the Python package's pytest);
# `make install PREFIX=/usr/local DESTDIR=` installs the command, both
# libraries, the public headers and sparq.pc; `make uninstall` removes them.
# PYTHON_INSTALL=path/to/python adds the Python package (make install-python).
#
# Every src/LAYER/*.c goes into the library (except src/cli/, the command, and
# *.cc shims), every tests/test_*.c becomes one test program linked against it,
# so adding a module, a layer folder or a test never needs an edit here.
# src/README.md says what each layer owns and what it may include.

# Parallel by default (one job a core); `make -jN` on the command line wins.
# Only at the top: a sub-make (make run, make test) joins its parent's jobs.
ifeq ($(MAKELEVEL),0)
  ifeq ($(filter -j%,$(MAKEFLAGS)),)
    MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
  endif
endif

CC      ?= cc
# The portable baseline every file but the kernel twins is compiled for
# (see SIMD_AVX2 / SIMD_AVX512 / SIMD_NEONDP below); `make ARCH=-march=native`
# still works, for a binary that runs on this machine only. ARM64 is
# cross-built the same way: `make CC=aarch64-linux-gnu-gcc BUILD=build-arm64`
# (make test-arm64 does that and runs the result under qemu).
TARGET  := $(shell $(CC) -dumpmachine)
ifneq ($(findstring x86_64,$(TARGET)),)
  ARCH  ?= -march=x86-64-v2
  IS_X86 := 1
endif
ifneq ($(findstring aarch64,$(TARGET)),)
  ARCH  ?= -march=armv8-a
  IS_ARM64 := 1
endif
ARCH    ?=
OPT     ?= -O2
SAN     ?=
CFLAGS  ?=
CFLAGS  += $(SAN) -std=c11 -D_GNU_SOURCE $(OPT) $(ARCH) -g -Wall -Wextra \
           -Wshadow -Wstrict-prototypes -fopenmp -Iinclude -Isrc
LDLIBS  += $(SAN) -lm -fopenmp
BUILD   ?= build

# Optional libraries are looked for with the compiler in use, so a cross
# build sees its own sysroot: what is missing there is left out of that
# build, and make says so once. zlib (reading .gz evaluation data) and
# libmicrohttpd (sparq serve) are Debian packages for the host; for ARM64
# they would need a multiarch (dpkg --add-architecture arm64) install.
# (a link test: a cross compiler on Debian also reads the host's
# /usr/include, so finding the header proves nothing)
have_lib = $(shell printf '\043include <$(1)>\nint main(void) { return 0; }\n' | \
             $(CC) -x c - -o /dev/null $(2) >/dev/null 2>&1 && echo 1)
HAVE_ZLIB := $(call have_lib,zlib.h,-lz)
HAVE_MHD  := $(call have_lib,microhttpd.h,-lmicrohttpd)
ifeq ($(HAVE_ZLIB),1)
  CFLAGS += -DSPARQ_HAVE_ZLIB=1
  LDLIBS += -lz
else
  $(info sparq: no zlib for $(TARGET): built without zlib (.gz evaluation data cannot be read))
endif

# The shared library: soname libsparq.so.$(SO_MAJOR); only the functions
# include/*.h mark SPARQ_API are exported (-fvisibility=hidden). Its objects
# are compiled a second time with -fPIC in $(BUILD)/pic, so the command and
# the tests keep the non-PIC objects of the static library.
VERSION  := 0.1.0
SO_MAJOR := 0
SONAME   := libsparq.so.$(SO_MAJOR)
SO_REAL  := libsparq.so.$(VERSION)
PIC_FLAGS := -fPIC -fvisibility=hidden
CFLAGS  += -DSPARQ_VERSION='"$(VERSION)"'

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
# the default model, where the installed library looks (util/paths.c)
MODELDIR   ?= $(PREFIX)/share/sparq/models
MODEL_FILES := models/stories260K.gguf models/LICENSE.llama2.c.MIT.txt

# Each target compiles only its own kernel twins (util/cpu.h): x86-64 the
# *_avx2.c / *_avx512.c files, ARM64 the *_neon.c files.
ifeq ($(IS_X86),1)
  NOT_HERE := %_neon.c
else ifeq ($(IS_ARM64),1)
  NOT_HERE := %_avx2.c %_avx512.c
else
  NOT_HERE := %_neon.c %_avx2.c %_avx512.c
endif
LIB_SRC  := $(filter-out src/cli/% src/server/% $(NOT_HERE),$(wildcard src/*/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
SRV_SRC  := $(wildcard src/server/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o)
# Every *_neon.c is compiled twice: for baseline ARMv8-A (Advanced SIMD is
# in every ARM64 core) and, as *_neondp.o, with the ARMv8.2 dot-product
# instructions (sdot/udot), which util/cpu.c chooses only where
# getauxval(AT_HWCAP) has HWCAP_ASIMDDP. NEON_TWIN() (util/cpu.h) gives
# the two builds' tables different names.
NEON_SRC := $(filter %_neon.c,$(LIB_SRC))
LIB_OBJ  += $(NEON_SRC:src/%_neon.c=$(BUILD)/obj/%_neondp.o)
CLI_OBJ  := $(CLI_SRC:src/%.c=$(BUILD)/obj/%.o)
SRV_OBJ  := $(SRV_SRC:src/%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

# The chat page `sparq serve` answers GET / with (src/server/webui.h) goes
# into the command as bytes: od prints them in hex, sed makes that a C
# initialiser (coreutils and sed, nothing to install), so the page stays an
# ordinary file to edit and the binary needs no file beside it.
WEBUI_HTML := src/server/webui/index.html
WEBUI_C    := $(BUILD)/gen/webui_html.c
SRV_OBJ    += $(BUILD)/obj/server/webui_html.o
PUB_HDRS := $(wildcard include/*.h)

# Optional C++ shim around Faiss (HNSW index); built only when Faiss is installed.
# (looked for in /usr/include: the host's, so never for a cross build)
CROSS := $(if $(findstring $(shell uname -m),$(TARGET)),,1)
FAISS_HDR := $(if $(CROSS),,$(wildcard /usr/include/faiss/IndexHNSW.h))
ifneq ($(FAISS_HDR),)
  ifneq ($(wildcard src/index/index_hnsw_faiss.cc),)
    CFLAGS   += -DSPARQ_HAVE_FAISS=1
    LIB_OBJ  += $(BUILD)/obj/index/index_hnsw_faiss.o
    LDLIBS   += -lfaiss -lopenblas -lstdc++
  endif
endif
PIC_OBJ := $(LIB_OBJ:$(BUILD)/obj/%=$(BUILD)/pic/%)

# sparq serve (src/server/, a client of the library like src/cli/, kept out of
# libsparq): libmicrohttpd (scripts/setup.sh installs libmicrohttpd-dev).
# Without it the command is built without the server (`sparq serve` says
# so) and the tests that drive the server are not built.
ifeq ($(HAVE_MHD),1)
  SRV_LIBS := -lmicrohttpd -lpthread
else
  $(info sparq: no libmicrohttpd for $(TARGET): built without the server (sparq serve, its tests))
  SRV_SRC  :=
  SRV_OBJ  :=
  SRV_LIBS := -lpthread
  CFLAGS   += -DSPARQ_NO_SERVER=1
  TEST_SRC := $(filter-out $(addprefix tests/test_,$(addsuffix .c,server request deploy soak cli_compat webui embed_server)),$(TEST_SRC))
  TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
endif

.PHONY: all run test test-asan test-avx2 test-arm64 test-deploy fuzz setup setup-run clean bench install uninstall testmodel \
	install-python FORCE
all: $(BUILD)/sparq $(BUILD)/libsparq.so $(BUILD)/sparq.pc

# What the optional-library probes above found, as a file every object
# depends on: `make run` installs the libraries the command needs and `make
# test` the rest (Faiss), so a tree built before either would otherwise keep
# objects compiled without the server or the HNSW index beside new ones that
# expect them. Rewritten only when the findings change; ARCH, OPT and SAN
# are the caller's to keep apart (BUILD=), as make test-asan does.
BUILD_FEATURES = zlib=$(HAVE_ZLIB) server=$(HAVE_MHD) faiss=$(if $(FAISS_HDR),1)
$(BUILD)/features: FORCE
	@mkdir -p $(dir $@)
	@echo '$(BUILD_FEATURES)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(LIB_OBJ) $(PIC_OBJ) $(CLI_OBJ) $(SRV_OBJ) $(TEST_BIN): $(BUILD)/features

# Kernel twins: src/*/*_avx2.c and *_avx512.c alone are compiled for those
# instruction sets (whatever ARCH says); util/cpu.c picks at run time which
# twins run, so one binary runs (and never dies of SIGILL) on any x86-64
# from ARCH's baseline up. On other targets the flags are empty and the
# twins compile to nothing.
ifneq ($(findstring x86_64,$(shell $(CC) -dumpmachine)),)
  SIMD_AVX2   := -mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt -mpopcnt
  SIMD_AVX512 := $(SIMD_AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                 -mavx512vnni -mavx512bf16
endif
$(BUILD)/obj/%_avx2.o: SIMD = $(SIMD_AVX2)
$(BUILD)/pic/%_avx2.o: SIMD = $(SIMD_AVX2)
$(BUILD)/obj/%_avx512.o: SIMD = $(SIMD_AVX512)
$(BUILD)/pic/%_avx512.o: SIMD = $(SIMD_AVX512)
ifeq ($(IS_ARM64),1)
  SIMD_NEONDP := -march=armv8.2-a+dotprod
endif
$(BUILD)/obj/%_neondp.o: src/%_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(SIMD_NEONDP) -c $< -o $@
$(BUILD)/pic/%_neondp.o: src/%_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(SIMD_NEONDP) $(PIC_FLAGS) -c $< -o $@

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(SIMD) -c $< -o $@

$(BUILD)/obj/%.o: src/%.cc
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -O2 $(ARCH) -g -Wall -Wextra -fopenmp -Iinclude -Isrc $(DEPFLAGS) -c $< -o $@

$(BUILD)/pic/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(SIMD) $(PIC_FLAGS) -c $< -o $@

$(BUILD)/pic/%.o: src/%.cc
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -O2 $(ARCH) -g -Wall -Wextra -fopenmp -Iinclude -Isrc $(DEPFLAGS) $(PIC_FLAGS) -c $< -o $@

# Each object's header dependencies, as the compiler found them (-MMD); -MP
# adds an empty rule per header, so deleting a header breaks no build.
DEPFLAGS := -MMD -MP
-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/pic/*/*.d $(BUILD)/tests/*.d)

$(BUILD)/libsparq.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# --no-undefined: a library missing from LDLIBS fails here, not at dlopen.
# The version script keeps what static archives bring in (Faiss is a .a on
# Debian, built with default visibility) out of the dynamic symbol table.
$(BUILD)/$(SO_REAL): $(PIC_OBJ) $(BUILD)/libsparq.map
	$(CC) $(SAN) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined \
	    -Wl,--version-script,$(BUILD)/libsparq.map -o $@ $(PIC_OBJ) $(LDLIBS)

$(BUILD)/libsparq.map:
	@mkdir -p $(dir $@)
	printf '{ global: sparq_*; local: *; };\n' > $@

$(BUILD)/libsparq.so: $(BUILD)/$(SO_REAL)
	ln -sf $(SO_REAL) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# pkg-config file; the private libraries are what a static link needs.
# Rewritten only when its text changes, so `make install PREFIX=...` after a
# plain `make` gets the right prefix without relinking anything.
$(BUILD)/sparq.pc: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: sparq' \
	  'Description: CPU inference for GGUF language models with sparse (SparQ, top-k) attention' \
	  'Version: $(VERSION)' \
	  'Libs: -L$${libdir} -lsparq' \
	  'Libs.private: $(filter-out -fsanitize% -fno-%,$(LDLIBS))' \
	  'Cflags: -I$${includedir}' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
FORCE:

# `sparq --version` names the commit it was built from; cli.o is rebuilt
# when that changes (the file is rewritten only then), "unknown" outside git.
GIT_COMMIT := $(or $(if $(wildcard .git),$(shell git rev-parse --short HEAD 2>/dev/null)),unknown)
$(BUILD)/git-commit: FORCE
	@mkdir -p $(dir $@)
	@echo '$(GIT_COMMIT)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/obj/cli/cli.o: $(BUILD)/git-commit
$(BUILD)/obj/cli/cli.o: CFLAGS += -DSPARQ_GIT_COMMIT='"$(GIT_COMMIT)"'

$(WEBUI_C): $(WEBUI_HTML)
	@mkdir -p $(dir $@)
	@{ echo '/* generated by the Makefile from $(WEBUI_HTML): edit that file */'; \
	  echo '#include "server/webui.h"'; \
	  echo 'const unsigned char srv_webui_html[] = {'; \
	  od -An -v -tx1 $< | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '};'; \
	  echo 'const size_t srv_webui_html_len = sizeof srv_webui_html;'; } > $@.tmp
	@mv $@.tmp $@

$(BUILD)/obj/server/webui_html.o: $(WEBUI_C) src/server/webui.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libsparq-server.a: $(SRV_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/sparq: $(CLI_OBJ) $(BUILD)/libsparq-server.a $(BUILD)/libsparq.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libsparq-server.a $(BUILD)/libsparq.a $(LDLIBS) $(SRV_LIBS)

# Debian's aarch64 GCC 12 dies (internal compiler error in
# vect_transform_reduction) vectorising some of the tests' double-precision
# reference loops; the tests need no speed, so they are not vectorised there.
ifeq ($(IS_ARM64),1)
  TEST_CFLAGS := -fno-tree-vectorize
endif
$(BUILD)/tests/%: tests/%.c $(BUILD)/libsparq-server.a $(BUILD)/libsparq.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $@.d -MT $@ $(TEST_CFLAGS) -Itests -o $@ $< $(BUILD)/libsparq-server.a $(BUILD)/libsparq.a \
	    $(LDLIBS) $(SRV_LIBS)

# DESTDIR stages the tree (packaging, tests/test_install.c); a real install
# into the system refreshes the loader cache so ctypes finds libsparq.so.0.
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(MODELDIR)
	install -m 755 $(BUILD)/sparq $(DESTDIR)$(BINDIR)/sparq
	install -m 644 $(BUILD)/libsparq.a $(DESTDIR)$(LIBDIR)/libsparq.a
	install -m 755 $(BUILD)/$(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_REAL)
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libsparq.so
	install -m 644 $(PUB_HDRS) $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(BUILD)/sparq.pc $(DESTDIR)$(PKGCONFIGDIR)/sparq.pc
	install -m 644 $(MODEL_FILES) $(DESTDIR)$(MODELDIR)/
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
	@if [ -n "$(PYTHON_INSTALL)" ]; then $(MAKE) --no-print-directory install-python; fi

# The Python package (python/) into the interpreter PYTHON_INSTALL names (a
# venv's python, say); `make install PYTHON_INSTALL=...` runs this too. Its
# build backend is stdlib only, so this works offline in a bare venv.
# PIP_FLAGS: e.g. --break-system-packages for Debian's own python3.
PYTHON_INSTALL ?=
PIP_FLAGS ?=
install-python:
	$(or $(PYTHON_INSTALL),python3) -m pip install --no-index $(if $(DESTDIR),--root $(DESTDIR)) \
	    $(PIP_FLAGS) ./python

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/sparq $(DESTDIR)$(LIBDIR)/libsparq.a \
	      $(DESTDIR)$(LIBDIR)/$(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libsparq.so \
	      $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(PUB_HDRS))) $(DESTDIR)$(PKGCONFIGDIR)/sparq.pc \
	      $(addprefix $(DESTDIR)$(MODELDIR)/,$(notdir $(MODEL_FILES)))
	-rmdir $(DESTDIR)$(MODELDIR) $(DESTDIR)$(dir $(MODELDIR)) 2>/dev/null || true
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

# Installs what the project needs from Debian (idempotent; skipped when
# present): `setup` all of it (make test), `setup-run` only what building
# and running the command need (make run).
setup:
	@scripts/setup.sh

setup-run:
	@scripts/setup.sh --run

# The packages go in before anything compiles: a prerequisite list would
# build them in parallel with the objects that need their headers.
run:
	@scripts/setup.sh --run
	@$(MAKE) --no-print-directory all
	./$(BUILD)/sparq run -p "Once upon a time" -n 64 --temp 0

test:
	@scripts/setup.sh
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@scripts/run_tests.sh $(BUILD)

# Three replicas behind deploy/nginx/sparq.conf (also part of `make test`).
test-deploy:
	@scripts/setup.sh
	@$(MAKE) --no-print-directory all $(BUILD)/tests/test_deploy
	SPARQ_BUILD=$(BUILD) ./$(BUILD)/tests/test_deploy

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	SPARQ_TEST_QUICK=1 $(MAKE) BUILD=build-asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# The same suite on the same build with the AVX2 kernels forced
# (SPARQ_CPU=avx2, util/cpu.h): the *_avx2.c twins checked against their
# plain-C twins and the golden logits on this AVX-512 machine too.
# Only the programs whose results go through the kernels: the HTTP, CLI
# and packaging tests run the same code at any level, and make test covers
# them (test_cpu there already runs the kernel tests at every level).
AVX2_TESTS := test_attn test_batch test_context_shift test_decode_policies test_embed test_gemm test_generate \
              test_grammar test_import test_index test_kvcache test_kvfile test_kvq8 test_model test_pf_sparse \
              test_phi3 test_prefill test_quant test_sparq_adaptive test_testmodel test_topk
test-avx2: setup all $(TEST_BIN)
	@SPARQ_CPU=avx2 SPARQ_TEST_QUICK=1 SPARQ_TESTS="$(AVX2_TESTS)" scripts/run_tests.sh $(BUILD)

# The ARM64 build, cross-compiled into build-arm64/ (without the server and
# zlib, whose arm64 libraries are not installed) and run under qemu-user:
# every NEON twin against its reference, at every ARM64 level, and
# stories260K's greedy tokens against the golden ones (scripts/test_arm64.sh).
ARM64_CC    ?= aarch64-linux-gnu-gcc
ARM64_TESTS := test_cpu test_quant test_gemm test_attn test_prefill test_index test_model test_generate
test-arm64:
	@scripts/setup.sh
	@$(MAKE) --no-print-directory CC=$(ARM64_CC) BUILD=build-arm64 ARCH=-march=armv8-a build-arm64/sparq \
	    $(addprefix build-arm64/tests/,$(ARM64_TESTS))
	@scripts/test_arm64.sh build-arm64

# Reproduces models/tiny-d64.gguf (models/README.md): trains it with
# Debian's python3-torch on the CPU (about an hour on two cores), exports it
# with `sparq gen-model --weights`, checks sparq's logits against the training
# forward pass, and copies the model and its training record into models/.
testmodel: all
	@scripts/setup.sh --train
	SPARQ_LIB=$(BUILD)/libsparq.so.0 /usr/bin/python3 scripts/train_testmodel.py --out-dir $(BUILD)/testmodel \
	    --sparq $(BUILD)/sparq
	mkdir -p models/tiny-d64
	cp $(BUILD)/testmodel/tiny-d64.gguf models/tiny-d64.gguf
	cp $(BUILD)/testmodel/manifest.json $(BUILD)/testmodel/train_log.csv $(BUILD)/testmodel/loss.png models/tiny-d64/

# A short libFuzzer run over the GGUF reader (clang + libclang-rt-14-dev).
fuzz: setup
	@scripts/fuzz.sh

clean:
	rm -rf build build-asan build-avx2 build-arm64 build-fuzz
