import sys

from aclarena_slime.arena import runner
from aclarena_slime.curriculum import runner as curriculum

# ``launch/curriculum.sh``'s entry: an arena file (it lists methods) runs every method's curriculum; any other
# file is one curriculum.
raise SystemExit((runner.main if len(sys.argv) > 1 and runner.is_arena(sys.argv[1]) else curriculum.main)())
