# SPDX-License-Identifier: Apache-2.0
"""README "From Python": a PyTorch model trained on alloy, its statistics and its snapshot.

Needs torch and a CUDA device; run it with liballoy built (ALLOY_LIBRARY, or the build tree):
    PYTHONPATH=python python3 examples/pytorch_on_alloy.py
"""


def train(model, steps=20):
    import torch

    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(steps):
        batch = torch.randn(64, 1024, device="cuda") * (1 + step % 4)  # sizes vary by step
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    import alloy, torch
    alloy.torch.install("composition:virtual,capacity:0.9,history:100000")  # before any CUDA tensor
    train(model.cuda())                                   # your training loop, unchanged
    print(alloy.memory_stats()["allocated_bytes.all.peak"])  # keyed as torch.cuda.memory_stats()
    alloy.dump_snapshot("snapshot.pickle")                # drop it on pytorch.org/memory_viz


if __name__ == "__main__":
    main()
