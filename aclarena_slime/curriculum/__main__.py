import sys

from aclarena_slime.curriculum import arena, runner

# An arena file (it lists methods) runs every method's curriculum; any other file is one curriculum.
raise SystemExit((arena.main if len(sys.argv) > 1 and arena.is_arena(sys.argv[1]) else runner.main)())
