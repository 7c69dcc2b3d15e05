"""Side by side with what a user would pick instead: Hugging Face generate, llama.cpp."""
