"""bench/distributed.py still runs (its quick form); speed is measured by running it, not asserted.

(Here rather than in tests/test_bench.py, which others are editing; the same kind of test.)"""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_distributed_bench_reports_every_variant_and_the_collective():
    done = subprocess.run([sys.executable, str(BENCH / "distributed.py"), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for variant in ("ddp bare", "ddp + local watch", "ddp + watch", "ddp + watch + store"):
        assert re.search(rf"^  {re.escape(variant)}\s+\d+\.\d+ ms/step\s+\d+\.\d+x$", out, re.M), out
    assert re.search(r"payload \(parameter sums\) \d+\.\d+ ms, exchange \d+\.\d+ ms .*merge \d+\.\d+ ms", out), out
    assert re.search(r"the all_gather alone \(\d+ float64 per rank, ranks in step\): \d+\.\d+ ms", out), out
