#!/bin/sh
# deploy/timed.sh LABEL COMMAND...: run COMMAND, then say how long it took, so that the long
# steps of `make test` (installs, lint, the suite) each end with a line rather than in silence.
# Exits with COMMAND's status.
label="$1"
shift
start=$(date +%s)
echo "make: ${label} ..." >&2
status=0
"$@" || status=$?
echo "make: ${label}: $(($(date +%s) - start)) s$([ "${status}" -eq 0 ] || echo ", failed (exit ${status})")" >&2
exit "${status}"
