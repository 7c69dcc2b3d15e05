"""The fp32 engine: Hugging Face models on our order-fixed AVX2 linear kernels, prepared model directories."""
