# secrets-bridge — `make demo` and `make test` work on a fresh machine (Python >= 3.11, kubectl).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install tools test lint demo protos bench soak clean

install: $(STAMP)

# Re-installs only when the project definition or the lock changes; otherwise a no-op. Every
# package comes from requirements-test.lock at its pinned version, each file checked against its
# sha256: pip first (so the locked pip, not the one the Python came with, installs the rest),
# then everything else, the build backend included, then the project itself, editable, with no
# dependency resolved. A dependency pyproject.toml adds without deploy/lock.sh fails `pip check`
# (runtime) or tests/deploy/test_deploy_dockerfile.py (test extras).
$(STAMP): pyproject.toml requirements-test.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	sed -n '/^pip==/,/[^\\]$$/p' requirements-test.lock >$(VENV)/pip.lock
	$(BIN)/python -m pip install --quiet --require-hashes -r $(VENV)/pip.lock
	deploy/timed.sh "install requirements-test.lock" \
		$(BIN)/python -m pip install --quiet --require-hashes -r requirements-test.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

# Tools that conflict with the runtime dependencies live in their own virtual environments.
tools: install
	@command -v kubectl >/dev/null || { echo "kubectl is required for the manifest tests (kubectl kustomize); install it" >&2; exit 1; }
	@if [ -x deploy/tools.sh ]; then deploy/tools.sh; fi
	@# Azurite, the Azure Storage emulator the change feed's queue tests run (pinned in
	@# deploy/azurite/; a no-op once installed).
	$(BIN)/python -c 'from devkit.azurite import install; install()'


lint: install
	deploy/timed.sh "ruff check" $(BIN)/ruff check .
	deploy/timed.sh "ruff format --check" $(BIN)/ruff format --check .
	deploy/timed.sh mypy $(BIN)/mypy
	deploy/timed.sh lint-imports $(BIN)/lint-imports

# The suite on every core (pytest-xdist; JOBS=0 runs it in this process). Each worker starts its
# own session servers (OpenBao, moto, ...) on ports the kernel picks; a module's tests stay on one
# worker (loadscope), so module fixtures start once. The soaks (marker `bench`) are left out by
# pyproject's addopts: `make soak` runs them. The tests that measure latency while the provider
# is under attack (marker `serial`) run afterwards in one process, with no other worker beside
# them on the two cores.
# Three workers on two cores: much of the suite waits (token lifetimes of the lease tests,
# servers starting), and a third worker fills that wait: the parallel run took 446 s with two,
# 329 s with three, on this machine kind. Timed tests run alone afterwards (`serial`).
JOBS ?= 3
test: install tools lint
	deploy/timed.sh pytest $(BIN)/pytest -q -n $(JOBS) --dist loadscope -m "not bench and not serial"
	deploy/timed.sh "pytest -m serial" $(BIN)/pytest -q -m "serial and not bench"

soak: install tools
	deploy/timed.sh "pytest -m bench" $(BIN)/pytest -q -m bench -n $(JOBS) --dist loadscope

demo: install
	$(BIN)/python -m devkit.demo

protos: install
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/provider.proto

bench: install
	$(BIN)/python -m provider.cli.main bench

clean:
	rm -rf $(VENV) .tools build *.egg-info
