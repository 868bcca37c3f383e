import sys

from hybrid_lightning.cli import main

sys.exit(main())
