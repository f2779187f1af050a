from autotune.cli import main

raise SystemExit(main())
