"""One torch thread for a test module's training runs (bit-reproducible only at a fixed
thread count): ``from threads import one_torch_thread  # noqa: F401`` makes it autouse there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
