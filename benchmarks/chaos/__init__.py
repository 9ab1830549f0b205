"""The chaos harness: a whole sweep under repeated, random faults on a loopback Ray cluster, then audited
against the fault-free run (`python -m benchmarks.chaos.run`)."""
