# The two entry points of the README. Both work on a fresh Debian 12 machine as root.
#   make run   installs what is missing, builds, generates text from the bundled model
#   make test  installs what is missing, builds (warnings are errors), runs the whole suite
APT_PACKAGES := build-essential cmake pkg-config clang clang-format libomp-dev libclang-rt-14-dev \
                libpcre2-dev libcjson-dev libxxhash-dev libmicrohttpd-dev libcurl4-gnutls-dev nettle-dev \
                python3 python3-jsonschema \
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
	$(MAKE) --no-print-directory sanitize

# Sanitizers: the unit and golden tests again with ASan + UBSan (build-asan;
# no recovery: any report fails; the server tests labelled asan_server, and the
# Hugging Face download test, label asan_cli),
# and the server tests with TSan (build-tsan;
# one compute thread, OMP_NUM_THREADS=1 also sizing the kvl_pool: the threads
# to check there are the server's own) plus test_pool, which checks the pool
# with several threads. `make test` runs all of them. What kept that within
# the CI budget (~15 minutes on 2 cores): a kvllm process costs ~0.15 s of CPU
# under ASan before it does anything, so the goldens there tokenize through
# the CLI once per flag pair instead of once per case (check_golden.py
# --sanitizer; test_tokenizer checks every case in one process), and the
# reference forward in test_attention computes logits only for the tokens
# compared. SAN_ASAN_EXCLUDE: a ctest -E regex to leave tests out by hand.
SAN_TYPE := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_WERROR=ON
SAN_ASAN_EXCLUDE :=
sanitize: deps
	cmake -S . -B build-asan $(SAN_TYPE) -DKVLLM_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L 'unit|golden|asan_server|asan_cli' $(if $(SAN_ASAN_EXCLUDE),-E '$(SAN_ASAN_EXCLUDE)')
	cmake -S . -B build-tsan $(SAN_TYPE) -DKVLLM_TSAN=ON >/dev/null
	cmake --build build-tsan -j $(JOBS) --target kvllm test_server test_pool test_kv_disk_load
	TSAN_OPTIONS=halt_on_error=1 OMP_NUM_THREADS=1 ctest --test-dir build-tsan --output-on-failure -L 'server|threads'

clean:
	rm -rf $(BUILD) build-*
