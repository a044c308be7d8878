import sys

from xrl.cli import main

sys.exit(main())
