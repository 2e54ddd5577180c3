# sparq: the entry point. `make` builds build/sparq and build/libsparq.a;
# `make run` runs the main job on the default model; `make test` runs every test.
#
# Every src/LAYER/*.c goes into the library (except src/cli/, the command, and
# *.cc shims), every tests/test_*.c becomes one test program linked against it,
# so adding a module, a layer folder or a test never needs an edit here.
# src/README.md says what each layer owns and what it may include.

CC      ?= cc
ARCH    ?= -march=native
OPT     ?= -O2
SAN     ?=
CFLAGS  ?=
CFLAGS  += $(SAN) -std=c11 -D_GNU_SOURCE $(OPT) $(ARCH) -g -Wall -Wextra -Wno-unused-parameter \
           -Wshadow -Wstrict-prototypes -fopenmp -Iinclude -Isrc
LDLIBS  += $(SAN) -lz -lm -fopenmp
BUILD   ?= build

LIB_SRC  := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
HDRS     := $(wildcard src/*/*.h) $(wildcard include/*.h)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:src/%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

# Optional C++ shim around Faiss (HNSW index); built only when Faiss is installed.
FAISS_HDR := $(wildcard /usr/include/faiss/IndexHNSW.h)
ifneq ($(FAISS_HDR),)
  ifneq ($(wildcard src/index/index_hnsw_faiss.cc),)
    CFLAGS   += -DSPARQ_HAVE_FAISS=1
    LIB_OBJ  += $(BUILD)/obj/index/index_hnsw_faiss.o
    LDLIBS   += -lfaiss -lopenblas -lstdc++
  endif
endif

# sparq serve: libmicrohttpd (scripts/setup.sh installs libmicrohttpd-dev)
LDLIBS  += -lmicrohttpd -lpthread

.PHONY: all run test test-asan test-deploy fuzz setup clean bench
all: $(BUILD)/sparq

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: src/%.cc $(HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN) -O2 $(ARCH) -g -Wall -Wextra -fopenmp -Iinclude -Isrc -c $< -o $@

$(BUILD)/libsparq.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/sparq: $(CLI_OBJ) $(BUILD)/libsparq.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libsparq.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(HDRS) $(BUILD)/libsparq.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libsparq.a $(LDLIBS)

# Installs what the project needs from Debian (idempotent; skipped when present).
setup:
	@scripts/setup.sh

run: setup all
	./$(BUILD)/sparq run -p "Once upon a time" -n 64 --temp 0

test: setup all $(TEST_BIN)
	@scripts/run_tests.sh $(BUILD)

# Three replicas behind deploy/nginx/sparq.conf (also part of `make test`).
test-deploy: setup all $(BUILD)/tests/test_deploy
	SPARQ_BUILD=$(BUILD) ./$(BUILD)/tests/test_deploy

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	SPARQ_TEST_QUICK=1 $(MAKE) BUILD=build-asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# A short libFuzzer run over the GGUF reader (clang + libclang-rt-14-dev).
fuzz: setup
	@scripts/fuzz.sh

clean:
	rm -rf build build-asan build-fuzz
