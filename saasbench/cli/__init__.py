"""The command line: one module per noun group, wired in main.py."""
