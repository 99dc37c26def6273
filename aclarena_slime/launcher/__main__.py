from aclarena_slime.launcher.stage import main

raise SystemExit(main())
