import sys

from vidql.cli import main

sys.exit(main())
