"""Calibration probes that drive real vLLM to fit the cost model's parameters."""
