"""Sweep orchestration: the resumable end-to-end run (`specray run`) and, later, Ray Tune search."""
