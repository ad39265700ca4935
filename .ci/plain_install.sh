#!/usr/bin/env bash
# Plain-install check: the package installed the way a cluster installs it, without the dev extra
# (`pip install torch==2.13.0`, then `pip install .`), in a venv of its own, and every command run once from it
# (.ci/plain_commands.py). Fails on an ImportError, on any command that fails, and on a dev-only package that
# the plain install pulled in. The llm and gpu extras cannot run here (no GPU): their paths must stop with one
# line naming the extra (checked), and the reason is printed.
#
# Everything lives in one temporary folder (venv, Ray's session files, runs), removed at the end; the Ray it
# starts is this check's own (RAY_TMPDIR in that folder; never `ray stop`), and any process still carrying this
# run's marker variable after the check is ended by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/vb-plain.XXXXXX)  # short: Ray's socket paths live under it
MARK="VB_PLAIN_CHECK=$WORK"

ours() {  # pids of the processes that carry this run's marker in their environment
    "$PYTHON" - "$MARK" <<'PY'
import os, sys
mark = sys.argv[1].encode()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            if mark in fh.read().split(b"\0"):
                print(pid)
    except OSError:
        pass
PY
}

cleanup() {
    local left i pid
    for i in $(seq 1 30); do  # Ray's own shutdown and the reaper first
        left=$(ours)
        [ -z "$left" ] && break
        sleep 0.5
    done
    if [ -n "$left" ]; then
        echo "[plain-install] ending processes left running: $(echo $left)"
        for pid in $left; do kill -9 "$pid" 2>/dev/null || true; done
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

started=$(date +%s)
echo "[plain-install] venv in $WORK: pip install torch==2.13.0, then pip install . (no extras)"
"$PYTHON" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/pip" install -q --no-compile)
"${PIP[@]}" torch==2.13.0
# Build from a copy of the working tree, so no build/ folder is left in (or reused from) the checkout.
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
(cd "$WORK/src" && "${PIP[@]}" .)
echo "[plain-install] installed in $(( $(date +%s) - started )) s"

# The plain install must not have the dev extra's packages (else this check proves nothing).
"$WORK/venv/bin/python" - <<'PY'
import importlib.util, sys
dev_only = ["pytest", "hypothesis", "ruff", "datasets", "fastapi", "uvicorn", "openai", "moto"]
found = [m for m in dev_only if importlib.util.find_spec(m) is not None]
if found:
    sys.exit(f"[plain-install] the plain install has dev-only packages: {found}")
PY

set +e
env -u RAY_ADDRESS "$MARK" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$WORK/hf" RAY_TMPDIR="$WORK/ray" \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 \
    "$WORK/venv/bin/python" "$REPO/.ci/plain_commands.py" "$WORK/run" > "$WORK/log" 2>&1
rc=$?
set -e
grep -F "[plain-install]" "$WORK/log" || true
if grep -qE "\b(ImportError|ModuleNotFoundError): " "$WORK/log"; then
    echo "[plain-install] an ImportError was raised (in the driver or a Ray worker):"
    grep -nE -B2 -A2 "\b(ImportError|ModuleNotFoundError): " "$WORK/log" | head -40
    rc=1
fi
if [ "$rc" -ne 0 ]; then
    echo "[plain-install] FAILED (exit $rc); the last 150 lines of its output:"
    tail -n 150 "$WORK/log"
    exit 1
fi
echo "[plain-install] passed in $(( $(date +%s) - started )) s"
