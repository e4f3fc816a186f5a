#!/usr/bin/env bash
# Install the workbench into .venv and serve the app on http://127.0.0.1:7860
#   bash scripts/app.sh [--host H] [--port P] [--share] [--runs-root DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# [export]: the Runs tab exports to Parquet (pyarrow) and TensorBoard (tensorboard, google-crc32c) as well as CSV
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[export]"
export GRADIO_ANALYTICS_ENABLED=False
exec .venv/bin/python app.py "$@"
