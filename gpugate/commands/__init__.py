"""The thin subcommands: parse the arguments, call the code that does the work, print."""
