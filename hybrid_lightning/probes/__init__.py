"""Probe generation, torch-free: the NIAH, pass-key and variable-tracking probes (tasks) on their
haystacks (haystack), the echo probes of the head scores (near), and the probes file of
``hybrid-lightning probes`` (files: written and read)."""
