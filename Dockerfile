# One image, every entry point: prefix-router, prefix-operator, prefix-metrics-adapter, engine-sim.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router router
COPY operator operator
COPY sim sim
COPY bench bench
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin prefix
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY crds /opt/prefix-router/crds
USER 10001
ENV PYTHONUNBUFFERED=1
EXPOSE 8080
ENTRYPOINT ["prefix-router"]
