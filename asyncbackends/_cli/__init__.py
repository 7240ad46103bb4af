"""The `asyncbackends` command line (private: the console script and `python -m asyncbackends` use it)."""
