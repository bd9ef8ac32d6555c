# Two commands on a fresh clone (see README, "Quick start"):
#
#   make demo     create .venv (once), install blockcoupling + the demo's extras, run the demo
#   make test     the same .venv, plus the test extras (pytest, hypothesis, ray, ...), run
#                 `make check`, then the tests (the default suite: not the `slow` marker)
#   make check    ruff (lint) and mypy (types, on all of src/; settings in pyproject.toml)
#   make docs     the same .venv as make test; run the tutorials, build the site into site/
#                 (mkdocs build --strict: a warning, e.g. a broken link, is an error)
#   make test-compat   a second venv (.venv-compat) with the OLDEST supported transformers
#                 (constraints-oldest.txt) and torch pinned as above; runs the engine tests
#                 and the model-family conformance matrix there (CI runs it after make test)
#   make test-interop  the real wrappers, each in a small venv of its own (CI runs it too):
#                 .venv-tl3 (TransformerLens 3.x HookedTransformer), .venv-tl4 (TransformerLens
#                 4.x TransformerBridge, nnsight, PEFT): tests/integrations/test_interop.py, test_wrappers.py
#
# torch is installed first and pinned by a constraints file, so no later install can replace it
# (an unpinned `pip install torch` on Linux pulls the multi-GB CUDA build). Installs are
# remembered by stamp files keyed on the contents of pyproject.toml and the torch pin: a
# second `make demo` goes straight to the demo. Variables (override on the command line):
#
#   TORCH=torch==2.13.0       the torch requirement; e.g. a CUDA build on a GPU machine:
#   TORCH_PIP_ARGS=...        extra pip arguments for torch only, e.g.
#                             --index-url https://download.pytorch.org/whl/cpu (CPU wheels)
#   PYTHON=python3            the interpreter that creates the venv (3.10 or newer)
#   VENV=.venv                where the environment lives
#   DEMO_ARGS=                arguments for `blockcoupling demo`, e.g. --quick
#   TEST_ARGS=-q              arguments for pytest, e.g. "-q -x tests/studies/test_demo.py", or
#                             "-q -m 'slow or not slow'" for every test (what CI runs), or
#                             "-q --random-order" to shuffle the order

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=
DEMO_ARGS ?=
TEST_ARGS ?= -q

# offline by default: the demo and the tests need no Hub; Agg: no display needed
export HF_HUB_OFFLINE ?= 1
export MPLBACKEND ?= Agg
export PIP_DISABLE_PIP_VERSION_CHECK ?= 1

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := $(VENV)/constraints.txt
# cksum is POSIX (Linux and macOS); the key changes when pyproject.toml or the torch pin does
KEY := $(firstword $(shell cat pyproject.toml | cksum))-$(firstword $(shell echo '$(TORCH)' | cksum))
TORCH_STAMP := $(VENV)/.stamp-torch-$(firstword $(shell echo '$(TORCH)' | cksum))
DEMO_STAMP := $(VENV)/.stamp-demo-$(KEY)
TEST_STAMP := $(VENV)/.stamp-test-$(KEY)

# the oldest supported releases (constraints-oldest.txt), for the engine and the families
COMPAT_VENV ?= .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_KEY := $(KEY)-$(firstword $(shell cat constraints-oldest.txt | cksum))
COMPAT_TORCH_STAMP := $(COMPAT_VENV)/.stamp-torch-$(firstword $(shell echo '$(TORCH)' | cksum))
COMPAT_STAMP := $(COMPAT_VENV)/.stamp-compat-$(COMPAT_KEY)
#: the engine's tests and the conformance matrix (tests/engine/test_families.py)
COMPAT_TESTS ?= tests/engine/test_blocks.py tests/engine/test_capture.py tests/engine/test_jacobian.py \
	tests/engine/test_fastpath.py tests/engine/test_structured.py tests/engine/test_measure.py tests/engine/test_normdirs.py \
	tests/engine/test_state.py tests/engine/test_inputs.py tests/engine/test_engine_api.py tests/engine/test_families.py

