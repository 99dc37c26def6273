"""The ``local`` backend: a stage recipe on a CPU, no slime and no GPU (its scope: docs/local-backend.md).

:mod:`.spec` says which recipe keys the backend reads and refuses what it cannot run;
:func:`.session.open_session` reads the recipe once into the parts the phases take; :func:`.stage.run_stage` is the
one runner (warm start, SFT or GRPO; a LoRA expert or full fine-tuning, with the KL term when the recipe asks)
over the embedded engine (:mod:`.engine`) and the shared rollout. For plugin authors, smoke tests, CI and the study in miniature; not meant to scale.
"""
