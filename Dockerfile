# One image, every entry point ([project.scripts] of pyproject.toml): prefix-router,
# prefix-operator, prefix-metrics-adapter, engine-sim. The Helm chart (charts/prefix-router)
# runs it as ghcr.io/prefixrouter/prefix-router:<appVersion> with `command:` set per component,
# as uid/gid 10001 on a read-only root filesystem. The entry point is tini; the command is an
# argument, so `docker run IMAGE` starts the router and `docker run IMAGE engine-sim ...` (or a
# custom engine's `args`) the simulator, which then gets SIGTERM forwarded instead of being a
# PID 1 that ignores it.
#
#   docker build -t ghcr.io/prefixrouter/prefix-router:0.1.0 .
#
# Without Docker, `make image` (hack/image/build.sh) runs this same file with buildah on a local
# Debian bookworm stand-in for python:3.11-slim and imports the image into the real node
# (e2e/cluster); tests/k8s/test_chart.py checks it against pyproject.toml and the chart.

# ---------------------------------------------------------------- build: wheels of the package
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router router
COPY operator operator
COPY sim sim
COPY bench bench
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# ---------------------------------------------------------------- runtime
FROM python:3.11-slim
LABEL org.opencontainers.image.title="prefix-router" \
      org.opencontainers.image.description="Prefix-aware LLM router, its Kubernetes operator, external-metrics adapter and engine simulator" \
      org.opencontainers.image.licenses="Apache-2.0"
# tini as PID 1 (the stand-in base of `make image` has it already).
RUN command -v tini >/dev/null \
 || { apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*; }
RUN groupadd --gid 10001 prefix \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin prefix
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && prefix-router --help >/dev/null \
 && prefix-operator --help >/dev/null \
 && prefix-metrics-adapter --help >/dev/null \
 && engine-sim --help >/dev/null
COPY crds /opt/prefix-router/crds
# Nothing is written at run time: no bytecode cache (the root filesystem is read-only in the
# chart's pods), HOME on /tmp (an emptyDir there).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 10001:10001
# The router's port; the operator's health port is 8081, the adapter's HTTPS port 6443.
EXPOSE 8080 9090
ENTRYPOINT ["tini", "--"]
CMD ["prefix-router"]
