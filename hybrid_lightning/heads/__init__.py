"""Retrieval heads: the per-head retrieval scores of Wu et al. 2024 (retrieval), head ablations with
their layer-matched controls (ablation), and the tables, image and ``eval/heads_step_<k>.json`` files
(report)."""
