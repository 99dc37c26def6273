"""The ``local`` backend: a whole RL stage on a CPU, no slime and no GPU.

An embedded engine (:mod:`.engine`) speaks the SGLang subset our rollout uses, a small LoRA
policy-gradient trainer (:mod:`.trainer`) updates one adapter, and :func:`.stage.run_stage` ties them
together from a :class:`.config.LocalStageConfig`. For plugin authors, smoke tests and CI; not meant
to scale.
"""
