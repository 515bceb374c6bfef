# Two entry points a user needs: `make demo` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench bench-quick redis k8s-binaries helm clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (found %s)" % sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "error: cannot create a venv; install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $@

redis:
	@bash hack/ensure-redis.sh

k8s-binaries:
	@bash hack/cluster/ensure-binaries.sh

helm:
	@bash hack/ensure-helm.sh >/dev/null

demo: $(STAMP)
	$(PY) -m bench demo

test: $(STAMP) redis k8s-binaries helm
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rs --ignore=tests/redis
	# The Redis store tests run in their own process, so their real redis-servers and
	# timers do not share a loop with the control-plane tests.
	$(PY) -m pytest -q -rs tests/redis

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP) redis
	$(PY) -m bench compare

bench-quick: $(STAMP) redis
	$(PY) -m bench compare --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
