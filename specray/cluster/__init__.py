"""Ray runtime and cluster helpers: starting or joining Ray, and (later) Ray Jobs submission."""
