import sys

from ._cli._main import main

sys.exit(main())
