"""``python -m felix.cni_server``: a standalone CNI server with a local pool (tests, lab)."""

from felix.cni_server.server import main

raise SystemExit(main())
