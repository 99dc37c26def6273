"""Files the smoke run (:mod:`aclarena_slime.launcher.smoke`) puts in front of slime, never imported here.

- ``musa_patch.py``: slime's own accelerator bootstrap hook. slime imports a module of that name from
  the folder ``MUSA_PATCH_PATH`` names (``slime/utils/accelerator/__init__.py``); ours gives torch a
  do-nothing device so the training actor, which slime creates even with ``--debug-rollout-only``,
  gets through its ``__init__`` on a machine without a GPU. No patch to slime.
- ``standins/torchvision``: SGLang imports torchvision when slime parses its arguments; on a CPU-only
  torch the PyPI torchvision does not load. The stand-in only imports; it is put on the job's
  ``PYTHONPATH`` when the real one is not importable, and never installed anywhere.
"""
