"""``python -m streamengine`` is the ``streamengine`` command."""
import sys

from ._cli.main import main

sys.exit(main())
