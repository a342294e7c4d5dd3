from labkube.cli_entry import main

main()
