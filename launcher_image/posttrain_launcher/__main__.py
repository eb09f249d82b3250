"""`python -m posttrain_launcher`: run the job described by POSTTRAIN_JOB_SPEC."""

from .launcher import main

raise SystemExit(main())
