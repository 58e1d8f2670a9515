from curate.cli import main

main()
