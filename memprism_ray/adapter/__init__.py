"""Adapter: view-policy learning (paper: "Adapter"; appendix A.3, A.4, D.4): D1's labels
(``d1_labels``) and training (``sft``), D2's grouped GRPO (``grpo_update``), checkpoints.
"""
