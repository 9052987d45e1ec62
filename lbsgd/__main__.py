import sys

from lbsgd.cli import main

sys.exit(main())
