# kiln: the two commands a fresh machine needs are `make demo` and `make test`.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
KILN_CUDA  ?= AUTO
CMAKE_ARGS ?=
# A short run on the CPU; on a GPU the default -p 512 -n 128 takes seconds.
DEMO_BENCH_ARGS ?= $(shell command -v nvidia-smi > /dev/null 2>&1 && echo '-r 3' || echo '-p 16 -n 8 -r 1')
# The Python module builds with the rest (KILN_PYTHON) against a virtual environment in the build folder
# that holds nanobind, NumPy and pytest (scripts/python-venv.sh); PYTHON=OFF leaves it out.
PYTHON     ?= ON
VENV        = $(BUILD)/venv
CMAKE       = cmake -G Ninja -DKILN_CUDA=$(KILN_CUDA) $(CMAKE_ARGS)
PY_ARGS     = $(if $(filter ON,$(PYTHON)),-DKILN_PYTHON=ON -DPython_EXECUTABLE=$(abspath $(VENV))/bin/python,-DKILN_PYTHON=OFF)

.PHONY: all deps configure build demo test test-asan fuzz ci plots bench clean

all: build

deps:
	@scripts/install-deps.sh

$(VENV)/.ready3:
	@scripts/python-venv.sh $(VENV)

$(BUILD)/build.ninja: | deps $(if $(filter ON,$(PYTHON)),$(VENV)/.ready3)
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(PY_ARGS)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# The demo: the devices, an operator demo, then the engine on the model that ships in models/kiln-tiny (a
# 25 M-parameter Qwen3 trained on the Python documentation by scripts/train_tiny.py): text from a prompt, its
# perplexity of held-out text next to transformers' (they must agree to 3 significant digits), and the
# decode benchmark of a real model shape (random weights).
TINY = models/kiln-tiny
demo: build
	$(BUILD)/bin/kiln info
	$(BUILD)/bin/kiln demo
	$(BUILD)/bin/kiln generate -m $(TINY) -p "The Python interpreter" -n 48 --temp 0.7 --seed 1 --device cpu
	@if command -v nvidia-smi > /dev/null 2>&1; then \
	  $(BUILD)/bin/kiln generate -m $(TINY) -p "A dictionary" -n 48 --temp 0.7 --seed 1 --device auto; fi
	$(BUILD)/bin/kiln perplexity -m $(TINY) --file $(TINY)/heldout.txt --reference $(TINY)/perplexity.json
	$(BUILD)/bin/kiln bench --preset qwen3-0.6b $(DEMO_BENCH_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	$(CMAKE) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_CUDA=OFF -DKILN_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# The fuzz targets (fuzz/, clang + libFuzzer, build-fuzz): each runs FUZZ_SECONDS, and the inputs that reach
# new code join fuzz/corpus/<target> (commit them). FUZZ_TARGETS="tokenizer chat" runs only those.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?=
fuzz:
	@scripts/install-deps.sh --fuzz
	scripts/fuzz.sh --seconds $(FUZZ_SECONDS) --merge $(FUZZ_TARGETS)

# What CI runs on every change (.ci/run): the tests, the sanitizer suite and a minute of each fuzz target.
ci:
	.ci/run

# docs/benchmarks.md's plots and tables from bench/results.
plots:
	@python3 -c "import matplotlib" 2> /dev/null || python3 -m pip install --quiet matplotlib
	python3 scripts/plots.py

bench: build
	$(BUILD)/bin/kiln demo --repeats 200

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
