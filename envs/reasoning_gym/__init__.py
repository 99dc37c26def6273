"""reasoning-gym tasks as a single-turn env (the ``reasoning-gym`` extra: ``pip install -e '.[reasoning-gym]'``)."""
