import pytest
import torch


@pytest.fixture(autouse=True)
def _no_kernel_plans(monkeypatch, tmp_path_factory):
    """Models load with the default kernel and layouts: no test times kernels at load, reads the user's cached plans
    or writes them (tests/test_kernel_plan.py turns the plans on, with a cache of its own)."""
    monkeypatch.setenv("SPECDEC_KERNEL_PLAN", "off")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path_factory.getbasetemp() / "specdec-cache"))


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


ALL_PRODUCT_KERNELS = ("avx2", "avx512-vnni-256", "avx512-vnni", "amx")  # specdec/native/_quant_kernels.h's


@pytest.fixture(params=ALL_PRODUCT_KERNELS)
def kernel(request):
    """Run a test on every quantized product kernel this CPU has (the others are skipped, named, so a report shows
    which instruction sets the run covered)."""
    from specdec.gguf import quant

    if request.param not in quant.kernels():
        pytest.skip(f"this CPU does not run the {request.param} product kernel")
    with quant.use_kernel(request.param):
        yield request.param
