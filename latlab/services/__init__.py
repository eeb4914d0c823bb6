"""What latlab does, as functions a command (or a program) calls: run a bench, a sweep, an
A/B, cold starts; calibrate and predict. A service takes a config (`latlab.records`) and
returns what it measured or predicted; it never prints results or exits."""
