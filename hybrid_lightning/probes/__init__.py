"""Probe generation, torch-free: the haystacks and the NIAH, pass-key and variable-tracking probes
(tasks), the echo probes of the head scores (near), the probes file of ``hybrid-lightning probes``
(files) and generation-scored exact match on such a file (generation)."""
