#!/usr/bin/env bash
# Install everything the test suite needs into .venv and run it.
#   bash scripts/test.sh [pytest args...]
# Needs Python 3.11. Installs Debian's chromium for the browser tests when it is
# missing and we are root (apt-get); Playwright drives that binary, it downloads none.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# constraints.txt pins torch to the 2.13.0 CPU wheel this project's machines keep on disk.
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test,docs]"

if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing chromium for the browser tests (apt-get)..."
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "chromium is missing: install it (e.g. sudo apt-get install chromium) for the browser tests" >&2
    fi
fi

export GRADIO_ANALYTICS_ENABLED=False
exec .venv/bin/python -m pytest "$@"
