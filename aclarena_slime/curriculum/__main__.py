from aclarena_slime.curriculum.runner import main

raise SystemExit(main())
