from aclarena_slime.curriculum import runner

# One curriculum file (``launch/curriculum.sh`` runs ``python -m aclarena_slime.arena``, which also takes an
# arena file).
raise SystemExit(runner.main())
