# Two commands: `make demo` and `make test`. Each bootstraps what it needs first.
PY      ?= python3
VENV    := .venv
STAMP   := $(VENV)/.installed
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-fast setup vllm-env browser fixtures clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	# CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

setup: $(STAMP)

# Real vLLM (CPU build) lives in its own environment: it pins its own torch and transformers.
$(VLLM_STAMP): scripts/setup_vllm_env.sh
	bash scripts/setup_vllm_env.sh $(VLLM_VENV)
	touch $@

vllm-env: $(VLLM_STAMP)

# Headless Chromium for the report's browser test (Debian's package).
browser:
	@command -v chromium >/dev/null || apt-get install -y -q chromium >/dev/null || \
		(apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)

demo: $(STAMP)
	$(VENV)/bin/specops demo

test: $(STAMP) $(VLLM_STAMP) browser
	SPECOPS_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/python -m pytest -q

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow"

fixtures: $(STAMP)
	$(VENV)/bin/specops fixtures build

clean:
	rm -rf $(VENV) $(VLLM_VENV)
