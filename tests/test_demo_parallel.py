"""The demo's second process (issue 42): ``curate.demo`` runs its fidelity step beside the rest of
the demo, each process on one torch thread; the caller gets the step's result or its error, and
its own thread count back."""
from __future__ import annotations

import math

import pytest
import torch

from curate.demo import run_beside


def test_the_step_beside_returns_its_result_and_the_callers_threads_come_back() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with run_beside(math.factorial, 10) as job:
            assert torch.get_num_threads() == 1  # the caller's half of the cores meanwhile
            assert job.result(timeout=120) == 3628800
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="negative"), run_beside(math.factorial, -1):
            pass  # the step's error comes out of the block even when nobody asked for its result
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
