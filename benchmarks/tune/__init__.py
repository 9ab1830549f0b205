"""Ray Tune's mixture search against exhaustive enumeration."""
