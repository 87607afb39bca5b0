"""Adapter: view-policy learning (paper: "Adapter"; appendix A.3, A.4, D.4).

``d1_labels`` (D1 data: the view teachers' labels of reference decisions), ``sft`` (D1: KL
to the view teacher plus expected structural cost), ``grpo_update`` (D2: grouped GRPO with
clipped ratio, reference KL and entropy), ``checkpoint`` (safetensors weights, JSON config,
safely loaded trainer state). The Router's other modules stay frozen.
"""
