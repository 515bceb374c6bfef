# Entry points a user needs: `make demo`, `make test`, and `make cluster` (a real single-node
# cluster on this machine running the product; `make cluster-down` removes it). The rest is
# plumbing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench bench-quick redis k8s-binaries helm llama anchors image node-images \
	cluster cluster-down clean

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

# llama.cpp's llama-server built from source once (cached under ~/.cache/prefix-router/llama/)
# and the tiny random-weight GGUF the tests serve with it. TOKENIZER_DIR: the tokenizer to embed.
TOKENIZER_DIR ?= sim/engine_sim/data/tiny-tokenizer
LLAMA_STAMP := $(VENV)/.llama-stamp
$(LLAMA_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench,llama]'
	@touch $@

llama: $(LLAMA_STAMP)
	@PYTHON=$(PY) bash hack/llama/ensure.sh
	@$(PY) hack/llama/make_gguf.py $(TOKENIZER_DIR)

# The anchors' and the third-party client's pinned venvs (python -m bench install, cached under
# ~/.cache/prefix-router/anchors: ~2 min and ~1 GB cold, nothing once built), so `make test`
# runs their tests (tests/bench/test_anchors.py). inference-perf needs Python >= 3.12: where
# pyenv is, each of its versions is offered to the install's search (its shims answer only for
# the versions named in PYENV_VERSION).
anchors: $(STAMP)
	@PYENV_VERSION="$${PYENV_VERSION:-$$(pyenv versions --bare 2>/dev/null | paste -sd: -)}" \
	  $(PY) -m bench install

# The images the real node runs (product from the Dockerfile, Redis, pause, CoreDNS), built
# without Docker and cached by content; imported into the node when one is up.
image: k8s-binaries
	@bash hack/image/build.sh >/dev/null
	@$(PYTHON) e2e/cluster/cluster.py import-images

# For `make test`: the images where this machine can run a node at all (root, Linux, cgroups,
# overlayfs). Elsewhere the node suite skips and says which check failed; under CI (the CI
# environment variable set) this fails with it instead: CI machines can run the node.
node-images: k8s-binaries
	@if $(PYTHON) e2e/cluster/cluster.py check >/dev/null; then \
	  bash hack/image/build.sh >/dev/null; \
	elif [ -n "$$CI" ]; then $(PYTHON) e2e/cluster/cluster.py check; \
	else $(PYTHON) e2e/cluster/cluster.py check || true; fi

# A real single-node cluster (kubelet, containerd, runc, CNI bridge, kube-proxy, CoreDNS) in the
# background; prints its KUBECONFIG. Then: helm install ... charts/prefix-router (README).
cluster: image
	@$(PYTHON) e2e/cluster/cluster.py up

cluster-down:
	@$(PYTHON) e2e/cluster/cluster.py down

demo: $(STAMP)
	$(PY) -m bench demo

test: $(STAMP) redis k8s-binaries helm llama anchors node-images
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rs --ignore=tests/redis --ignore=tests/node
	# The Redis store tests run in their own process, so their real redis-servers and
	# timers do not share a loop with the control-plane tests.
	$(PY) -m pytest -q -rs tests/redis
	# The real node: one cluster for the whole suite, the machine restored at its end.
	$(PY) -m pytest -q -rs tests/node

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP) redis
	$(PY) -m bench compare

bench-quick: $(STAMP) redis
	$(PY) -m bench compare --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
