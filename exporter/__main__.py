from exporter.cli.main import main

raise SystemExit(main())
