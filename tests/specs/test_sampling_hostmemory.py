"""The shared sampling step (executor backend and profiler decode row) and the host-allocator pin."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from hetprof.runtime.sampling import next_tokens


def test_next_tokens_pads_finished_rows_and_finishes_on_eos():
    logits = torch.full((3, 5), -30.0)
    logits[:, 2] = 30.0  # every row draws token 2 almost surely
    finished = torch.tensor([False, True, False])
    tok, lp, alive, done = next_tokens(logits, finished, 1.0, 1.0, torch.Generator().manual_seed(0),
                                       pad_id=0, eos_id=2)
    assert tok.tolist() == [2, 0, 2]
    assert alive.tolist() == [True, False, True]
    assert done.tolist() == [True, True, True]
    assert lp[1] == 0.0 and torch.all(lp[[0, 2]] > -1e-6)


def test_next_tokens_logprob_is_the_tempered_softmax_of_the_drawn_token():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 11, generator=g)
    tok, lp, _, _ = next_tokens(logits, torch.zeros(4, dtype=torch.bool), 0.7, 1.0, g, pad_id=0, eos_id=-1)
    want = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
    torch.testing.assert_close(lp, want)
    greedy, glp, _, _ = next_tokens(logits, torch.zeros(4, dtype=torch.bool), 0.0, 1.0, None, 0, -1)
    assert greedy.tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(glp, torch.log_softmax(logits, -1).max(-1).values)


FAULTS = """
import resource, sys, torch
from hetprof.runtime.hostmemory import keep_freed_memory
if sys.argv[1] == "pin":
    assert keep_freed_memory()
def cycle():
    xs = [torch.ones(1 << 18) for _ in range(24)]  # 24 x 1 MB, a small model's activations
    del xs  # freed together: the heap's top exceeds the default trim threshold and goes back
for _ in range(3):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="the allocator pin is for glibc's malloc")
def test_pinned_allocator_reuses_freed_memory_instead_of_faulting_it_back():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    loose, pinned = faults("default"), faults("pin")
    # Pinned, a warmed-up cycle reuses its memory: no faults. By default glibc may trim the freed top
    # and fault it back (256 faults for 10 cycles on the dev machine), depending on the heap's history.
    assert pinned < 20, pinned
    assert pinned <= loose, (pinned, loose)
