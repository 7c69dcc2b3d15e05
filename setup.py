"""The one compiled piece: specdec._linear, a batch-1 fp32 linear layer for AVX2 CPUs (specdec/_linear.c).

Optional: where it cannot be built (no C compiler, no OpenMP) the install goes on without it and the engine uses
torch's own kernels (specdec/kernels.py asks whether it is there)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("specdec._linear", ["specdec/_linear.c"], extra_compile_args=["-O3", "-fopenmp"],
                             extra_link_args=["-fopenmp"], optional=True)])
