import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    # Tiny models run ~10x faster on one thread than on two busy ones.
    torch.set_num_threads(1)


@pytest.fixture(params=(1, 2), ids=lambda n: f"threads{n}")
def threads(request):
    """Run a test on 1 and on 2 torch threads (the native kernels' serial and OpenMP paths)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
