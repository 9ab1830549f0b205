"""The teacher: the generator pool's throughput by replicas, online KD's teacher pass over student samples."""
