# SPDX-License-Identifier: Apache-2.0
"""README "Replaying your own trace": how much device memory alloy would need for a PyTorch program,
from a memory snapshot of it. No GPU and no torch needed; liballoy built (ALLOY_LIBRARY, or the
build tree):
    PYTHONPATH=python python3 examples/replay_snapshot.py snapshot.pickle
"""

import sys


def main(path):
    from alloy import replay

    trace = replay.load_snapshot(path)  # what torch.cuda.memory._dump_snapshot() wrote
    need = replay.smallest_device(trace, "virtual")  # replays on host memory, no GPU
    print(f"alloy needs {need.capacity / trace.peak_live:.3f}x the peak live bytes;", end=" ")
    print(f"PyTorch had reserved {trace.pytorch_reserved / trace.peak_live:.3f}x")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "snapshot.pickle")
