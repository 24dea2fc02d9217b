"""`python -m watcher` is the same as the `pod-resources-watcher` command."""

from watcher.cli import main

raise SystemExit(main())
