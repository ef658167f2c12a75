"""The bench's echo floor, as the dev kit has always started it (`python -m devkit.echo SOCKET`).

The server itself lives in the wheel (`provider.cli.bench.floor`) because the load-test Job
measures the floor on a node, where there is no dev kit.
"""

from __future__ import annotations

import sys

from provider.cli.bench.floor import FloorServicer, default_response, main, serve

EchoServicer = FloorServicer

__all__ = ["EchoServicer", "default_response", "serve"]

if __name__ == "__main__":
    main(sys.argv[1:])
