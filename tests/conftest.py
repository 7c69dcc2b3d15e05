import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    # Tiny models run ~10x faster on one thread than on two busy ones.
    torch.set_num_threads(1)
