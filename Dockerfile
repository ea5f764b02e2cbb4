# syntax=docker/dockerfile:1
# The gateway image. The same image runs the upstream simulators
# (`gateway sim hosted|vllm`), so the compose stack builds it once.
#
#   docker build -t cost-gateway .
#   docker run -p 8080:8080 -v "$PWD/policies:/etc/gateway/policies:ro" \
#     -e GATEWAY_POLICY=/etc/gateway/policies/minimal.yaml cost-gateway
ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: a virtualenv from the hash-pinned lock, then the package itself ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, so a code change does not reinstall them. Every wheel is checked
# against the lock's hashes and nothing is resolved (see the litellm note in the lock).
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml ./
COPY gateway ./gateway
# A regular (not editable) install: the image does not need the source tree. setuptools
# comes from the lock, hence --no-build-isolation (nothing is fetched unpinned).
RUN pip install --no-deps --no-build-isolation . \
 && gateway --help >/dev/null

# ---- runtime ----
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GATEWAY_PRICING_DIR=/app/pricing \
    GATEWAY_VAR_DIR=/var/lib/gateway \
    GATEWAY_POLICY=/etc/gateway/policy.yaml
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid gateway --home-dir /var/lib/gateway --no-create-home \
      --shell /usr/sbin/nologin gateway \
 && mkdir -p /var/lib/gateway /etc/gateway \
 && chown gateway:gateway /var/lib/gateway
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The price overrides the catalog reads (GATEWAY_PRICING_DIR) and the example policies.
COPY pricing ./pricing
COPY policies ./policies
USER gateway:gateway
EXPOSE 8080
# slim has no curl: ask /healthz with the interpreter that is already there.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
# One worker per container: each worker keeps its own Prometheus registry, so scale
# with more containers (or pass --workers and accept per-worker /metrics).
CMD ["gateway", "serve", "--host", "0.0.0.0", "--port", "8080"]
