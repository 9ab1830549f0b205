"""The machine's compute: bf16 on a CPU, memory at paper scale, each stage's FLOP/s against its peak."""
