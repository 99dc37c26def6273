import sys

from aclarena_slime.cli import main

sys.exit(main())
