import sys

from dlio_ckpt_ext.report.cli import main

sys.exit(main())
