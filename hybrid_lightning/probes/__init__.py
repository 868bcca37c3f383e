"""Probe generation, torch-free: the haystacks and the NIAH, pass-key and variable-tracking probes
(tasks), the echo probes of the head scores (near), and the probes file of ``hybrid-lightning probes``
(files: written and read)."""
