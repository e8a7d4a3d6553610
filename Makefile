# The two entry points of the README. Both work on a fresh Debian 12 machine as root.
#   make run   installs what is missing, builds, generates text from the bundled model
#   make test  installs what is missing, builds (warnings are errors), runs the whole suite
APT_PACKAGES := build-essential cmake pkg-config clang clang-format libomp-dev libclang-rt-14-dev \
                libpcre2-dev libcjson-dev libxxhash-dev libmicrohttpd-dev python3 python3-jsonschema \
                chromium openmpi-bin libopenmpi-dev
# chromium: the browser the built-in web pages are tested in (tests/server/test_web.mjs).
# Node.js runs the OpenAI-client tests; a machine may already have its own Node
# (Debian's npm package conflicts with NodeSource's nodejs), so only install it
# from apt when the commands are missing.
NODE_PACKAGES := nodejs npm
BUILD := build
JOBS := $(shell nproc 2>/dev/null || echo 2)

.PHONY: run test sanitize deps build clean

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing="$$missing $(NODE_PACKAGES)"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/kvllm run -p "Once upon a time" -n 200

test: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKVLLM_WERROR=ON >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory sanitize SAN_ASAN_EXCLUDE='$(SAN_CI_ASAN_EXCLUDE)'

# Sanitizers: the unit and golden tests again with ASan + UBSan (build-asan;
# no recovery: any report fails), and the server tests with TSan (build-tsan;
# one compute thread, OMP_NUM_THREADS=1 also sizing the kvl_pool: the threads
# to check there are the server's own) plus test_pool, which checks the pool
# with several threads. `make sanitize` runs every one of them; `make test` runs
# them too but for SAN_CI_ASAN_EXCLUDE, to stay within a CI budget of ~15
# minutes on 2 cores: goldens of quant types whose kernels test_kernels
# already runs under ASan, the variants of an architecture another golden
# covers, test_attention (its forward pass runs in every golden), and
# golden_llama4-f32 (~26 s under ASan for its 8250-token prompt and 8320-token
# perplexity; its layers run under ASan in test_engine).
# CPU time (user + sys) measured on a 2-core machine: the Release suite ~440 s
# (build ~65 s); ASan + UBSan build ~300 s, its tests ~200 s for this subset
# (~390 s for all; test_attention 55 s, a golden 4-16 s); TSan build of kvllm
# and test_server ~100 s, the server tests under it ~17 s.
SAN_TYPE := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_WERROR=ON
SAN_ASAN_EXCLUDE :=
SAN_CI_ASAN_EXCLUDE := test_attention|golden_llama4-f32|golden_deepseek2-(moe|yarn)-f32|golden_qwen3-f32|golden_qwen3moe-f32|golden_llama-gqa-bpe-(f16|f32|iq4_nl|q2_k|q3_k_m|q4_0|q4_1|q4_k_s|q5_0|q5_1|q5_k_m|q5_k_s|q6_k)
sanitize: deps
	cmake -S . -B build-asan $(SAN_TYPE) -DKVLLM_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L 'unit|golden' $(if $(SAN_ASAN_EXCLUDE),-E '$(SAN_ASAN_EXCLUDE)')
	cmake -S . -B build-tsan $(SAN_TYPE) -DKVLLM_TSAN=ON >/dev/null
	cmake --build build-tsan -j $(JOBS) --target kvllm test_server test_pool test_kv_disk_load
	TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 ctest --test-dir build-tsan --output-on-failure -L 'server|threads'

clean:
	rm -rf $(BUILD) build-*
