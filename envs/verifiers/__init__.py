"""verifiers environments as aclarena envs (the ``verifiers`` extra: ``pip install -e '.[verifiers]'``)."""
