"""`python -m musubi.cli`: the same command line as the `musubi` script."""

from musubi.cli.entry import main

main()
