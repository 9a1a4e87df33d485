"""``python -m bench`` (and ``make bench``): the side-by-side benchmark suite, see bench/suite."""

from bench.suite.cli import main

raise SystemExit(main())
