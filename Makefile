# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use and install what they need (torch from pip;
# on the development machines the pinned wheels lie on local disk).
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
STAMP  := $(VENV)/.musubi-installed
# Bytecode is written even where the environment says not to (why: above `test`).
CACHE_PYC := PYTHONDONTWRITEBYTECODE=

.PHONY: demo test test-durations test-quick test-distributed test-system gpu-test lint clean chromium

# --no-compile: pip would compile every module of every package (torch, transformers: tens of thousands of
# files, ~45 s of CPU on the 2-core machine) where a run imports a fraction of them; the first import writes
# the bytecode of what is used (+10 s once), and both targets below let it (CACHE_PYC). The venv's own pip
# installs editable pyproject packages already: upgrading it cost 10-15 s and nothing else.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile $(TORCH)
	$(PY) -m pip install -q --no-compile -e '.[dev,eval,tb,mlflow,report,transformers,effdet]'
	touch $@

demo: $(STAMP)
	$(CACHE_PYC) $(VENV)/bin/musubi run examples/fleet-demo.yaml

# Every tier (CI runs this). The tiers (docs/testing.md): unit in process, distributed (torchrun on
# gloo CPU ranks), system (Slurm, a browser, the recovery drill); tests/conftest.py marks them.
# Three pytest-xdist workers, one test file each at a time (a file's module fixtures and the Slurm
# cluster start once): much of a torchrun test is waiting (start-up, rendezvous, timeouts), so a
# third worker fills the waits of the other two even on 2 cores, and with more workers than cores
# tests/conftest.py gives each one intra-op thread (no spinning threads fighting for the cores): three
# finished sooner than two on the 2-core machine (BENCHMARKS.md, tests). Files go out slowest first
# (tests/conftest.py orders them by the last run's durations; --no-loadscope-reorder keeps that order), so
# the run ends on short files, not on one worker alone with a long one. TEST_WORKERS=0 runs in one process.
# Bytecode is cached even where the environment says PYTHONDONTWRITEBYTECODE (this sandbox does): the suite
# starts hundreds of interpreters (launchers, torchrun agents, spares, evaluation steps), and each one compiled
# Musubi's modules from source again, and each xdist worker re-ran pytest's assertion rewriting of every test
# module (a collection: 40 s of CPU uncached, 19 s cached). The caches land in __pycache__ (git-ignored);
# compileall writes Musubi's and the tests' bytecode once up front, so no two processes race to write it.
TEST_WORKERS ?= 3
test: $(STAMP) chromium
	$(CACHE_PYC) $(PY) -m compileall -q -j 0 musubi tests bench >/dev/null
	$(CACHE_PYC) $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Refresh the committed test durations (tests/durations.json: a fresh checkout's xdist order) from the
# last `make test` on this machine (tests of files that are gone are dropped).
test-durations:
	$(PY) -c "import json, os; d = json.load(open('.pytest_cache/v/musubi/test-durations')); \
	json.dump({k: round(v, 1) for k, v in sorted(d.items()) if v >= 0.05 and not k.startswith('tests/gpu/') \
	and os.path.isfile(k.split('::')[0])}, open('tests/durations.json', 'w'), indent=0, sort_keys=True)"

# The edit-test loop: the unit tier alone, no torchrun.
test-quick: $(STAMP)
	$(CACHE_PYC) $(VENV)/bin/python -m pytest -q -m "not slow"

test-distributed: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m distributed

test-system: $(STAMP) chromium
	$(VENV)/bin/python -m pytest -q -m system

# The GPU tier (tests/gpu) on this machine's GPUs: writes bench/results/gpu-tests-DATE-CARD.txt.
# It uses the Python that has the GPU build of torch (GPU_PY; the lent machines have no internet, so
# no venv is built there): PYTHONPATH points it at this checkout.
GPU_PY ?= python3
gpu-test:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PY) bench/gpu_tier.py $(GPU_TIER_ARGS)

# The report is checked in a real browser (tests/diagnose/test_report_browser.py): install
# Chromium when it is missing and we may (root + apt); otherwise say loudly that the test will skip.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	        echo "WARNING: installing Chromium failed: the report's browser test will SKIP"; \
	    else echo "WARNING: no Chromium and no root apt-get: the report's browser test will SKIP"; fi; }

lint: $(STAMP)
	$(VENV)/bin/ruff check musubi tests bench

clean:
	rm -rf $(VENV) runs musubi.db
