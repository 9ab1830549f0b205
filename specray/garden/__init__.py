"""DistillSpec's model garden (Fig. 6): targets of several sizes, the largest teaching the others, each
target with a draft — quality against latency for raw, distilled and speculative decoding (`garden.run`)."""
