# secrets-bridge: the Secrets Store CSI driver provider, one pod per node (see deploy/).
#
# Two stages. The build stage installs exactly the committed lock (requirements.lock: every
# version pinned, every file checked against its sha256, wheels only) and the project's own
# wheel into a virtual environment that has no pip, drops what the runtime never reads, and
# compiles the byte-code. The final image gets only that environment, and compiles its own
# standard library, because the base deletes that byte-code and the container's root filesystem
# is read-only. Build from the repository root:  docker build -t secrets-bridge:0.1.0 .
# After changing dependencies in pyproject.toml, regenerate the locks: deploy/lock.sh.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
# binutils for `strip --strip-debug` below, in this stage only: it removes the debug sections of
# the extension modules, so its version changes nothing that runs.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements-build.lock requirements.lock ./
# The locked pip and build backend (requirements-build.lock) for this stage's own interpreter;
# then the runtime dependencies, exactly requirements.lock, into a virtual environment created
# without pip. --no-deps: the lock is complete, and leaves out the pbr and setuptools that
# hdrhistogram declares but never imports. --only-binary: no source build fetches unpinned tools.
RUN python -m pip install --no-cache-dir --require-hashes --only-binary=:all: \
        -r requirements-build.lock \
    && python -m venv --without-pip /opt/secrets-bridge \
    && python -m pip --python /opt/secrets-bridge/bin/python install --no-cache-dir --no-compile \
        --require-hashes --only-binary=:all: --no-deps -r requirements.lock
# Only what building the wheel needs; tests, docs and deploy files stay out (.dockerignore).
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY backends ./backends
COPY provider ./provider
# botocore's models of the AWS services the provider calls (backends/aws: Secrets Manager, SSM
# Parameter Store, STS) and of those its credential chain may call (SSO, sign-in); the other
# ~430 (about 18 MB) go.
ARG BOTOCORE_SERVICES="secretsmanager ssm sts sso sso-oidc signin"
# The project's wheel, built by the locked backend without build isolation and installed with
# nothing resolved. Then what the runtime never reads goes (test suites, type stubs, the debug
# sections of extension modules, unused AWS models) and everything left is compiled to
# byte-code once (pip compiles nothing: --no-compile), hash-based and unchecked: valid whatever
# times the files get, never checked against the sources nor recompiled.
RUN python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/wheels . \
    && python -m pip --python /opt/secrets-bridge/bin/python install --no-cache-dir --no-compile \
        --no-deps --no-index /tmp/wheels/secrets_bridge-*.whl \
    && site="$(/opt/secrets-bridge/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && find "$site" -type d -name tests -prune -exec rm -rf {} + \
    && find "$site" -type f -name '*.pyi' -delete \
    && find "$site" -type f -name '*.so' ! -path '*.libs/*' -exec strip --strip-debug {} + \
    && for dir in "$site"/botocore/data/*/; do \
        case " $BOTOCORE_SERVICES " in *" $(basename "$dir") "*) ;; *) rm -rf "$dir" ;; esac; \
    done \
    && /opt/secrets-bridge/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash \
        /opt/secrets-bridge

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="secrets-bridge" \
      org.opencontainers.image.description="Secrets Store CSI driver provider for Vault/OpenBao, AWS, GCP and Azure" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/secrets-bridge/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Nothing installs anything at run time: the base's pip, setuptools and wheel go (with
# ensurepip's bundled copies). The base deletes the standard library's byte-code and the root
# filesystem is read-only in the pod, so every start would compile what it imports in memory:
# it is compiled here, once, as the environment is in the build stage.
RUN purelib="$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && stdlib="$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
    && scripts="$(python -c 'import sysconfig; print(sysconfig.get_path("scripts"))')" \
    && rm -rf "$purelib"/pip "$purelib"/pip-*.dist-info "$purelib"/setuptools \
        "$purelib"/setuptools-*.dist-info "$purelib"/pkg_resources "$purelib"/_distutils_hack \
        "$purelib"/distutils-precedence.pth "$purelib"/wheel "$purelib"/wheel-*.dist-info \
        "$stdlib"/ensurepip/_bundled "$scripts"/pip "$scripts"/pip3 "$scripts"/pip3.* \
        "$scripts"/wheel \
    && python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash "$stdlib"
COPY --from=build /opt/secrets-bridge /opt/secrets-bridge
# Non-root by default (for `check`, `mount`, `version`). The DaemonSet overrides this with
# uid 0 because the driver's socket directory on the node is root-owned: see
# deploy/base/daemonset.yaml.
USER 65532:65532
EXPOSE 8098
ENTRYPOINT ["secrets-bridge"]
CMD ["serve"]
