"""`python -m pathattn ...`, the same as the `pathattn` command (see `pathattn.cli`)."""

from .cli import main

raise SystemExit(main())
