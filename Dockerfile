# secrets-bridge: the Secrets Store CSI driver provider, one pod per node (see deploy/).
#
# Two stages: the build stage installs the package and its runtime dependencies into a
# virtual environment; the final image gets only that environment (no pip cache, no sources,
# no build tools). Build from the repository root:  docker build -t secrets-bridge:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/secrets-bridge
# Only what `pip install .` needs; tests, docs and deploy files stay out (.dockerignore).
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY backends ./backends
COPY provider ./provider
# Runtime dependencies only (the project declares no runtime extras); byte-code is compiled
# here because the running container has a read-only root filesystem.
RUN /opt/secrets-bridge/bin/pip install --no-cache-dir . \
    && /opt/secrets-bridge/bin/python -m compileall -q /opt/secrets-bridge

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="secrets-bridge" \
      org.opencontainers.image.description="Secrets Store CSI driver provider for Vault/OpenBao, AWS, GCP and Azure" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/secrets-bridge/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/secrets-bridge /opt/secrets-bridge
# Non-root by default (for `check`, `mount`, `version`). The DaemonSet overrides this with
# uid 0 because the driver's socket directory on the node is root-owned: see
# deploy/base/daemonset.yaml.
USER 65532:65532
EXPOSE 8098
ENTRYPOINT ["secrets-bridge"]
CMD ["serve"]
