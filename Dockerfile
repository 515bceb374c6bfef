# One image, every entry point ([project.scripts] of pyproject.toml): prefix-router,
# prefix-operator, prefix-metrics-adapter, engine-sim. The Helm chart (charts/prefix-router)
# runs it as ghcr.io/prefixrouter/prefix-router:<appVersion> with `command:` set per component,
# as uid/gid 10001 on a read-only root filesystem.
#
#   docker build -t ghcr.io/prefixrouter/prefix-router:0.1.0 .
#
# tests/k8s/test_chart.py checks this file against pyproject.toml and the chart (it cannot
# build it: the development machine has no container engine).

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
EXPOSE 8080
ENTRYPOINT ["prefix-router"]
