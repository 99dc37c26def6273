"""Distillation for the MLE backbone and the MOPD baseline: SDFT data, a balanced data source, teacher log-probs.

- :mod:`~aclarena_slime.distill.dumps`: read rollout dumps (slime's ``--save-debug-rollout-data`` files,
  JSONL) into plain episodes;
- :mod:`~aclarena_slime.distill.sdft`: filter by reward per domain, convert to chat ``messages``
  records, de-duplicate, write one domain-tagged mixture;
- :mod:`~aclarena_slime.distill.balanced_source`: drawing equally from every domain (and replaying earlier
  stages), the logic behind slime's ``--data-source-path`` hook;
- :mod:`~aclarena_slime.distill.mopd`: the teachers of multi-teacher on-policy distillation and their log-probs.

Slime reaches these through the hooks of :mod:`aclarena_slime.slime_edge` (``data_source``, ``mopd``);
nothing here imports slime.
"""
