"""Speculative decoding evaluation: the exact decoder, the analytic estimator, and the Ray eval pool."""
