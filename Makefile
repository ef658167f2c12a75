# secrets-bridge — `make demo` and `make test` work on a fresh machine (Python >= 3.11, kubectl).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install tools test lint demo protos bench clean

install: $(STAMP)

# Re-installs only when the project definition changes; otherwise a no-op.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Tools that conflict with the runtime dependencies live in their own virtual environments.
tools:
	@command -v kubectl >/dev/null || { echo "kubectl is required for the manifest tests (kubectl kustomize); install it" >&2; exit 1; }
	@if [ -x deploy/tools.sh ]; then deploy/tools.sh; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: install tools lint
	$(BIN)/pytest -q

demo: install
	$(BIN)/python -m devkit.demo

protos: install
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/provider.proto

bench: install
	$(BIN)/python -m provider.cli.main bench

clean:
	rm -rf $(VENV) .tools build *.egg-info
