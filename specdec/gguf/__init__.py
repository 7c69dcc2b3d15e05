"""The GGUF engine: the files' own quantized weights on order-fixed native products (the lean session)."""
