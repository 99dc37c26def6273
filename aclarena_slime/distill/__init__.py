"""Distillation for the MLE backbone and the MOPD baseline: SDFT data, a balanced data source, teacher log-probs.

- :mod:`~aclarena_slime.distill.dumps`: read rollout dumps (slime's ``--save-debug-rollout-data`` files,
  JSONL) into plain episodes;
- :mod:`~aclarena_slime.distill.sdft`: filter by reward per domain, convert to chat ``messages``
  records, de-duplicate, write one domain-tagged mixture;
- :mod:`~aclarena_slime.distill.balanced_source`: ``--data-source-path`` class drawing equally from every domain;
- :mod:`~aclarena_slime.distill.mopd`: the reward / post-process plugins of multi-teacher on-policy distillation.
"""
