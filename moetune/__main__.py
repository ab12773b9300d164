from moetune.cli import main

raise SystemExit(main())
