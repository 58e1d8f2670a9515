"""Fixtures shared by several suites."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from service_fixtures import fo, ls, mongo  # noqa: F401 - shared fixtures, registered once


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo's worlds and weights (``curate.demo.run_demo``: two reference CLIPs, about 2 minutes).

    ``$CURATE_DEMO_WORKDIR`` if set (reused when current), else trained once per session and
    shared by the slow suites (explain, fidelity).
    """
    from curate.demo import run_demo

    workdir = Path(os.environ.get("CURATE_DEMO_WORKDIR") or tmp_path_factory.mktemp("demo"))
    run_demo(workdir)
    return workdir


@pytest.fixture()
def one_thread():
    """Torch on one thread for the test (small models run faster so on 2 shared cores); restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
