from latlab.cli import main

main()