# the interop tier: TransformerLens 3 and 4 cannot share one environment
INTEROP_TESTS ?= tests/integrations/test_interop.py tests/engine/test_wrappers.py
INTEROP_TL3 := 'transformer-lens>=3,<4'
INTEROP_TL4 := 'transformer-lens>=4,<5' 'nnsight>=0.4' 'peft>=0.10'

.PHONY: demo test test-compat test-interop check docs venv clean-venv help

help:
	@echo "make demo    create .venv, install, run the offline demo (writes demo_run/report.html)"
	@echo "make test    same .venv plus the test extras, make check, run the test-suite"
	@echo "make check   ruff (lint) + mypy (types) on the sources"
	@echo "make docs    same .venv, run the tutorials and build the docs site into site/"
	@echo "make test-compat   engine tests + model families on the oldest supported transformers"
	@echo "make test-interop  the real TransformerLens 3 / 4, nnsight and PEFT, in venvs of their own"
	@echo "make clean-venv   delete .venv"

demo: $(DEMO_STAMP)
	$(VENV)/bin/blockcoupling demo $(DEMO_ARGS)

test: check
	$(PY) -m pytest $(TEST_ARGS)

check: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests tools benchmarks
	$(VENV)/bin/mypy

docs: $(TEST_STAMP)
	BLOCKCOUPLING_DOCS_FRESH=1 NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

venv: $(DEMO_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(TORCH_STAMP): | $(PY)
	$(PIP) install $(TORCH_PIP_ARGS) '$(TORCH)'
	echo '$(TORCH)' > $(CONSTRAINTS)
	rm -f $(VENV)/.stamp-torch-*
	touch $@

$(DEMO_STAMP): $(TORCH_STAMP)
	$(PIP) install -c $(CONSTRAINTS) -e '.[demo]'
	touch $@

$(TEST_STAMP): $(TORCH_STAMP)
	$(PIP) install -c $(CONSTRAINTS) -e '.[demo,test,sweep,dev,docs]'
	touch $(DEMO_STAMP) $@

test-compat: $(COMPAT_STAMP)
	@$(COMPAT_PY) -c 'import torch, transformers; print("test-compat: torch", torch.__version__, "transformers", transformers.__version__)'
	$(COMPAT_PY) -m pytest $(TEST_ARGS) $(COMPAT_TESTS)

$(COMPAT_PY):
	$(PYTHON) -m venv $(COMPAT_VENV)

$(COMPAT_TORCH_STAMP): | $(COMPAT_PY)
	$(COMPAT_PY) -m pip install $(TORCH_PIP_ARGS) '$(TORCH)'
	echo '$(TORCH)' > $(COMPAT_VENV)/constraints.txt
	rm -f $(COMPAT_VENV)/.stamp-torch-*
	touch $@

$(COMPAT_STAMP): $(COMPAT_TORCH_STAMP) constraints-oldest.txt
	$(COMPAT_PY) -m pip install -c $(COMPAT_VENV)/constraints.txt -c constraints-oldest.txt \
		-e '.[test-engine]'
	rm -f $(COMPAT_VENV)/.stamp-compat-*
	touch $@

test-interop: .venv-tl3/.stamp-interop-$(KEY) .venv-tl4/.stamp-interop-$(KEY)
	.venv-tl3/bin/python -m pytest $(TEST_ARGS) $(INTEROP_TESTS)
	.venv-tl4/bin/python -m pytest $(TEST_ARGS) $(INTEROP_TESTS)

# one small venv per tier: torch pinned first (as everywhere), then blockcoupling + the wrappers
.venv-tl%/.stamp-interop-$(KEY):
	rm -rf .venv-tl$* && $(PYTHON) -m venv .venv-tl$*
	.venv-tl$*/bin/python -m pip install $(TORCH_PIP_ARGS) '$(TORCH)'
	echo '$(TORCH)' > .venv-tl$*/constraints.txt
	.venv-tl$*/bin/python -m pip install -c .venv-tl$*/constraints.txt -e '.[test-engine]' \
		$(INTEROP_TL$*)
	touch $@

clean-venv:
	rm -rf $(VENV) $(COMPAT_VENV) .venv-tl3 .venv-tl4
