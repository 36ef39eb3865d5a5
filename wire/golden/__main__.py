import sys

from wire.golden import main

sys.exit(main())
