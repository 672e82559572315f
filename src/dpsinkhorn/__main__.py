import sys

from dpsinkhorn.cli import main

sys.exit(main())
